"""The text of the TinyStories experiment (:mod:`.language`): its HTML/Markdown report
(:func:`write_report`), the summary lines the command prints (:func:`summary_lines`), its section of
``docs/results.md`` (:func:`render_section`) and the verdict rules of its two claims (:func:`judge_loss`,
:func:`judge_features`), all read from the experiment's summary or results file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .formatting import ci as fmt_ci
from .formatting import num as _f
from .formatting import pval as _p
from .formatting import sig as _g
from .language_analysis import COMPONENTS, LOSS_TEST, PROBE_GROUPS, SHARE_TEST, SYNTAX_TEST
from .language_config import PAPER_LOSS, REGIMES


def _ci(c: dict[str, Any] | None, fmt: Any = _f) -> str:
    return fmt_ci(c, fmt=fmt)


def _cell(s: Any) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _test_rows(tests: dict[str, Any]) -> list[list[str]]:
    rows = []
    for fam in ("loss", "features"):
        for k, v in tests.get(fam, {}).items():
            rows.append(
                [
                    k,
                    fam,
                    f"{_g(v['diff'])} [{_g(v['diff_low'])}, {_g(v['diff_high'])}]",
                    _p(v["p_t"]),
                    _p(v.get("p_holm")),
                    _p(v["p_wilcoxon"]),
                    _f(v["dz"], 2),
                    _f(v["detectable_dz"], 2),
                    "yes" if v.get("holds") else "no",
                ]
            )
    return rows


TEST_HEADER = [
    "test",
    "family",
    "mean difference [95 % CI]",
    "p (t)",
    "p (Holm)",
    "p (Wilcoxon, exact)",
    "d_z",
    "detectable d_z",
    "holds",
]
INFLUENCE_HEADER = [
    "regime",
    "group",
    "direct",
    "pre-cached (k < L)",
    "shared",
    "full",
    "pre-cached share (k < L)",
    "pre-cached at k = L",
    "direct at k = L",
]


def _influence_rows(influence: dict[str, Any]) -> list[list[str]]:
    rows = []
    for regime, inf in influence.items():
        for g in inf.get("influence", {}):
            m, last = inf["influence"][g], inf["last_layer"].get(g, {})
            rows.append(
                [
                    regime,
                    g,
                    _ci(m["direct"], _g),
                    _ci(m["precached"], _g),
                    _ci(m["shared"], _g),
                    _ci(m["full"], _g),
                    _ci(inf["precached_share"].get(g)),
                    _ci(last.get("precached"), _g),
                    _ci(last.get("direct"), _g),
                ]
            )
    return rows


def _probe_rows(per_regime: dict[str, Any]) -> list[list[str]]:
    rows = []
    for regime, s in per_regime.items():
        for g, ci in s["probe"].items():
            rows.append([regime, g, _ci(ci), _ci(s["initial_probe"].get(g)), _p(s["probe_gain"][g]["p_t"])])
    return rows


def _loss_rows(quality: dict[str, Any], runs: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for regime in REGIMES:
        q = quality.get(regime)
        if not q:
            continue
        secs = [r["seconds"] for r in runs if r["regime"] == regime and r.get("seconds") is not None]
        rows.append(
            [
                regime,
                _ci(q["eval_loss"], lambda x: _f(x, 4)),
                _ci(q["initial_eval_loss"], lambda x: _f(x, 3)),
                _ci(q["next_token_acc"]),
                PAPER_LOSS[regime],
                _f(sum(secs) / len(secs), 0) if secs else "—",
            ]
        )
    return rows


LOSS_HEADER = [
    "regime",
    "held-out loss [95 % CI]",
    "initial-model loss",
    "next-token accuracy",
    "paper's loss (their tokenizer)",
    "s / run",
]
PROBE_HEADER = ["regime", "feature group", "trained r [95 % CI]", "initial-model r (null)", "p (trained > null)"]


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``): loss, probes, influence per group × component, tests,
    continuations, and a bar plot of the standard regime's influences."""
    from ..report import Report, setup_matplotlib

    sc = summary["scale"]
    rep = Report(f"TinyStories: standard vs myopic training ({sc['name']} scale)")
    rep.text(
        f"Scale: {sc['summary']}; {sc['model']}; {sc['training']}; eval {sc['eval']}; {sc['syntax']}; "
        f"attribution {sc['attribution']}. Deviations from the paper: {', '.join(sc['deviations']) or 'none'}."
    )
    rep.text("Claims tested (arXiv 2603.14087): " + "; ".join(f"{k} — {v}" for k, v in summary["expected"].items()))
    quality = {r: summary["per_regime"][r] for r in summary["per_regime"]}
    rep.section("Held-out loss")
    rep.table(LOSS_HEADER, _loss_rows(quality, summary["runs"]), caption="Student-t intervals over seeds")
    rep.section("Probe quality per feature group")
    rep.table(
        PROBE_HEADER,
        _probe_rows(summary["per_regime"]),
        caption="mean test Pearson r over layers 1..L and the probed positions; Fisher-z intervals over "
        "seeds; p: one-sided paired t on Fisher z",
    )
    if summary["influence"]:
        rep.section("Integrated influence per feature group and component")
        rep.table(
            INFLUENCE_HEADER,
            _influence_rows(summary["influence"]),
            caption="mean over items (layer, position, feature) per run, Student-t intervals over seeds; "
            "positive = toward the final feature value",
        )
        inf = summary["influence"].get("standard") or next(iter(summary["influence"].values()))
        plt = setup_matplotlib()
        import numpy as np

        fig, ax = plt.subplots(figsize=(6, 3.2))
        groups = list(inf["influence"])
        xs = np.arange(len(groups))
        for j, comp in enumerate(COMPONENTS[:3]):
            st = [inf["influence"][g][comp] for g in groups]
            m = np.array([s["mean"] if s["mean"] is not None else np.nan for s in st], dtype=float)
            lo = np.array([s["mean"] - s["low"] if s["low"] is not None else 0 for s in st], dtype=float)
            hi = np.array([s["high"] - s["mean"] if s["high"] is not None else 0 for s in st], dtype=float)
            ax.bar(xs + (j - 1) * 0.27, m, width=0.25, yerr=[lo, hi], capsize=3, label=comp)
        ax.set_xticks(xs, groups)
        ax.set_ylabel("integrated influence")
        ax.legend(fontsize=7)
        rep.figure(
            fig,
            "Integrated influence per component and feature group (pre-cached over layers k < L); "
            "bars: Student-t 95 % CIs over seeds.",
            name="influence.png",
        )
    rep.section("The paper's claims as hypotheses")
    rep.table(
        TEST_HEADER,
        _test_rows(summary["tests"]),
        caption="one-sided paired tests over seeds on raw values; Holm over the feature family",
    )
    if summary.get("continuations"):
        rep.section("Continuations of held-out stories")
        rows = []
        for it in summary["continuations"]:
            for regime, cont in it["continuations"].items():
                rows.append([it["prompt"], regime, cont["greedy"], cont["sampled"]])
        rep.table(
            ["prompt", "regime", "greedy", "sampled (T = 1)"],
            rows,
            caption=f"model of seed {summary['continuations'][0]['seed']}; BPE tokens joined by spaces",
        )
    rep.section("Runs")
    rep.table(
        ["regime", "seed", "held-out loss", "initial loss", "probe r (" + "/".join(PROBE_GROUPS) + ")", "seconds"],
        [
            [
                r["regime"],
                r["seed"],
                _f(r["eval_loss"], 4),
                _f(r["initial_eval_loss"], 3),
                " / ".join(_f(r["probe"].get(g)) for g in PROBE_GROUPS),
                _f(r["seconds"], 0),
            ]
            for r in summary["runs"]
        ],
    )
    return rep.write(out)


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The headline numbers as text lines (the CLI prints them)."""
    lines = []
    for regime, s in summary["per_regime"].items():
        lines.append(
            f"{regime:<9} held-out loss {_ci(s['eval_loss'], lambda x: _f(x, 4))}; probes "
            + ", ".join(f"{g} {_ci(c)} (null {_ci(s['initial_probe'].get(g))})" for g, c in s["probe"].items())
        )
    for regime, inf in summary["influence"].items():
        for g, m in inf["influence"].items():
            lines.append(
                f"{regime:<9} {g:<8} "
                + ", ".join(f"{c} {_ci(m[c], _g)}" for c in COMPONENTS)
                + f"; pre-cached share {_ci(inf['precached_share'].get(g))}"
            )
    for fam in ("loss", "features"):
        for k, v in summary["tests"][fam].items():
            lines.append(
                f"{k}: p {_p(v['p_t'])}, p (Holm) {_p(v.get('p_holm'))}, detectable d_z {_f(v.get('detectable_dz'), 2)}, holds {v['holds']}"
            )
    return lines


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown lines of one results file of this experiment for ``docs/results.md`` (a
    :data:`originlens.experiments.render.SECTIONS` entry): header, loss table, probe table, influence
    table (group × component with CIs), the tests with p-values and detectable d_z, and the continuations."""
    from .formatting import header

    out = [f"### {rec['name']} (`results/{key}.json`)", "", *header(rec)]
    sc = rec["scale"]
    for k in ("syntax", "attribution"):
        if sc.get(k):
            out.append(f"- {k}: {sc[k]}")
    out += [
        "",
        f"Metric: {rec.get('metric', '')}.",
        "",
        "Held-out loss (mean next-token cross-entropy on the held-out split; Student-t 95 % intervals over "
        "seeds; the paper's numbers use its own tokenizer and data, so they are not comparable in level):",
        "",
        "| " + " | ".join(LOSS_HEADER) + " |",
        "|" + "---|" * len(LOSS_HEADER),
    ]
    for row in _loss_rows(rec["quality"], rec["runs"]):
        out.append("| " + " | ".join(_cell(x) for x in row) + " |")
    probes = rec["numbers"].get("probes", {})
    out += [
        "",
        "Probe quality per feature group (Fisher-z 95 % intervals over seeds; the null is the same probe "
        "fitted on the untrained model of the same regime and seed):",
        "",
        "| " + " | ".join(PROBE_HEADER) + " |",
        "|" + "---|" * len(PROBE_HEADER),
    ]
    for row in _probe_rows(probes):
        out.append("| " + " | ".join(_cell(x) for x in row) + " |")
    influence = rec["numbers"].get("influence", {})
    if influence:
        out += [
            "",
            "Integrated Adam influence per feature group and component (mean over items per run, "
            "Student-t 95 % intervals over seeds; pre-cached over layers k < L, k = L separately, where "
            "G_pre ≡ 0; "
            "share = pre / (|dir| + |pre| + |sh|) over k < L):",
            "",
            "| " + " | ".join(INFLUENCE_HEADER) + " |",
            "|" + "---|" * len(INFLUENCE_HEADER),
        ]
        for row in _influence_rows(influence):
            out.append("| " + " | ".join(_cell(x) for x in row) + " |")
    tests = rec.get("tests", {})
    out += [
        "",
        "The paper's claims, one-sided paired t-tests over seeds (paired by seed) on the raw values, Holm "
        "over the feature family; the observed d_z and the d_z these seeds detect with power 0.8 (α = 0.05; "
        "post-hoc power at the observed d_z is a function of p and is not reported):",
        "",
        "| " + " | ".join(TEST_HEADER) + " |",
        "|" + "---|" * len(TEST_HEADER),
    ]
    for row in _test_rows(tests):
        out.append("| " + " | ".join(_cell(x) for x in row) + " |")
    conts = rec.get("continuations") or []
    if conts:
        out += [
            "",
            f"Continuations of held-out story openings by the seed-{conts[0]['seed']} models (greedy, and "
            "sampled at temperature 1 with a fixed seed; BPE tokens joined by spaces):",
            "",
            "| prompt | regime | greedy | sampled |",
            "|---|---|---|---|",
        ]
        for it in conts:
            for regime, c in it["continuations"].items():
                out.append(f"| {_cell(it['prompt'])} | {regime} | {_cell(c['greedy'])} | {_cell(c['sampled'])} |")
    return out + [""]


def _scale_text(rec: dict[str, Any]) -> str:
    sc = rec["scale"]
    return (
        f"{sc.get('model', '')}; {sc.get('training', '')}; {len(rec['seeds'])} seeds; deviations: "
        f"{', '.join(sc.get('deviations', [])) or 'none'}"
    )


def judge_loss(rec: dict[str, Any]) -> Any:
    """Reproduced when the held-out loss of myopic training exceeds standard training's significantly
    (one-sided paired t over seeds, α = 0.05); otherwise not reproduced (not yet run when the record
    lacks one of the regimes)."""
    from .verdicts import Verdict

    t = rec.get("tests", {}).get("loss", {}).get(LOSS_TEST)
    q = rec.get("quality", {})
    if t is None or "myopic" not in q or "standard" not in q:
        return Verdict("not yet run", "the record lacks the standard or the myopic regime", _scale_text(rec))
    ours = (
        f"held-out loss {_ci(q['myopic']['eval_loss'])} myopic vs {_ci(q['standard']['eval_loss'])} standard "
        f"({t['n']} seeds; our BPE tokenizer); myopic > standard: p {_p(t['p_t'])}, detectable d_z {_f(t.get('detectable_dz'), 2)}"
    )
    return Verdict("reproduced" if t.get("holds") else "not reproduced", ours, _scale_text(rec))


def judge_features(rec: dict[str, Any]) -> Any:
    """Reproduced when, under standard training, syntax features get more direct than pre-cached influence
    **and** position features have a larger pre-cached share than syntax features, both significantly
    (one-sided paired t over seeds, Holm over the two, α = 0.05); partial when one holds; not reproduced
    when neither (not yet run when the record has no standard-regime attribution)."""
    from .verdicts import Verdict

    tf = rec.get("tests", {}).get("features", {})
    inf = rec.get("numbers", {}).get("influence", {}).get("standard")
    if SYNTAX_TEST not in tf or SHARE_TEST not in tf or not inf:
        return Verdict("not yet run", "the record has no standard-regime attribution", _scale_text(rec))
    a, b = tf[SYNTAX_TEST], tf[SHARE_TEST]
    syn = inf["influence"].get("syntax", {})
    share = inf.get("precached_share", {})
    ours = (
        f"syntax: direct {_ci(syn.get('direct'), _g)} vs pre-cached {_ci(syn.get('precached'), _g)} "
        f"(p_Holm {_p(a.get('p_holm'))}); pre-cached share: position {_ci(share.get('position'))} vs syntax "
        f"{_ci(share.get('syntax'))} (p_Holm {_p(b.get('p_holm'))})"
    )
    held = int(bool(a.get("holds"))) + int(bool(b.get("holds")))
    verdict = "reproduced" if held == 2 else ("partial" if held == 1 else "not reproduced")
    return Verdict(verdict, ours, _scale_text(rec))
