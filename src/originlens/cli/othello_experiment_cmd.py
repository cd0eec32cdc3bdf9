"""``originlens ntp experiment othello``: OthelloGPT over seeds — training, untrained-model and
random-direction nulls, Adam-variant pathway attribution, the paper's Othello pattern tested over seeds.

Parses arguments and calls :func:`originlens.experiments.othello.run_othello`, which writes
``OUT/report.html``, a record per seed (``results/othello/othello-<scale>/seed-N.json``) and, for ≥ 3 seeds,
the results file ``results/othello/othello-<scale>.json`` (``--results`` to write elsewhere).  Re-running
resumes every stage; ``--from-records`` combines seed records made at different times or on different machines.
"""

from __future__ import annotations

import argparse
from typing import Any

from .options import add_device, add_option, add_threads, apply_threads, int_list


def cmd_othello(args: argparse.Namespace) -> int:
    from ..experiments.othello import OthelloConfig, run_othello
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
            "attribute_steps",
            "record_every",
            "snapshot_updates",
            "snapshot_record_every",
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
        jobs=args.jobs,
        matmul_precision=args.matmul_precision,
        replay_rtol=args.replay_rtol,
        **({"lr": args.lr} if args.lr is not None else {}),
    )
    s = run_othello(
        cfg, args.out, results=args.results, command=command_line(), from_records=args.from_records, stage=args.stage
    )
    if args.stage == "train":
        for seed, path in s["records"].items():
            print(f"seed {seed}: training record {path}")
        return 0
    q = s["quality"]
    print(f"legal-move accuracy {q['legal_acc']['mean']:.3f} over {len(cfg.seeds)} seed(s)")
    for k, t in s["by_fraction"][max(s["by_fraction"], key=float)]["tests"].items():
        print(f"{k}: p (Holm) {t['p_holm']}, holds {t['holds']}")
    print(f"{args.out}/report.html, " + (s["results_file"] or "seed records only (fewer than 3 seeds)"))
    return 0


def add_parser(esub: Any) -> None:
    o = esub.add_parser(
        "othello",
        help="OthelloGPT over seeds: nulls, attribution, the paper's pattern tested",
        description=__doc__.split("\n\n")[0],
    )
    o.add_argument("--scale", default="cpu", help="paper (a GPU job) | cpu | ci (a plumbing check)")
    o.add_argument("--seeds", type=int_list, default=[0, 1, 2], help="e.g. 0-2 (default)")
    o.add_argument("--out", required=True, help="experiment directory")
    o.add_argument(
        "--results",
        default=None,
        help="results file (default results/othello/othello-SCALE.json); "
        "each seed's record goes beside it (results/othello/othello-SCALE/seed-N.json)",
    )
    o.add_argument(
        "--stage",
        default="all",
        choices=("all", "train"),
        help="all (default): every stage; train: train the seeds only and write their training records",
    )
    o.add_argument(
        "--from-records",
        action="store_true",
        help="train nothing: combine the seeds' records (seeds run at different times or on different machines) into the results file",
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
        ("--positions", "positions", int_list, "attributed move positions, e.g. 12,24,36"),
        ("--attribute-steps", "attribute_steps", int, "attribute updates 1..N"),
        ("--record-every", "record_every", int, "record the influence at every N-th attributed update"),
        (
            "--snapshot-updates",
            "snapshot_updates",
            int,
            "SGD-variant updates attributed from each 10 %% checkpoint (0 = no snapshots)",
        ),
        (
            "--snapshot-record-every",
            "snapshot_record_every",
            int,
            "record the snapshot influence at every N-th of those updates",
        ),
        ("--lr", "lr", float, "Adam learning rate"),
        ("--lr-decay", "lr_decay", int_list, "A,B: a linear learning-rate cool-down over updates A..B"),
    ):
        add_option(g, flag, dest=dest, type=typ, default=None, help=f"{what} (default: the scale's)")
    o.add_argument("--attr-layers", type=int_list, default=None, help="attributed layers (default all)")
    o.add_argument("--random-directions", type=int, default=2, help="null directions per probe (2)")
    o.add_argument("--jobs", type=int, default=1, help="seeds trained and attributed in parallel processes (1)")
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
    o.set_defaults(func=cmd_othello)
