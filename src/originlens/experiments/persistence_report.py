"""The text of the persistence experiment (:mod:`.persistence`): its HTML/Markdown report
(:func:`write_report`) with the cosine figure (:func:`figure`), its section of ``docs/results.md``
(:func:`render_section`) and the verdict (:func:`judge`) against the paper's numbers (:data:`PAPER`), all
read from the experiment's summary or results file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .formatting import ci as fmt_ci
from .formatting import sig as _f
from .persistence_analysis import ALPHA
from .persistence_cosines import KINDS, THRESHOLDS

PAPER: dict[str, Any] = {
    "min_cos_small_lr": {"W": 0.999496, "V": 0.999169, "W_O": 0.998486},
    "epoch30_min": 0.9,
    "epoch100_min": 0.7,
    "t_small_lr": 16.0,
    "bpe": {"min_cos": {"W": 0.999914, "V": 0.998800, "W_O": 0.997891}, "t": 2.5},
}


def _ci(c: dict[str, Any] | None, d: int = 4) -> str:
    return fmt_ci(c, d=d)


def _rows(by_lr: dict[str, Any]) -> list[list[str]]:
    rows = []
    for lr, v in by_lr.items():
        for k in KINDS:
            kr = v[k]
            hz = ", ".join(f"{th}: {_horizon_text(kr, th, float(lr))}" for th in (f"{x:g}" for x in THRESHOLDS))
            nulls = "; ".join(
                f"{n} {_ci(x['final'])} (p {_f(x['test_final']['p_t'], 2)})" for n, x in kr["nulls"].items()
            )
            rows.append(
                [
                    lr,
                    f"{v['steps']} (t = {v['t']:g}, {_f(v['windows_covered'])} windows)",
                    k,
                    _ci(kr["min_logged"]),
                    _ci(kr["min_all"]),
                    _ci(kr["epoch30"]),
                    _ci(kr["final"]),
                    hz,
                    nulls or "—",
                ]
            )
    return rows


def _horizon_text(kr: dict[str, Any], th: str, lr: float) -> str:
    h = kr["horizon"][th]
    never = kr["horizon_never"][th]
    if h["n"] == 0:
        return "never"
    txt = f"step {_f(h['mean'])} (t = {_f(h['mean'] * lr)})"
    return txt + (f", never in {never} seed(s)" if never else "")


HEADER = [
    "η",
    "steps",
    "weight",
    "min cos, logging points",
    "min cos, all steps",
    "cos at paper epoch 30 (step ≤ 960)",
    "cos at the end",
    "horizon (first step below)",
    "nulls at the end (p: leading term > null)",
]


def figure(rec: dict[str, Any], plt: Any) -> Any:
    """Cosine with the leading term vs t = sη at the logging points, one panel per η, one line per weight
    type (mean over seeds, band: min–max over seeds) — the analogue of the paper's Fig. 4.  ``rec``: a
    results record or the experiment summary (both carry ``runs`` with their ``curve``)."""
    runs = (
        rec["runs"]
        if isinstance(rec["runs"], list)
        else [{"lr": float(lr), **r} for lr, by in rec["runs"].items() for r in by.values()]
    )
    lrs = sorted({float(r["lr"]) for r in runs})
    fig, axes = plt.subplots(1, len(lrs), figsize=(4.2 * len(lrs), 3.2), squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        rs = [r for r in runs if float(r["lr"]) == lr and r.get("curve")]
        if not rs:
            continue
        t = np.asarray(rs[0]["curve"]["steps"], dtype=float) * lr
        for k, colour in zip(KINDS, ("tab:red", "tab:blue", "tab:green")):
            ys = np.array([[np.nan if v is None else v for v in r["curve"][k]] for r in rs], dtype=float)
            ax.plot(t, np.nanmean(ys, axis=0), color=colour, label=k)
            ax.fill_between(t, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), color=colour, alpha=0.2)
        ax.set_xlabel("t = sη")
        ax.set_ylabel("cosine with the leading term")
        ax.set_title(f"η = {lr:g}")
        lo = float(np.nanmin([v for r in rs for k in KINDS for v in r["curve"][k] if v is not None] or [0.0]))
        if lo > 0.9:  # all close to 1: zoom in, the detail is the story
            ax.set_ylim(lo - 0.5 * (1 - lo), 1 + 0.1 * (1 - lo))
        else:
            ax.set_ylim(min(0.0, lo), 1.01)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``)."""
    from ..report import Report

    sc = summary["scale"]
    rep = Report(f"Leading terms beyond the theorem's window ({sc['name']} scale)")
    rep.text(
        f"{sc['summary']}: {sc['model']}; {sc['training']}; corpus {sc['corpus']}; {sc['logging']}. "
        f"Deviations: {', '.join(sc['deviations']) or 'none'}."
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(summary, plt)
    rep.figure(
        fig, "cosine with the leading term at the logging points (mean over seeds; band: min–max)", name="cosines.png"
    )
    plt.close(fig)
    rep.table(HEADER, _rows(summary["by_lr"]), caption="Fisher-z intervals over seeds; min over layers per type")
    rep.table(
        ["η", "loss at step 1", "loss at the end", "relative drop over the last 10 %", "seconds per run"],
        [
            [
                lr,
                _ci(v["loss"]["first"]),
                _ci(v["loss"]["final"]),
                _ci(v["loss"]["tail_rel_slope"]),
                _ci(v["seconds"], 0),
            ]
            for lr, v in summary["by_lr"].items()
        ],
        caption="Student-t over seeds",
    )
    return rep.write(out)


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown of one persistence results file for ``docs/results.md``."""
    from .formatting import header

    by = rec["numbers"]["by_lr"]
    out = [
        f"### {rec['name']} (`results/{key}.json`)",
        "",
        *header(rec),
        f"- corpus: {rec['scale']['corpus']}",
        f"- logging: {rec['scale']['logging']}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    out += ["| " + " | ".join(r) + " |" for r in _rows(by)]
    out += [
        "",
        "| η | loss at step 1 | loss at the end | relative drop over the last 10 % | seconds per run |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {lr} | {_ci(v['loss']['first'])} | {_ci(v['loss']['final'])} | {_ci(v['loss']['tail_rel_slope'])} | "
        f"{_ci(v['seconds'], 0)} |"
        for lr, v in by.items()
    ]
    if rec.get("protocol") == "paper-bpe":
        b = PAPER["bpe"]["min_cos"]
        out += [
            "",
            f"Paper, Table 2 (BPE, |V| = 10,000, T = 200, η = 0.005, 500 steps, t = 2.5): min cosine W {b['W']}, "
            f"V {b['V']}, W_O {b['W_O']}.",
            "",
        ]
    else:
        out += [
            "",
            f"Paper (|V| = 3,000, T = 200): min cosine over 100 epochs at η = 0.005: W "
            f"{PAPER['min_cos_small_lr']['W']}, V {PAPER['min_cos_small_lr']['V']}, W_O "
            f"{PAPER['min_cos_small_lr']['W_O']}; at η = 0.05 every cosine ≥ 0.9 at epoch 30 and > 0.7 at epoch 100.",
            "",
        ]
    return out


def judge(rec: dict[str, Any]) -> Any:
    """Reproduced: at the small η every type's minimum over the logging points has its lower bound ≥ 0.99
    and the run covers the paper's t (16 for Table 1, 2.5 for Table 2's BPE); at the large η every type is ≥ 0.9 at epoch 30 and > 0.7 at the end (lower
    bounds); and the leading term beats the permuted-token null for every type (p < 0.05).  Partial: some
    of these hold.  Not reproduced: none."""
    from .verdicts import Verdict

    by = rec["numbers"]["by_lr"]
    lrs = sorted(by, key=float)
    small, large = by[lrs[0]], by[lrs[-1]]
    checks = {}
    paper_t = float(rec.get("paper_t", PAPER["t_small_lr"]))
    checks[f"small η: min cos ≥ 0.99, t ≥ {paper_t:g}"] = small["t"] >= paper_t and all(
        (small[k]["min_logged"].get("low") or -1) >= 0.99 for k in KINDS
    )
    if len(lrs) > 1:
        checks["large η: ≥ 0.9 at epoch 30"] = all((large[k]["epoch30"].get("low") or -1) >= 0.9 for k in KINDS)
        checks["large η: > 0.7 at the end"] = all((large[k]["final"].get("low") or -1) > 0.7 for k in KINDS)
    checks["beats the permuted-token null"] = all(
        (v[k]["nulls"].get("permuted", {}).get("test_final", {}).get("p_t") or 1) < ALPHA
        for v in by.values()
        for k in KINDS
    )
    held = [c for c, ok in checks.items() if ok]
    ours = (
        f"η = {lrs[0]} (t = {small['t']:g}): min cos over logging points W {_ci(small['W']['min_logged'])}, "
        f"V {_ci(small['V']['min_logged'])}, W_O {_ci(small['W_O']['min_logged'])}"
    )
    if len(lrs) > 1:
        ours += (
            f"; η = {lrs[-1]} (t = {large['t']:g}): epoch 30 min over types "
            f"{_f(min(large[k]['epoch30']['mean'] for k in KINDS))}, end "
            f"{_f(min(large[k]['final']['mean'] for k in KINDS))}"
        )
    ours += f"; {len(held)}/{len(checks)} checks hold"
    scale = f"{rec['scale']['model']}; {rec['scale']['training']}; {len(rec['seeds'])} seeds; deviations: " + (
        ", ".join(rec["scale"]["deviations"]) or "none"
    )
    verdict = "reproduced" if len(held) == len(checks) else "partial" if held else "not reproduced"
    return Verdict(verdict, ours, scale)
