"""The report of an attribution store (:func:`write_report`): integrated influence per component × feature
type with intervals over items, a bar plot in the style of the paper's Othello figure, cumulative
influence over training, the paper's Othello sign pattern and the replay checks.  The store and its
statistics are :mod:`.store`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..storage import atomic_write_json
from .store import (
    COMPONENT_ORDER,
    POOLING_UNIT,
    SIGN_CONVENTION,
    Summary,
    group_by,
    integrate,
    load_observables,
    mismatch_factor_text,
    read_segment_infos,
    sign_pattern,
    store_dir,
    summarize,
    summary_records,
)

TYPE_LABELS = {None: "all rows", 0: "empty (type 0)", 1: "NTP-useless (type 1)", 2: "NTP-useful (type 2)"}
COMPONENT_LABELS = {"direct": "direct", "precached": "pre-cached", "shared": "shared", "full": "combined"}


def _per_step_means(table: pa.Table) -> dict[tuple[Any, str], tuple[np.ndarray, np.ndarray]]:
    """(type, component) → (steps, mean over items of the influence at each step)."""
    g = group_by(table, ["type", "component", "step"], [("influence", "mean")])
    ty, comp = g.column("type").to_pylist(), g.column("component").to_pylist()
    step = np.asarray(g.column("step").to_pylist())
    val = np.asarray([np.nan if v is None else v for v in g.column("influence_mean").to_pylist()], dtype=float)
    out = {}
    for key in sorted(set(zip(ty, comp)), key=lambda k: (-1 if k[0] is None else k[0], k[1])):
        m = np.array([(a, b) == key for a, b in zip(ty, comp)])
        o = np.argsort(step[m])
        out[key] = (step[m][o], val[m][o])
    return out


MIN_ITEMS = 3  # fewer items than this: no interval is shown


def _interval_text(s: Summary) -> str:
    if s.n_items < MIN_ITEMS or not (math.isfinite(s.lo) and math.isfinite(s.hi)):
        return f"— (n = {s.n_items} < {MIN_ITEMS})" if s.n_items < MIN_ITEMS else "— (undefined)"
    return f"[{s.lo:.4g}, {s.hi:.4g}]"


def write_report(path: str | Path, *, ci: str = "t", level: float = 0.95) -> Path:
    """Build ``report.html`` (+ ``report.md``, ``figures/``, ``summary.json``) in the store directory.

    Tables of integrated influence per component × feature type (mean over items with a ``level``
    interval), a bar plot in the style of the paper's Othello figure, cumulative influence over
    training, the paper's Othello sign pattern and the replay checks.  Returns the HTML path.
    """
    from ..report import Report, setup_matplotlib

    d = store_dir(path)
    table = load_observables(d)
    infos = read_segment_infos(d)
    first = infos[0]
    half = bool(first.get("half", True))
    integ = integrate(table)
    summ = summarize(integ, ci=ci, level=level)
    per_layer = summarize(integ, by=("site_layer", "type", "component"), ci=ci, level=level)
    # the paper's sign pattern is a claim about Othello's cell types; other tasks get no such table
    pattern = sign_pattern(summ) if first.get("task") == "othello" else []
    few = [s for s in summ if s.n_items < MIN_ITEMS]
    method = "Student-t interval" if ci == "t" else "percentile bootstrap"
    steps = sorted(set(table.column("step").to_pylist()))
    rep = Report(f"Gradient-pathway attribution — {first.get('task')} / {first.get('regime')}")
    variant = (
        "per-component Adam moments, Σ_c Δ_c = real Adam update" if first.get("optimizer") == "adam" else "Δ_c = lr·G_c"
    )
    rep.text(
        f"Run: {first.get('run')}.  Optimizer variant: {first.get('optimizer')} ({variant}).  "
        f"Updates recorded: {len(steps)} ({steps[0]}..{steps[-1]}) of {first.get('final_step')}; sites "
        f"{first.get('sites')}; {len(first.get('features', []))} features."
    )
    rep.text(
        f"Mismatch: {mismatch_factor_text(half)}.  Sign convention: {SIGN_CONVENTION}.  "
        f"Integrated influence = Σ over recorded updates.  Pooling: {POOLING_UNIT}; "
        f"{int(level * 100)} % {method} over items."
    )
    rep.section("Integrated influence per component and feature type")
    rep.table(
        ["component", "feature type", "mean", f"{int(level * 100)} % CI", "items"],
        [
            [
                COMPONENT_LABELS.get(s.group["component"], s.group["component"]),
                TYPE_LABELS.get(s.group["type"], str(s.group["type"])),
                s.mean,
                _interval_text(s),
                s.n_items,
            ]
            for s in summ
        ],
    )
    if few:
        rep.text(
            f"Warning: {len(few)} of {len(summ)} rows rest on fewer than {MIN_ITEMS} items; their intervals are "
            f"not shown (an interval over 1–2 correlated items says nothing). Attribute more sites or "
            f"features for intervals."
        )
    plt = setup_matplotlib()
    shown: list[int | None] = [t for t in (2, 1) if any(s.group["type"] == t for s in summ)] or [None]
    comps = [c for c in COMPONENT_ORDER if any(s.group["component"] == c for s in summ)]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.8 / len(shown)
    by = {(s.group["component"], s.group["type"]): s for s in summ}
    xs: list[float]
    ys: list[float]
    err: list[list[float]]
    for j, ty in enumerate(shown):
        xs, ys, err = [], [], [[], []]
        for c_idx, c in enumerate(comps):
            s = by.get((c, ty))
            if s is None:
                continue
            xs.append(c_idx + (j - (len(shown) - 1) / 2) * width)
            ys.append(s.mean)
            err[0].append(s.mean - s.lo if math.isfinite(s.lo) else 0.0)
            err[1].append(s.hi - s.mean if math.isfinite(s.hi) else 0.0)
        ax.bar(xs, ys, width=width, yerr=err, capsize=3, label=TYPE_LABELS.get(ty, str(ty)))
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(comps)), [COMPONENT_LABELS[c] for c in comps])
    ax.set_ylabel("integrated influence")
    ax.legend()
    rep.figure(
        fig,
        f"Integrated influence per pathway component (bars: mean over items; error bars: "
        f"{int(level * 100)} % {method}); positive = toward the final feature value; "
        f"{'factor ½' if half else 'no ½ factor'}.",
        name="influence-bars.png",
    )
    if pattern:
        rep.section(
            "Sign pattern of arXiv 2603.14087 (Othello: direct > 0 only for useful, pre-cached > 0 "
            "for useless, shared > 0 for both)"
        )
        rep.table(
            ["component", "feature type", "expected", "mean", "CI", "holds", "CI excludes 0"],
            [
                [
                    COMPONENT_LABELS[p["component"]],
                    TYPE_LABELS[p["type"]],
                    p["expected"],
                    p["mean"],
                    _interval_text(by[(p["component"], p["type"])]),
                    "yes" if p["holds"] else "no",
                    "yes" if p["significant"] else "no",
                ]
                for p in pattern
            ],
        )
    rep.section("Cumulative influence over training")
    series = _per_step_means(table)
    types_present = sorted({k[0] for k in series}, key=lambda t: -1 if t is None else t)
    panels = [t for t in types_present if t in (1, 2)] or types_present[:1]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels), 3.0), squeeze=False)
    for ax, ty in zip(axes[0], panels):
        for c in comps:
            if (ty, c) in series:
                st, v = series[(ty, c)]
                ax.plot(st, np.nancumsum(v), label=COMPONENT_LABELS[c])
        ax.set_title(TYPE_LABELS.get(ty, str(ty)))
        ax.set_xlabel("update")
        ax.axhline(0, color="black", linewidth=0.6)
    axes[0][0].set_ylabel("cumulative mean influence")
    axes[0][0].legend()
    rep.figure(
        fig,
        "Cumulative influence (mean over items at each update, summed over updates) per component.",
        name="influence-cumulative.png",
    )
    rep.section("Per layer")
    rep.table(
        ["layer k", "feature type", "component", "mean", "CI", "items"],
        [
            [
                s.group["site_layer"],
                TYPE_LABELS.get(s.group["type"], str(s.group["type"])),
                COMPONENT_LABELS.get(s.group["component"], s.group["component"]),
                s.mean,
                _interval_text(s),
                s.n_items,
            ]
            for s in per_layer
        ],
    )
    rep.section("Replay checks and cost")
    rep.table(
        [
            "segment",
            "replayed from",
            "losses equal to the log",
            "checkpoints bit-identical",
            "‖∇L eager − ∇L train‖ / ‖∇L‖",
            "max rel. err Σ_c Δ_c",
            "s / attributed update",
        ],
        [
            [
                f"{i['start']}:{i['end']}",
                i.get("replay_from_checkpoint"),
                i["checks"]["losses_checked"],
                ", ".join(str(c) for c in i["checks"]["checkpoints_verified"]) or "none",
                i["checks"]["max_grad_rel_diff"],
                i["checks"]["adam_sum_max_rel_err"],
                i.get("seconds_per_attributed_step"),
            ]
            for i in infos
        ],
    )
    atomic_write_json(
        d / "summary.json",
        {
            "sign": SIGN_CONVENTION,
            "mismatch": mismatch_factor_text(half),
            "pooling_unit": POOLING_UNIT,
            "ci": method,
            "level": level,
            "summaries": summary_records(summ),
            "sign_pattern": pattern,
            "per_layer": summary_records(per_layer),
        },
    )
    return rep.write(d)
