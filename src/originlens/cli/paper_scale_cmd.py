"""``originlens ntp experiment paper-scale`` (and ``scripts/paper_scale.py``): the toy grids and the Othello
attribution of arXiv 2603.14087 at the paper's configuration within a time budget on one GPU.

Parses arguments and calls :func:`originlens.experiments.paper_scale.run_paper_scale`: a short calibration,
a plan from the measured throughput, the toy grids (seeds grown while they fit) and Othello (cut to what is
left; every cut recorded), the results files under ``--results``, ``OUT/paper-scale-runs.tar.gz`` and a
summary table.  ``--smoke``: the same run at tiny size on the CPU (under a minute).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from .options import add_device, int_list


def cmd_paper_scale(args: argparse.Namespace) -> int:
    from ..experiments.paper_scale import run_paper_scale
    from ..experiments.paper_scale_config import PaperScaleConfig
    from ..experiments.results import command_line

    cfg = PaperScaleConfig(
        budget_minutes=args.budget_minutes,
        device=args.device or ("cpu" if args.smoke else "auto"),
        smoke=args.smoke,
        matmul_precision=args.matmul_precision,
        jobs=args.jobs,
        tasks=args.tasks,
        seed_rounds=args.seed_rounds,
        othello=not args.no_othello,
        othello_seeds=args.othello_seeds,
        toy_steps=args.toy_steps,
        calibration=args.calibration,
    )
    results = args.results or (f"{args.out}/results" if args.smoke else "results")
    rec = run_paper_scale(cfg, args.out, results=results, command=getattr(args, "command", None) or command_line())
    print(rec["results_file"])
    return 1 if rec["errors"] else 0


def _configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--budget-minutes", type=float, default=8.0, help="wall-clock budget, calibration included (8)")
    p.add_argument("--out", default="runs/paper-scale", help="run directories (default runs/paper-scale)")
    p.add_argument(
        "--results",
        default=None,
        help="results root (default results/; with --smoke OUT/results, so a check never touches results/)",
    )
    p.add_argument("--smoke", action="store_true", help="the same run at tiny size on the CPU (< 1 min)")
    p.add_argument(
        "--matmul-precision",
        default="tf32",
        choices=("tf32", "highest"),
        help="CUDA float32 products: tf32 (default) or highest (no effect on the CPU)",
    )
    p.add_argument("--jobs", type=int, default=0, help="toy runs at once, processes sharing the device (0: auto)")
    p.add_argument(
        "--tasks",
        type=lambda s: [t for t in s.split(",") if t],
        default=["cond-majority", "majority"],
        help="toy tasks (default cond-majority,majority)",
    )
    p.add_argument("--seed-rounds", type=int_list, default=[3, 5, 10], help="toy seed counts tried in turn (3,5,10)")
    p.add_argument("--othello-seeds", type=int, default=3, help="Othello seeds, if they fit (3; cut to 1 first)")
    p.add_argument("--toy-steps", type=int, default=None, help="toy training steps (default the paper's 3,000)")
    p.add_argument("--no-othello", action="store_true", help="the toy grids only")
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="reuse the calibration of an earlier paper-scale results file from the same device (no measuring)",
    )
    add_device(p, default=None, help="auto (default; cpu with --smoke), cuda, cuda:N or cpu")


def add_parser(esub: Any) -> None:
    p = esub.add_parser(
        "paper-scale",
        help="the toy grids and Othello attribution at the paper's configuration within a GPU time budget",
        description=__doc__.split("\n\n")[0],
    )
    _configure(p)
    p.set_defaults(func=cmd_paper_scale, writes=lambda a: [a.out])


def main(argv: list[str] | None = None) -> int:
    """``scripts/paper_scale.py``: the same options as ``originlens ntp experiment paper-scale``."""
    from .main import run_script

    p = argparse.ArgumentParser(prog="paper_scale.py", description=__doc__.split("\n\n")[0])
    _configure(p)
    args = p.parse_args(argv)
    args.command = "PYTHONPATH=src python3 scripts/paper_scale.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    return run_script(lambda: cmd_paper_scale(args), "paper_scale.py")
