"""``originlens demo``: the end-to-end demo (``make demo``)."""
from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="end-to-end demo on embedded defaults; writes a report",
                       description="Builds a corpus (TinyStories subset if the data root has it, else the "
                                   "storyworld), computes the corpus statistics, prints top associations "
                                   "and writes RUN/report.html.")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo)")
    p.add_argument("--corpus", default="auto", help="auto | tinystories | storyworld | PATH")
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import DemoConfig, run_demo
    path = run_demo(DemoConfig(out=args.out, corpus=args.corpus, vocab_size=args.vocab_size,
                               seq_len=args.seq_len, seed=args.seed))
    print(f"report: {path}")
    return 0
