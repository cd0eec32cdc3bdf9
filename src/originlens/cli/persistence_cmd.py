"""``originlens assoc experiment persistence | horizon``: the leading terms beyond the theorem's window
(arXiv 2601.19208 Table 1, Fig. 4) over data seeds with the permuted-token and disjoint-batch nulls, and
the horizon of agreement over a |V| × T grid.

Parses arguments and calls :func:`originlens.experiments.persistence.run_persistence` /
:func:`originlens.experiments.horizon.run_horizon`, which write ``OUT/report.html`` and the results file
``results/leading-terms/<persistence|horizon>-<scale>.json`` (``--results`` to write elsewhere).
Re-running resumes every run.
"""

from __future__ import annotations

import argparse
from typing import Any

from .options import add_option, add_threads, apply_threads, finite_float, float_list, int_list, positive_int


def cmd_persistence(args: argparse.Namespace) -> int:
    from ..experiments.persistence import run_persistence
    from ..experiments.persistence_config import PersistenceConfig
    from ..experiments.persistence_cosines import KINDS
    from ..experiments.results import command_line

    apply_threads(args)
    overrides = {
        k: getattr(args, k)
        for k in ("vocab_size", "seq_len", "layers", "batch_size", "steps", "log_every")
        if getattr(args, k) is not None
    }
    cfg = PersistenceConfig(
        scale=args.scale, seeds=args.seeds, overrides=overrides, **({"lrs": args.lrs} if args.lrs is not None else {})
    )
    s = run_persistence(cfg, args.out, results=args.results, command=command_line(), from_records=args.from_records)
    for lr, v in s["by_lr"].items():
        mins = ", ".join(f"{k} {v[k]['min_logged']['mean']:.4f}" for k in KINDS)
        print(f"η = {lr} ({v['steps']} steps, t = {v['t']:g}): min cosine over the logging points {mins}")
    print(f"{args.out}/report.html, " + (s["results_file"] or "unit records only (fewer than 3 seeds)"))
    return 0


def add_parser(esub: Any) -> None:
    o = esub.add_parser(
        "persistence",
        help="leading terms over a long run: min cosines, horizons, nulls",
        description=__doc__.split("\n\n")[0],
    )
    o.add_argument(
        "--scale",
        default="cpu",
        help="paper | cpu (Table 1, Fig. 4) | paper-bpe | cpu-bpe (Table 2) | ci (a plumbing check)",
    )
    o.add_argument("--seeds", type=int_list, default=[0, 1, 2], help="data-order seeds, e.g. 0-2 (default)")
    o.add_argument(
        "--lrs",
        type=float_list,
        default=None,
        help="learning rates η (default: the scale's, 0.005,0.05; BPE scales 0.005)",
    )
    o.add_argument("--out", required=True, help="experiment directory")
    o.add_argument(
        "--from-records",
        action="store_true",
        help="train nothing: combine the (η, seed) runs' records (written beside the results file by earlier "
        "calls, e.g. one seed at a time) into the results file",
    )
    o.add_argument(
        "--results", default=None, help="results file (default results/leading-terms/persistence-SCALE.json)"
    )
    g = o.add_argument_group("overrides of the scale")
    for flag, dest, what in (
        ("--vocab-size", "vocab_size", "|V|"),
        ("--seq-len", "seq_len", "T"),
        ("--n-layers", "layers", "layers L"),
        ("--batch-size", "batch_size", "SGD minibatch"),
        ("--steps", "steps", "SGD steps"),
        ("--log-every", "log_every", "logging-point interval in steps"),
    ):
        add_option(g, flag, dest=dest, type=positive_int, default=None, help=f"{what} (default: the scale's)")
    add_threads(o)
    o.set_defaults(func=cmd_persistence, writes=lambda a: [a.out])


def cmd_horizon(args: argparse.Namespace) -> int:
    from ..experiments.horizon import run_horizon
    from ..experiments.horizon_config import HorizonConfig
    from ..experiments.horizon_report import fit_rows
    from ..experiments.results import command_line

    apply_threads(args)
    overrides = {
        k: getattr(args, k)
        for k in ("vocab_sizes", "seq_lens", "layers", "batch_size", "max_steps", "lr")
        if getattr(args, k) is not None
    }
    cfg = HorizonConfig(scale=args.scale, seeds=args.seeds, overrides=overrides)
    s = run_horizon(cfg, args.out, results=args.results, command=command_line(), from_records=args.from_records)
    for row in fit_rows(s["fits"]):
        if row[1] == "0.9":
            print(
                f"{row[0]}, θ 0.9: exponent of |V| {row[4]} over seeds, {row[5]} pooled; of T {row[6]} "
                f"({row[2]} runs, {row[3]} censored)"
            )
    print(f"{args.out}/report.html, " + (s["results_file"] or "unit records only (fewer than 3 seeds)"))
    return 0


def add_horizon_parser(esub: Any) -> None:
    o = esub.add_parser(
        "horizon",
        help="when the weights leave their leading terms, over a |V| × T grid",
        description="The step at which each weight's cosine with its leading term drops below "
        "0.99 / 0.9 / 0.7, over a grid of vocabulary sizes and sequence lengths, and "
        "a fit of its scaling (originlens.experiments.horizon).",
    )
    o.add_argument("--scale", default="cpu", help="cpu | ci (a plumbing check)")
    o.add_argument("--seeds", type=int_list, default=[0, 1, 2], help="data-order seeds, e.g. 0-2 (default)")
    o.add_argument("--out", required=True, help="experiment directory")
    o.add_argument("--results", default=None, help="results file (default results/leading-terms/horizon-SCALE.json)")
    o.add_argument(
        "--from-records",
        action="store_true",
        help="train nothing: fit the grid from the runs' records (written beside the results file by earlier "
        "calls, e.g. a few cells at a time)",
    )
    g = o.add_argument_group("overrides of the scale")
    g.add_argument(
        "--vocab-sizes",
        dest="vocab_sizes",
        type=int_list,
        default=None,
        help="|V| grid, e.g. 150,300,600,1000 (default: the scale's)",
    )
    g.add_argument("--seq-lens", dest="seq_lens", type=int_list, default=None, help="T grid, e.g. 16,32")
    add_option(g, "--n-layers", dest="layers", type=positive_int, default=None, help="layers L (default: the scale's)")
    g.add_argument("--batch-size", dest="batch_size", type=positive_int, default=None, help="SGD minibatch")
    g.add_argument(
        "--max-steps",
        dest="max_steps",
        type=positive_int,
        default=None,
        help="steps after which a run that has not dropped is censored",
    )
    g.add_argument("--lr", type=finite_float, default=None, help="learning rate η (default: the scale's)")
    add_threads(o)
    o.set_defaults(func=cmd_horizon, writes=lambda a: [a.out])


def register(asub: Any) -> None:
    """``assoc experiment`` and its experiments."""
    p = asub.add_parser(
        "experiment",
        help="leading-term experiments that write results files",
        description="Leading-term experiments of arXiv 2601.19208 over seeds, with nulls; each "
        "writes a results file under results/leading-terms/.",
    )
    esub = p.add_subparsers(dest="assoc_experiment", metavar="EXPERIMENT")
    add_parser(esub)
    add_horizon_parser(esub)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])
