"""The numbers of the Othello experiment (:mod:`.othello`): per seed, the influence integrated over all
of training from its strata (:func:`seed_estimate`, the stratified sum of :mod:`.othello_strata`); across
seeds, Student-t intervals of the seed means, the paper's pattern as one-sided tests (:data:`HYPOTHESES`,
Holm over the family), the positive control (real probes against random directions), the learning curve
and the gates (:mod:`.gates`) that decide whether the design could see the effect.

Pooling: an *item* is one (layer k, position i, central cell); per seed, the integrated influence of every
item, component and feature type is estimated, then averaged over items (``main``: k < L; ``last_layer``:
k = L, reported apart because there G_pre ≡ 0).  Influences are given per item (the paper's table is a
sum over its items, so only signs and orderings compare directly) and normalised by each item's initial
mismatch R(θ₀) (the influence a component would have if it alone removed the whole mismatch is 1).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import gates, inference

COMPONENTS = ("direct", "precached", "shared", "carried", "full")
PAPER_COMPONENTS = ("direct", "precached", "shared", "full")
TYPES = {1: "useless", 2: "useful"}
ALPHA = 0.05
# (name, component, type a, type b or None (= against 0), alternative): the paper's Othello pattern
HYPOTHESES = [
    ("direct: useful > useless", "direct", 2, 1, "greater"),
    ("direct: useful > 0", "direct", 2, None, "greater"),
    ("pre-cached: useless > 0", "precached", 1, None, "greater"),
    ("pre-cached: useless > useful", "precached", 1, 2, "greater"),
    ("shared: useful > 0", "shared", 2, None, "greater"),
    ("shared: useless > 0", "shared", 1, None, "greater"),
    ("combined: useful > useless", "full", 2, 1, "greater"),
]
# the paper's Othello table (its Fig. / table of integrated influences, useful / useless)
PAPER = {
    "direct": {"useful": 7.61, "useless": -0.97},
    "precached": {"useful": -0.66, "useless": 1.80},
    "shared": {"useful": 8.64, "useless": 6.42},
}


def _part(key: str, n_layer: int) -> str:
    return "last_layer" if int(key.split(".")[0]) == n_layer else "main"


def seed_estimate(
    strata: dict[int, dict[str, Any]], n_layer: int, mismatch: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One seed's estimates from its stratum records' values (keyed by stratum index).

    Every item's integral is the stratified sum Σ_h w_h S_h (w_h = N_h / n_h; a stratum in which the item
    has no row of a type contributes 0 to that type).  Returns ``means`` (part → kind → component → type:
    the mean over the items of that type, with the collapsed-strata standard error ``se`` of that mean),
    ``normalised`` (main part, real probes: mean over items of the integral divided by the item's R(θ₀);
    only with ``mismatch``, the values of the seed's ``mismatch`` record),
    ``normalised_random`` (the same for the random directions, each item's integral divided by the mean
    R(θ₀) of its random directions),
    ``per_stratum`` (per stratum: the mean over the main real items of the influence per recorded update,
    component × type — where over training each pathway builds which features) and ``wilcoxon_items``
    (useful vs useless paired by item, per component)."""
    from scipy import stats

    hs = sorted(strata)
    totals: dict[str, dict[str, dict[str, dict[str, float]]]] = {"real": {}, "random": {}}
    contrib: dict[str, dict[str, dict[str, dict[str, dict[int, float]]]]] = {"real": {}, "random": {}}
    for h in hs:
        w = float(strata[h]["weight"])
        for kind, field in (("real", "items"), ("random", "random")):
            for key, comps in strata[h][field].items():
                for c, ts in comps.items():
                    for t, val in ts.items():
                        tot = totals[kind].setdefault(key, {}).setdefault(c, {})
                        tot[t] = tot.get(t, 0.0) + w * float(val)
                        per = contrib[kind].setdefault(key, {}).setdefault(c, {}).setdefault(t, {})
                        per[h] = w * float(val)
    means: dict[str, Any] = {}
    for kind in ("real", "random"):
        for part in ("main", "last_layer"):
            keys = [k for k in totals[kind] if _part(k, n_layer) == part]
            for c in COMPONENTS:
                for t in TYPES.values():
                    ks = [k for k in keys if t in totals[kind][k].get(c, {})]
                    if not ks:
                        continue
                    per_h = [float(np.mean([contrib[kind][k][c][t].get(h, 0.0) for k in ks])) for h in hs]
                    means.setdefault(part, {}).setdefault(kind, {}).setdefault(c, {})[t] = {
                        "mean": float(np.mean([totals[kind][k][c][t] for k in ks])),
                        "se": collapsed_strata_se(per_h),
                        "n_items": len(ks),
                    }
    items = totals["real"]
    # R(θ₀) from the seed's mismatch record (the ``initial_mismatch`` field of earlier stratum-0 records
    # was measured at that stratum's segment start, not at θ₀, and is not read)
    normalised = _normalised(items, mismatch["real"], n_layer) if mismatch else {}
    normalised_random = _normalised(totals["random"], mismatch["random"], n_layer) if mismatch else None
    per_stratum = {}
    main_keys = [k for k in items if _part(k, n_layer) == "main"]
    for h in hs:
        n_rec = strata[h]["recorded"][1] - strata[h]["recorded"][0] + 1
        rate: dict[str, dict[str, float]] = {}
        for c in COMPONENTS:
            for t in TYPES.values():
                ks = [k for k in main_keys if t in items[k].get(c, {})]
                vals = [strata[h]["items"].get(k, {}).get(c, {}).get(t, 0.0) for k in ks]
                if vals:
                    rate.setdefault(c, {})[t] = float(np.mean(vals)) / n_rec
        per_stratum[str(h)] = {"bounds": strata[h]["bounds"], "segment": strata[h]["segment"], "rate": rate}
    wil = {}
    for c in COMPONENTS:
        diff = np.array(
            [
                d[c]["useful"] - d[c]["useless"]
                for k, d in items.items()
                if _part(k, n_layer) == "main" and "useful" in d.get(c, {}) and "useless" in d.get(c, {})
            ]
        )
        wil[c] = {
            "n_items": int(diff.size),
            "p_useful_gt_useless": (
                float(stats.wilcoxon(diff, alternative="greater").pvalue) if diff.size > 1 and np.any(diff) else None
            ),
        }
    return {
        "means": means,
        "normalised": normalised,
        "normalised_random": normalised_random,
        "per_stratum": per_stratum,
        "wilcoxon_items": wil,
    }


def _normalised(totals: dict[str, Any], r0: dict[str, Any], n_layer: int) -> dict[str, dict[str, float]]:
    """Component → type → the mean over the main items (k < L) of each item's integral divided by its
    initial mismatch R(θ₀) (items without a positive R(θ₀) left out)."""
    out: dict[str, dict[str, float]] = {}
    for c in COMPONENTS:
        for t in TYPES.values():
            ratios = [
                totals[k][c][t] / r0[k][t]
                for k in totals
                if _part(k, n_layer) == "main" and t in totals[k].get(c, {}) and r0.get(k, {}).get(t, 0) > 0
            ]
            if ratios:
                out.setdefault(c, {})[t] = float(np.mean(ratios))
    return out


def collapsed_strata_se(contributions: list[float]) -> float | None:
    """Standard error of a stratified total from one sample per stratum: adjacent strata paired (an odd
    last one joins the last pair's spread), Var ≈ Σ_pairs (T_a − T_b)² (collapsed strata); None for < 2."""
    x = [float(v) for v in contributions]
    if len(x) < 2:
        return None
    var = sum((x[j] - x[j + 1]) ** 2 for j in range(0, len(x) - 1, 2))
    if len(x) % 2:
        var += (x[-1] - x[-2]) ** 2 / 2
    return math.sqrt(var)


# ----------------------------------------------------------------------------------------------------
# across seeds


def _get(est: dict[str, Any], part: str, kind: str, comp: str, typ: str) -> float | None:
    try:
        return est["means"][part][kind][comp][typ]["mean"]
    except KeyError:
        return None


def across_seeds(per_seed: dict[int, dict[str, Any]], confidence: float) -> dict[str, Any]:
    """Seed-level intervals per (part, kind, component, type), the normalised influences, the
    hypotheses (Holm), the positive control and the per-stratum rates over seeds."""
    seeds = sorted(per_seed)
    est = {s: per_seed[s]["estimate"] for s in seeds}
    table: dict[str, Any] = {}
    for part in ("main", "last_layer"):
        for kind in ("real", "random"):
            for c in COMPONENTS:
                for t in TYPES.values():
                    vals = [_get(est[s], part, kind, c, t) for s in seeds]
                    if any(v is not None for v in vals):
                        ci = inference.mean_ci(vals, confidence)
                        ses = [
                            est[s]["means"][part][kind][c][t].get("se")
                            for s in seeds
                            if vals[seeds.index(s)] is not None
                        ]
                        ci["within_seed_se_mean"] = float(np.mean([x for x in ses if x is not None])) if ses else None
                        table.setdefault(part, {}).setdefault(kind, {}).setdefault(c, {})[t] = ci
    normalised = {
        c: {
            t: inference.mean_ci([est[s]["normalised"].get(c, {}).get(t) for s in seeds], confidence)
            for t in TYPES.values()
        }
        for c in COMPONENTS
    }
    normalised_random = (
        {
            c: {
                t: inference.mean_ci([est[s]["normalised_random"].get(c, {}).get(t) for s in seeds], confidence)
                for t in TYPES.values()
            }
            for c in COMPONENTS
        }
        if all(est[s].get("normalised_random") for s in seeds)
        else None
    )
    tests: dict[str, Any] = {}
    for name, comp, a, b, alt in HYPOTHESES:
        va: list[Any] = [_get(est[s], "main", "real", comp, TYPES[a]) for s in seeds]
        vb: list[Any] = (
            [0.0] * len(seeds) if b is None else [_get(est[s], "main", "real", comp, TYPES[b]) for s in seeds]
        )
        tests[name] = inference.paired_test(va, vb, alternative=alt, correlation=False, alpha=ALPHA)
    adj = inference.holm({k: v["p_t"] for k, v in tests.items()})
    for k, v in tests.items():
        v["p_holm"] = adj[k]
        v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
    # the positive control: the real probe directions receive more (combined) influence than random
    # directions of the same norm, averaged over the two feature types
    real = [_type_mean(est[s], "real") for s in seeds]
    rand = [_type_mean(est[s], "random") for s in seeds]
    control = inference.paired_test(real, rand, alternative="greater", correlation=False, alpha=ALPHA)
    control["holds"] = control["p_t"] is not None and control["p_t"] < ALPHA
    per_type_control = {}
    for t in TYPES.values():
        nt = inference.paired_test(
            [_get(est[s], "main", "real", "full", t) for s in seeds],
            [_get(est[s], "main", "random", "full", t) for s in seeds],
            alternative="greater",
            correlation=False,
            alpha=ALPHA,
        )
        nt["holds"] = nt["p_t"] is not None and nt["p_t"] < ALPHA
        per_type_control[t] = nt
    # the same control read on the scale of each direction's own initial mismatch (the raw influence of a
    # direction grows with its R(θ₀), and a random direction of the probe's norm starts farther from its
    # final value than the probe): only when every seed has its mismatch record
    control_normalised = None
    if all(est[s].get("normalised_random") for s in seeds):
        real_n = [_normalised_type_mean(est[s]["normalised"]) for s in seeds]
        rand_n = [_normalised_type_mean(est[s]["normalised_random"]) for s in seeds]
        control_normalised = inference.paired_test(
            real_n, rand_n, alternative="greater", correlation=False, alpha=ALPHA
        )
        control_normalised["holds"] = control_normalised["p_t"] is not None and control_normalised["p_t"] < ALPHA
        control_normalised["real"] = inference.mean_ci(real_n, confidence)
        control_normalised["random"] = inference.mean_ci(rand_n, confidence)
    hs = sorted({h for s in seeds for h in est[s]["per_stratum"]}, key=int)
    strata = {}
    for h in hs:
        rows = [est[s]["per_stratum"].get(h) for s in seeds]
        rate = {
            c: {
                t: inference.mean_ci([r["rate"].get(c, {}).get(t) if r else None for r in rows], confidence)
                for t in TYPES.values()
            }
            for c in COMPONENTS
        }
        strata[h] = {"bounds": next(r["bounds"] for r in rows if r), "rate": rate}
    return {
        "influence": table,
        "normalised": normalised,
        "normalised_random": normalised_random,
        "tests": tests,
        "control": control,
        "control_per_type": per_type_control,
        "control_normalised": control_normalised,
        "strata": strata,
    }


def _type_mean(est: dict[str, Any], kind: str) -> float | None:
    vals = [_get(est, "main", kind, "full", t) for t in TYPES.values()]
    return None if any(v is None for v in vals) else float(np.mean(vals))  # type: ignore[arg-type]


def _normalised_type_mean(normalised: dict[str, Any]) -> float | None:
    vals = [normalised.get("full", {}).get(t) for t in TYPES.values()]
    return None if any(v is None for v in vals) else float(np.mean(vals))


def learning_curve(per_seed: dict[int, dict[str, Any]], confidence: float, n_layer: int) -> dict[str, Any]:
    """Over seeds, at every step with a curve point (the strata's grid points and segment checkpoints, the
    training's evaluations, the final model): legal-move accuracy, held-out loss and probe r per layer
    (overall, useless, useful cells); and the untrained-model null of each."""
    seeds = sorted(per_seed)
    points: dict[int, dict[int, dict[str, Any]]] = {}  # step → seed → point
    for s in seeds:
        for p in per_seed[s]["curve"]:
            points.setdefault(int(p["step"]), {})[s] = p
    out = []
    for step in sorted(points):
        ps = points[step]
        row: dict[str, Any] = {
            "step": step,
            "n_seeds": len(ps),
            "legal_acc": inference.mean_ci([p.get("legal_acc") for p in ps.values()], confidence, bounds=(0, 1)),
            "eval_loss": inference.mean_ci([p.get("eval_loss") for p in ps.values()], confidence),
        }
        probes = {}
        for k in range(1, n_layer + 1):
            vals = [p.get("probes", {}).get(str(k)) for p in ps.values()]
            if any(v for v in vals):
                probes[str(k)] = {
                    m: inference.correlation_ci([v.get(m) if v else None for v in vals], confidence)
                    for m in ("pearson", "pearson_type1", "pearson_type2")
                }
        row["probes"] = probes
        out.append(row)
    null = {
        "legal_acc": inference.mean_ci(
            [per_seed[s]["train"]["initial_eval"].get("legal_acc") for s in seeds], confidence, bounds=(0, 1)
        ),
        "probes": {
            str(k): {
                m: inference.correlation_ci(
                    [per_seed[s]["train"]["initial_probes"].get(str(k), {}).get(m) for s in seeds], confidence
                )
                for m in ("pearson", "pearson_type1", "pearson_type2")
            }
            for k in range(1, n_layer + 1)
        },
    }
    return {"points": out, "null": null}


def main_layer_r(point_probes: dict[str, Any], n_layer: int) -> float | None:
    """Mean probe r over the layers k < L (the main part) of one curve point."""
    vals = [point_probes[str(k)]["pearson"] for k in range(1, n_layer) if str(k) in point_probes]
    vals = [v for v in vals if v is not None and math.isfinite(v)]
    return float(np.mean(vals)) if vals else None


def learned_gate(per_seed: dict[int, dict[str, Any]], n_layer: int, last_stratum: int) -> tuple[gates.Gate, dict]:
    """Gate 1 for the Othello claim: at the start of the last attributed stratum (the end of the attributed
    window), the board probes (main layers) beat the untrained model's, paired by seed (Fisher z)."""
    seeds = sorted(per_seed)
    at = [main_layer_r(per_seed[s]["strata"][last_stratum]["curve"]["start"]["probes"], n_layer) for s in seeds]
    null = [main_layer_r(per_seed[s]["train"]["initial_probes"], n_layer) for s in seeds]
    t = inference.paired_test(at, null, alternative="greater", correlation=True, alpha=ALPHA)
    step = int(np.median([per_seed[s]["strata"][last_stratum]["curve"]["start"]["step"] for s in seeds]))
    ok = t["p_t"] is not None and t["p_t"] < ALPHA
    mean_at = float(np.mean([a for a in at if a is not None])) if any(a is not None for a in at) else float("nan")
    mean_null = float(np.mean([a for a in null if a is not None])) if any(a is not None for a in null) else float("nan")
    p = f"p {t['p_t']:.2g}" if t["p_t"] is not None else f"{len(seeds)} seed(s): no paired test"
    what = f"board probes r {mean_at:.2f} at update ≈ {step} vs untrained {mean_null:.2f} ({p})"
    return gates.learned(ok, what), {"test": t, "at_update": step, "r": mean_at, "untrained_r": mean_null}
