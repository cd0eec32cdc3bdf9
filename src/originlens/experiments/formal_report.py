"""Aggregation over seeds, report, verdicts and docs section of the formal-feature experiment
(:mod:`originlens.experiments.formal`).

:func:`summarise` reads every seed's stored arrays (``labels.npz``, ``qscore.npz``, ``lookahead.npz``,
``steering.json``, ``losses.json``) and returns ``quality`` (held-out loss per model and domain, Student t
over seeds; the unigram null; whether the models learned both domains; SAE fvu / L0 / dead fraction),
``numbers`` (σ(ln Q) formal / other / difference per model with each seed's bootstrap and permutation
results; ρ(alignment, Q); steering fractions per group and α) and ``tests`` (one-sided tests over seeds:
σ_formal > σ_other, ρ < 0, top-Q > random and > zero).  A claim is "reproduced" only with ≥ 3 seeds,
its test over seeds at p < 0.05 and models that learned both domains (see each ``judge_*``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..storage import read_json
from . import formal_metrics as fm
from . import inference
from .formatting import ci as fmt_ci
from .formatting import num as _f
from .formatting import pval as _p

ALPHA = 0.05
REGIMES = ("standard", "myopic")
MIN_SEEDS = 3  # fewer seeds: at most "partial"


# ----------------------------------------------------------------------------------------------------
# across seeds


def seed_statistics(config: Any, out: Path, seed: int, regime: str) -> dict[str, Any]:
    """:func:`formal_metrics.feature_statistics` of one (seed, regime) from its stored arrays."""
    s, d = config.settings, out / f"seed-{seed}" / regime
    lab, q, la = np.load(d / "labels.npz"), np.load(d / "qscore.npz"), np.load(d / "lookahead.npz")
    return fm.feature_statistics(
        lab["share"],
        q["q"],
        la["alignment"],
        float(lab["threshold"]),
        n_boot=s["n_boot"],
        n_perm=s["n_perm"],
        confidence=config.confidence,
        seed=1000 * seed + 7,
    )


def summarise(config: Any, out: Path, unigram: dict[str, float]) -> dict[str, Any]:
    """Per-seed statistics, CIs over seeds and the tests of the three claims."""
    s, seeds, conf = config.settings, config.seeds, config.confidence
    losses = {
        x: {nm: [read_json(out / f"seed-{sd}" / nm / "losses.json")[x] for sd in seeds] for nm in (*REGIMES, "initial")}
        for x in fm.DOMAINS
    }
    learned = {
        nm: all(a <= b - s["learned_margin"] for x in fm.DOMAINS for a, b in zip(losses[x][nm], losses[x]["initial"]))
        for nm in REGIMES
    }
    quality: dict[str, Any] = {
        "held_out_loss": {
            nm: {x: inference.mean_ci(losses[x][nm], conf) for x in fm.DOMAINS} for nm in (*REGIMES, "initial")
        },
        "unigram_loss": unigram,
        "learned": learned,
        "learned_rule": f"every seed's held-out loss on both domains ≥ {s['learned_margin']} nat below its untrained model's",
        "sae": {},
    }
    per_seed = {r: {sd: seed_statistics(config, out, sd, r) for sd in seeds} for r in REGIMES}
    numbers: dict[str, Any] = {
        "sigma_lnq": {},
        "lookahead": {},
        "labels": {"rule": fm.RULE, "threshold": s["threshold"]},
    }
    tests: dict[str, Any] = {"formal_share": {}, "lookahead": {}, "steering": {}, "alpha": ALPHA}
    for r in REGIMES:
        st = [per_seed[r][sd] for sd in seeds]
        sf, so = [x["sigma"]["formal"]["estimate"] for x in st], [x["sigma"]["other"]["estimate"] for x in st]
        quality["sae"][r] = {
            k: inference.mean_ci(
                [read_json(out / f"seed-{sd}" / r / "sae" / "results.json")["metrics"][k] for sd in seeds], conf
            )
            for k in ("fvu", "l0", "dead_frac")
        }
        vl = [np.load(out / f"seed-{sd}" / r / "lookahead.npz")["val_loss"] for sd in seeds]
        quality.setdefault("lookahead_maps", {})[r] = {
            "map": inference.mean_ci([fm.nanmean(v[0]) for v in vl], conf),
            "identity": inference.mean_ci([fm.nanmean(v[1]) for v in vl], conf),
        }
        numbers["sigma_lnq"][r] = {
            "formal": inference.mean_ci(sf, conf),
            "other": inference.mean_ci(so, conf),
            "difference": inference.mean_ci(np.subtract(sf, so).tolist(), conf),
            "story_only_difference": inference.mean_ci(
                [x["sigma_story_only"]["difference"]["estimate"] for x in st], conf
            ),
            "enrichment": inference.mean_ci([x["enrichment"]["enrichment"] for x in st], conf),
            "n_formal": inference.mean_ci([x["sigma"]["n_formal"] for x in st], conf),
            "n_other": inference.mean_ci([x["sigma"]["n_other"] for x in st], conf),
            "per_seed": {str(sd): x for sd, x in zip(seeds, st)},
        }
        ok_groups = all(min(x["sigma"]["n_formal"], x["sigma"]["n_other"]) >= s["min_group"] for x in st)
        t = inference.paired_test(sf, so, alternative="greater", correlation=False, alpha=ALPHA, confidence=conf)
        perm = [x["permutation"]["p"] for x in st]
        tests["formal_share"][r] = {
            **t,
            "holds": (t["p_t"] or 1.0) < ALPHA and ok_groups,
            "groups_large_enough": ok_groups,
            "permutation_p": perm,
            "permutation_significant": sum((p or 1) < ALPHA for p in perm),
        }
        rho = [x["lookahead"]["rho"] for x in st]
        numbers["lookahead"][r] = {
            "rho": inference.correlation_ci(rho, conf),
            "per_seed": {str(sd): x["lookahead"] for sd, x in zip(seeds, st)},
            "rank": int(np.load(out / f"seed-{seeds[0]}" / r / "lookahead.npz")["rank"]),
            "offsets": f"2..{s['la_max_offset']}",
        }
        t = inference.paired_test(
            rho, [0.0] * len(rho), alternative="less", correlation=True, alpha=ALPHA, confidence=conf
        )
        lp = [x["lookahead"]["p"] for x in st]
        tests["lookahead"][r] = {
            **t,
            "holds": (t["p_t"] or 1.0) < ALPHA,
            "permutation_p": lp,
            "permutation_significant": sum((p or 1) < ALPHA for p in lp),
        }
    steer = {sd: read_json(out / f"seed-{sd}" / "standard" / "steering.json") for sd in seeds}
    sst = {sd: fm.steering_statistics(v["cells"], s["steer_alphas"]) for sd, v in steer.items() if v["cells"]}
    numbers["steering"] = {}
    for m in fm.STEER_METRICS:
        if not sst:
            break
        means = {g: [sst[sd][m]["seed_means"][g] for sd in sst] for g in (*fm.STEER_GROUPS, "zero")}
        numbers["steering"][m] = {
            "seed_means": {g: inference.mean_ci(v, conf, bounds=(0, 1)) for g, v in means.items()},
            "by_alpha": {
                g: {
                    a: inference.mean_ci([sst[sd][m]["by_alpha"][g][a] for sd in sst], conf, bounds=(0, 1))
                    for a in sst[next(iter(sst))][m]["by_alpha"][g]
                }
                for g in fm.STEER_GROUPS
            },
            "within_seed": {
                str(sd): {
                    f"top > {b}": inference.paired_test(
                        v[m]["per_prompt"]["top"], v[m]["per_prompt"][b], correlation=False
                    )
                    for b in ("random", "zero")
                }
                for sd, v in sst.items()
            },
        }
        if m != "python_token_frac":
            for b in ("random", "zero"):
                t = inference.paired_test(
                    means["top"], means[b], alternative="greater", correlation=False, alpha=ALPHA, confidence=conf
                )
                tests["steering"][f"{m}: top > {b}"] = {**t, "holds": (t["p_t"] or 1.0) < ALPHA}
    return {
        "seeds": list(seeds),
        "quality": quality,
        "numbers": numbers,
        "tests": tests,
        "steering_examples": {str(sd): v.get("examples", []) for sd, v in steer.items()},
    }


def clean(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    return x.item() if isinstance(x, np.generic) else x


# ----------------------------------------------------------------------------------------------------
# verdicts, docs, report


def _ci(c: dict[str, Any] | None, d: int = 3) -> str:
    return fmt_ci(c, d)


def _boot(b: dict[str, Any]) -> str:
    if b.get("estimate") is None:
        return "—"
    if b.get("low") is None:
        return _f(b["estimate"])
    return f"{_f(b['estimate'])} [{_f(b['low'])}, {_f(b['high'])}]"


def _test(t: dict[str, Any]) -> str:
    return (
        f"mean diff {_f(t.get('mean_diff'))} [{_f(t.get('diff_low'))}, {_f(t.get('diff_high'))}], p (t) "
        f"{_p(t.get('p_t'))}, detectable d_z {_f(t.get('detectable_dz'), 2)}"
    )


def _learned(rec: dict[str, Any]) -> bool:
    return bool(rec["quality"]["learned"].get("standard"))


def _losses(rec: dict[str, Any]) -> str:
    q = rec["quality"]["held_out_loss"]
    return "; ".join(
        f"{x}: standard {_ci(q['standard'][x])}, myopic {_ci(q['myopic'][x])}, untrained {_ci(q['initial'][x])}"
        for x in fm.DOMAINS
    )


def _scale(rec: dict[str, Any]) -> str:
    sc = rec["scale"]
    return f"{sc['model']}; {sc['training']}; {len(rec['seeds'])} seeds; deviations: " + ", ".join(sc["deviations"])


def _verdict(rec: dict[str, Any], holds: bool, partial: bool, ours: str) -> Any:
    """Reproduced only when the test holds, the models learned both domains and ≥ MIN_SEEDS seeds ran;
    partial when the test holds otherwise or ``partial``; else not reproduced.  Notes the shortfalls."""
    from .verdicts import Verdict

    n = len(rec["seeds"])
    if not _learned(rec):
        ours += "; the models did not learn both domains"
    if n < MIN_SEEDS:
        ours += f"; only {n} seed(s)"
    if holds and _learned(rec) and n >= MIN_SEEDS:
        return Verdict("reproduced", ours, _scale(rec))
    return Verdict("partial" if (holds or partial) else "not reproduced", ours, _scale(rec))


def judge_formal_share(rec: dict[str, Any]) -> Any:
    """Claim (a).  Reproduced: σ_formal > σ_other over seeds (one-sided paired t, p < 0.05, both groups
    ≥ ``min_group`` features in every seed) on the standard model, ≥ 3 seeds, and the models learned both
    domains.
    Partial: the test holds otherwise (fewer seeds, models that did not learn), or it fails over seeds while the
    mean difference is positive and the within-seed permutation test holds in at least half the seeds.
    Otherwise not reproduced (with the d_z the seeds can detect)."""

    t, n = rec["tests"]["formal_share"]["standard"], rec["numbers"]["sigma_lnq"]
    k = len(rec["seeds"])
    ours = (
        f"σ(ln Q) formal {_ci(n['standard']['formal'])} vs other {_ci(n['standard']['other'])} (myopic control "
        f"{_ci(n['myopic']['formal'])} vs {_ci(n['myopic']['other'])}); {_test(t)}; permutation p < 0.05 in "
        f"{t['permutation_significant']}/{k} seeds"
    )
    partial = (t.get("mean_diff") or 0) > 0 and 2 * t["permutation_significant"] >= k
    return _verdict(rec, bool(t["holds"]), partial, ours)


def judge_steering(rec: dict[str, Any]) -> Any:
    """Claim (b).  Reproduced: top-Q > random and top-Q > zero over seeds for both the code and the
    punctuation fraction (one-sided paired t, p < 0.05), ≥ 3 seeds, on models that learned both domains;
    partial: some of the four hold; otherwise not reproduced."""
    from .verdicts import Verdict

    tests = rec["tests"]["steering"]
    if not tests:
        return Verdict("not reproduced", "no steering measurement (too few scored features)", _scale(rec))
    held = [k for k, t in tests.items() if t["holds"]]
    m = rec["numbers"]["steering"]
    ours = (
        "; ".join(
            f"{x}: top {_ci(m[x]['seed_means']['top'])}, random {_ci(m[x]['seed_means']['random'])}, zero "
            f"{_ci(m[x]['seed_means']['zero'])}"
            for x in ("code_frac", "punct_frac")
        )
        + f"; {len(held)}/{len(tests)} tests hold"
        + ("" if held else f" ({_test(next(iter(tests.values())))})")
    )
    return _verdict(rec, len(held) == len(tests), bool(held), ours)


def judge_lookahead(rec: dict[str, Any]) -> Any:
    """Claim (c).  Reproduced: ρ(alignment, Q) < 0 over seeds (one-sided t on Fisher z, p < 0.05) on the
    standard model, ≥ 3 seeds, models learned both domains; partial: the test holds otherwise, or the
    mean ρ is negative and the permutation test holds in at least half the seeds; otherwise not reproduced."""

    t, n = rec["tests"]["lookahead"]["standard"], rec["numbers"]["lookahead"]
    k = len(rec["seeds"])
    ours = (
        f"Spearman ρ(alignment, Q) {_ci(n['standard']['rho'])} (myopic {_ci(n['myopic']['rho'])}), rank "
        f"{n['standard']['rank']}, offsets {n['standard']['offsets']}; p (t on z) {_p(t.get('p_t'))}, detectable d_z "
        f"{_f(t.get('detectable_dz'), 2)}; permutation p < 0.05 in {t['permutation_significant']}/{k} seeds"
    )
    partial = (n["standard"]["rho"].get("mean") or 0) < 0 and 2 * t["permutation_significant"] >= k
    return _verdict(rec, bool(t["holds"]), partial, ours)


JUDGES = {"formal-share": judge_formal_share, "steering": judge_steering, "lookahead": judge_lookahead}


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown of one formal-experiment results file for ``docs/results.md``."""
    from .formatting import header

    n, t, q = rec["numbers"], rec["tests"], rec["quality"]
    out = [f"### {rec['name']} (`results/{key}.json`)", "", *header(rec), f"- labels: {rec.get('rule', '')}", ""]
    out += [
        f"Held-out loss per domain (Student t over seeds): {_losses(rec)}; unigram "
        + ", ".join(f"{x} {_f(v)}" for x, v in q["unigram_loss"].items())
        + f". Learned both domains ({q['learned_rule']}): {'yes' if _learned(rec) else 'no'}.",
        "",
        "| model | σ(ln Q) formal | σ(ln Q) other | difference | story-only difference | formal features | "
        "other features | p (formal > other, t over seeds) | permutation p per seed | holds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in REGIMES:
        s, tt = n["sigma_lnq"][r], t["formal_share"][r]
        out.append(
            f"| {r} | {_ci(s['formal'])} | {_ci(s['other'])} | {_ci(s['difference'])} | "
            f"{_ci(s['story_only_difference'])} | {_ci(s['n_formal'], 1)} | {_ci(s['n_other'], 1)} | "
            f"{_p(tt.get('p_t'))} | {', '.join(_p(p) for p in tt['permutation_p'])} | {'yes' if tt['holds'] else 'no'} |"
        )
    paper = rec.get("paper", {}).get("sigma_lnq", {})
    sae = q.get("sae", {}).get("standard", {})
    out += [
        "",
        f"Paper (Gemma-2-2B, Gemma Scope): σ(ln Q) formal {paper.get('formal', '—')} vs other {paper.get('other', '—')}. "
        f"Our SAEs (standard model): fvu {_ci(sae.get('fvu'))}, L0 {_ci(sae.get('l0'), 1)}, dead "
        f"{_ci(sae.get('dead_frac'))}; look-ahead maps (standard, held-out CE, mean over offsets): "
        f"{_ci(q.get('lookahead_maps', {}).get('standard', {}).get('map'))} vs identity "
        f"{_ci(q.get('lookahead_maps', {}).get('standard', {}).get('identity'))}.",
        "",
    ]
    if n.get("steering"):
        out += ["| steering metric | top-Q | bottom-Q | random | zero (c = 0) |", "|---|---|---|---|---|"]
        for m, v in n["steering"].items():
            sm = v["seed_means"]
            out.append(f"| {m} | {_ci(sm['top'])} | {_ci(sm['bottom'])} | {_ci(sm['random'])} | {_ci(sm['zero'])} |")
        out += ["", "| steering test (over seeds) | result | holds |", "|---|---|---|"]
        out += [f"| {k} | {_test(v)} | {'yes' if v['holds'] else 'no'} |" for k, v in t["steering"].items()]
        out.append("")
    out += ["| model | ρ(alignment, Q) | p (ρ < 0, t on z) | permutation p per seed | holds |", "|---|---|---|---|---|"]
    for r in REGIMES:
        tt = t["lookahead"][r]
        out.append(
            f"| {r} | {_ci(n['lookahead'][r]['rho'])} | {_p(tt.get('p_t'))} | "
            f"{', '.join(_p(p) for p in tt['permutation_p'])} | {'yes' if tt['holds'] else 'no'} |"
        )
    return out + [""]


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``): losses, ln Q histograms formal vs other (log x axis), the
    σ table, steering samples side by side, the Q-vs-alignment scatter."""
    from ..report import Report, setup_matplotlib

    plt = setup_matplotlib()
    out = Path(out)
    sc, n, q, t = summary["scale"], summary["numbers"], summary["quality"], summary["tests"]
    rep = Report(f"Formal features and Q(w) ({sc['name']} scale)")
    rep.text(
        f"{sc['summary']}: {sc['model']}; {sc['training']}; SAE {sc['sae']}. Stories: {sc['corpus']['story_source']}."
    )
    rep.text("Deviations from arXiv 2603.14087: " + "; ".join(sc["deviations"]) + ".")
    rep.section("Model quality")
    rep.text(
        f"Held-out loss per domain (nats/token): {_losses({'quality': q})}; unigram {q['unigram_loss']}; "
        f"learned both domains: {q['learned']} ({q['learned_rule']})."
    )
    rep.section("Claim (a): σ(ln Q), formal vs other")
    rep.text(f"Labels: {n['labels']['rule']} (threshold {n['labels']['threshold']}).")
    rows = []
    for r in REGIMES:
        for sd, x in n["sigma_lnq"][r]["per_seed"].items():
            rows.append(
                [
                    r,
                    sd,
                    x["sigma"]["n_formal"],
                    x["sigma"]["n_other"],
                    _boot(x["sigma"]["formal"]),
                    _boot(x["sigma"]["other"]),
                    _boot(x["sigma"]["difference"]),
                    _p(x["permutation"]["p"]),
                    x["share_histogram"]["counts"],
                ]
            )
    rep.table(
        [
            "model",
            "seed",
            "formal",
            "other",
            "σ formal",
            "σ other",
            "difference",
            "permutation p",
            "share histogram (10 bins of [0, 1])",
        ],
        rows,
        caption="bootstrap 95 % intervals over features",
    )
    rep.table(["model", "test over seeds"], [[r, _test(t["formal_share"][r])] for r in REGIMES])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    out_seeds = [out / f"seed-{sd}" for sd in summary["seeds"]]
    for ax, r in zip(axes, REGIMES):
        for lab, name, color in ((fm.FORMAL, "formal", "#D55E00"), (fm.OTHER, "other", "#0072B2")):
            v = []
            for p in out_seeds:
                qq, ll = np.load(p / r / "qscore.npz")["q"], np.load(p / r / "labels.npz")["label"]
                v += qq[(ll == lab) & np.isfinite(fm.log_q(qq))].tolist()
            if v:
                ax.set_xscale("log")
                ax.hist(
                    v,
                    bins=np.logspace(np.log10(min(v)) - 0.1, np.log10(max(v)) + 0.1, 25),
                    alpha=0.6,
                    color=color,
                    label=name,
                )
        ax.set_xlabel("Q (log scale)")
        ax.set_title(r)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    rep.figure(
        fig, "Q of the scored live features, formal vs other, all seeds pooled; log x axis.", name="lnq-hist.png"
    )
    if t["steering"]:
        rep.section("Claim (b): steering")
        rep.table(
            ["metric", "top-Q", "bottom-Q", "random", "zero"],
            [
                [m, *(_ci(v["seed_means"][g]) for g in ("top", "bottom", "random", "zero"))]
                for m, v in n["steering"].items()
            ],
            caption="per seed: mean over prompts and α; Student t over seeds",
        )
        rep.table(["test", "result", "holds"], [[k, _test(v), v["holds"]] for k, v in t["steering"].items()])
        ex: list[dict[str, Any]] = next(iter(summary["steering_examples"].values()), [])
        rep.table(
            ["prompt", "zero (c = 0)", "top-Q", "random", "bottom-Q"],
            [[e["prompt"], e["zero"], e["top"], e["random"], e["bottom"]] for e in ex],
            caption="first sample per condition at the largest α, first seed",
        )
    rep.section("Claim (c): Q vs look-ahead alignment")
    rep.table(
        ["model", "ρ over seeds", "test"],
        [[r, _ci(n["lookahead"][r]["rho"]), _test(t["lookahead"][r])] for r in REGIMES],
    )
    if out_seeds:
        p = out_seeds[0] / "standard"
        qq, ll = np.load(p / "qscore.npz")["q"], np.load(p / "labels.npz")["label"]
        a = fm.lookahead_alignment(np.load(p / "lookahead.npz")["alignment"])
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for lab, name, color in ((fm.FORMAL, "formal", "#D55E00"), (fm.OTHER, "other", "#0072B2")):
            m = (ll == lab) & np.isfinite(fm.log_q(qq)) & np.isfinite(a)
            if m.any():
                ax.set_xscale("log")
                ax.scatter(qq[m], a[m], s=8, color=color, label=name)
        ax.set_xlabel("Q (log scale)")
        ax.set_ylabel("alignment (mean over offsets 2..K)")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        rep.figure(fig, f"Q vs look-ahead alignment, standard model of {out_seeds[0].name}.", name="q-alignment.png")
    return rep.write(out)
