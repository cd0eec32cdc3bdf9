"""``originlens report RUN [RUN ...]``: rebuild a run's report, or combine several runs' reports."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="rebuild one run's report or combine several runs side by side",
        description="With one RUN: re-render RUN/report.html from RUN/report.blocks.json (adds the "
        "run record). With several RUNs: write a combined report to --out (the "
        "configuration keys that differ, final metrics, figures side by side).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories written by originlens")
    p.add_argument("--out", help="output directory of the combined report (required with several runs)")
    p.add_argument("--title", help="title of the combined report")
    p.set_defaults(func=run, writes=_writes)


def _writes(args: argparse.Namespace) -> list[str]:
    """One RUN: its report files, in place; several: the combined report's directory."""
    return [args.out] if args.out else [args.runs[0]]


def run(args: argparse.Namespace) -> int:
    from ..errors import ConfigError
    from ..report import combine_reports, rebuild_report

    if len(args.runs) == 1 and not args.out:
        path = rebuild_report(args.runs[0])
    else:
        if not args.out:
            raise ConfigError("combining several runs needs an output directory", "pass --out DIR")
        path = combine_reports(args.runs, args.out, title=args.title)
    print(path)
    return 0
