"""The estimator check of the Othello experiment (:mod:`.othello`, stage ``check``): does the stratified
sample of :mod:`.othello_strata` estimate the integral it stands for?

On one seed, at the check's sites (all attributed layers × ``check_positions``), the first
``check_updates`` updates are attributed contiguously from update 1 — every update decomposed and recorded,
no carried moment: the exact integral of that range.  The same range is then cut into sub-strata of
``checkpoint_every`` updates and sampled the strata's way (from each sub-stratum's checkpoint a carried
segment of ``burn_in`` + ``stratum_updates`` updates, the recorded sum scaled to the sub-stratum's
length).  Reported (:func:`check_summary`):

* **exactness of the burn-in**: at every update both replays record, the carried segment's combined
  influence (direct + pre-cached + shared + carried) against the contiguous replay's (equal to round-off),
  and the carried part's share;
* **the estimator**: per component and type, the mean over items of the stratified estimate against the
  exact integral (relative error), and the correlation over items of the two.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .othello_strata import CHECK_STORE, TYPES, item_sums, replay_threads

if TYPE_CHECKING:
    from .othello_config import OthelloConfig

CHECK_STRATA_STORE = "attribution-check-strata"


def check_substrata(config: OthelloConfig) -> list[tuple[int, int, int, list[int]]]:
    """(lo, hi, start, recorded) of every sub-stratum of updates 1..check_updates."""
    s = config.settings
    U, every = int(s["check_updates"]), int(s["checkpoint_every"])
    b, n = int(s["burn_in"]), int(s["stratum_updates"])
    if every < b + n or U // every < 2:
        raise ConfigError(
            f"the check's sub-strata of {every} updates (checkpoint_every) cannot hold {b + n}-update segments "
            f"twice within {U} updates",
            "raise check_updates or checkpoint_every",
        )
    out = []
    for j in range(U // every):
        lo = j * every
        out.append((lo, lo + every, lo, list(range(lo + b + 1, lo + b + n + 1))))
    return out


def check_unit(config: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    """The check's values: exact per-item sums of the contiguous range, the sub-strata's per-item sums and
    weights, and per update the combined influence of both replays where they overlap."""
    from ..attribution.replay import attribute_run
    from ..attribution.run import RunReplay

    s = config.settings
    run_dir = Path(out) / f"seed-{int(seed)}" / "run"
    replay_threads(run_dir, config.device)
    L = int(s["n_layer"])
    U = int(s["check_updates"])
    sites = [(k, i) for k in config.attr_layers for i in sorted(s["check_positions"])]
    feats = [f for f in RunReplay(run_dir, device=config.device).task.tracked.features]
    common: dict[str, Any] = dict(
        sites=sites, features=feats, optimizer="adam", types=True, half=False, replay_rtol=config.replay_rtol
    )
    t0 = time.time()
    whole = attribute_run(
        run_dir, segment=(0, U), out=run_dir / CHECK_STORE, overwrite=True, verify="segment", **common
    )
    t1 = time.time()
    exact, _ = item_sums(whole.table, L)
    subs = []
    overlap = []
    for lo, hi, start, recorded in check_substrata(config):
        seg = attribute_run(
            run_dir,
            segment=(start, recorded[-1]),
            steps=recorded,
            out=run_dir / CHECK_STRATA_STORE,
            overwrite=True,
            verify="segment",
            carry=True,
            **common,
        )
        items, _ = item_sums(seg.table, L)
        subs.append(
            {
                "bounds": [lo, hi],
                "recorded": [recorded[0], recorded[-1]],
                "weight": (hi - lo) / len(recorded),
                "items": items,
            }
        )
        overlap.append(_overlap(whole.table, seg.table, recorded))
    return {
        "seed": int(seed),
        "updates": U,
        "sites": [list(x) for x in sites],
        "exact": exact,
        "substrata": subs,
        "overlap": overlap,
        "seconds": {"contiguous": t1 - t0, "substrata": time.time() - t1},
    }


def _overlap(whole: Any, seg: Any, recorded: list[int]) -> dict[str, Any]:
    """At the updates both replays recorded: the largest difference of the combined influence relative to
    the largest combined influence (over items, types and updates), and the carried part's share
    Σ|carried| / Σ|combined| over them."""

    def index(table: Any) -> dict[tuple, float]:
        return {
            (r["step"], r["site_layer"], r["site_position"], r["feature"], r["type"], r["component"]): r["influence"]
            for r in table.to_pylist()
            if r["influence"] is not None and r["step"] in set(recorded)
        }

    a, b = index(whole), index(seg)
    worst, scale = 0.0, max((abs(v) for k, v in a.items() if k[-1] == "full"), default=0.0)
    carried = combined = 0.0
    for k, v in b.items():
        if k[-1] == "full" and k in a:
            worst = max(worst, abs(v - a[k]) / max(scale, 1e-300))
            combined += abs(v)
        if k[-1] == "carried":
            carried += abs(v)
    share = carried / combined if combined > 0 else 0.0
    return {"updates": [recorded[0], recorded[-1]], "full_max_rel_diff": worst, "carried_share": share}


def check_summary(values: dict[str, Any]) -> dict[str, Any]:
    """Per component and type (main items: k < L): the exact mean integral over items, the stratified
    estimate, their relative difference and the correlation over items; and the burn-in's exactness."""
    L = max(int(k) for k, _ in values["sites"])
    keys = [k for k in values["exact"] if int(k.split(".")[0]) < L]
    out: dict[str, Any] = {"updates": values["updates"], "n_items": len(keys), "components": {}}
    for c in ("direct", "precached", "shared", "full"):
        for t in TYPES.values():
            exact, est = [], []
            for k in keys:
                e = values["exact"][k].get(c, {}).get(t)
                if e is None:
                    continue
                estimate = sum(
                    sub["weight"] * sub["items"].get(k, {}).get(c, {}).get(t, 0.0) for sub in values["substrata"]
                )
                exact.append(float(e))
                est.append(float(estimate))
            if not exact:
                continue
            me, ms = float(np.mean(exact)), float(np.mean(est))
            r = (
                float(np.corrcoef(exact, est)[0, 1])
                if len(exact) > 2 and np.std(exact) > 0 and np.std(est) > 0
                else None
            )
            out["components"].setdefault(c, {})[t] = {
                "exact": me,
                "stratified": ms,
                "rel_error": abs(ms - me) / abs(me) if me else None,
                "item_r": r,
            }
    ov = values["overlap"]
    out["burn_in"] = {
        "full_max_rel_diff": max(o["full_max_rel_diff"] for o in ov),
        "carried_max_share": max(o["carried_share"] for o in ov),
    }
    out["sampled_fraction"] = (
        sum(len(range(s["recorded"][0], s["recorded"][1] + 1)) for s in values["substrata"]) / values["updates"]
    )
    out["seconds"] = values["seconds"]
    if any(v is not None and not math.isfinite(v) for v in out["burn_in"].values()):
        out["burn_in"]["note"] = "non-finite"
    return out
