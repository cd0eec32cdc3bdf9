"""Rebuild one run's report, or combine the reports of several runs side by side.

:func:`combine_reports` reads each run's ``report.blocks.json`` (written by :meth:`Report.write`), its
``config.json`` and the last record of ``metrics.jsonl``, and writes one report with

* an overview table: one row per run, the configuration keys whose values **differ** between runs
  (what distinguishes them: regime, seed, learning rate, ...) and the final logged scalar metrics;
* for every figure file name present in at least two runs, the figures side by side in one row
  (e.g. the four regimes' loss curves next to each other);
* then each run's own report, its section headings demoted one level.

Caveats: runs written before report.blocks.json existed (originlens < 0.2) cannot be combined; figures
are compared by file name, so only runs made by the same command line up.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import InputError
from .html import Report, flatten, jsonable, load_report, read_report_json


def _last_scalars(run: Path) -> dict[str, Any]:
    p = run / "metrics.jsonl"
    if not p.exists():
        return {}
    last: dict[str, Any] = {}
    for line in p.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            break
        if isinstance(rec, dict):
            last.update({k: v for k, v in rec.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return last


def run_labels(runs: Sequence[Path]) -> list[str]:
    """Short unique labels: the shortest path suffixes that tell the runs apart."""
    parts = [r.resolve().parts for r in runs]
    for n in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-n:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(r) for r in runs]


def combine_reports(runs: Sequence[str | Path], out: str | Path, *, title: str | None = None) -> Path:
    """Write a combined report of ``runs`` into ``out``; returns the HTML path."""
    paths = [Path(r) for r in runs]
    if len(paths) < 2:
        raise InputError(
            "combining needs at least two run directories",
            "pass several RUN directories, or one RUN to rebuild its report",
        )
    reports = [load_report(p) for p in paths]
    labels = run_labels(paths)
    configs = [flatten(read_report_json(p / "config.json") or {}) for p in paths]
    keys = sorted({k for c in configs for k in c})
    differing = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    metrics = [_last_scalars(p) for p in paths]
    metric_keys = sorted({k for m in metrics for k in m if k not in ("step", "epoch", "time", "seconds")})[:8]

    rep = Report(title or "Combined report: " + ", ".join(labels))
    rep.section("Runs")
    header = ["run", "report", *differing, *metric_keys]
    rows = [
        [lab, r.title, *[jsonable(c.get(k)) for k in differing], *[m.get(k, "") for k in metric_keys]]
        for lab, r, c, m in zip(labels, reports, configs, metrics)
    ]
    rep.table(
        header,
        rows,
        caption="One row per run: the configuration keys that differ between the runs "
        "and the last logged value of each scalar metric.",
    )
    figs: dict[str, list[tuple[int, bytes, str]]] = {}
    for i, r in enumerate(reports):
        for kind, val in r.blocks:
            if kind == "fig":
                png, caption, name = val
                figs.setdefault(name, []).append((i, png, caption))
    shared = {n: v for n, v in figs.items() if len({i for i, _, _ in v}) >= 2}
    if shared:
        rep.section("Figures side by side")
        for name, items in shared.items():
            row = [(png, labels[i], f"{Path(name).stem}--{i:02d}.png") for i, png, _ in items]
            rep.figure_row(row, f"{items[0][2]} (one panel per run: {', '.join(labels[i] for i, _, _ in items)}).")
    for i, (lab, r) in enumerate(zip(labels, reports)):
        rep.section(f"Run {lab}: {r.title}")
        for kind, val in r.blocks:
            if kind == "h2":
                rep.blocks.append(("h3", val))
            elif kind == "fig":
                png, caption, name = val
                rep.blocks.append(("fig", (png, caption, f"run{i:02d}-{name}")))
            elif kind == "figrow":
                items, caption = val
                rep.blocks.append(("figrow", ([(p, l, f"run{i:02d}-{n}") for p, l, n in items], caption)))
            else:
                rep.blocks.append((kind, val))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(exist_ok=True)
    from ..storage import atomic_write_json

    atomic_write_json(out / "combined.json", {"runs": [str(p.resolve()) for p in paths], "labels": labels})
    return rep.write(out, run_record=False)


def rebuild_report(run: str | Path) -> Path:
    """Re-render ``run``'s report from its report.blocks.json (e.g. after an upgrade); returns the HTML path."""
    return load_report(run).write(run)
