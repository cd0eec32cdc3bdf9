"""``originlens ntp experiment formal``: the Q(w) claims of arXiv 2603.14087 on a GPT trained on stories + Python.

Parses arguments and calls :func:`originlens.experiments.formal.run_formal`, which builds the mixed corpus,
trains the standard and myopic models (and the untrained null) per seed, fits an SAE per model, labels
its features formal/other, measures Q(w), steers with high-Q features and fits look-ahead maps, then
writes ``OUT/report.html`` and ``results/formal/formal-<scale>.json`` (``--results`` to write elsewhere).
Re-running resumes every stage.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .options import add_device, add_threads, apply_threads, int_list


def _setting(s: str) -> tuple[str, Any]:
    key, sep, value = s.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE (VALUE in JSON, e.g. steps=500), got {s!r}")
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def cmd_formal(args: argparse.Namespace) -> int:
    from ..experiments.formal import run_formal
    from ..experiments.formal_config import FormalConfig
    from ..experiments.formal_report import JUDGES
    from ..experiments.results import command_line, read_results

    apply_threads(args)
    cfg = FormalConfig(
        scale=args.scale,
        seeds=args.seeds,
        overrides=dict(args.set or []),
        confidence=args.confidence,
        device=args.device or "cpu",
    )
    s = run_formal(cfg, args.out, results=args.results, command=command_line())
    rec = read_results(s["results_file"])
    for name, judge in JUDGES.items():
        v = judge(rec)
        print(f"{name}: {v.verdict} — {v.ours}")
    print(f"{args.out}/report.html, {s['results_file']}")
    return 0


def add_parser(esub: Any) -> None:
    o = esub.add_parser(
        "formal",
        help="Q(w) claims on a GPT trained on stories + Python: formal features, steering, look-ahead",
        description=__doc__.split("\n\n")[0],
    )
    o.add_argument("--scale", default="cpu", help="cpu (default) | ci (a plumbing check in seconds)")
    o.add_argument("--seeds", type=int_list, default=[0, 1, 2], help="training seeds, e.g. 0-2 (default)")
    o.add_argument("--out", required=True, help="experiment directory (corpus, runs, report)")
    o.add_argument("--results", default=None, help="results file (default results/formal/formal-SCALE.json)")
    o.add_argument(
        "--set",
        type=_setting,
        action="append",
        metavar="KEY=VALUE",
        help="override a setting of the scale (JSON value; repeatable), e.g. steps=500; the settings are the "
        "keys of originlens.experiments.formal.SCALES (an unknown key is refused)",
    )
    o.add_argument("--confidence", type=float, default=0.95, help="interval level (0.95)")
    add_device(o, default=None, help="where to train and measure (default cpu)")
    add_threads(o)
    o.set_defaults(func=cmd_formal, writes=lambda a: [a.out])
