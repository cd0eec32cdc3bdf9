"""The Othello attribution experiment of arXiv 2603.14087 over training seeds: the paper's Adam-variant
influence integrated over **all** of training (estimated from strata), the learning curve beside it, the
untrained-model and random-direction nulls, and the paper's pattern tested only where the design can see
it (:mod:`.gates`).

Stages (``run_othello(config, OUT, stage=...)``; each writes unit records beside the results file, so a
stage may run in another process, at another time or on another machine):

1. ``train`` — per seed, a GPT trained on synthetic Othello (``OUT/seed-<s>/run``; checkpoints with the
   Adam state every ``checkpoint_every`` updates, held-out evaluation every tenth of training) and its
   untrained-model null (``OUT/seed-<s>/initial``); record ``train-<s>`` (:func:`.othello_seeds.train_unit`).
2. ``stratum`` — per (seed, stratum h) of ``strata`` strata: the stratum's segment (a burn-in, then the
   recorded updates) replayed from a checkpoint inside it with the first moment carried, the influences of
   the 16 central cells × useful/useless types at ``positions`` (all layers), ``random_directions`` null
   directions per probe, the learning curve at the stratum's start; record ``stratum-<s>-<h>``
   (:mod:`.othello_strata`).
3. ``mismatch`` — per seed, the initial mismatch R(θ₀) of every real probe and of its random directions;
   record ``mismatch-<s>`` (:func:`.othello_strata.mismatch_unit`): the positive control read on the
   scale of each direction's own mismatch (:mod:`.othello_analysis`).
4. ``check`` — the estimator check on one seed: the first ``check_updates`` updates attributed
   contiguously (every update recorded, at the check's positions), against the stratified estimate of the
   same range made the stratum way; record ``check-<s>`` (:mod:`.othello_check`).
5. ``combine`` — every seed's records: the stratified integral per seed, over seeds the intervals, the
   seven tests of the paper's pattern (Holm), the positive control, the learning curve with the strata
   marked, the gates and the verdict; ``OUT/report.html`` and ``results/othello/othello-<scale>.json``.

``stage="all"`` runs the five in order in this process (the ``ci`` scale; and what ``--seeds`` without
``--stage`` does).  Scales (:data:`SCALES`): ``paper`` (6 layers × 256, batch 1024, 5,000 steps: a GPU job),
``cpu`` (4 layers × 128, batch 64, 12,000 steps: the Adam learning rate of the paper, 1e-3; at a constant
rate 4,000 steps reached a legal-move accuracy of only 0.89 and 12,000 plateaued at 0.934 (seed 0), so
the last 20 % of updates cool the rate down linearly (``lr_decay`` [9600, 12000], a deviation), which
reached 0.958; the paper's 5,000 constant-rate steps do not reach 0.95 at batch 64, so the 12,000-step
schedule is kept), ``ci`` (seconds; a plumbing check, not a result).

The pathways paper integrates the influence over every update; at the CPU scale every update would need a
decomposition (≈ 10 training steps each), so 10 strata × 50 recorded updates (after 50 burn-in updates)
sample it: 1,000 decomposed updates of 12,000, 500 of them recorded (4.2 % of training), spread over all of
it.  The estimate and its error are described in :mod:`.othello_strata`; the estimator is checked against
the exact contiguous integral of the first updates by the ``check`` stage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError
from ..progress import log
from ..runs import exclusive, to_jsonable
from .othello_combine import combine
from .othello_config import STAGES, OthelloConfig, stratum_segment
from .othello_seeds import EXPERIMENT, train_key, train_record_path, train_unit
from .othello_strata import (
    check_key,
    check_record_path,
    mismatch_record_path,
    mismatch_unit,
    stratum_key,
    stratum_record_path,
    stratum_unit,
)
from .records import check_record_slot, write_unit_record
from .results import default_results_path

__all__ = ["run_othello"]


def run_othello(
    config: OthelloConfig,
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
    stage: str = "all",
    check_seed: int | None = None,
) -> dict[str, Any]:
    """Run ``stage`` (:data:`STAGES`; module docstring) for ``config.seeds``, resuming what exists.

    ``train``, ``stratum`` and ``check`` write unit records beside the results file
    (``results/othello/othello-<scale>/``); ``combine`` reads them (checked against ``config`` and
    against each other: one configuration, one commit per kind of unit) and writes the report and — for
    ≥ :data:`MIN_SEEDS` seeds or an explicit ``results`` path — the results file.  ``check_seed``: the
    seed of the estimator check (default the first)."""
    out = Path(out)
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}", f"use one of: {', '.join(STAGES)}")
    res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
    command = command or f"python: run_othello({config!r}, {str(out)!r}, stage={stage!r})"
    check_seed = config.seeds[0] if check_seed is None else int(check_seed)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Any] = {"stage": stage, "records": []}
    if stage in ("all", "train"):
        done["records"] += _train_stage(config, out, res_path, command)
    if stage in ("all", "stratum"):
        done["records"] += _stratum_stage(config, out, res_path, command)
    if stage in ("all", "mismatch"):
        done["records"] += _mismatch_stage(config, out, res_path, command)
    if stage in ("all", "check"):
        done["records"].append(_check_stage(config, check_seed, out, res_path, command))
    if stage in ("all", "combine"):
        done.update(combine(config, out, res_path, command, results_given=results is not None))
    return done


def _train_stage(config: OthelloConfig, out: Path, res_path: Path, command: str) -> list[str]:
    key = train_key(config)
    todo = [s for s in config.seeds if not _recorded(train_record_path(res_path, s), key)]
    for seed in todo:  # before the hour of training, not after
        check_record_slot(train_record_path(res_path, seed), unit=f"train-{seed}", config_key=key)
    written = []
    for seed in todo:
        d = out / f"seed-{seed}"
        with exclusive(d):
            log(f"[othello] seed {seed}: training (and the untrained-model null) ...")
            values = train_unit(config, seed, d)
            written.append(
                str(
                    write_unit_record(
                        train_record_path(res_path, seed),
                        experiment=EXPERIMENT,
                        name=config.name,
                        unit=f"train-{seed}",
                        config_key=key,
                        values=values,
                        command=command,
                        run_dir=d / "run",
                    )
                )
            )
    return written


def _recorded(path: Path, key: dict[str, Any]) -> bool:
    """Whether ``path`` holds a unit record made with configuration ``key`` (a finished unit)."""
    if not path.is_file():
        return False
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(rec, dict) and rec.get("config_key") == to_jsonable(key)


def _stratum_stage(config: OthelloConfig, out: Path, res_path: Path, command: str) -> list[str]:
    key = stratum_key(config)
    written = []
    for seed in config.seeds:
        run = out / f"seed-{seed}" / "run"
        if not (run / "model.safetensors").is_file():
            raise InputError(
                f"seed {seed} is not trained ({run} has no final model)",
                "run the train stage for it first (--stage train)",
            )
        for h in config.strata:
            path = stratum_record_path(res_path, seed, h)
            if _recorded(path, key):
                continue
            check_record_slot(path, unit=f"stratum-{seed}-{h}", config_key=key)
            start, end, _ = stratum_segment(config, seed, h)
            log(f"[othello] seed {seed}, stratum {h}: updates {start + 1}..{end} from checkpoint {start} ...")
            values = stratum_unit(config, seed, h, out)
            written.append(
                str(
                    write_unit_record(
                        path,
                        experiment=EXPERIMENT,
                        name=config.name,
                        unit=f"stratum-{seed}-{h}",
                        config_key=key,
                        values=values,
                        command=command,
                        run_dir=run,
                    )
                )
            )
    return written


def _mismatch_stage(config: OthelloConfig, out: Path, res_path: Path, command: str) -> list[str]:
    key = stratum_key(config)
    written = []
    for seed in config.seeds:
        run = out / f"seed-{seed}" / "run"
        if not (run / "model.safetensors").is_file():
            raise InputError(
                f"seed {seed} is not trained ({run} has no final model)",
                "run the train stage for it first (--stage train)",
            )
        path = mismatch_record_path(res_path, seed)
        if _recorded(path, key):
            continue
        check_record_slot(path, unit=f"mismatch-{seed}", config_key=key)
        log(f"[othello] seed {seed}: the initial mismatch of the real probes and the random directions ...")
        values = mismatch_unit(config, seed, out)
        written.append(
            str(
                write_unit_record(
                    path,
                    experiment=EXPERIMENT,
                    name=config.name,
                    unit=f"mismatch-{seed}",
                    config_key=key,
                    values=values,
                    command=command,
                    run_dir=run,
                )
            )
        )
    return written


def _check_stage(config: OthelloConfig, seed: int, out: Path, res_path: Path, command: str) -> str:
    from .othello_check import check_unit

    key = check_key(config)
    path = check_record_path(res_path, seed)
    if _recorded(path, key):
        return str(path)
    check_record_slot(path, unit=f"check-{seed}", config_key=key)
    log(f"[othello] seed {seed}: the estimator check over updates 1..{config.settings['check_updates']} ...")
    values = check_unit(config, seed, out)
    return str(
        write_unit_record(
            path,
            experiment=EXPERIMENT,
            name=config.name,
            unit=f"check-{seed}",
            config_key=key,
            values=values,
            command=command,
            run_dir=out / f"seed-{seed}" / "run",
        )
    )
