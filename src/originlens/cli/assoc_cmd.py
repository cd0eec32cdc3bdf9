"""``originlens assoc ...``: token associations under the basis maps (and, later, the leading-term model)."""
from __future__ import annotations

import argparse
import json

from ..stats.assoc import BASES


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("assoc", help="token associations and the one-hot attention model (leading terms)",
                       description="Leading-term tools of arXiv 2601.19208.")
    asub = p.add_subparsers(dest="assoc_command", metavar="ASSOC_COMMAND")
    t = asub.add_parser("top", help="top associations of a word under a basis map",
                        description="Print the k strongest entries of a token's row (what it maps to) and "
                                    "column (what maps to it) in a basis matrix of saved statistics.")
    t.add_argument("--stats", required=True, help="directory written by `originlens stats`")
    t.add_argument("--basis", choices=BASES, default="bigram", help="which matrix (default bigram)")
    t.add_argument("--word", required=True, action="append",
                   help="token string (or integer id); repeat for several")
    t.add_argument("-k", type=int, default=10, help="how many associations (default 10)")
    t.add_argument("--direction", choices=["row", "column", "both"], default="both")
    t.add_argument("--include-self", action="store_true", help="keep the token itself in its list")
    t.add_argument("--json", action="store_true", help="print JSON instead of text")
    t.set_defaults(func=run_top)
    p.set_defaults(func=lambda a: (p.print_help(), 0)[1])


def _token(w: str) -> str | int:
    return int(w) if w.lstrip("-").isdigit() else w


def run_top(args: argparse.Namespace) -> int:
    from ..stats import load_statistics, top_associations
    st = load_statistics(args.stats)
    dirs = ["row", "column"] if args.direction == "both" else [args.direction]
    result = {}
    for w in args.word:
        result[w] = {d: top_associations(st, args.basis, _token(w), args.k, direction=d,
                                         exclude_self=not args.include_self) for d in dirs}
    if args.json:
        print(json.dumps({w: {d: [[t, v] for t, v in lst] for d, lst in r.items()} for w, r in result.items()},
                         ensure_ascii=False, indent=1))
        return 0
    arrow = {"row": "→", "column": "←"}
    for w, r in result.items():
        for d, lst in r.items():
            print(f"{args.basis} {w} {arrow[d]} " + ", ".join(f"{t} ({v:.3g})" for t, v in lst))
    return 0
