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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError
from ..progress import log
from ..runs import exclusive, to_jsonable
from .othello_combine import combine
from .othello_report import judge, render_section
from .othello_seeds import EXPERIMENT, train_key, train_record_path, train_unit
from .othello_strata import (
    check_key,
    check_record_path,
    mismatch_record_path,
    mismatch_unit,
    stratum_key,
    stratum_record_path,
    stratum_segment,
    stratum_unit,
    validate_strata,
)
from .records import check_record_slot, write_unit_record
from .results import default_results_path

__all__ = ["SCALES", "STAGES", "OthelloConfig", "judge", "render_section", "run_othello"]

SCALES: dict[str, dict[str, Any]] = {
    "paper": dict(
        n_layer=6,
        d_model=256,
        n_head=4,
        batch_size=1024,
        steps=5000,
        eval_size=20480,
        othello_pool=500_000,
        positions=list(range(4, 57, 4)),
        checkpoint_every=500,
        strata=10,
        burn_in=50,
        stratum_updates=50,
        check_updates=1200,
        check_positions=[24],
        lr_decay=None,
    ),
    "cpu": dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        batch_size=64,
        steps=12000,
        eval_size=4096,
        othello_pool=500_000,
        positions=[12, 24, 36, 48],
        checkpoint_every=300,
        strata=10,
        burn_in=50,
        stratum_updates=50,
        check_updates=1200,
        check_positions=[24],
        lr_decay=[9600, 12000],
    ),
    "ci": dict(
        n_layer=2,
        d_model=32,
        n_head=2,
        batch_size=16,
        steps=30,
        eval_size=200,
        othello_pool=2000,
        positions=[8, 20],
        checkpoint_every=3,
        strata=5,
        burn_in=1,
        stratum_updates=2,
        check_updates=12,
        check_positions=[8],
        lr_decay=None,
    ),
}
STAGES = ("all", "train", "stratum", "mismatch", "check", "combine")


@dataclass
class OthelloConfig:
    """Seeds × the scale's model; ``overrides`` replace scale fields (each recorded as a deviation).
    ``strata_run``: the strata a ``stratum`` stage attributes (default all)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    layers: list[int] | None = None  # attributed layers (default 1..L)
    random_directions: int = 2
    overrides: dict[str, Any] = field(default_factory=dict)
    lr: float = 1e-3
    device: str = "cpu"
    confidence: float = 0.95
    matmul_precision: str = "highest"  # "tf32": CUDA products in TF32 (training and replay)
    replay_rtol: float = 0.0  # tolerance of the replay's checks against training (0: bit-exact)
    strata_run: list[int] | None = None

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r}", f"use one of: {', '.join(SCALES)}")
        bad = set(self.overrides) - set(SCALES["paper"])
        if bad:
            raise ConfigError(f"unknown override(s) {sorted(bad)}", f"use: {', '.join(SCALES['paper'])}")
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds)
        ):
            raise ConfigError(f"seeds must be distinct non-negative integers, got {self.seeds!r}", "e.g. seeds 0-4")
        s = self.settings
        L = s["n_layer"]
        if any(not 1 <= k <= L for k in self.attr_layers):
            raise ConfigError(f"attributed layers {self.attr_layers} outside 1..{L}", f"use layers in 1..{L}")
        for key in ("positions", "check_positions"):
            if not s[key] or any(not 1 <= i <= 59 for i in s[key]):
                raise ConfigError(f"{key} {s[key]} must be non-empty and lie in 1..59", "e.g. 12,24,36,48")
        if not set(s["check_positions"]) <= set(s["positions"]):
            raise ConfigError(
                f"check positions {s['check_positions']} are not among the probed positions {s['positions']}",
                "check at probed positions",
            )
        if not self.replay_rtol >= 0:
            raise ConfigError(f"replay_rtol={self.replay_rtol!r} must be ≥ 0", "use 0 (bit-exact) on the CPU")
        cu = s["check_updates"]
        if isinstance(cu, bool) or not isinstance(cu, int) or not 1 <= cu <= s["steps"]:
            raise ConfigError(f"check_updates={cu!r} outside 1..{s['steps']}", "e.g. a tenth of training")
        validate_strata(self)
        if self.strata_run is not None and any(not 0 <= h < s["strata"] for h in self.strata_run):
            raise ConfigError(f"strata {self.strata_run} outside 0..{s['strata'] - 1}", "e.g. strata 0-9")
        self.ntp_config(self.seeds[0], initial=False)  # the trainer's own validation

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def attr_layers(self) -> list[int]:
        return list(range(1, self.settings["n_layer"] + 1)) if self.layers is None else list(self.layers)

    @property
    def strata(self) -> list[int]:
        return list(range(int(self.settings["strata"]))) if self.strata_run is None else list(self.strata_run)

    @property
    def curve_every(self) -> int:
        """Held-out evaluation every tenth of training (the learning curve's points)."""
        return max(1, self.settings["steps"] // 10)

    def ntp_config(self, seed: int, *, initial: bool) -> Any:
        from ..train.ntp import NTPConfig

        s = self.settings
        return NTPConfig(
            task="othello",
            regime="standard",
            seed=int(seed),
            n_layer=s["n_layer"],
            d_model=s["d_model"],
            n_head=s["n_head"],
            batch_size=s["batch_size"],
            steps=0 if initial else s["steps"],
            lr=self.lr,
            eval_size=s["eval_size"],
            othello_pool=s["othello_pool"],
            probe_positions=sorted(s["positions"]),
            probe_every=0,
            lr_decay=None if initial else s.get("lr_decay"),
            eval_every=0 if initial else self.curve_every,
            checkpoint_every=0 if initial else int(s["checkpoint_every"]),
            keep_checkpoints=0,
            device=self.device,
            matmul_precision=self.matmul_precision,
        )

    def sampled_fraction(self) -> float:
        """The fraction of training's updates whose influence is recorded."""
        s = self.settings
        return s["strata"] * s["stratum_updates"] / s["steps"]

    def deviations(self) -> list[str]:
        paper, used = SCALES["paper"], self.settings
        out = [
            f"{k} {used[k]} (paper {paper[k]})"
            for k in ("n_layer", "d_model", "n_head", "batch_size", "steps", "eval_size")
            if used[k] != paper[k]
        ]
        if used["positions"] != paper["positions"]:
            out.append(f"attributed positions {used['positions']} (paper 4, 8, …, 56)")
        if used.get("lr_decay"):
            a, b = used["lr_decay"]
            out.append(f"learning rate cooled down linearly over updates {a}..{b} (paper: constant)")
        out.append(
            f"influence integrated over all {used['steps']} updates by a stratified sample: {used['strata']} "
            f"strata, in each {used['burn_in']} burn-in and {used['stratum_updates']} recorded updates from a "
            f"checkpoint drawn per seed ({self.sampled_fraction():.1%} of updates recorded; paper: every update)"
        )
        if len(self.seeds) != 1:
            out.append(f"{len(self.seeds)} seeds (paper 1)")
        return out

    @property
    def name(self) -> str:
        return f"othello-{self.scale}"


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
