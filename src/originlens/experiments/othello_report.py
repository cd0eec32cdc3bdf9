"""The text of the Othello experiment (:mod:`.othello`): its HTML/Markdown report (:func:`write_report`),
its section of ``docs/results.md`` (:func:`render_section`) and the verdict on the paper's pattern
(:func:`judge`), all read from the experiment's summary or results file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .formatting import ci as fmt_ci
from .formatting import sig as _f
from .othello_analysis import ALPHA, COMPONENTS


def _snapshot_rows(snapshots: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c, v in snapshots.items():
        real = v["influence"].get("main", {}).get("real", {})
        cells = [
            _ci(real.get(comp, {}).get(t)) for comp in ("direct", "precached", "shared") for t in ("useful", "useless")
        ]
        held = [k for k, t in v["tests"].items() if t.get("holds")]
        rows.append(
            [c, _ci(v["eval"]["legal_acc"]), *cells, f"{len(held)}/{len(v['tests'])}: " + ("; ".join(held) or "none")]
        )
    return rows


SNAPSHOT_HEADER = [
    "checkpoint c",
    "legal-move acc. at c",
    "direct useful",
    "direct useless",
    "pre-cached useful",
    "pre-cached useless",
    "shared useful",
    "shared useless",
    "paper's pattern (tests that hold)",
]


def _ci(c: dict[str, Any] | None) -> str:
    return fmt_ci(c, fmt=_f)


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``)."""
    from ..report import Report

    rep = Report(f"OthelloGPT gradient pathways over seeds ({summary['scale']['name']} scale)")
    sc = summary["scale"]
    rep.text(
        f"{sc['summary']}: {sc['model']}; {sc['training']}; eval {sc['eval']}; attribution: "
        f"{sc['attribution']}. Deviations: {', '.join(sc['deviations']) or 'none'}."
    )
    q = summary["quality"]
    rep.section("Model quality")
    rep.text(
        f"legal-move top-1 accuracy {_ci(q['legal_acc'])} (untrained {_ci(q['initial_legal_acc'])}); "
        f"eval loss {_ci(q['eval_loss'])}; training seconds per seed {_ci(q['train_seconds'])}."
    )
    rep.table(
        ["layer", "probe r (trained)", "untrained null", "useless cells", "useful cells"],
        [
            [
                k,
                _ci(v["pearson"]["trained"]),
                _ci(v["pearson"]["initial"]),
                _ci(v["pearson_type1"]["trained"]),
                _ci(v["pearson_type2"]["trained"]),
            ]
            for k, v in q["probes"].items()
        ],
        caption="16 central cells at the attributed positions; Fisher-z intervals over seeds",
    )
    for frac, v in summary["by_fraction"].items():
        rep.section(f"Integrated influence, first {float(frac):.0%} of the attributed updates")
        infl = v["influence"]
        rows = []
        for part in ("main", "last_layer"):
            for c in COMPONENTS:
                real = infl.get(part, {}).get("real", {}).get(c, {})
                rnd = infl.get(part, {}).get("random", {}).get(c, {})
                rows.append(
                    [
                        part,
                        c,
                        _ci(real.get("useful")),
                        _ci(real.get("useless")),
                        _ci(rnd.get("useful")),
                        _ci(rnd.get("useless")),
                    ]
                )
        rep.table(
            ["sites", "component", "useful", "useless", "random dir., useful", "random dir., useless"],
            rows,
            caption="mean over items per seed, then Student-t over seeds; main: layers k < L; "
            "last_layer: k = L (pre-cached ≡ 0)",
        )
        rep.table(
            ["hypothesis", "mean diff", "p (t)", "p (Holm)", "p (Wilcoxon)", "power", "holds"],
            [
                [
                    k,
                    _f(t["mean_diff"]),
                    _f(t["p_t"], 2),
                    _f(t.get("p_holm"), 2),
                    _f(t["p_wilcoxon"], 2),
                    _f(t["power"], 2),
                    t.get("holds", (t["p_t"] or 1) < ALPHA),
                ]
                for k, t in {**v["tests"], **v["null_tests"]}.items()
            ],
            caption="one-sided tests over seeds (the paper's pattern, Holm over its family; then the nulls)",
        )
    if summary.get("snapshots"):
        rep.section("How the pathways feed the features as the model learns (snapshots)")
        rep.text(sc.get("snapshots", ""))
        rep.table(
            SNAPSHOT_HEADER,
            _snapshot_rows(summary["snapshots"]),
            caption="influence per update (SGD variant), mean over items (layers k < L) per seed, Student-t "
            "over seeds; tests as above, Holm within each snapshot",
        )
    return rep.write(out)


# ----------------------------------------------------------------------------------------------------
# docs: the results-page section and the verdict

PAPER_MIDPOINTS = {
    ("direct", "useful"): 7.61,
    ("direct", "useless"): -0.97,
    ("precached", "useful"): -0.66,
    ("precached", "useless"): 1.80,
    ("shared", "useful"): 8.64,
    ("shared", "useless"): 6.42,
}
PLAYS = 0.95  # legal-move accuracy below which the model has not learned the game


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown of one Othello results file for ``docs/results.md``."""
    from .render import _header

    q = rec["quality"]
    out = [
        f"### {rec['name']} (`results/{key}.json`)",
        "",
        *_header(rec),
        f"- attribution: {rec['scale']['attribution']}",
        f"- sign: {rec.get('sign', '')}",
        f"- pooling: {rec.get('pooling', '')}",
        "",
        f"Model quality: legal-move top-1 accuracy {_ci(q['legal_acc'])} (untrained {_ci(q['initial_legal_acc'])}; "
        f"the analysis needs ≥ {PLAYS}), eval loss {_ci(q['eval_loss'])}, training {_ci(q['train_seconds'])} s "
        "per seed.",
        "",
        "| layer | probe r, trained | untrained-model null | useless cells | useful cells |",
        "|---|---|---|---|---|",
    ]
    for k, v in q["probes"].items():
        out.append(
            f"| {k} | {_ci(v['pearson']['trained'])} | {_ci(v['pearson']['initial'])} | "
            f"{_ci(v['pearson_type1']['trained'])} | {_ci(v['pearson_type2']['trained'])} |"
        )
    infl = rec["numbers"]["influence"]
    out += [
        "",
        "Integrated influence (mean over items per seed, Student-t over seeds; layers k < L; k = L apart):",
        "",
        "| component | useful (ours) | useless (ours) | random dir., useful | random dir., useless | "
        "k = L useful | k = L useless | paper useful / useless |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in COMPONENTS:
        real = infl.get("main", {}).get("real", {}).get(c, {})
        rnd = infl.get("main", {}).get("random", {}).get(c, {})
        last = infl.get("last_layer", {}).get("real", {}).get(c, {})
        paper = (
            f"{PAPER_MIDPOINTS[(c, 'useful')]} / {PAPER_MIDPOINTS[(c, 'useless')]}"
            if (c, "useful") in PAPER_MIDPOINTS
            else "—"
        )
        out.append(
            f"| {c} | {_ci(real.get('useful'))} | {_ci(real.get('useless'))} | {_ci(rnd.get('useful'))} | "
            f"{_ci(rnd.get('useless'))} | {_ci(last.get('useful'))} | {_ci(last.get('useless'))} | {paper} |"
        )
    out += [
        "",
        "The paper's pattern as one-sided tests over seeds (Holm over the family), and the random-direction null:",
        "",
        "| hypothesis | mean | p (t) | p (Holm) | p (Wilcoxon) | power | detectable d_z | holds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, t in {**rec["tests"]["hypotheses"], **rec["tests"]["null"]}.items():
        out.append(
            f"| {k} | {_f(t['mean_diff'])} | {_f(t['p_t'], 2)} | {_f(t.get('p_holm'), 2)} | "
            f"{_f(t['p_wilcoxon'], 2)} | {_f(t['power'], 2)} | {_f(t['detectable_dz'], 2)} | "
            f"{'yes' if t.get('holds') else 'no'} |"
        )
    out += [
        "",
        "How the pattern builds up (hypotheses that hold, by fraction of the attributed updates): "
        + "; ".join(
            f"{float(f):.0%}: {sum(1 for t in ts.values() if t['holds'])}/{len(ts)}"
            for f, ts in rec["tests"]["by_fraction"].items()
        ),
        "",
    ]
    snaps = rec["numbers"].get("snapshots")
    if snaps:
        merged = {c: {**v, "tests": rec["tests"]["snapshots"][c]} for c, v in snaps.items()}
        out += [
            f"Snapshots across training — {rec['scale'].get('snapshots', '')}; influence per update, mean over "
            "items (k < L) per seed, Student-t over seeds; tests Holm within each snapshot:",
            "",
            "| " + " | ".join(SNAPSHOT_HEADER) + " |",
            "|" + "---|" * len(SNAPSHOT_HEADER),
        ]
        out += ["| " + " | ".join(r) + " |" for r in _snapshot_rows(merged)]
        out.append("")
    return out


def judge(rec: dict[str, Any]) -> Any:
    """Reproduced: every hypothesis holds and the models play (legal-move accuracy ≥ 0.95); partial: some
    hold, or all hold on models that do not play; not reproduced: none."""
    from .claims import Verdict

    tests = rec["tests"]["hypotheses"]
    held = [k for k, t in tests.items() if t["holds"]]
    acc = rec["quality"]["legal_acc"]["mean"]
    infl = rec["numbers"]["influence"].get("main", {}).get("real", {})
    ours = (
        f"direct {_ci(infl.get('direct', {}).get('useful'))} / {_ci(infl.get('direct', {}).get('useless'))}, "
        f"pre-cached {_ci(infl.get('precached', {}).get('useful'))} / "
        f"{_ci(infl.get('precached', {}).get('useless'))}, shared {_ci(infl.get('shared', {}).get('useful'))} / "
        f"{_ci(infl.get('shared', {}).get('useless'))} (useful / useless); {len(held)}/{len(tests)} tests hold; "
        f"legal-move accuracy {_f(acc)}"
    )
    scale = f"{rec['scale']['model']}; {rec['scale']['attribution']}; {len(rec['seeds'])} seeds; deviations: " + (
        ", ".join(rec["scale"]["deviations"]) or "none"
    )
    if not held:
        return Verdict("not reproduced", ours, scale)
    if len(held) < len(tests) or acc is None or acc < PLAYS:
        return Verdict(
            "partial",
            ours + ("" if acc is not None and acc >= PLAYS else f"; the models do not play (accuracy < {PLAYS})"),
            scale,
        )
    return Verdict("reproduced", ours, scale)
