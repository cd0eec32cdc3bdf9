"""One seed of the Othello experiment (:mod:`.othello`): training it and its untrained-model null,
attributing its updates and the snapshots (:func:`_prepare_all`, in parallel processes when asked), reading
back its values (probe quality, held-out eval, the aggregates of :mod:`.othello_analysis`), and its seed
record beside the results file (:func:`seed_record_path`, :func:`config_key`), through which seeds run at
different times combine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..progress import log
from ..runs import to_jsonable
from ..storage import read_json
from .othello_analysis import seed_aggregates, snapshot_aggregates
from .records import read_unit_record, record_path

if TYPE_CHECKING:
    from .othello import OthelloConfig


EXPERIMENT = "othello"  # the results directory and the experiment name of the seed records


def _train(cfg: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    from ..train.ntp import Trainer

    res = {}
    for initial, d in ((False, out / "run"), (True, out / "initial")):
        t = time.time()
        r = Trainer(cfg.ntp_config(seed, initial=initial), d, resume=True).run()
        res["initial" if initial else "trained"] = {
            "final_eval": r.final_eval,
            "seconds": r.seconds,
            "wall_this_call": time.time() - t,
        }
    return res


def _probe_quality(run: Path, positions: list[int]) -> dict[str, Any]:
    from ..tasks.othello import CENTRAL_CELLS
    from ..train.ntp import load_probe_metrics, tracked_quality

    pm = load_probe_metrics(run / "probe_metrics.npz")
    return {str(k): tracked_quality(pm, [k], positions, CENTRAL_CELLS) for k in pm.layers if k > 0}


def _attribute(cfg: OthelloConfig, run: Path) -> Path:
    from ..attribution.replay import attribute_run
    from ..attribution.store import read_segment_infos

    store = run / "attribution"
    end = cfg.attributed_updates
    done = store.is_dir() and any(int(s["start"]) == 0 and int(s["end"]) == end for s in read_segment_infos(store))
    if not done:
        sites = [(k, i) for k in cfg.attr_layers for i in cfg.settings["positions"]]
        attribute_run(
            run,
            sites=sites,
            features="tracked",
            optimizer="adam",
            segment=(0, end),
            types=True,
            half=False,
            out=store,
            random_directions=cfg.random_directions,
            overwrite=True,
            steps=recorded_updates(end, cfg.settings["record_every"]),
            replay_rtol=cfg.replay_rtol,
        )
    return store


def _attribute_snapshots(cfg: OthelloConfig, run: Path) -> Path | None:
    """SGD-variant influences of updates c+1..c+K at every snapshot checkpoint c (``RUN/attribution-snapshots``);
    snapshots already stored are kept.  Each replays K updates from its checkpoint (the logged training loss
    at c+K is checked bit-exactly)."""
    from ..attribution.replay import attribute_run
    from ..attribution.store import read_segment_infos

    if not cfg.snapshot_starts:
        return None
    store = run / "attribution-snapshots"
    K = cfg.snapshot_window
    done = {(int(i["start"]), int(i["end"])) for i in read_segment_infos(store)} if store.is_dir() else set()
    sites = [(k, i) for k in cfg.attr_layers for i in cfg.settings["positions"]]
    for c in cfg.snapshot_starts:
        if (c, c + K) not in done:
            attribute_run(
                run,
                sites=sites,
                features="tracked",
                optimizer="sgd",
                segment=(c, c + K),
                types=True,
                half=False,
                out=store,
                random_directions=cfg.random_directions,
                overwrite=True,
                steps=cfg.snapshot_recorded(c),
                verify="segment",
                replay_rtol=cfg.replay_rtol,
            )
    return store


def recorded_updates(end: int, every: int) -> list[int]:
    """Updates whose influences are recorded: every ``every``-th of 1..end, centred in its block of
    ``every`` updates (so the rectangle rule ``every × Σ recorded`` estimates the sum over all updates)."""
    if every < 1:
        raise ConfigError(f"record_every={every} must be ≥ 1", "use 1 to record every update")
    return list(range(1 + (every - 1) // 2, end + 1, every))


def _prepare_seed(args: tuple[OthelloConfig, int, str, int | None]) -> dict[str, Any]:
    """Train (and the null) and attribute one seed; a worker of :func:`_prepare_all`."""
    config, seed, d, threads = args
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    trained = _train(config, seed, Path(d))
    t = time.time()
    _attribute(config, Path(d) / "run")
    t_snap = time.time()
    _attribute_snapshots(config, Path(d) / "run")
    return {
        "train": trained,
        "attribution_seconds_this_call": t_snap - t,
        "snapshot_seconds_this_call": time.time() - t_snap,
    }


def _prepare_all(config: OthelloConfig, out: Path) -> dict[int, dict[str, Any]]:
    """Every seed trained and attributed (resuming what exists): in this process for ``jobs`` = 1, else in
    ``jobs`` spawned processes of one torch thread each."""
    todo = [(config, seed, str(out / f"seed-{seed}"), None if config.jobs == 1 else 1) for seed in config.seeds]
    if config.jobs == 1:
        res = {}
        for item in todo:
            log(
                f"[othello] seed {item[1]}: training (and the untrained-model null), then attributing updates "
                f"1..{config.attributed_updates} ..."
            )
            res[item[1]] = _prepare_seed(item)
        return res
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    from ..train.grid import worker_environment

    log(f"[othello] seeds {config.seeds}: training and attributing in {config.jobs} processes ...")
    with worker_environment(), ProcessPoolExecutor(max_workers=config.jobs, mp_context=mp.get_context("spawn")) as pool:
        return dict(zip(config.seeds, pool.map(_prepare_seed, todo)))


def eval_at(run: Path, initial: Path, step: int) -> dict[str, float | None]:
    """Held-out eval (loss, legal-move accuracy) of the model after ``step`` updates: the run's eval record
    at that step, or for step 0 the untrained model's (``initial``, same seed)."""
    if step == 0:
        path, want = initial / "metrics.jsonl", None
    else:
        path, want = run / "metrics.jsonl", step
    found: dict[str, float | None] = {"eval_loss": None, "legal_acc": None}
    if not path.is_file():
        return found
    import json

    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("event") == "eval" and (want is None or int(rec.get("step", -1)) == want):
            found = {k: rec.get(k) for k in found}
    return found


def seed_record_path(results_path: str | Path, seed: int) -> Path:
    """Where the record of ``seed`` lives beside a results file: ``results/othello/othello-cpu.json``
    → ``results/othello/othello-cpu/seed-<seed>.json`` (:mod:`originlens.experiments.records`)."""
    return record_path(results_path, f"seed-{int(seed)}")


# settings added after records existed: left out of the key at their defaults, so older records still combine
LATER_SETTINGS: dict[str, Any] = {"lr_decay": None, "matmul_precision": "highest"}


def config_key(config: OthelloConfig) -> dict[str, Any]:
    """What must agree between seed records for them to be combined: the experiment's settings and the
    trainer's configuration, without the seed list, the parallelism, the device (and settings added later
    at their defaults, :data:`LATER_SETTINGS`)."""

    def later_default(k: str, v: Any) -> bool:
        return k in LATER_SETTINGS and v == LATER_SETTINGS[k]

    exp = {
        k: v
        for k, v in to_jsonable(config).items()
        if k not in ("seeds", "jobs", "device", "replay_rtol") and not later_default(k, v)
    }
    exp["overrides"] = {k: v for k, v in exp.get("overrides", {}).items() if not later_default(k, v)}
    settings = {k: v for k, v in to_jsonable(config.settings).items() if not later_default(k, v)}
    ntp = {
        k: v
        for k, v in config.ntp_config(config.seeds[0], initial=False).to_dict().items()
        if k not in ("seed", "device") and not later_default(k, v)
    }
    return {"experiment": exp, "settings": settings, "ntp": to_jsonable(ntp)}


def read_seed_record(path: str | Path, config: OthelloConfig, seed: int) -> dict[str, Any]:
    """A seed's record checked against ``config`` (:func:`originlens.experiments.records.read_unit_record`)."""
    return read_unit_record(path, experiment=EXPERIMENT, unit=f"seed-{int(seed)}", config_key=config_key(config))


def _seed_values(config: OthelloConfig, d: Path, prepared: dict[str, Any]) -> dict[str, Any]:
    """The per-seed values of a finished seed directory ``d`` (``d/run``, ``d/initial``)."""
    L = config.settings["n_layer"]
    positions = sorted(config.settings["positions"])
    store = d / "run" / "attribution"
    return {
        "train": prepared["train"],
        "probes": _probe_quality(d / "run", positions),
        "initial_probes": _probe_quality(d / "initial", positions),
        "attribution_seconds_this_call": prepared["attribution_seconds_this_call"],
        "aggregates": seed_aggregates(
            store, L, config.attributed_updates, config.fractions, config.settings["record_every"]
        ),
        "snapshot_seconds_this_call": prepared.get("snapshot_seconds_this_call"),
        "snapshots": snapshot_aggregates(
            d / "run" / "attribution-snapshots" if config.snapshot_starts else None,
            L,
            config.snapshot_starts,
            config.snapshot_window,
        ),
        "snapshot_eval": {str(c): eval_at(d / "run", d / "initial", c) for c in config.snapshot_starts},
        "data_hashes": read_json(d / "run" / "environment.json").get("data_hashes", {}),
    }


# ----------------------------------------------------------------------------------------------------
# the training unit: one seed's run, its untrained-model null and its learning curve


def train_record_path(results_path: str | Path, seed: int) -> Path:
    """Where the training record of ``seed`` lives: ``results/othello/othello-cpu/train-<seed>.json``."""
    return record_path(results_path, f"train-{int(seed)}")


def train_key(config: OthelloConfig) -> dict[str, Any]:
    """What must agree between training records: the trainer's configuration without the seed and the
    device, and the probed positions (the attribution's settings are not part of a training unit)."""
    ntp = {
        k: v
        for k, v in config.ntp_config(config.seeds[0], initial=False).to_dict().items()
        if k not in ("seed", "device")
    }
    return {"ntp": to_jsonable(ntp), "positions": sorted(config.settings["positions"])}


def eval_curve(run: Path) -> list[dict[str, Any]]:
    """Every held-out evaluation of a run (step, loss, legal-move accuracy), in step order."""
    import json

    path = run / "metrics.jsonl"
    out: dict[int, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("event") == "eval":
                out[int(rec["step"])] = {
                    "step": int(rec["step"]),
                    "eval_loss": rec.get("eval_loss"),
                    "legal_acc": rec.get("legal_acc"),
                }
    return [out[s] for s in sorted(out)]


def train_unit(config: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    """Train one seed and its untrained-model null (resuming what exists) and return the training
    record's values: held-out eval of both, every evaluation of the run (the learning curve's legal-move
    accuracy), the probes of the final and the untrained model, the data hashes and the thread count
    (the attribution replays bit-exactly only with the training's)."""
    import torch

    d = Path(out)
    trained = _train(config, seed, d)
    positions = sorted(config.settings["positions"])
    return {
        "train": trained,
        "probes": _probe_quality(d / "run", positions),
        "initial_probes": _probe_quality(d / "initial", positions),
        "curve_eval": eval_curve(d / "run"),
        "initial_eval": trained["initial"]["final_eval"],
        "data_hashes": read_json(d / "run" / "environment.json").get("data_hashes", {}),
        "torch_threads": torch.get_num_threads(),
    }
