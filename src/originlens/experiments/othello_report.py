"""The text of the Othello experiment (:mod:`.othello`): its HTML/Markdown report (:func:`write_report`:
the learning curve with the attributed strata marked, the influence per stratum, the paper's table side by
side, the tests and the gates), its section of ``docs/results.md`` (:func:`render_section`) and the verdict
(:func:`judge`), all read from the experiment's summary or results file.

A results file of the earlier design (the influence integrated over a prefix of training, updates
1..200) is still read: it is judged **not tested**, with the reason, and rendered as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .formatting import ci as fmt_ci
from .formatting import sig as _f
from .othello_analysis import HYPOTHESES, PAPER, PAPER_COMPONENTS

PLAYS = 0.95  # legal-move accuracy below which the model has not learned the game
COMPONENT_NAMES = {
    "direct": "direct",
    "precached": "pre-cached",
    "shared": "shared",
    "carried": "carried",
    "full": "combined",
}


def _ci(c: dict[str, Any] | None) -> str:
    return fmt_ci(c, fmt=_f)


def _legacy(rec: dict[str, Any]) -> bool:
    """A results file of the prefix design (before the strata)."""
    return "strata" not in rec.get("numbers", {})


# ----------------------------------------------------------------------------------------------------
# figures


def curve_figure(curve: dict[str, Any], attributed: list[list[int]], n_layer: int, plt: Any) -> Any:
    """Legal-move accuracy and probe r per layer over training (mean over seeds, band: the interval), the
    untrained-model nulls dashed, the attributed windows shaded."""
    import numpy as np

    pts = curve["points"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    steps = [p["step"] for p in pts]
    acc = [p["legal_acc"]["mean"] for p in pts]
    axes[0].plot(steps, [np.nan if a is None else a for a in acc], "o-", color="black", label="trained")
    null = curve["null"]["legal_acc"]["mean"]
    if null is not None:
        axes[0].axhline(null, ls="--", color="grey", label="untrained")
    axes[0].set_ylabel("legal-move top-1 accuracy")
    for k in range(1, n_layer + 1):
        xs, ys = [], []
        for p in pts:
            v = p.get("probes", {}).get(str(k))
            if v and v["pearson"]["mean"] is not None:
                xs.append(p["step"])
                ys.append(v["pearson"]["mean"])
        if xs:
            (line,) = axes[1].plot(xs, ys, "o-", label=f"layer {k}")
            nv = curve["null"]["probes"].get(str(k), {}).get("pearson", {}).get("mean")
            if nv is not None:
                axes[1].axhline(nv, ls="--", color=line.get_color(), alpha=0.6)
    axes[1].set_ylabel("board probe r (16 central cells)")
    for ax in axes:
        for a, b in attributed:
            ax.axvspan(a, b, color="tab:orange", alpha=0.15, lw=0)
        ax.set_xlabel("update")
        ax.legend(fontsize=7)
    fig.suptitle(
        "learning curve; shaded: the recorded windows of the strata (all seeds); dashed: untrained", fontsize=9
    )
    fig.tight_layout()
    return fig


def strata_figure(strata: dict[str, Any], plt: Any) -> Any:
    """Influence per recorded update in each stratum, per component, useful and useless cells (mean over
    seeds and items k < L; bars: the interval over seeds)."""
    import numpy as np

    hs = sorted(strata, key=int)
    mids = [0.5 * (strata[h]["bounds"][0] + strata[h]["bounds"][1]) for h in hs]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.3), sharey=False)
    for ax, c in zip(axes, ("direct", "precached", "shared")):
        for t, colour in (("useful", "tab:blue"), ("useless", "tab:red")):
            m = [strata[h]["rate"][c][t]["mean"] for h in hs]
            lo = [strata[h]["rate"][c][t].get("low") for h in hs]
            hi = [strata[h]["rate"][c][t].get("high") for h in hs]
            mm = np.array([np.nan if v is None else v for v in m], dtype=float)
            err = np.array(
                [
                    [0 if a is None or v is None else v - a for v, a in zip(m, lo)],
                    [0 if b is None or v is None else b - v for v, b in zip(m, hi)],
                ],
                dtype=float,
            )
            ax.errorbar(mids, mm, yerr=err, fmt="o-", color=colour, label=t, capsize=2)
        ax.axhline(0, color="black", lw=0.5)
        ax.set_title(COMPONENT_NAMES[c])
        ax.set_xlabel("update (stratum midpoint)")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("influence per update")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------------------------------
# the report


def _influence_rows(infl: dict[str, Any], normalised: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in ("direct", "precached", "shared", "carried", "full"):
        real = infl.get("main", {}).get("real", {}).get(c, {})
        rnd = infl.get("main", {}).get("random", {}).get(c, {})
        last = infl.get("last_layer", {}).get("real", {}).get(c, {})
        paper = f"{PAPER[c]['useful']} / {PAPER[c]['useless']}" if c in PAPER else "—"
        rows.append(
            [
                COMPONENT_NAMES[c],
                _ci(real.get("useful")),
                _ci(real.get("useless")),
                _ci(normalised.get(c, {}).get("useful")),
                _ci(normalised.get(c, {}).get("useless")),
                _ci(rnd.get("useful")),
                _ci(rnd.get("useless")),
                _ci(last.get("useful")),
                _ci(last.get("useless")),
                paper,
            ]
        )
    return rows


INFLUENCE_HEADER = [
    "component",
    "useful",
    "useless",
    "useful / R(θ₀)",
    "useless / R(θ₀)",
    "random dir., useful",
    "random dir., useless",
    "k = L useful",
    "k = L useless",
    "paper useful / useless",
]


def _test_rows(tests: dict[str, Any]) -> list[list[str]]:
    return [
        [
            k,
            _f(t["mean_diff"]),
            _f(t.get("dz"), 2),
            _f(t["p_t"], 2),
            _f(t.get("p_holm"), 2),
            _f(t["p_wilcoxon"], 2),
            _f(t["detectable_dz"], 2),
            "yes" if t.get("holds") else "no",
        ]
        for k, t in tests.items()
    ]


TEST_HEADER = ["test", "mean diff", "d_z", "p (t)", "p (Holm)", "p (Wilcoxon)", "detectable d_z", "holds"]


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..report import Report

    sc = summary["scale"]
    L = int(sc["model"].split()[0])
    rep = Report(f"OthelloGPT gradient pathways over all of training ({sc['name']} scale)")
    rep.text(
        f"{sc['summary']}: {sc['model']}; {sc['training']}; eval {sc['eval']}; attribution: "
        f"{sc['attribution']}. Deviations: {', '.join(sc['deviations']) or 'none'}."
    )
    rep.section("Gates")
    rep.table(["gate", "passed", "why"], [[g["name"], g["passed"], g["reason"]] for g in summary["gates"]])
    rep.section("Learning curve")
    q = summary["quality"]
    rep.text(
        f"final legal-move top-1 accuracy {_ci(q['legal_acc'])} (untrained {_ci(q['initial_legal_acc'])}); eval "
        f"loss {_ci(q['eval_loss'])}; recorded updates: {summary['sampled_fraction']:.1%} of training, in "
        f"{len(summary['attributed_updates'])} windows; carried share of the update at the first recorded "
        f"update {_ci(summary.get('carried_share_first_recorded'))}."
    )
    rep.figure(
        curve_figure(summary["curve"], summary["attributed_updates"], L, plt), "learning curve", name="curve.png"
    )
    plt.close("all")
    st = summary["stats"]
    rep.section("Influence integrated over training")
    rep.table(
        INFLUENCE_HEADER,
        _influence_rows(st["influence"], st["normalised"]),
        caption="per seed: the stratified integral of each item (layer k < L, position, cell), mean over items; "
        "Student-t over seeds; / R(θ₀): each item's integral divided by its initial mismatch; k = L apart "
        "(pre-cached ≡ 0); carried: the first moment at each segment's checkpoint; the paper's numbers are "
        "sums over its items (signs and orderings compare)",
    )
    rep.table(
        TEST_HEADER,
        _test_rows({**st["tests"], **_controls(st["control"], st.get("control_normalised"))}),
        caption="one-sided tests over seeds (the paper's pattern, Holm over its seven; then the positive control)",
    )
    rep.section("Where over training each pathway builds which features")
    rep.figure(strata_figure(st["strata"], plt), "influence per update in each stratum", name="strata.png")
    plt.close("all")
    chk = summary.get("check")
    if chk:
        rep.section("Estimator check")
        rep.text(_check_text(chk))
    return rep.write(out)


def _check_text(chk: dict[str, Any]) -> str:
    comps = chk["components"]
    parts = [
        f"{COMPONENT_NAMES[c]} {t}: stratified {_f(v['stratified'])} vs exact {_f(v['exact'])} "
        f"(rel. error {_f(v['rel_error'], 2)}, item r {_f(v['item_r'], 2)})"
        for c, ts in comps.items()
        for t, v in ts.items()
    ]
    b = chk["burn_in"]
    return (
        f"seed {chk['seed']}, updates 1..{chk['updates']} ({chk['n_items']} items k < L): "
        + "; ".join(parts)
        + f". Burn-in exactness: combined influence of the carried segments vs the contiguous replay, max "
        f"relative difference {_f(b['full_max_rel_diff'], 2)}; carried share at most {_f(b['carried_max_share'], 2)}."
    )


# ----------------------------------------------------------------------------------------------------
# docs: the results-page section and the verdict


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown of one Othello results file for ``docs/results.md``."""
    from .formatting import header

    out = [f"### {rec['name']} (`results/{key}.json`)", "", *header(rec)]
    if _legacy(rec):
        v = judge(rec)
        return out + ["", f"**Not tested** (earlier design): {v.ours}", ""]
    n = rec["numbers"]
    t = rec["tests"]
    out += [
        f"- attribution: {rec['scale']['attribution']}",
        f"- sign: {rec.get('sign', '')}",
        f"- pooling: {rec.get('pooling', '')}",
        f"- recorded updates: {n['sampled_fraction']:.1%} of training, windows "
        + ", ".join(f"{a}–{b}" for a, b in _distinct(n["attributed_updates"])),
        "",
        "Gates: "
        + "; ".join(f"{g['name']}: {'passed' if g['passed'] else 'failed'} ({g['reason']})" for g in t["gates"]),
        "",
        "Learning curve (mean over seeds; probe r of the main layers k < L, 16 central cells):",
        "",
        "| update | seeds | legal-move acc. | "
        + " | ".join(
            f"probe r layer {k}" for k in sorted({k for p in n["curve"]["points"] for k in p["probes"]}, key=int)
        )
        + " |",
    ]
    layers = sorted({k for p in n["curve"]["points"] for k in p["probes"]}, key=int)
    out.append("|---|---|---|" + "---|" * len(layers))
    for p in n["curve"]["points"]:
        out.append(
            f"| {p['step']} | {p['n_seeds']} | {_ci(p['legal_acc'])} | "
            + " | ".join(_ci(p["probes"].get(k, {}).get("pearson")) for k in layers)
            + " |"
        )
    out.append(
        "| untrained | | "
        + _ci(n["curve"]["null"]["legal_acc"])
        + " | "
        + " | ".join(_ci(n["curve"]["null"]["probes"].get(k, {}).get("pearson")) for k in layers)
        + " |"
    )
    out += [
        "",
        "Integrated influence (" + INFLUENCE_HEADER[0] + " rows; mean over items per seed, Student-t over seeds):",
        "",
        "| " + " | ".join(INFLUENCE_HEADER) + " |",
        "|" + "---|" * len(INFLUENCE_HEADER),
    ]
    out += ["| " + " | ".join(r) + " |" for r in _influence_rows(n["influence"], n["normalised"])]
    out += [
        "",
        "The paper's pattern as one-sided tests over seeds (Holm over the seven), and the positive control:",
        "",
        "| " + " | ".join(TEST_HEADER) + " |",
        "|" + "---|" * len(TEST_HEADER),
    ]
    out += [
        "| " + " | ".join(r) + " |"
        for r in _test_rows({**t["hypotheses"], **_controls(t["control"], t.get("control_normalised"))})
    ]
    if n.get("check"):
        out += ["", "Estimator check: " + _check_text(n["check"])]
    out.append("")
    return out


def _controls(raw: dict[str, Any], normalised: dict[str, Any] | None) -> dict[str, Any]:
    """The positive control's rows: the gate's reading (raw combined influence) and, where the mismatch
    records exist, the same comparison as fractions of each direction's own initial mismatch."""
    rows = {"control: real > random directions (combined; the gate)": raw}
    if normalised:
        rows["control: real > random, / own R(θ₀) (reported)"] = normalised
    return rows


def _distinct(windows: list[list[int]]) -> list[list[int]]:
    seen, out = set(), []
    for w in windows:
        if tuple(w) not in seen:
            seen.add(tuple(w))
            out.append(w)
    return out


def _scale_text(rec: dict[str, Any]) -> str:
    return f"{rec['scale']['model']}; {rec['scale']['attribution']}; {len(rec['seeds'])} seeds; deviations: " + (
        ", ".join(rec["scale"]["deviations"]) or "none"
    )


def judge(rec: dict[str, Any]) -> Any:
    """The gates first (:mod:`.gates`): the board features are learned where the influence is measured,
    the positive control holds, and — for a negative verdict — the seeds can detect the effect; else
    **not tested** with the first failing gate's reason.  Then: reproduced when all seven tests hold (Holm)
    on models that play (legal-move accuracy ≥ 0.95), partial when some hold (or all on models that do
    not play), not reproduced when none."""
    from .verdicts import Verdict

    if _legacy(rec):
        return _judge_legacy(rec)
    tests = rec["tests"]["hypotheses"]
    held = [k for k, t in tests.items() if t["holds"]]
    acc = rec["quality"]["legal_acc"]["mean"]
    infl = rec["numbers"]["influence"].get("main", {}).get("real", {})
    ours = (
        ", ".join(
            f"{COMPONENT_NAMES[c]} {_ci(infl.get(c, {}).get('useful'))} / {_ci(infl.get(c, {}).get('useless'))}"
            for c in PAPER_COMPONENTS[:3]
        )
        + f" (useful / useless, per item); {len(held)}/{len(tests)} tests hold"
        + (f" ({', '.join(held)})" if held else "")
        + f"; legal-move accuracy {_f(acc)}; detectable d_z {_f(rec['tests']['detectable_dz'], 2)}"
    )
    failed = next((g for g in rec["tests"]["gates"] if not g["passed"]), None)
    if failed:
        return Verdict("not tested", ours + f"; {failed['reason']}", _scale_text(rec))
    if not held:
        return Verdict("not reproduced", ours, _scale_text(rec))
    if len(held) < len(tests) or acc is None or acc < PLAYS:
        return Verdict(
            "partial",
            ours + ("" if acc is not None and acc >= PLAYS else f"; the models do not play (accuracy < {PLAYS})"),
            _scale_text(rec),
        )
    return Verdict("reproduced", ours, _scale_text(rec))


def _judge_legacy(rec: dict[str, Any]) -> Any:
    """The prefix design's file: the influence over updates 1..N of training only, before the board is
    learned; judged not tested, with its own numbers as the reason."""
    from .verdicts import Verdict

    q = rec["quality"]
    probes = q.get("probes", {})
    trained = [
        v["pearson"]["trained"]["mean"] for k, v in probes.items() if v["pearson"]["trained"]["mean"] is not None
    ]
    initial = [
        v["pearson"]["initial"]["mean"] for k, v in probes.items() if v["pearson"]["initial"]["mean"] is not None
    ]
    null = rec["tests"].get("null", {})
    ctl = "; ".join(f"{k}: p {_f(v.get('p_t'), 2)}" for k, v in null.items())
    window = next(
        (d for d in rec["scale"].get("deviations", []) if d.startswith("influence integrated over")), "a prefix"
    )
    ours = (
        f"{window}: the window ends before the board features exist (the final probes reach r "
        f"{_f(min(trained), 2)}–{_f(max(trained), 2)} against the untrained {_f(min(initial), 2)}–{_f(max(initial), 2)}, "
        f"but the attributed updates come from the first 2 % of training); positive control: {ctl}; "
        f"{len(rec['seeds'])} seeds (detectable d_z {_f(2.30, 3)}); to be replaced by the influence over all of training"
    )
    return Verdict("not tested", ours, _scale_text(rec))


__all__ = ["HYPOTHESES", "PLAYS", "judge", "render_section", "write_report"]
