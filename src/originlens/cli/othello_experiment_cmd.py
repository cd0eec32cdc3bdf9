"""``originlens ntp experiment othello``: OthelloGPT over seeds — the Adam-variant pathway influence
integrated over all of training from strata, the learning curve, untrained-model and random-direction
nulls, the paper's Othello pattern tested over seeds behind its gates.

Parses arguments and calls :func:`originlens.experiments.othello.run_othello`.  Every stage writes unit
records (``results/othello/othello-<scale>/train-S.json``, ``stratum-S-H.json``, ``mismatch-S.json``,
``check-S.json``), so the stages of different seeds and strata can run in different processes, at different
times; ``--stage
combine`` reads them and writes ``OUT/report.html`` and, for ≥ 3 seeds, ``results/othello/othello-<scale>.json``
(``--results`` to write elsewhere).  Finished units are skipped on a rerun.
"""

from __future__ import annotations

import argparse
from typing import Any

from .options import add_device, add_option, add_threads, apply_threads, int_list


def cmd_othello(args: argparse.Namespace) -> int:
    from ..experiments.othello import run_othello
    from ..experiments.othello_config import OthelloConfig
    from ..experiments.results import command_line

    apply_threads(args)
    overrides = {
        k: getattr(args, k)
        for k in (
            "n_layer",
            "d_model",
            "n_head",
            "batch_size",
            "steps",
            "eval_size",
            "othello_pool",
            "positions",
            "checkpoint_every",
            "strata",
            "burn_in",
            "stratum_updates",
            "check_updates",
            "check_positions",
            "lr_decay",
        )
        if getattr(args, k) is not None
    }
    cfg = OthelloConfig(
        scale=args.scale,
        seeds=args.seeds,
        layers=args.attr_layers,
        overrides=overrides,
        random_directions=args.random_directions,
        device=args.device or "cpu",
        matmul_precision=args.matmul_precision,
        replay_rtol=args.replay_rtol,
        strata_run=args.strata_run,
        **({"lr": args.lr} if args.lr is not None else {}),
    )
    s = run_othello(
        cfg, args.out, results=args.results, command=command_line(), stage=args.stage, check_seed=args.check_seed
    )
    for path in s["records"]:
        print(f"unit record {path}")
    if "summary" in s:
        summary = s["summary"]
        print(f"legal-move accuracy {summary['quality']['legal_acc']['mean']:.3f} over {len(cfg.seeds)} seed(s)")
        for g in summary["gates"]:
            print(f"gate {g['name']}: {'passed' if g['passed'] else 'FAILED'} — {g['reason']}")
        for k, t in summary["stats"]["tests"].items():
            print(f"{k}: p (Holm) {t['p_holm']}, holds {t['holds']}")
        print(f"{args.out}/report.html, " + (s["results_file"] or "no results file (fewer than 3 seeds)"))
    return 0


def add_parser(esub: Any) -> None:
    o = esub.add_parser(
        "othello",
        help="OthelloGPT over seeds: influence over all of training, nulls, learning curve, the paper's pattern tested",
        description=__doc__.split("\n\n")[0],
    )
    o.add_argument("--scale", default="cpu", help="paper (a GPU job) | cpu | ci (a plumbing check)")
    o.add_argument("--seeds", type=int_list, default=[0, 1, 2, 3, 4], help="e.g. 0-4 (default)")
    o.add_argument("--out", required=True, help="experiment directory (one run directory per seed)")
    o.add_argument(
        "--stage",
        default="all",
        choices=("all", "train", "stratum", "mismatch", "check", "combine"),
        help="all (default): every stage in turn; train: train the seeds; stratum: attribute the strata "
        "(--strata); mismatch: the initial mismatch of the probes and random directions; check: the "
        "estimator check on --check-seed; combine: the analysis over the seeds' records",
    )
    o.add_argument(
        "--strata",
        dest="strata_run",
        type=int_list,
        default=None,
        help="strata the stratum stage attributes (default all)",
    )
    o.add_argument("--check-seed", type=int, default=None, help="seed of the estimator check (default the first)")
    o.add_argument(
        "--results",
        default=None,
        help="results file (default results/othello/othello-SCALE.json); "
        "the unit records go beside it (results/othello/othello-SCALE/)",
    )
    g = o.add_argument_group("overrides of the scale")
    for flag, dest, typ, what in (
        ("--n-layers", "n_layer", int, "transformer blocks"),
        ("--d-model", "d_model", int, "residual width"),
        ("--heads", "n_head", int, "attention heads"),
        ("--batch-size", "batch_size", int, "games per step"),
        ("--steps", "steps", int, "training steps"),
        ("--eval-size", "eval_size", int, "held-out eval games"),
        ("--othello-pool", "othello_pool", int, "training games generated once per seed"),
        ("--positions", "positions", int_list, "attributed move positions, e.g. 12,24,36,48"),
        ("--checkpoint-every", "checkpoint_every", int, "checkpoints (with Adam state) every N updates"),
        ("--n-strata", "strata", int, "strata of training"),
        ("--burn-in", "burn_in", int, "decomposed updates before each stratum's recorded ones"),
        ("--stratum-updates", "stratum_updates", int, "recorded updates per stratum"),
        ("--check-updates", "check_updates", int, "updates 1..N of the estimator check"),
        ("--check-positions", "check_positions", int_list, "positions of the estimator check"),
        ("--lr", "lr", float, "Adam learning rate"),
        ("--lr-decay", "lr_decay", int_list, "A,B: a linear learning-rate cool-down over updates A..B"),
    ):
        add_option(g, flag, dest=dest, type=typ, default=None, help=f"{what} (default: the scale's)")
    o.add_argument("--attr-layers", type=int_list, default=None, help="attributed layers (default all)")
    o.add_argument("--random-directions", type=int, default=2, help="null directions per probe (2)")
    add_device(o, default=None, help="where to train and attribute (default cpu)")
    o.add_argument(
        "--matmul-precision",
        default="highest",
        choices=("highest", "tf32"),
        help="CUDA float32 products: highest (default) or tf32, in training and its replay",
    )
    o.add_argument(
        "--replay-rtol",
        type=float,
        default=0.0,
        help="tolerance of the replay's checks against training (0: bit-exact; e.g. 1e-3 on a GPU "
        "without deterministic kernels)",
    )
    add_threads(o)
    o.set_defaults(func=cmd_othello, writes=lambda a: [a.out])
