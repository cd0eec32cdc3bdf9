"""The numbers of the Othello experiment (:mod:`.othello`): per seed, the influence stored by the
attribution averaged over items (:func:`seed_aggregates`; the per-update rates of the snapshots,
:func:`snapshot_aggregates`), and across seeds, Student-t intervals of those seed means with the paper's
pattern tested as one-sided hypotheses (:data:`HYPOTHESES`, Holm over the family) beside the
random-direction null (:func:`across_seeds`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import inference

if TYPE_CHECKING:
    from .othello import OthelloConfig


COMPONENTS = ("direct", "precached", "shared", "full")
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


def seed_aggregates(
    store: Path, n_layer: int, updates: int, fractions: list[float], record_every: int = 1
) -> dict[str, Any]:
    """Per-seed means of integrated influence over items, by fraction of the attributed updates, part
    (``main``: k < L; ``last_layer``: k = L), probe kind (``real`` / ``random``), component and type;
    plus the item-paired Wilcoxon test of useful vs useless per component (main part, real probes).
    With ``record_every`` > 1 only every ``record_every``-th update was recorded and the integrated
    influence is estimated as ``record_every`` × the sum over recorded updates (rectangle rule)."""
    import pyarrow.compute as pc
    from scipy import stats

    from ..attribution.store import integrate, load_observables

    table = load_observables(store)
    out: dict[str, Any] = {}
    for frac in fractions:
        cutoff = max(1, int(round(frac * updates)))
        integ = integrate(table.filter(pc.less_equal(table["step"], cutoff))).to_pylist()
        means, items = _item_means(integ, n_layer, lambda r: record_every * float(r["integrated"]))
        wil = {}
        for c in COMPONENTS:
            pairs = [(d[2], d[1]) for (cc, *_), d in items.items() if cc == c and 1 in d and 2 in d]
            diff = np.array([a - b for a, b in pairs])
            wil[c] = {
                "n_items": len(pairs),
                "p_useful_gt_useless": (
                    float(stats.wilcoxon(diff, alternative="greater").pvalue)
                    if len(pairs) > 1 and np.any(diff)
                    else None
                ),
            }
        out[f"{frac:g}"] = {"updates": cutoff, "means": means, "wilcoxon_items": wil}
    return out


def _item_means(integ: list[dict[str, Any]], n_layer: int, value_of: Any) -> tuple[dict[str, Any], dict[tuple, dict]]:
    """Mean over items (layer, position, cell) per part (``main``: k < L, ``last_layer``: k = L), probe kind
    (``real`` / ``random``), component and type of ``value_of(row)`` for integrated rows; and the main-part
    real-probe values per item (component, layer, position, feature) → {type: value} for paired tests."""
    from ..attribution.store import RANDOM_TAG

    agg: dict[str, Any] = {}
    items: dict[tuple, dict[int, float]] = {}
    for r in integ:
        if r["type"] not in TYPES or r["integrated"] is None or not math.isfinite(r["integrated"]):
            continue
        part = "last_layer" if r["site_layer"] == n_layer else "main"
        kind = "random" if RANDOM_TAG in r["feature"] else "real"
        value = value_of(r)
        agg.setdefault(part, {}).setdefault(kind, {}).setdefault(r["component"], {}).setdefault(
            TYPES[r["type"]], []
        ).append(value)
        if part == "main" and kind == "real":
            items.setdefault((r["component"], r["site_layer"], r["site_position"], r["feature"]), {})[r["type"]] = value
    means = {
        part: {
            kind: {
                c: {t: {"mean": float(np.mean(v)), "n_items": len(v)} for t, v in ts.items()} for c, ts in comps.items()
            }
            for kind, comps in kinds.items()
        }
        for part, kinds in agg.items()
    }
    return means, items


def snapshot_aggregates(store: Path | None, n_layer: int, starts: list[int], window: int) -> dict[str, Any]:
    """Per snapshot c (key ``str(c)``): mean over items of the influence *per recorded update* of updates
    c+1..c+``window`` (SGD variant), by part, probe kind, component and type — a rate, comparable across
    snapshots, where the fractions of :func:`seed_aggregates` are integrals."""
    import pyarrow.compute as pc

    from ..attribution.store import integrate, load_observables

    if store is None or not starts:
        return {}
    table = load_observables(store)
    out: dict[str, Any] = {}
    for c in starts:
        sel = table.filter(pc.and_(pc.greater(table["step"], c), pc.less_equal(table["step"], c + window)))
        means, _ = _item_means(
            integrate(sel).to_pylist(), n_layer, lambda r: float(r["integrated"]) / max(1, int(r["n_steps"]))
        )
        out[str(c)] = {"updates": [c + 1, c + window], "means": means}
    return out


# ----------------------------------------------------------------------------------------------------
# across seeds


def _get(agg: dict[str, Any], frac: str, part: str, kind: str, comp: str, typ: str) -> float | None:
    try:
        return agg[frac]["means"][part][kind][comp][typ]["mean"]
    except KeyError:
        return None


def across_seeds(
    per_seed: dict[int, dict[str, Any]],
    fractions: list[float],
    confidence: float,
    *,
    field: str = "aggregates",
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Seed-level intervals per (fraction, part, kind, component, type) and the hypothesis tests;
    ``field="snapshots"`` with ``labels`` (snapshot steps) does the same for the snapshot rates."""
    seeds = sorted(per_seed)
    out: dict[str, Any] = {}
    for frac in labels if labels is not None else [f"{f:g}" for f in fractions]:
        table: dict[str, Any] = {}
        for part in ("main", "last_layer"):
            for kind in ("real", "random"):
                for c in COMPONENTS:
                    for t in TYPES.values():
                        vals = [_get(per_seed[s][field], frac, part, kind, c, t) for s in seeds]
                        if any(v is not None for v in vals):
                            table.setdefault(part, {}).setdefault(kind, {}).setdefault(c, {})[t] = inference.mean_ci(
                                vals, confidence
                            )
        tests: dict[str, Any] = {}
        for name, comp, a, b, alt in HYPOTHESES:
            # a seed without the value is None: paired_test drops that pair
            va: list[Any] = [_get(per_seed[s][field], frac, "main", "real", comp, TYPES[a]) for s in seeds]
            vb: list[Any] = (
                [0.0] * len(seeds)
                if b is None
                else [_get(per_seed[s][field], frac, "main", "real", comp, TYPES[b]) for s in seeds]
            )
            tests[name] = inference.paired_test(va, vb, alternative=alt, correlation=False, alpha=ALPHA)
        adj = inference.holm({k: v["p_t"] for k, v in tests.items()})
        for k, v in tests.items():
            v["p_holm"] = adj[k]
            v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
        null_tests = {}
        for t in TYPES.values():
            va = [_get(per_seed[s][field], frac, "main", "real", "full", t) for s in seeds]
            vb = [_get(per_seed[s][field], frac, "main", "random", "full", t) for s in seeds]
            nt = inference.paired_test(va, vb, alternative="greater", correlation=False, alpha=ALPHA)
            nt["holds"] = nt["p_t"] is not None and nt["p_t"] < ALPHA
            null_tests[f"combined, {t}: real probe > random directions"] = nt
        out[frac] = {"influence": table, "tests": tests, "null_tests": null_tests}
    return out


def _snapshots_across_seeds(config: OthelloConfig, per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per snapshot step: the models' quality there (eval loss, legal-move accuracy over seeds), the
    influence rates and the paper's pattern tested over seeds (Holm within each snapshot)."""
    labels = [str(c) for c in config.snapshot_starts]
    if not labels:
        return {}
    rates = across_seeds(per_seed, [], config.confidence, field="snapshots", labels=labels)
    out = {}
    for c in labels:
        ev = [per_seed[s]["snapshot_eval"][c] for s in sorted(per_seed)]
        out[c] = {
            "updates": [int(c) + 1, int(c) + config.snapshot_window],
            "eval": {
                "legal_acc": inference.mean_ci([e.get("legal_acc") for e in ev], config.confidence, bounds=(0, 1)),
                "eval_loss": inference.mean_ci([e.get("eval_loss") for e in ev], config.confidence),
            },
            **rates[c],
        }
    return out
