"""``originlens results render [--check]``: the README's reproduction status and ``docs/results.md``,
generated from the committed results files (:mod:`originlens.experiments.render`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _writes(args: argparse.Namespace) -> list[Path]:
    from ..experiments.render import DOC

    root = Path(args.root)
    return [] if args.check else [root / "README.md", root / DOC]


def cmd_render(args: argparse.Namespace) -> int:
    from ..experiments.render import render

    changed = render(args.root, check=args.check)
    if args.check:
        if changed:
            print("out of date (run `originlens results render`): " + ", ".join(map(str, changed)))
            return 1
        print("docs agree with the results files")
        return 0
    print("rewrote: " + (", ".join(map(str, changed)) or "nothing (already up to date)"))
    return 0


def register(subparsers: Any) -> None:
    r = subparsers.add_parser("results", help="docs generated from the results files")
    sub = r.add_subparsers(dest="results_command", metavar="RESULTS_COMMAND")
    g = sub.add_parser(
        "render",
        help="regenerate README's reproduction status and docs/results.md",
        description=__doc__.split("\n\n")[0],
    )
    g.add_argument("--root", default=".", help="repository root (README.md, docs/, results/)")
    g.add_argument("--check", action="store_true", help="write nothing; exit 1 when the docs are out of date")
    g.set_defaults(func=cmd_render, writes=_writes)
