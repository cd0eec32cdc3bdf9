"""``originlens ntp experiment grid``: the toy regime grid with nulls, CIs over seeds and tested orderings.

Parses arguments and calls :func:`originlens.experiments.toy_grid.run_toy_grid`, which trains (or resumes)
regimes × seeds and their initial-model nulls under ``--out``, and writes ``OUT/report.html`` and the
results file ``results/toy-grid/<task>-<scale>.json`` (``--results`` to write elsewhere).  ``--reanalyse
FILE`` recomputes this version's statistics from the runs a results file recorded, without training or
the run directories.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import ConfigError
from .options import apply_threads, int_list


def cmd_grid(args: argparse.Namespace) -> int:
    from ..experiments.results import command_line
    from ..experiments.toy_grid import ToyGridConfig, reanalyse_toy_grid, run_toy_grid
    from .ntp_cmd import _overrides

    apply_threads(args)
    if args.overwrite:
        raise ConfigError(
            "the experiment resumes its runs and never overwrites them", "remove the --out directory to start over"
        )
    regimes = args.regimes.split(",") if args.regimes else None
    cfg = ToyGridConfig(
        task=args.task,
        scale=args.scale,
        seeds=args.seeds,
        jobs=args.jobs,
        confidence=args.confidence,
        overrides=_overrides(args),
        **({"regimes": regimes} if regimes else {}),
    )
    if args.reanalyse:
        from ..experiments.results import read_results

        s = reanalyse_toy_grid(
            cfg, read_results(args.reanalyse), args.out, results=args.results or args.reanalyse, command=command_line()
        )
    else:
        s = run_toy_grid(cfg, args.out, results=args.results, command=command_line())
    for regime, v in s["per_regime"].items():
        u, i = v["useless_r"], v["initial_useless_r"]
        print(
            f"{regime:<14} r {u['mean']:.3f} [{u['low'] if u['low'] is None else round(u['low'], 3)}, "
            f"{u['high'] if u['high'] is None else round(u['high'], 3)}]  initial {i['mean']:.3f}  "
            f"eval loss {v['eval_loss']['mean']:.4f}"
        )
    for k, t in s["orderings"].items():
        print(f"{k}: p (Holm) {t['p_holm']}, holds {t['holds']}")
    print(f"{args.out}/report.html, {s['results_file']}")
    return 0


def add_parser(esub: Any) -> None:
    from .ntp_cmd import add_overrides

    g = esub.add_parser(
        "grid",
        help="toy regime grid: nulls, CIs over seeds, the paper's orderings tested",
        description=__doc__.split("\n\n")[0],
    )
    g.add_argument("--task", default="cond-majority", help="cond-majority | majority")
    g.add_argument("--scale", default="cpu", help="paper | cpu (d = 64) | ci (a seconds-long direction check)")
    g.add_argument("--seeds", type=int_list, default=[0, 1, 2, 3, 4], help="e.g. 0-4 (default) or 0,1,2")
    g.add_argument("--regimes", default=None, help="comma-separated (default: all four)")
    g.add_argument("--jobs", type=int, default=1, help="runs trained in parallel, one thread each (1)")
    g.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    g.add_argument("--out", required=True, help="experiment directory (runs, report)")
    g.add_argument("--results", default=None, help="results file (default results/toy-grid/TASK-SCALE.json)")
    g.add_argument(
        "--reanalyse",
        default=None,
        metavar="FILE",
        help="recompute the statistics from the runs recorded in this results file (no training); "
        "the file is rewritten unless --results names another",
    )
    add_overrides(g)
    g.set_defaults(func=cmd_grid, writes=lambda a: [a.out])
