"""``originlens demo``: the end-to-end demo (``make demo``)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="end-to-end demo on embedded defaults; writes a report",
        description="Both papers end to end at CPU scale (minutes on 2 cores): corpus "
        "statistics and associations (TinyStories subset if the data root has it, "
        "else the storyworld), a short leading-term training with theory-vs-learned "
        "curves, the four training regimes on Conditioned Majority, and a small "
        "OthelloGPT gradient-pathway attribution. Writes RUN/report.html.",
    )
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--corpus", default="auto", help="auto | tinystories | storyworld | PATH")
    p.add_argument("--vocab-size", type=int, default=1000, help="word vocabulary |V| of the demo corpus")
    p.add_argument("--seq-len", type=int, default=64, help="window length T of the demo corpus")
    p.add_argument("--seed", type=int, default=0, help="seed of every stage (data order, initialisation)")
    p.add_argument(
        "--stages", default="all", help="all, or a comma-separated subset of statistics,leading,regimes,othello"
    )
    p.add_argument("--quick", action="store_true", help="smaller settings (≈ 1 min on 2 cores; used by the tests)")
    p.add_argument(
        "--restart",
        action="store_true",
        help="recompute every stage (default: a rerun reuses the stages an earlier run finished)",
    )
    p.set_defaults(func=run, writes=lambda a: [a.out])


def run(args: argparse.Namespace) -> int:
    from ..demo import DemoConfig, run_demo

    path = run_demo(
        DemoConfig(
            out=args.out,
            corpus=args.corpus,
            vocab_size=args.vocab_size,
            seq_len=args.seq_len,
            seed=args.seed,
            stages=args.stages,
            quick=args.quick,
            restart=args.restart,
        )
    )
    from ..demo import reproduction_status

    rows = reproduction_status("results")
    if rows:  # always: every claim has a row, with or without a results file
        print("Reproduction status (committed results files; details in docs/results.md):")
        for claim, paper, _, _, _, verdict in rows:
            print(f"  {verdict:<15} {paper:<38} {claim[:90]}")
        print("The demo's own stages (in the report) illustrate the method at demo scale; they are not results.")
    print(f"report: {path}")
    return 0
