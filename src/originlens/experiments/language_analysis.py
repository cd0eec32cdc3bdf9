"""The numbers of the TinyStories experiment (:mod:`.language`): the feature groups (:func:`probe_group`,
:func:`influence_group`), what each finished (regime, seed) run measures (probe quality per group,
:func:`probe_quality`; integrated influence per group and component with the pre-cached share,
:func:`influence_by_group`, :func:`run_influence`), and their aggregation over seeds with the paper's claims
tested as hypotheses (:data:`TESTS`, :func:`summarise`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import inference
from .language_runs import run_dirs

if TYPE_CHECKING:
    from .language_config import LanguageExperimentConfig

COMPONENTS = ("direct", "precached", "shared", "full")
PROBE_GROUPS = ("tags", "deps", "position")
INFLUENCE_GROUPS = ("syntax", "position")
POSITION_FEATURES = ("pos_int", "pos_prop")
ALPHA = 0.05

LOSS_TEST = "myopic > standard (held-out loss)"
SYNTAX_TEST = "syntax: direct > precached"
SHARE_TEST = "precached share: position > syntax"
TESTS = {
    LOSS_TEST: "myopic training costs language-modelling loss (paper: 3.29 ± 0.02 myopic vs 2.53 ± 0.10 "
    "standard, their tokenizer)",
    SYNTAX_TEST: "syntax features are built directly: direct > pre-cached influence (standard training)",
    SHARE_TEST: "story-position features lean on pre-caching: their pre-cached share exceeds the syntax "
    "features' (standard training)",
}


def probe_group(feature: str) -> str | None:
    """``tags`` / ``deps`` / ``position`` for the task's features (None for anything else, e.g. the
    ``f~random{j}`` null directions of an attribution store)."""
    if "~" in feature:
        return None
    if feature.startswith("tag_"):
        return "tags"
    if feature.startswith("dep_"):
        return "deps"
    return "position" if feature in POSITION_FEATURES else None


def influence_group(feature: str) -> str | None:
    """``syntax`` (tags and dependency labels) / ``position`` / None."""
    g = probe_group(feature)
    return "syntax" if g in ("tags", "deps") else g


# ----------------------------------------------------------------------------------------------------
# per-run measurements


def probe_quality(run_dir: str | Path, layers: Sequence[int], positions: Sequence[int]) -> dict[str, Any]:
    """Mean test Pearson r of a finished run's final probes over ``layers`` × ``positions``: per feature
    group (:data:`PROBE_GROUPS`, groups the run lacks are left out) and per feature."""
    from ..train.ntp import load_probe_metrics, tracked_quality

    pm = load_probe_metrics(Path(run_dir) / "probe_metrics.npz")
    groups: dict[str, list[str]] = {}
    for f in pm.feature_names:
        g = probe_group(f)
        if g is not None:
            groups.setdefault(g, []).append(f)
    return {
        "groups": {
            g: tracked_quality(pm, layers, positions, groups[g])["pearson"] for g in PROBE_GROUPS if g in groups
        },
        "features": {f: tracked_quality(pm, layers, positions, [f])["pearson"] for f in pm.feature_names},
    }


def influence_by_group(integrated_rows: Sequence[dict[str, Any]], n_layer: int) -> dict[str, Any]:
    """Per-run aggregation of integrated influences (rows of
    :func:`originlens.attribution.store.integrate`, all-rows type only) by feature group and component.

    Returns ``influence[group][component]`` (mean over items; ``precached`` over layers k < L only),
    ``below_last`` (every component over k < L), ``last_layer`` (every component at k = L),
    ``precached_share[group]`` = ``pre / (|dir| + |pre| + |sh|)`` of the ``below_last`` means, and the item
    counts; None where a group has no items (or, for the share, a zero denominator).  ``by_feature``:
    the same means per feature (``precached`` over k < L).
    """
    cells: dict[tuple[str, str, str], list[float]] = {}
    per_feature: dict[tuple[str, str], list[float]] = {}
    for r in integrated_rows:
        f = str(r["feature"])
        g = influence_group(f)
        if g is None or r.get("type") is not None or r.get("integrated") is None or r["component"] not in COMPONENTS:
            continue
        k = int(r["site_layer"])
        for part in ("all", "below" if k < n_layer else "last"):
            cells.setdefault((g, r["component"], part), []).append(float(r["integrated"]))
        if r["component"] != "precached" or k < n_layer:
            per_feature.setdefault((f, r["component"]), []).append(float(r["integrated"]))

    def mean(g: str, c: str, part: str) -> float | None:
        v = cells.get((g, c, part))
        return float(sum(v) / len(v)) if v else None

    out: dict[str, Any] = {
        "influence": {},
        "below_last": {},
        "last_layer": {},
        "precached_share": {},
        "n_items": {},
        "by_feature": {},
    }
    for (f, comp), v in sorted(per_feature.items()):
        out["by_feature"].setdefault(f, {})[comp] = float(sum(v) / len(v))
    for g in INFLUENCE_GROUPS:
        if not any(key[0] == g for key in cells):
            continue
        out["influence"][g] = {c: mean(g, c, "below" if c == "precached" else "all") for c in COMPONENTS}
        out["below_last"][g] = {c: mean(g, c, "below") for c in COMPONENTS}
        out["last_layer"][g] = {c: mean(g, c, "last") for c in COMPONENTS}
        b = out["below_last"][g]
        share = None
        if all(b[c] is not None for c in ("direct", "precached", "shared")):
            den = abs(b["direct"]) + abs(b["precached"]) + abs(b["shared"])
            share = b["precached"] / den if den > 0 else None
        out["precached_share"][g] = share
        out["n_items"][g] = {part: len(cells.get((g, "direct", part), [])) for part in ("all", "below", "last")}
    return out


def run_influence(run_dir: str | Path, n_layer: int) -> dict[str, Any]:
    """:func:`influence_by_group` of the attribution store ``RUN/attribution`` plus its replay checks."""
    from ..attribution.store import integrate, load_observables, read_segment_infos

    store = Path(run_dir) / "attribution"
    agg = influence_by_group(integrate(load_observables(store)).to_pylist(), n_layer)
    infos = read_segment_infos(store)
    agg["updates"] = [1, max(int(i["end"]) for i in infos)]
    agg["checks"] = [i.get("checks") for i in infos]
    agg["seconds"] = sum(float(i.get("seconds") or 0.0) for i in infos)
    return agg


def _per_run(config: LanguageExperimentConfig, out: Path, regime: str, seed: int) -> dict[str, Any]:
    from ..storage import read_json

    d, d0 = run_dirs(out, regime, seed)
    cfg = config.run_config(regime, seed, initial=False)
    layers = list(range(1, cfg.n_layer + 1))
    s, s0 = read_json(d / "summary.json"), read_json(d0 / "summary.json")
    env = read_json(d / "environment.json")
    q, q0 = probe_quality(d, layers, config.probe_positions), probe_quality(d0, layers, config.probe_positions)
    ev, ev0 = s.get("final_eval", {}), s0.get("final_eval", {})
    rec = {
        "regime": regime,
        "seed": seed,
        "eval_loss": ev.get("eval_loss"),
        "next_token_acc": ev.get("legal_acc"),
        "initial_eval_loss": ev0.get("eval_loss"),
        "probe": q["groups"],
        "initial_probe": q0["groups"],
        "probe_by_feature": q["features"],
        "seconds": s.get("seconds"),
        "num_params": s.get("num_params"),
        "data_hashes": env.get("data_hashes", {}),
        "attribution": None,
    }
    if regime in (config.attribute_regimes or []):
        rec["attribution"] = run_influence(d, cfg.n_layer)
    return rec


# ----------------------------------------------------------------------------------------------------
# aggregation over seeds


def _mean_ci_of(runs: list[dict[str, Any]], get: Any, confidence: float) -> dict[str, Any]:
    vals = []
    for r in runs:
        try:
            vals.append(get(r))
        except (KeyError, TypeError):
            vals.append(None)
    return inference.mean_ci(vals, confidence)


def _get(d: Any, *keys: Any) -> Any:
    for k in keys:
        if d is None:
            return None
        d = d.get(k)
    return d


def summarise(config: LanguageExperimentConfig, out: str | Path) -> dict[str, Any]:
    """Per-run values, per-regime CIs over seeds and the hypothesis tests of the finished runs under ``out``."""
    out = Path(out)
    c = config.confidence
    runs = [_per_run(config, out, r, s) for r in config.regimes for s in config.seeds]
    by = {(r["regime"], r["seed"]): r for r in runs}
    per_regime: dict[str, Any] = {}
    influence: dict[str, Any] = {}
    for regime in config.regimes:
        rr = [by[(regime, s)] for s in config.seeds]
        groups = [g for g in PROBE_GROUPS if any(g in r["probe"] for r in rr)]
        per_regime[regime] = {
            "eval_loss": inference.mean_ci([r["eval_loss"] for r in rr], c),
            "eval_loss_bootstrap": inference.bootstrap_ci([r["eval_loss"] for r in rr], c),
            "initial_eval_loss": inference.mean_ci([r["initial_eval_loss"] for r in rr], c),
            "next_token_acc": inference.mean_ci([r["next_token_acc"] for r in rr], c),
            "seconds": inference.mean_ci([r["seconds"] for r in rr], c),
            "probe": {g: inference.correlation_ci([r["probe"].get(g) for r in rr], c) for g in groups},
            "initial_probe": {g: inference.correlation_ci([r["initial_probe"].get(g) for r in rr], c) for g in groups},
            "probe_gain": {
                g: inference.paired_test(
                    [r["probe"].get(g) for r in rr],
                    [r["initial_probe"].get(g) for r in rr],
                    alternative="greater",
                    alpha=ALPHA,
                    confidence=c,
                )
                for g in groups
            },
        }
        if regime in (config.attribute_regimes or []):
            att = [r["attribution"] for r in rr]
            gs = [g for g in INFLUENCE_GROUPS if any(g in a["influence"] for a in att)]
            influence[regime] = {
                part: {
                    g: {
                        comp: _mean_ci_of(att, lambda a, p=part, g=g, comp=comp: a[p][g][comp], c)
                        for comp in COMPONENTS
                    }
                    for g in gs
                }
                for part in ("influence", "below_last", "last_layer")
            }
            influence[regime]["precached_share"] = {
                g: _mean_ci_of(att, lambda a, g=g: a["precached_share"][g], c) for g in gs
            }
            influence[regime]["updates"] = att[0]["updates"]
            influence[regime]["n_items"] = att[0]["n_items"]
    tests: dict[str, Any] = {
        "loss": {},
        "features": {},
        "alpha": ALPHA,
        "expected": dict(TESTS),
        "method": "one-sided paired t-test over seeds on the raw values (paired by seed); "
        "Holm over the feature family; exact Wilcoxon beside it",
    }
    if "standard" in config.regimes and "myopic" in config.regimes:
        t = inference.paired_test(
            [by[("myopic", s)]["eval_loss"] for s in config.seeds],
            [by[("standard", s)]["eval_loss"] for s in config.seeds],
            alternative="greater",
            correlation=False,
            alpha=ALPHA,
            confidence=c,
        )
        t["p_holm"] = t["p_t"]
        t["holds"] = t["p_t"] is not None and t["p_t"] < ALPHA
        tests["loss"][LOSS_TEST] = t
    if "standard" in influence:
        att = [by[("standard", s)]["attribution"] for s in config.seeds]
        fam = {
            SYNTAX_TEST: (
                [_get(a, "influence", "syntax", "direct") for a in att],
                [_get(a, "influence", "syntax", "precached") for a in att],
            ),
            SHARE_TEST: (
                [_get(a, "precached_share", "position") for a in att],
                [_get(a, "precached_share", "syntax") for a in att],
            ),
        }
        for k, (a, b) in fam.items():
            tests["features"][k] = inference.paired_test(
                a, b, alternative="greater", correlation=False, alpha=ALPHA, confidence=c
            )
        adj = inference.holm({k: v["p_t"] for k, v in tests["features"].items()})
        for k, v in tests["features"].items():
            v["p_holm"] = adj[k]
            v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
    hashes: dict[str, Any] = {f"{r['regime']}/seed-{r['seed']}": r["data_hashes"] for r in runs}
    hashes["tinystories"] = _task_hashes(config)
    return {
        "scale": config.scale,
        "per_regime": per_regime,
        "influence": influence,
        "tests": tests,
        "runs": runs,
        "data_hashes": hashes,
    }


def _task_hashes(config: LanguageExperimentConfig) -> dict[str, Any]:
    """The tokenisation and syntax cache keys (they hash the data files, the BPE and the annotator) and
    the SHA-256 of every story file."""
    task = config.make_task()
    m = task.data.manifest
    return {
        "tokenisation_key": m["key"],
        "files": m["key_material"]["data"],
        "syntax_key": task.syntax.manifest["key"],
        "annotator": f"{task.syntax.manifest['key_material']['annotator']} "
        f"{task.syntax.manifest['key_material']['annotator_version']}",
    }
