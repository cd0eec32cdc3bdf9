"""``originlens assoc experiment persistence``: the leading terms beyond the theorem's window (arXiv
2601.19208 Table 1, Fig. 4) over data seeds, with the permuted-token and disjoint-batch nulls.

Parses arguments and calls :func:`originlens.experiments.persistence.run_persistence`, which writes
``OUT/report.html`` and the results file ``results/leading-terms/persistence-<scale>.json`` (``--results``
to write elsewhere).  Re-running resumes every run.
"""
from __future__ import annotations

import argparse
from typing import Any

from .options import add_threads, apply_threads, float_list, positive_int


def cmd_persistence(args: argparse.Namespace) -> int:
    from ..experiments.persistence import KINDS, PersistenceConfig, run_persistence
    from ..experiments.results import command_line
    apply_threads(args)
    overrides = {k: getattr(args, k) for k in ("vocab_size", "seq_len", "layers", "batch_size", "steps", "log_every")
                 if getattr(args, k) is not None}
    cfg = PersistenceConfig(scale=args.scale, seeds=args.seeds, overrides=overrides,
                            **({"lrs": args.lrs} if args.lrs is not None else {}))
    s = run_persistence(cfg, args.out, results=args.results, command=command_line())
    for lr, v in s["by_lr"].items():
        mins = ", ".join(f"{k} {v[k]['min_logged']['mean']:.4f}" for k in KINDS)
        print(f"η = {lr} ({v['steps']} steps, t = {v['t']:g}): min cosine over the logging points {mins}")
    print(f"{args.out}/report.html, {s['results_file']}")
    return 0


def add_parser(esub: Any) -> None:
    from .ntp_attribute_cmd import _int_spec
    o = esub.add_parser("persistence", help="leading terms over a long run: min cosines, horizons, nulls",
                        description=__doc__.split("\n\n")[0])
    o.add_argument("--scale", default="cpu", help="paper (a GPU job) | cpu | ci (a plumbing check)")
    o.add_argument("--seeds", type=_int_spec, default=[0, 1, 2], help="data-order seeds, e.g. 0-2 (default)")
    o.add_argument("--lrs", type=float_list, default=None, help="learning rates η (default 0.005,0.05)")
    o.add_argument("--out", required=True, help="experiment directory")
    o.add_argument("--results", default=None,
                   help="results file (default results/leading-terms/persistence-SCALE.json)")
    g = o.add_argument_group("overrides of the scale")
    for flag, dest, what in (("--vocab-size", "vocab_size", "|V|"), ("--seq-len", "seq_len", "T"),
                             ("--layers", "layers", "layers L"), ("--batch-size", "batch_size", "SGD minibatch"),
                             ("--steps", "steps", "SGD steps"),
                             ("--log-every", "log_every", "logging-point interval in steps")):
        g.add_argument(flag, dest=dest, type=positive_int, default=None, help=f"{what} (default: the scale's)")
    add_threads(o)
    o.set_defaults(func=cmd_persistence)


def register(asub: Any) -> None:
    """``assoc experiment`` and its experiments."""
    p = asub.add_parser("experiment", help="leading-term experiments that write results files",
                        description="Leading-term experiments of arXiv 2601.19208 over seeds, with nulls; each "
                                    "writes a results file under results/leading-terms/.")
    esub = p.add_subparsers(dest="assoc_experiment", metavar="EXPERIMENT")
    add_parser(esub)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
