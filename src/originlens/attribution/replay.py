"""Optimizer-aware attribution and influence over a saved training run: replay, not retrain.

``attribute_run(RUN, sites=[(k, i), ...], features=[...], segment=(start, end))`` reconstructs the
trajectory of an ``originlens ntp train`` run from its checkpoints and its recorded data order and, for
every update s = start+1 .. end (observables at θ_{s−1} on batch b = s−1, before the update):

1. decomposes ∇L at the requested sites (:func:`~.decompose.decompose`, fast path);
2. re-runs the trainer's own step (``model.loss`` → ``backward`` → ``Adam.step``, same kernels, same
   batch) — so the trajectory is the training run's, bit for bit on CPU;
3. attributes the step to the components: ``"adam"`` — :class:`~.steps.AdamAttributor` (per-component
   first moments, the optimizer's real second moment; Σ_c Δ_c equals the real Adam update, asserted
   every step), ``"sgd"`` — Δ_c = lr · G_c (the SGD variant of :mod:`.steps`; not the step actually taken);
4. computes the influences I_c = ⟨Δ_c, ∇R⟩ of every component on every probed feature (probes of
   ``RUN/probes.safetensors``, references ⟨w, r(θ*)⟩ from a no-grad forward of ``RUN/model.safetensors``
   on the batch), for all rows and per feature type, and appends them to the observable store
   (:mod:`.store`).

Exactness checks (the replay must follow the training run exactly): the replayed loss of every update
that has a ``last_loss`` record in ``metrics.jsonl`` must equal it, and the replayed weights and Adam
state at every checkpoint inside the segment — and, with ``verify="next"`` (default), at the first
checkpoint after it, by replaying on without attribution — must equal the saved checkpoint (bit-exact by
default; ``replay_rtol`` relaxes both for GPUs).  Trajectory steps use the training kernel (e.g. SDPA); the
decomposition uses eager attention (as required for the myopic graph and forward-mode AD), so G_sh is taken
as ∇L_train − G_dir − G_pre, making Σ_c G_c the gradient actually applied; the eager/training gradient
difference (rounding) is reported as ``checks.max_grad_rel_diff``.

Segments and the Adam dependency:

* Segments (start, end] are replayed independently from the latest checkpoint ≤ start (or from the
  deterministic initialisation ``torch.manual_seed(seed); GPT(config)``), so **SGD segments are
  independent** and may run in parallel; ``steps`` may subsample them (influences at those updates only).
* **Adam segments are not independent**: the component moments m_c accumulate from update 1.  A segment
  starting at start > 0 needs the moment state after update ``start``, which the segment ending at
  ``start`` persists as ``moments-{start:06d}.safetensors`` (float64, one parameter-sized buffer per site
  and component).  Without it, ``warm=True`` recomputes the moments from the nearest earlier state (or
  update 1) — a decomposition at every earlier step, no influences — otherwise ``ConfigError``.  With
  Adam, the decomposition runs at every update; ``steps`` only selects which updates record influences.

Several segments at once, over processes (:func:`.segments.attribute_segments`): the updates are cut into N
contiguous segments; one process computes them in order, under ``torchrun`` rank r takes segments
r, r+W, … and rank 0 rebuilds ``meta.json`` after a barrier.  Every segment is the same computation on
the same checkpoints as in one process, so the stored tables are bit-identical.  SGD segments split the
work perfectly; an Adam segment whose starting moments are not stored yet recomputes them (``warm``),
so the decomposition before it is repeated and only the influence work is shared.

Caveats: the run must be finished (final model and probes define θ* and w); the ``language`` task (a bare token
store) has no features, while ``tinystories`` has its syntax and position features (no useful/useless
typing, so no per-type rows); bit-exact replay needs the torch version, device and thread count of training (see
``environment.json``).  Dependencies on the trainer: this module builds the trainer's own model,
optimizer and data source (``Trainer(config, RUN, resume=True)``, ``Trainer._train_data()``) so the data
order cannot drift from the trainer's rule.  ``check_identity=True`` also evaluates
R(θ_{s−1} − Σ_c Δ_c) on the same batch (column ``mismatch_after``): Σ_c I_c ≈ R before − R after up to
O(‖Δ‖²) (a first-order sanity check).

The replayed run itself (:class:`~.run.RunReplay`) and the resolution of sites, features and updates live
in :mod:`.run`.

:func:`attribute_run` is one loop whose order of operations (decomposition, the trainer's own step, the
attributed step, influences, the checks) must follow the training step exactly; several segments at once
live in :mod:`.segments`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
import torch

from ..errors import CompatibilityError, ConfigError, NumericalError
from ..models.gpt import GPT
from ..progress import Heartbeat, log, progress
from ..storage import load_tensors, save_tensors
from ..train.ntp.trainer import set_lr
from . import store as ostore
from .decompose import PathwayGradients, decompose, trainable_parameters
from .influence import InfluenceTable, Probe, influence_table, projections, reference_projections
from .run import RunReplay, check_sites, parse_sites, resolve_features, resolve_steps
from .steps import AdamAttributor, sgd_steps, step_sum
from .stopgrad import Site

if TYPE_CHECKING:
    from tqdm.auto import tqdm

OPTIMIZERS = ("adam", "sgd")
VERIFY = ("next", "segment", "none")
MOMENTS_KIND = "attribution-moments"


# ----------------------------------------------------------------------------------------------------
# replay


@dataclass
class SegmentResult:
    """What :func:`attribute_run` wrote: the segment's table and info (checks, timings)."""

    path: Path
    table: pa.Table
    info: dict[str, Any]
    moments_path: Path | None = None
    store: Path = field(default_factory=Path)


class _Timer:
    def __init__(self) -> None:
        self.total: dict[str, float] = {}

    def add(self, key: str, t0: float) -> float:
        now = time.perf_counter()
        self.total[key] = self.total.get(key, 0.0) + now - t0
        return now


def _copy_params(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    with torch.no_grad():
        for a, b in zip(dst.parameters(), src.parameters()):
            a.copy_(b)


def _influence_rows(
    rows: dict[str, list],
    step: int,
    table: InfluenceTable,
    feature_of: dict[str, str],
    optimizer: str,
    half: bool,
    after: dict[tuple[str, int | None], float] | None,
) -> None:
    """Append ``table``'s rows to the observables' columns (missing values as None)."""
    n = len(table)
    types = [None if t < 0 else int(t) for t in table.feature_type.tolist()]
    rows["step"] += [step] * n
    rows["site_layer"] += table.layer.tolist()
    rows["site_position"] += table.position.tolist()
    rows["feature"] += [feature_of[p] for p in table.probe]
    rows["type"] += types
    rows["component"] += table.component
    rows["influence"] += [None if v != v else v for v in table.value.tolist()]
    rows["mismatch"] += [None if v != v else v for v in table.risk.tolist()]
    rows["mismatch_after"] += [None if after is None else after.get((p, t)) for p, t in zip(table.probe, types)]
    rows["n_rows"] += table.n_rows.tolist()
    rows["optimizer"] += [optimizer] * n
    rows["half"] += [bool(half)] * n


def _risks_after(
    shadow: GPT,
    tokens: torch.Tensor,
    probes: Sequence[Probe],
    refs: dict[str, torch.Tensor],
    types: dict[str, torch.Tensor] | None,
    half: bool,
) -> dict[tuple[str, int | None], float]:
    """R on every probe/type subset at the shadow model's parameters (no grad)."""
    cur = projections(shadow, tokens, probes)
    f = 0.5 if half else 1.0
    out: dict[tuple[str, int | None], float] = {}
    for p in probes:
        d = (cur[p.name] - refs[p.name].to(cur[p.name].dtype)).double()
        out[(p.name, None)] = float(f * d.pow(2).mean())
        if types is not None:
            ty = types[p.name].to(d.device)
            for tau in torch.unique(ty).tolist():
                out[(p.name, int(tau))] = float(f * d[ty == tau].pow(2).mean())
    return out


def attribute_run(
    run_dir: str | Path,
    *,
    sites: Any,
    features: Any,
    optimizer: str = "adam",
    steps: Iterable[int] | None = None,
    segment: tuple[int, int] | None = None,
    types: bool = True,
    half: bool = False,
    check_identity: bool = False,
    out: str | Path | None = None,
    warm: bool = False,
    verify: str = "next",
    device: str | None = None,
    overwrite: bool = False,
    replay_rtol: float = 0.0,
    chunk_size: int | None = None,
    index: bool = True,
    random_directions: int = 0,
    carry: bool = False,
) -> SegmentResult:
    """Attribute the updates ``segment = (start, end)`` (updates start+1..end) of a finished run.

    ``sites``: [(k, i), ...] or ``"1:4,2:8"`` (probed sites of the run); ``features``: ``"all"``,
    ``"tracked"`` or names; ``optimizer``: ``"adam"`` (the paper's variant) or ``"sgd"``; ``steps``:
    updates whose influences are recorded (default: all of the segment; with SGD the decomposition is
    skipped elsewhere); ``segment`` default (0, final step); ``types``: per-feature-type influences as
    well; ``half``: a ½ in the mismatch (default False: the paper's factor 1); ``check_identity``:
    also R after the attributed step (column ``mismatch_after``); ``out``: store directory (default
    ``RUN/attribution``); ``warm``: Adam only, recompute missing component moments from an earlier
    state; ``verify``: checkpoints to compare bit-exactly (``"next"``: inside the segment and the first
    after it, ``"segment"``: inside only, ``"none"``); ``replay_rtol``: relative tolerance of the loss
    and checkpoint checks (0 = exact).  Writes ``segment-{start:06d}-{end:06d}.parquet`` (and, for Adam,
    ``moments-{end:06d}.safetensors``) and updates ``meta.json`` (``index=False``: left to the caller, as
    :func:`attribute_segments` does for parallel segments).  ``random_directions``: per (site, feature)
    that many random directions of the probe's norm are attributed beside it (features ``f~random{j}``, the
    rows typed like ``f``): the null of "influence onto a direction the model was not asked to build".
    ``carry`` (Adam only): start the component moments at 0 after update ``start`` and carry the
    optimizer's first moment there as the component ``"carried"`` (:class:`~.steps.AdamAttributor`,
    ``carry=True``), so that a segment starting anywhere needs no earlier moments; its influence rows are
    recorded beside the others, and ``checks`` reports the carried share of the update at the first and
    the last recorded update.
    """
    if optimizer not in OPTIMIZERS:
        raise ConfigError(f"unknown optimizer variant {optimizer!r}", "use 'adam' or 'sgd'")
    if verify not in VERIFY:
        raise ConfigError(f"unknown verify mode {verify!r}", f"use one of: {', '.join(VERIFY)}")
    if isinstance(random_directions, bool) or not isinstance(random_directions, int) or random_directions < 0:
        raise ConfigError(
            f"random_directions must be an integer ≥ 0, got {random_directions!r}", "e.g. --random-directions 4"
        )
    if not replay_rtol >= 0:
        raise ConfigError(f"replay_rtol={replay_rtol!r} must be ≥ 0", "use 0 (bit-exact) on CPU")
    if carry and optimizer != "adam":
        raise ConfigError("carry applies to the Adam variant only", "use optimizer='adam', or carry=False")
    run = RunReplay(run_dir, device=device)
    site_list = parse_sites(sites)
    check_sites(run, site_list)
    feats = resolve_features(run, features)
    start, end = (0, run.final_step) if segment is None else (int(segment[0]), int(segment[1]))
    if not 0 <= start < end <= run.final_step:
        raise ConfigError(
            f"segment {start}:{end} is not inside the run's updates 0:{run.final_step}",
            f"use 0 ≤ START < END ≤ {run.final_step}",
        )
    recorded = resolve_steps(steps, start, end)
    store = Path(out) if out is not None else run.path / "attribution"
    store.mkdir(parents=True, exist_ok=True)
    settings = {
        "run": str(run.path),
        "run_config": run.config.identity(),
        "sites": [list(s) for s in site_list],
        "features": feats,
        "optimizer": optimizer,
        "types": bool(types),
        "half": bool(half),
        "random_directions": int(random_directions),
    }
    if carry:
        settings["carry"] = True
    seg_name = ostore.segment_path(store, start, end).name
    for info in ostore.read_segment_infos(store):
        ostore.check_settings(info, settings, str(store))
        if info["file"] != seg_name and int(info["start"]) < end and start < int(info["end"]):
            raise CompatibilityError(
                f"segment {start}:{end} overlaps the stored segment {info['start']}:{info['end']}",
                "choose non-overlapping segments, or another --out",
            )
    seg_file = ostore.segment_path(store, start, end)
    if seg_file.exists() and not overwrite:
        raise CompatibilityError(f"{seg_file} already exists", "pass overwrite=True (--overwrite) to recompute it")

    # -- where the replay starts ----------------------------------------------------------------------
    attributor = None
    moments_from = start
    if optimizer == "adam" and carry:
        pass  # the attributor starts at update `start`, created below once the replay stands there
    elif optimizer == "adam":
        attributor = AdamAttributor(run.optimizer, run.model)  # before any optimizer state is loaded
        if start > 0:
            have = [s for s, _ in ostore.list_moments(store) if s <= start]
            if start in have:
                moments_from = start
            elif warm:
                moments_from = max(have) if have else 0
            else:
                raise ConfigError(
                    f"Adam attribution of segment {start}:{end} needs the per-component moments after update "
                    f"{start} ({ostore.moments_path(store, start).name}), written by the segment that ends at {start}",
                    f"run segment ?:{start} first, or pass warm=True (--warm) to recompute them from an earlier "
                    f"state (a decomposition at every earlier update)",
                )
    replay_from = checkpoint_from = run.restore(moments_from)
    if optimizer == "adam" and carry:
        if replay_from < start:
            _plain_steps(run, replay_from, start, replay_rtol, verify != "none")
            replay_from = start
        attributor = AdamAttributor(run.optimizer, run.model, carry=True)
    elif attributor is not None and moments_from > 0:
        _plain_steps(run, replay_from, moments_from, replay_rtol, verify != "none")
        replay_from = moments_from
        _load_moments(attributor, ostore.moments_path(store, moments_from), moments_from, settings)
    names, _ = trainable_parameters(run.model)
    probes, feature_of, base_of = run.make_probes(site_list, feats, random_directions=random_directions)
    shadow = copy.deepcopy(run.model)  # θ_{s−1} for the influences (Adam's Δ_c needs v')
    lr = float(run.optimizer.param_groups[0]["lr"])
    record_set = set(recorded)
    rows: dict[str, list] = {f.name: [] for f in ostore.SCHEMA}
    timer = _Timer()
    checks: dict[str, Any] = {
        "losses_checked": 0,
        "checkpoints_verified": [],
        "max_grad_rel_diff": 0.0,
        "adam_sum_max_rel_err": 0.0,
    }
    if carry:
        checks["carried_share"] = {"first_recorded": None, "last_recorded": None, "max_recorded": 0.0}
    n_attributed = 0
    grad_diffs: list[torch.Tensor] = []  # ‖∇L_eager − ∇L_train‖ / ‖∇L_train‖ per decomposed update
    run.model.train()
    log(
        f"attributing {run.path} updates {start + 1}..{end} ({len(recorded)} recorded, {len(site_list)} sites × "
        f"{len(feats)} features, {optimizer}); replay from step {replay_from}",
        level=2,
    )
    bar = cast("tqdm | Heartbeat", progress(total=end - replay_from, desc=f"attribute {start}:{end}", unit="step"))
    t_seg = time.perf_counter()
    trusted = contextlib.ExitStack()  # each batch's ids are checked once (one host read), its forwards trust them
    for m in (run.model, shadow, run.final_model):
        trusted.enter_context(m.trusted_tokens())
    try:
        for b in range(replay_from, end):
            s = b + 1
            recording = s > start and s in record_set
            need_dec = (optimizer == "adam" and s > moments_from) or (optimizer == "sgd" and recording)
            t_iter = t0 = time.perf_counter()
            x = run.batch(b)
            run.model.check_tokens(x)
            pathways = None
            if need_dec:
                if recording:
                    _copy_params(shadow, run.model)
                pathways = decompose(run.model, x, site_list, chunk_size=chunk_size)
                t0 = timer.add("decompose", t0)
            loss = run.model.loss(x)  # the trainer's step, verbatim
            value = float(loss.detach())
            if not math.isfinite(value):
                raise NumericalError(f"replayed loss is {value} at update {s}", "the run itself diverged there")
            run.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if pathways is not None:
                # loss.backward() has set the .grad of every trainable parameter
                real = {
                    n: cast(torch.Tensor, p.grad).detach() for n, p in zip(names, trainable_parameters(run.model)[1])
                }
                pathways, diff = with_training_gradient(pathways, real)
                grad_diffs.append(diff)
            set_lr(run.optimizer, run.config.lr_at(s))
            run.optimizer.step()
            t0 = timer.add("train_step", t0)
            if run.check_loss(s, value, replay_rtol):
                checks["losses_checked"] += 1
            if verify != "none" and s in run.checkpoints:
                run.verify_checkpoint(s, replay_rtol)
                checks["checkpoints_verified"].append(s)
            if pathways is not None:
                if attributor is not None:
                    site_steps = attributor.attribute(pathways)
                    checks["adam_sum_max_rel_err"] = max(checks["adam_sum_max_rel_err"], attributor.last_check)
                    if carry and recording:
                        share = checks["carried_share"]
                        if share["first_recorded"] is None:
                            share["first_recorded"] = attributor.carried_share
                        share["last_recorded"] = attributor.carried_share
                        share["max_recorded"] = max(share["max_recorded"], attributor.carried_share or 0.0)
                else:
                    site_steps = sgd_steps(pathways, run.config.lr_at(s))
                t0 = timer.add("attribute", t0)
            if recording:
                refs = reference_projections(run.final_model, x, probes)
                type_map = None
                if types and run.has_types:
                    ft = run.feature_types(x)
                    fidx = {f: run.feature_names.index(f) for f in feats}
                    type_map = {
                        p.name: torch.from_numpy(ft[:, p.position, fidx[base_of[p.name]]].astype(np.int64))
                        for p in probes
                    }
                # the types present, known on the host: no device read for them
                present = (
                    None
                    if type_map is None
                    else sorted({int(v) for t in type_map.values() for v in np.unique(t.numpy())})
                )
                infl = influence_table(
                    shadow,
                    x,
                    site_steps,
                    probes,
                    refs,
                    types=type_map,
                    type_values=present,
                    drop_absent=True,
                    half=half,
                )
                after = None
                if check_identity:
                    total = step_sum(site_steps[site_list[0]])
                    with torch.no_grad():
                        for n, p in zip(names, trainable_parameters(shadow)[1]):
                            p.sub_(total[n].to(p.dtype))
                    after = _risks_after(shadow, x, probes, refs, type_map, half)
                _influence_rows(rows, s, infl, feature_of, optimizer, half, after)
                n_attributed += 1
                timer.add("influence", t0)
            timer.add("recorded_steps" if recording else "warm_steps" if need_dec else "plain_steps", t_iter)
            bar.update(1)
    finally:
        trusted.close()
        bar.close()
    if grad_diffs:
        checks["max_grad_rel_diff"] = float(torch.stack(grad_diffs).max())
    seg_seconds = time.perf_counter() - t_seg
    moments_file = None
    moments_state = attributor.state_dict() if attributor is not None else None
    if verify == "next" and end not in run.checkpoints:
        later = [c for c in run.checkpoints if c > end]
        if later:
            _plain_steps(run, end, min(later), replay_rtol, True)
            checks["checkpoints_verified"].append(min(later))
    table = ostore.observables_table(rows)
    info = {
        **settings,
        "replay_from_checkpoint": checkpoint_from,
        "moments_from": moments_from if attributor else None,
        "carry": bool(carry),
        "n_recorded_steps": len(recorded),
        "recorded_steps": _compact(recorded),
        "rows": table.num_rows,
        "seconds": seg_seconds,
        "seconds_per_attributed_step": timer.total.get("recorded_steps", 0.0) / max(1, n_attributed),
        "seconds_breakdown": timer.total,
        "checks": checks,
        "check_identity": bool(check_identity),
        "lr": lr,
        "device": str(run.device),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "sign": ostore.SIGN_CONVENTION,
        "mismatch": ostore.mismatch_factor_text(half),
        "task": run.config.task,
        "regime": run.config.regime,
        "final_step": run.final_step,
    }
    if moments_state is not None:
        moments_file = save_tensors(
            ostore.moments_path(store, end),
            moments_state,
            kind=MOMENTS_KIND,
            metadata={"step": end, "sites": settings["sites"], "run_config": settings["run_config"]},
        )
    path = ostore.write_segment(store, table, start=start, end=end, info=info, overwrite=overwrite)
    if index:
        ostore.update_meta(store, settings, {**info, "file": path.name, "start": start, "end": end})
    return SegmentResult(path=path, table=table, info=info, moments_path=moments_file, store=store)


def _compact(steps: list[int]) -> Any:
    if len(steps) > 1 and all(b - a == steps[1] - steps[0] for a, b in zip(steps, steps[1:])):
        return {"first": steps[0], "last": steps[-1], "stride": steps[1] - steps[0]}
    return steps


def with_training_gradient(
    pathways: dict[Site, PathwayGradients], real: dict[str, torch.Tensor]
) -> tuple[dict[Site, PathwayGradients], torch.Tensor]:
    """Components with full = the training kernel's ∇L and G_sh = full − G_dir − G_pre; also
    ‖∇L_eager − ∇L_train‖ / ‖∇L_train‖ (a device scalar: read once per segment)."""
    first = next(iter(pathways.values())).full
    eager = torch.cat([first[n].reshape(-1) for n in real]).double()
    train = torch.cat([real[n].reshape(-1) for n in real]).double()
    diff = ((eager - train).norm() / train.norm().clamp_min(1e-300)).where(train.norm() > 0, 0.0)  # on the device
    out = {}
    for s, pg in pathways.items():
        shared = {n: real[n] - pg.direct[n] - pg.precached[n] for n in real}
        out[s] = PathwayGradients(direct=pg.direct, precached=pg.precached, shared=shared, full=real)
    return out, diff


def _plain_steps(run: RunReplay, first: int, last: int, rtol: float, verify: bool) -> None:
    """Replay updates first+1..last exactly like the trainer, without attribution (checks as usual)."""
    run.model.train()
    for b in range(first, last):
        s = b + 1
        x = run.batch(b)
        loss = run.model.loss(x)
        value = float(loss.detach())
        run.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        set_lr(run.optimizer, run.config.lr_at(s))
        run.optimizer.step()
        run.check_loss(s, value, rtol)
        if verify and s in run.checkpoints:
            run.verify_checkpoint(s, rtol)


def _load_moments(attributor: AdamAttributor, path: Path, step: int, settings: dict[str, Any]) -> None:
    arrays, meta = load_tensors(path, kind=MOMENTS_KIND)
    if int(json.loads(meta.get("step", "-1"))) != step:
        raise CompatibilityError(f"{path} does not hold the moments after update {step}", "delete it and recompute")
    if json.loads(meta.get("sites", "null")) != settings["sites"] or json.loads(
        meta.get("run_config", "null")
    ) != json.loads(json.dumps(settings["run_config"])):
        raise CompatibilityError(
            f"{path} was written for other sites or another run",
            "use the same --sites as the earlier segments, or another --out",
        )
    dev = attributor.params[0].device
    attributor.load_state_dict({k: torch.from_numpy(np.array(v)).to(dev) for k, v in arrays.items()})
    if attributor.num_steps != step:
        raise CompatibilityError(f"{path} has {attributor.num_steps} steps, expected {step}", "delete it and recompute")
