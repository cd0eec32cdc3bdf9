"""The paper's Othello influence integrated over all of training, estimated from strata (:mod:`.othello`).

The Adam-variant influence of arXiv 2603.14087 is a sum over every update of training; computing it at
every update needs a decomposition at each (≈ 10 training steps each at the CPU scale), so the CPU scale
*samples* it.  Training (updates 1..S) is cut into ``strata`` equal strata of N = S / strata updates.  In
stratum h (updates hN+1..(h+1)N) one segment is replayed from a training checkpoint c inside the stratum
(model **and** Adam state restored):

* ``burn_in`` decomposed updates c+1..c+b whose influences are not recorded: the component moments start
  at 0 at c, and the optimizer's first moment at c is carried as its own decaying component
  (``"carried"``, :class:`~originlens.attribution.steps.AdamAttributor` with ``carry=True``), so direct +
  pre-cached + shared + carried is the real Adam update to round-off at every update, and the carried
  share is ≈ β1ᵇ by the first recorded update (0.9⁵⁰ ≈ 0.5 %);
* ``stratum_updates`` recorded updates c+b+1..c+b+n: their influences, summed, estimate the stratum's
  integral as (N / n) × the sum.

The segment's checkpoint c is drawn per (seed, stratum) among the checkpoints whose segment fits in the
stratum (:func:`stratum_segment`, ``default_rng([seed, 38, h])``), so that the seeds sample different
parts of each stratum and the spread over seeds — the interval every table reports — contains the
sampling error of the estimate, not only the seed-to-seed variation.  The estimate of a seed's integral is
the stratified sum Σ_h (N / n) S_h; :func:`integral` also gives its collapsed-strata standard error
(adjacent strata paired, Σ_pairs (T_a − T_b)², the standard estimator for one sample per stratum), reported
beside the over-seed interval.

One stratum of one seed is a unit (:func:`stratum_unit`, ≈ 10 minutes on one core at the CPU scale): its
record holds the per-item sums of the recorded updates (per layer, position, cell, component and type, for
the real probes and for the mean of the item's random directions), the learning curve at the stratum's start (held-out loss,
legal-move accuracy, probe r per layer at the grid point hN and at the segment's checkpoint c), the
initial mismatch R(θ₀) per item (stratum 0; the influence's natural unit), and the checks (the replay's
bit-exact loss and checkpoint checks, Σ_c Δ_c against the real update, the carried share).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InputError
from .othello_config import stratum_bounds, stratum_segment
from .records import record_path

if TYPE_CHECKING:
    from .othello_config import OthelloConfig

STRATA_STORE = "attribution-strata"  # RUN/attribution-strata: every stratum's segment of one seed
CHECK_STORE = "attribution-check"  # RUN/attribution-check: the estimator check's contiguous replay
R0_BATCHES = 8  # training batches at θ₀ on which the initial mismatch R(θ₀) is measured
TYPES = {1: "useless", 2: "useful"}
ITEM_COMPONENTS = ("direct", "precached", "shared", "carried", "full")


def stratum_record_path(results_path: str | Path, seed: int, h: int) -> Path:
    """``results/othello/othello-cpu/stratum-<seed>-<h>.json``."""
    return record_path(results_path, f"stratum-{int(seed)}-{int(h)}")


def mismatch_record_path(results_path: str | Path, seed: int) -> Path:
    """Where the initial-mismatch record of ``seed`` lives."""
    return record_path(results_path, f"mismatch-{int(seed)}")


def check_record_path(results_path: str | Path, seed: int) -> Path:
    """``results/othello/othello-cpu/check-<seed>.json``: the estimator check of one seed."""
    return record_path(results_path, f"check-{int(seed)}")


# ----------------------------------------------------------------------------------------------------
# the learning curve at a checkpoint


def curve_point(run: Any, step: int, positions: list[int]) -> dict[str, Any]:
    """Held-out loss, legal-move accuracy and probe r per layer (overall and per feature type, the 16
    central cells at ``positions``) of the model at checkpoint ``step`` of an open
    :class:`~originlens.attribution.run.RunReplay` (step 0: the initialisation)."""
    from ..tasks.othello import CENTRAL_CELLS
    from ..train.ntp import tracked_quality

    got = run.restore(step)
    if got != step:
        raise InputError(f"{run.path} has no checkpoint at update {step} (nearest below: {got})", "retrain it")
    record, pm = run.trainer.measure(probe=True)
    probes = {}
    if pm is not None:
        probes = {str(k): tracked_quality(pm, [k], positions, CENTRAL_CELLS) for k in pm.layers if k > 0}
    return {
        "step": int(step),
        "eval_loss": record.get("eval_loss"),
        "legal_acc": record.get("legal_acc"),
        "probes": probes,
    }


# ----------------------------------------------------------------------------------------------------
# one stratum


def replay_threads(run_dir: Path, device: str) -> None:
    """On the CPU, replay with the torch thread count the run was trained with (its ``environment.json``):
    the replay's bit-exact checks hold only then."""
    import torch

    from ..progress import log
    from ..storage import read_json

    env = run_dir / "environment.json"
    threads = read_json(env).get("torch_threads") if env.is_file() else None
    if device == "cpu" and threads is not None and int(threads) != torch.get_num_threads():
        log(f"[othello] replaying {run_dir} with {threads} torch thread(s), as it was trained", level=1)
        torch.set_num_threads(int(threads))


def item_sums(table: Any, n_layer: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Per-item sums over the recorded updates, "k.i.cell" → component → type: the real probes', and the
    random directions' (the mean over an item's random directions).  A type absent from every recorded
    batch of the item has no entry (it is not an item of that type here)."""
    from ..attribution.store import RANDOM_TAG, integrate

    items: dict[str, Any] = {}
    random: dict[str, dict[str, dict[str, list[float]]]] = {}
    for r in integrate(table).to_pylist():
        if r["type"] not in TYPES:
            continue
        value = 0.0 if r["integrated"] is None else float(r["integrated"])
        t = TYPES[r["type"]]
        base = r["feature"].split(RANDOM_TAG)[0]
        key = f"{r['site_layer']}.{r['site_position']}.{base}"
        if RANDOM_TAG in r["feature"]:
            random.setdefault(key, {}).setdefault(r["component"], {}).setdefault(t, []).append(value)
        else:
            items.setdefault(key, {}).setdefault(r["component"], {})[t] = value
    rand = {
        k: {c: {t: float(np.mean(v)) for t, v in ts.items()} for c, ts in comps.items()} for k, comps in random.items()
    }
    return items, rand


def initial_mismatch(
    run: Any, sites: list[tuple[int, int]], features: list[str], *, random_directions: int = 0
) -> dict[str, dict[str, dict[str, float]]]:
    """R(θ₀) per item ("k.i.cell") and type, for the real probes (``"real"``) and for their
    ``random_directions`` null directions (``"random"``, pooled over the directions of an item: the mean of
    their R(θ₀)): the mean squared distance of ⟨w, r⟩ from its final value over the rows of that type in
    the first :data:`R0_BATCHES` training batches, at the initialisation (the paper's factor 1)."""
    import torch

    from ..attribution.influence import projections
    from ..attribution.store import RANDOM_TAG

    run.restore(0)
    probes, feature_of, base_of = run.make_probes(sites, features, random_directions=random_directions)
    fidx = {f: run.feature_names.index(f) for f in features}
    sums: dict[tuple[str, str, int], list[float]] = {}
    for b in range(R0_BATCHES):
        x = run.batch(b)
        cur = projections(run.model, x, probes)
        ref = projections(run.final_model, x, probes)
        ft = run.feature_types(x)
        for p in probes:
            d = (cur[p.name] - ref[p.name]).double()
            ty = torch.from_numpy(ft[:, p.position, fidx[base_of[p.name]]].astype(np.int64))
            kind = "random" if RANDOM_TAG in feature_of[p.name] else "real"
            for tau in TYPES:
                rows = d[ty == tau]
                acc = sums.setdefault((kind, f"{p.layer}.{p.position}.{base_of[p.name]}", tau), [0.0, 0.0])
                acc[0] += float(rows.pow(2).sum())
                acc[1] += int(rows.numel())
    out: dict[str, dict[str, dict[str, float]]] = {"real": {}, "random": {}}
    for (kind, key, tau), (total, n) in sums.items():
        if n:
            out[kind].setdefault(key, {})[TYPES[tau]] = total / n
    return out


def mismatch_unit(config: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    """The ``mismatch`` stage's values for ``seed``: R(θ₀) of every real item and of its random directions
    (:func:`initial_mismatch`, at every attributed site), so that the influence on a real probe and on a
    random direction can each be read as a fraction of its own initial mismatch."""
    from ..attribution.run import RunReplay

    run_dir = Path(out) / f"seed-{int(seed)}" / "run"
    s = config.settings
    sites = [(k, i) for k in config.attr_layers for i in sorted(s["positions"])]
    t0 = time.time()
    replay_threads(run_dir, config.device)
    run = RunReplay(run_dir, device=config.device)
    feats = [f for f in run.task.tracked.features if f in run.probes.feature_names]
    r0 = initial_mismatch(run, sites, feats, random_directions=config.random_directions)
    return {
        "seed": int(seed),
        "batches": R0_BATCHES,
        "random_directions": config.random_directions,
        **r0,
        "seconds": time.time() - t0,
    }


def stratum_unit(config: OthelloConfig, seed: int, h: int, out: Path) -> dict[str, Any]:
    """Attribute stratum h of ``seed`` (its run at ``out/seed-<seed>/run``, trained by the training stage)
    and return the stratum record's values (module docstring)."""
    from ..attribution.replay import attribute_run
    from ..attribution.run import RunReplay
    from ..attribution.store import read_segment, segment_path

    run_dir = Path(out) / f"seed-{int(seed)}" / "run"
    s = config.settings
    L = int(s["n_layer"])
    positions = sorted(s["positions"])
    sites = [(k, i) for k in config.attr_layers for i in positions]
    lo, hi = stratum_bounds(config, h)
    start, end, recorded = stratum_segment(config, seed, h)
    t0 = time.time()
    replay_threads(run_dir, config.device)
    run = RunReplay(run_dir, device=config.device)
    feats = [f for f in run.task.tracked.features if f in run.probes.feature_names]
    curve = {
        "grid": curve_point(run, lo, positions) if lo != start else None,
        "start": curve_point(run, start, positions),
    }
    if curve["grid"] is None:
        curve["grid"] = curve["start"]
    del run
    t_curve = time.time()
    store = run_dir / STRATA_STORE
    seg = segment_path(store, start, end)
    if seg.is_file():  # a unit interrupted after its segment: the segment is reused, not recomputed
        table, info = read_segment(seg)
    else:
        res = attribute_run(
            run_dir,
            sites=sites,
            features=feats,
            optimizer="adam",
            segment=(start, end),
            types=True,
            half=False,
            out=store,
            random_directions=config.random_directions,
            steps=recorded,
            verify="segment",
            replay_rtol=config.replay_rtol,
            carry=True,
        )
        table, info = res.table, res.info
    items, random = item_sums(table, L)
    checks = info["checks"]
    return {
        "seed": int(seed),
        "stratum": int(h),
        "bounds": [lo, hi],
        "segment": [start, end],
        "recorded": [recorded[0], recorded[-1]],
        "weight": (hi - lo) / len(recorded),
        "items": items,
        "random": random,
        "curve": curve,
        "checks": {
            "losses_checked": checks["losses_checked"],
            "checkpoints_verified": checks["checkpoints_verified"],
            "adam_sum_max_rel_err": checks["adam_sum_max_rel_err"],
            "max_grad_rel_diff": checks["max_grad_rel_diff"],
            "carried_share": checks.get("carried_share"),
        },
        "seconds": {"curve": t_curve - t0, "attribution": time.time() - t_curve},
        "torch_threads": info.get("torch_threads"),
    }


def stratum_key(config: OthelloConfig) -> dict[str, Any]:
    """What must agree between stratum records: the training's key and the attribution's settings."""
    from .othello_seeds import train_key as _train_key

    s = config.settings
    return {
        **_train_key(config),
        "attribution": {
            "layers": config.attr_layers,
            "random_directions": config.random_directions,
            **{k: s[k] for k in ("strata", "burn_in", "stratum_updates", "checkpoint_every")},
        },
    }


def check_key(config: OthelloConfig) -> dict[str, Any]:
    s = config.settings
    return {**stratum_key(config), "check": {k: s[k] for k in ("check_updates", "check_positions")}}
