"""The toy regime grid's report (:mod:`.toy_grid`): ``OUT/report.html`` (+ ``report.md``) with the
per-regime table (r, the initial-model null, the gain), the orderings, the two readings, a bar plot of
trained vs initial probe quality and the runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .formatting import num as _f
from .formatting import pval as _p


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``): per-regime table, orderings, bar plot trained vs initial."""
    from ..report import Report, setup_matplotlib

    plt = setup_matplotlib()
    import numpy as np

    rep = Report(f"Toy regime grid: {summary['task']} ({summary['scale']['name']} scale)")
    sc = summary["scale"]
    rep.text(
        f"Scale: {sc['summary']}; {sc['model']}; {sc['training']}; {sc['untied']}. Deviations from the "
        f"paper: {', '.join(sc['deviations']) or 'none'}."
    )
    rep.text(f"Expected (arXiv 2603.14087): {summary['expected']}.")
    rows = []
    for regime, s in summary["per_regime"].items():
        u, i = s["useless_r"], s["initial_useless_r"]
        rows.append(
            [
                regime,
                u["n"],
                f"{_f(u['mean'])} [{_f(u['low'])}, {_f(u['high'])}]",
                f"{_f(i['mean'])} [{_f(i['low'])}, {_f(i['high'])}]",
                f"{_f(s['gain']['mean'])} [{_f(s['gain']['low'])}, {_f(s['gain']['high'])}]",
                _p(s["gain_over_initial"]["p_t"]),
                _f(s["useful_r"]["mean"]),
                _f(s["eval_loss"]["mean"], 4),
                _f(s["legal_output_acc"]["mean"]),
                _f(s["first_output_token_acc"]["mean"]),
            ]
        )
    rep.section("Probe quality of the NTP-useless feature")
    rep.table(
        [
            "regime",
            "seeds",
            "trained r [95% CI]",
            "initial-model r (null)",
            "gain (r − r₀)/(1 − r₀)",
            "p(trained > initial)",
            "useful r",
            "eval loss",
            "output legal acc",
            "first output acc",
        ],
        rows,
        caption="Fisher-z intervals of r over seeds, Student t of the gain; p: one-sided paired t on Fisher z",
    )
    rep.section("The paper's orderings as hypotheses")
    rep.table(
        ["hypothesis", "Δ gain [95% CI]", "p (t)", "p (Holm)", "p (Wilcoxon)", "d_z", "power", "holds"],
        [
            [
                k,
                f"{_f(v['diff'])} [{_f(v['diff_low'])}, {_f(v['diff_high'])}]",
                _p(v["p_t"]),
                _p(v["p_holm"]),
                _p(v["p_wilcoxon"]),
                _f(v["dz"], 2),
                _f(v["power"], 2),
                v["holds"],
            ]
            for k, v in summary["orderings"].items()
        ],
        caption="one-sided paired tests over seeds on the null-normalised gains; Holm over the family of orderings",
    )
    rd = summary.get("readings")
    if rd:
        rep.section("The claim read two ways")
        rep.table(
            ["reading", "regime", "estimate [CI]", "p", "holds"],
            [
                [
                    f"A: {rd['statements']['A']}",
                    r,
                    f"{_f(v['mean'])} [{_f(v['low'])}, {_f(v['high'])}] (90 %)",
                    _p(v["p"]),
                    v["equivalent"],
                ]
                for r, v in rd["A"].items()
            ]
            + [
                [
                    f"B: {rd['statements']['B']}",
                    r,
                    f"{_f(v['diff'])} [{_f(v['diff_low'])}, {_f(v['diff_high'])}] (95 %)",
                    _p(v["p_holm"]),
                    v["holds"],
                ]
                for r, v in rd["B"].items()
            ],
            caption=f"A: TOST of the regime's gain against ± {rd['margin']:g}; B: ½·gain(standard) − gain(regime) > 0",
        )
    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = list(summary["per_regime"])
    xs = np.arange(len(names))
    for off, key, color, label in (
        (-0.18, "useless_r", "#0072B2", "trained"),
        (0.18, "initial_useless_r", "#999999", "initial (null)"),
    ):
        st = [summary["per_regime"][r][key] for r in names]
        m = np.array([s["mean"] for s in st], dtype=float)
        lo = np.array([s["mean"] - s["low"] if s["low"] is not None else 0 for s in st], dtype=float)
        hi = np.array([s["high"] - s["mean"] if s["high"] is not None else 0 for s in st], dtype=float)
        ax.bar(xs + off, m, width=0.34, yerr=[lo, hi], capsize=3, color=color, label=label)
        for j, s in enumerate(st):
            ax.plot([xs[j] + off] * len(s["values"]), s["values"], "o", color="#D55E00", ms=2.5)
    ax.set_xticks(xs, names)
    ax.set_ylabel("probe Pearson r (NTP-useless)")
    ax.legend(fontsize=7)
    rep.figure(
        fig,
        "Probe quality per regime, trained vs initial model; bars: Fisher-z 95 % CIs over seeds; dots: seeds.",
        name="toy-grid.png",
    )
    rep.section("Runs")
    rep.table(
        ["regime", "seed", "useless r", "initial r", "useful r", "eval loss", "seconds"],
        [
            [
                r["regime"],
                r["seed"],
                _f(r["useless_r"]),
                _f(r["initial_useless_r"]),
                _f(r["useful_r"]),
                _f(r["eval_loss"], 4),
                _f(r["seconds"], 0),
            ]
            for r in summary["runs"]
        ],
    )
    return rep.write(out)
