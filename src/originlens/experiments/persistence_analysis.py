"""The numbers of the persistence experiment (:mod:`.persistence`): what one (η, seed) run contributes,
read back from its per-step cosines and losses (:func:`run_summary`), and per η and weight type the
Fisher-z intervals over seeds, the horizons and the tests of the leading term against each null
(:func:`across_seeds`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..storage import read_json
from . import inference
from .persistence_cosines import KINDS, NULLS, THRESHOLDS, horizon

if TYPE_CHECKING:
    from .persistence_config import PersistenceConfig

ALPHA = 0.05


def run_summary(run_dir: Path, config: PersistenceConfig, lr: float) -> dict[str, Any]:
    """Everything one run contributes, read back from its metrics."""
    import json

    from ..theory.leading_terms import validity_window

    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    cos = {int(r["step"]): r for r in recs if r.get("event") == "cosines"}
    losses = {int(r["step"]): float(r["loss"]) for r in recs if r.get("event") == "step"}
    s = config.settings
    steps = s["steps"]
    if len(cos) != steps:
        raise InputError(f"{run_dir} has cosines for {len(cos)} of {steps} steps", "rerun the experiment (it resumes)")
    points = config.logging_points
    out: dict[str, Any] = {"lr": lr, "steps": steps, "t": steps * lr}
    for which in ("lt", *NULLS):
        per: dict[str, Any] = {}
        for k in KINDS:
            series = [(st, cos[st].get(which, {}).get(k)) for st in sorted(cos)]
            defined = [c for _, c in series if c is not None]
            logged = [cos[p].get(which, {}).get(k) for p in points]
            logged = [c for c in logged if c is not None]
            per[k] = {
                "min_logged": min(logged) if logged else None,
                "min_all": min(defined) if defined else None,
                "argmin_all": min(((c, st) for st, c in series if c is not None), default=(None, None))[1],
                "epoch30": cos[config.epoch30_step].get(which, {}).get(k),
                "final": cos[steps].get(which, {}).get(k),
            }
            if which == "lt":
                per[k]["horizon"] = {f"{th:g}": horizon(series, th) for th in THRESHOLDS}
                per[k]["first_defined"] = next((st for st, c in series if c is not None), None)
        out[which] = per
    out["curve"] = {
        "steps": points,
        **{k: [cos[p]["lt"].get(k) for p in points] for k in KINDS},
        "loss": [losses.get(p) for p in points],
    }
    first, last = losses.get(1), losses.get(steps)
    tail = [losses[st] for st in sorted(losses) if st > 0.9 * steps]
    out["loss"] = {
        "first": first,
        "final": last,
        "tail_rel_slope": (tail[0] - tail[-1]) / tail[0] if len(tail) > 1 and tail[0] else None,
    }
    w = validity_window(s["seq_len"], s["layers"], lr, s["vocab_size"])
    out["window_s_max"] = float(w.s_max)
    out["windows_covered"] = steps / float(w.s_max) if w.s_max > 0 else None
    env = read_json(run_dir / "environment.json") if (run_dir / "environment.json").is_file() else {}
    out["data_hashes"] = env.get("data_hashes", {})
    return out


# ----------------------------------------------------------------------------------------------------
# across seeds


def _corr(vals: list[Any], confidence: float) -> dict[str, Any]:
    return inference.correlation_ci([v for v in vals if v is not None], confidence)


def across_seeds(runs: dict[float, dict[int, dict[str, Any]]], config: PersistenceConfig) -> dict[str, Any]:
    """Per η and weight type: Fisher-z intervals over seeds, the horizons, the nulls and their tests."""
    out: dict[str, Any] = {}
    conf = config.confidence
    for lr, by_seed in runs.items():
        seeds = sorted(by_seed)
        rec: dict[str, Any] = {
            "t": by_seed[seeds[0]]["t"],
            "steps": by_seed[seeds[0]]["steps"],
            "windows_covered": by_seed[seeds[0]]["windows_covered"],
        }
        for k in KINDS:
            g = lambda which, key: [by_seed[s][which][k][key] for s in seeds]  # noqa: B023 (used in this iteration)
            kr: dict[str, Any] = {m: _corr(g("lt", m), conf) for m in ("min_logged", "min_all", "epoch30", "final")}
            kr["horizon"] = {
                th: inference.mean_ci([by_seed[s]["lt"][k]["horizon"][th] for s in seeds], conf)
                for th in (f"{x:g}" for x in THRESHOLDS)
            }
            kr["horizon_never"] = {
                th: sum(by_seed[s]["lt"][k]["horizon"][th] is None for s in seeds)
                for th in (f"{x:g}" for x in THRESHOLDS)
            }
            kr["nulls"] = {}
            for null in NULLS:
                if any(by_seed[s].get(null, {}).get(k, {}).get("final") is None for s in seeds):
                    continue
                kr["nulls"][null] = {
                    "final": _corr(g(null, "final"), conf),
                    "min_logged": _corr(g(null, "min_logged"), conf),
                    "test_final": inference.paired_test(
                        g("lt", "final"), g(null, "final"), alternative="greater", alpha=ALPHA
                    ),
                }
            rec[k] = kr
        rec["loss"] = {
            m: inference.mean_ci([by_seed[s]["loss"][m] for s in seeds], conf)
            for m in ("first", "final", "tail_rel_slope")
        }
        rec["seconds"] = inference.mean_ci([by_seed[s]["seconds"] for s in seeds], conf)
        out[f"{lr:g}"] = rec
    return out
