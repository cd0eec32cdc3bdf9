"""The Othello attribution experiment of arXiv 2603.14087 (the Othello task, influence, results) over
training seeds, with nulls and the paper's comparison tested as hypotheses.

``run_othello(OthelloConfig(scale="cpu", seeds=[0, 1, 2]), OUT)`` does, per seed ``s``:

1. **train** a GPT on synthetic Othello (``OUT/seed-<s>/run``; resumable), probes of the board from
   the player-to-move's perspective at the attributed positions;
2. **null probes**: the same probes fitted on the untrained model of the same seed
   (``OUT/seed-<s>/initial``), so "the board is decodable" is measured against "decodable before any
   learning";
3. **attribute** updates 1..``attribute_steps`` (Adam variant, the paper's; exact replay) at sites
   ``layers × positions`` for the 16 central cells, per feature type (1 = NTP-useless, 2 = NTP-useful: the
   colour-flip definition), with ``random_directions`` null directions of each probe's norm beside every
   probe (``OUT/seed-<s>/run/attribution``);
4. **snapshots** (beside the paper): at each checkpoint c = 0, 10 %, …, 90 % of training, the SGD-variant
   influence (Δ_c = lr·G_c, no moment history needed) of updates c+1..c+K on the same sites and features
   (``OUT/seed-<s>/run/attribution-snapshots``), as a rate per update next to the model's eval at c: how
   the pathways feed the features as the model learns, where the Adam integral covers only a prefix.

Then, with the **seed** as the unit of replication:

* per seed and (component, type), the mean integrated influence over items (layer k, position i,
  cell); items at k = L are reported apart (``last_layer``), because there G_pre ≡ 0 (nothing reads r^L_i
  but λ_i) and pooling them would dilute the pre-cached mean;
* across seeds: Student-t intervals of those seed means; the paper's pattern as one-sided tests over
  seeds (paired by seed for useful vs useless, against 0 otherwise; Holm over the family), with power;
  the real probes against their random directions; per seed, a Wilcoxon test of useful vs useless
  paired by item;
* the same analysis on the influence integrated over the first 25 %, 50 % of the attributed updates
  (``fractions``), to show how the pattern builds up as the model learns;
* the models' own quality next to all of it: held-out eval loss, legal-move top-1 accuracy, probe
  Pearson r (overall / useless / useful cells) per layer against the initial-model null.

Writes ``OUT/experiment.json``, ``OUT/report.html`` and ``results/othello/othello-<scale>.json``.

Scales (:data:`SCALES`): ``paper`` (6 layers × 256, batch 1024, 5,000 steps, eval 20,480 games, positions
4, 8, …, 56: a GPU job), ``cpu`` (4 layers × 128, batch 64, 12,000 steps ≈ 50 min of training per seed on
two cores — the Adam learning rate of the paper, 1e-3: 3e-3 learned slower (legal-move accuracy 0.39 vs
0.60 at step 400 in a one-seed pilot); at a constant rate 4,000 steps reached only 0.89 and 12,000 plateaued at
0.934 (0.932 at 80 %, 0.933 at 90 %, seed 0), so the last 20 % of updates cool the rate down linearly
(``lr_decay`` [9600, 12000], a deviation from the paper's constant rate): resumed from that seed's 80 %
checkpoint, the cool-down reached 0.958; evaluation every 10 % of training for the learning curve; updates 1..200 attributed, influences recorded at every 5th), ``ci`` (seconds; a plumbing check, not a result).
Caveat: the Adam variant needs the decomposition at every attributed update (≈ 5–8 training steps each)
even where no influence is recorded, so at CPU scale only a prefix of training can be attributed
(``attribute_steps``), and the influence JVPs (the larger cost) run only at every ``record_every``-th
update, the integral estimated by the rectangle rule; both are listed as deviations in the results file.

The parts live in their own modules, and their public names are importable from here as well:
:mod:`.othello_seeds` (one seed: training, attribution, its values and its seed record),
:mod:`.othello_analysis` (the per-seed aggregates and the statistics over seeds) and :mod:`.othello_report`
(the report, the ``docs/results.md`` section and the verdict).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..progress import log
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from . import inference
from .othello_analysis import (  # noqa: F401 (re-exported)
    ALPHA,
    COMPONENTS,
    HYPOTHESES,
    TYPES,
    _snapshots_across_seeds,
    across_seeds,
    seed_aggregates,
    snapshot_aggregates,
)
from .othello_report import (  # noqa: F401 (re-exported)
    PAPER_MIDPOINTS,
    PLAYS,
    SNAPSHOT_HEADER,
    judge,
    render_section,
    write_report,
)
from .othello_seeds import (  # noqa: F401 (re-exported)
    EXPERIMENT,
    LATER_SETTINGS,
    _prepare_all,
    _seed_values,
    config_key,
    eval_at,
    read_seed_record,
    recorded_updates,
    seed_record_path,
    train_key,
    train_record_path,
    train_unit,
)
from .records import check_record_slot, commits_of, write_unit_record
from .results import default_results_path, write_results

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
        attribute_steps=None,
        record_every=1,
        snapshot_updates=10,
        snapshot_record_every=1,
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
        attribute_steps=200,
        record_every=5,
        snapshot_updates=10,
        snapshot_record_every=2,
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
        attribute_steps=None,
        record_every=1,
        snapshot_updates=2,
        snapshot_record_every=1,
    ),
}
SNAPSHOTS = 10  # snapshots at the checkpoints 0, 10 %, …, 90 % of training


@dataclass
class OthelloConfig:
    """Seeds × the scale's model; ``overrides`` replace scale fields (each recorded as a deviation)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    layers: list[int] | None = None  # attributed layers (default 1..L)
    random_directions: int = 2
    fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0])
    overrides: dict[str, Any] = field(default_factory=dict)
    lr: float = 1e-3
    device: str = "cpu"
    confidence: float = 0.95
    jobs: int = 1  # seeds trained and attributed in parallel processes
    matmul_precision: str = "highest"  # "tf32": CUDA products in TF32 (training and replay)
    replay_rtol: float = 0.0  # tolerance of the replay's checks against training (0: bit-exact)

    def __post_init__(self) -> None:
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ConfigError(f"jobs must be an integer ≥ 1, got {self.jobs!r}", "e.g. --jobs 2")
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
            raise ConfigError(f"seeds must be distinct non-negative integers, got {self.seeds!r}", "e.g. --seeds 0-2")
        if not self.fractions or any(not 0 < f <= 1 for f in self.fractions):
            raise ConfigError(f"fractions {self.fractions} must lie in (0, 1]", "e.g. 0.25,0.5,1")
        s = self.settings
        L = s["n_layer"]
        if any(not 1 <= k <= L for k in self.attr_layers):
            raise ConfigError(f"attributed layers {self.attr_layers} outside 1..{L}", f"use layers in 1..{L}")
        if any(not 1 <= i <= 59 for i in s["positions"]):
            raise ConfigError(f"positions {s['positions']} must lie in 1..59", "e.g. 12,24,36")
        if isinstance(s["record_every"], bool) or not isinstance(s["record_every"], int) or s["record_every"] < 1:
            raise ConfigError(
                f"record_every={s['record_every']!r} must be an integer ≥ 1",
                "use 1 to record the influence at every attributed update",
            )
        for key in ("snapshot_updates", "snapshot_record_every"):
            v = s[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "snapshot_updates" else 1):
                raise ConfigError(
                    f"{key}={v!r} must be an integer ≥ {0 if key == 'snapshot_updates' else 1}",
                    "snapshot_updates 0 switches the snapshots off",
                )
        if not self.replay_rtol >= 0:
            raise ConfigError(f"replay_rtol={self.replay_rtol!r} must be ≥ 0", "use 0 (bit-exact) on the CPU")
        if s["attribute_steps"] is not None and not 1 <= s["attribute_steps"] <= s["steps"]:
            raise ConfigError(
                f"attribute_steps={s['attribute_steps']} outside 1..{s['steps']}",
                "attribute a prefix of the training run",
            )
        self.ntp_config(self.seeds[0], initial=False)  # the trainer's own validation

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def attr_layers(self) -> list[int]:
        return list(range(1, self.settings["n_layer"] + 1)) if self.layers is None else list(self.layers)

    @property
    def attributed_updates(self) -> int:
        s = self.settings
        return int(s["attribute_steps"] or s["steps"])

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
        if used["record_every"] > 1:
            out.append(
                f"influences recorded at every {used['record_every']}th attributed update, integrated by the "
                "rectangle rule (paper: every update)"
            )
        if used["attribute_steps"] is not None and used["attribute_steps"] < used["steps"]:
            out.append(
                f"influence integrated over updates 1..{used['attribute_steps']} of {used['steps']} (paper: all)"
            )
        if self.snapshot_starts:
            out.append(
                f"beside it (not in the paper): the SGD-variant influence (Δ_c = lr·G_c) of updates c+1..c+"
                f"{self.snapshot_window} at the checkpoints c = 0, 10 %, …, 90 % of training, how the pathways "
                "feed the features as the model learns"
            )
        if len(self.seeds) != 1:
            out.append(f"{len(self.seeds)} seeds (paper 1)")
        return out

    @property
    def curve_every(self) -> int:
        """Held-out evaluation every tenth of training (the learning curve's points)."""
        return max(1, self.settings["steps"] // 10)

    @property
    def checkpoint_every(self) -> int:
        """Checkpoints (model and Adam state) every tenth of training: where the snapshots start."""
        return self.curve_every

    @property
    def snapshot_window(self) -> int:
        """Updates attributed from each snapshot checkpoint (≤ the checkpoint interval)."""
        return min(int(self.settings["snapshot_updates"]), self.checkpoint_every)

    @property
    def snapshot_starts(self) -> list[int]:
        """Checkpoint steps c whose updates c+1..c+``snapshot_window`` the snapshots attribute."""
        K, every, steps = self.snapshot_window, self.checkpoint_every, self.settings["steps"]
        if K == 0:
            return []
        return [j * every for j in range(SNAPSHOTS) if j * every + K <= steps]

    def snapshot_recorded(self, start: int) -> list[int]:
        """Updates of the snapshot at ``start`` whose influences are recorded."""
        return list(range(start + 1, start + self.snapshot_window + 1, self.settings["snapshot_record_every"]))

    @property
    def name(self) -> str:
        return f"othello-{self.scale}"


STAGES = ("all", "train")


def _train_stage(config: OthelloConfig, out: Path, res_path: Path, command: str) -> dict[str, Any]:
    """Train every seed (one unit each) and write its training record beside the results file."""
    written = {}
    with exclusive(out):
        for seed in config.seeds:  # before the hour of training, not after
            check_record_slot(train_record_path(res_path, seed), unit=f"train-{seed}", config_key=train_key(config))
        for seed in config.seeds:
            log(f"[othello] seed {seed}: training (and the untrained-model null) ...")
            d = out / f"seed-{seed}"
            values = train_unit(config, seed, d)
            written[seed] = write_unit_record(
                train_record_path(res_path, seed),
                experiment=EXPERIMENT,
                name=config.name,
                unit=f"train-{seed}",
                config_key=train_key(config),
                values=values,
                command=command,
                run_dir=d / "run",
            )
    return {"stage": "train", "records": {s: str(p) for s, p in written.items()}}


MIN_SEEDS = 3  # a combined results file at the default path needs at least this many seeds


def run_othello(
    config: OthelloConfig,
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
    from_records: bool = False,
    stage: str = "all",
) -> dict[str, Any]:
    """Train, probe, attribute every seed (resuming what exists), aggregate over seeds, write the
    experiment record, the report and the results file; returns the record.

    Every seed's values are also written as a *seed record* beside the results file
    (:func:`seed_record_path`).  ``from_records=True`` trains nothing: every seed is read from its record
    (checked against ``config``), so seeds run at different times combine into one results file.  With
    fewer than :data:`MIN_SEEDS` seeds and no explicit ``results`` path the combined file is not written
    (the seed records are): a results file at the default path is evidence, and evidence needs seeds."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    L = config.settings["n_layer"]
    positions = sorted(config.settings["positions"])
    res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
    command = command or f"python: run_othello({config!r}, {str(out)!r})"
    if stage not in STAGES:
        raise ConfigError(f"unknown stage {stage!r}", f"use one of: {', '.join(STAGES)}")
    if stage == "train":
        return _train_stage(config, out, res_path, command)
    with exclusive(out):
        per_seed: dict[int, dict[str, Any]] = {}
        seed_commits: dict[int, Any] = {}
        if from_records:
            for seed in config.seeds:
                rec = read_seed_record(seed_record_path(res_path, seed), config, seed)
                per_seed[seed] = rec["values"]
                seed_commits[seed] = commits_of(rec)
        else:
            for seed in config.seeds:  # before hours of training, not after
                check_record_slot(seed_record_path(res_path, seed), unit=f"seed-{seed}", config_key=config_key(config))
            prepared = _prepare_all(config, out)
            for seed in config.seeds:
                d = out / f"seed-{seed}"
                per_seed[seed] = _seed_values(config, d, prepared[seed])
                path = write_unit_record(
                    seed_record_path(res_path, seed),
                    experiment=EXPERIMENT,
                    name=config.name,
                    unit=f"seed-{seed}",
                    config_key=config_key(config),
                    values=per_seed[seed],
                    command=command,
                    run_dir=d / "run",
                )
                seed_commits[seed] = commits_of(read_json(path))
        per_seed = {s: per_seed[s] for s in config.seeds}
        layers = sorted({k for s in per_seed.values() for k in s["probes"]}, key=int)
        quality = {
            "eval_loss": inference.mean_ci(
                [s["train"]["trained"]["final_eval"].get("eval_loss") for s in per_seed.values()], config.confidence
            ),
            "legal_acc": inference.mean_ci(
                [s["train"]["trained"]["final_eval"].get("legal_acc") for s in per_seed.values()],
                config.confidence,
                bounds=(0, 1),
            ),
            "initial_legal_acc": inference.mean_ci(
                [s["train"]["initial"]["final_eval"].get("legal_acc") for s in per_seed.values()],
                config.confidence,
                bounds=(0, 1),
            ),
            "train_seconds": inference.mean_ci(
                [s["train"]["trained"]["seconds"] for s in per_seed.values()], config.confidence
            ),
            "probes": {
                k: {
                    m: {
                        "trained": inference.correlation_ci(
                            [s["probes"][k].get(m) for s in per_seed.values()], config.confidence
                        ),
                        "initial": inference.correlation_ci(
                            [s["initial_probes"][k].get(m) for s in per_seed.values()], config.confidence
                        ),
                    }
                    for m in ("pearson", "pearson_type1", "pearson_type2")
                }
                for k in layers
            },
        }
        summary: dict[str, Any] = {
            "scale": {
                "name": config.scale,
                "summary": {
                    "paper": "the paper's configuration",
                    "cpu": "a CPU-sized OthelloGPT",
                    "ci": "a plumbing check, not a result",
                }[config.scale],
                "model": f"{L} layers, d = {config.settings['d_model']}, {config.settings['n_head']} heads",
                "training": f"Adam lr {config.lr}, batch {config.settings['batch_size']}, "
                f"{config.settings['steps']} steps, a pool of {config.settings['othello_pool']} "
                "synthetic games",
                "eval": f"{config.settings['eval_size']} held-out synthetic games",
                "attribution": f"Adam variant, updates 1..{config.attributed_updates}, layers "
                f"{config.attr_layers} × positions {positions}, 16 central cells, "
                f"{config.random_directions} random directions per probe",
                "deviations": config.deviations(),
            },
            "quality": quality,
            "by_fraction": across_seeds(per_seed, config.fractions, config.confidence),
            "snapshots": _snapshots_across_seeds(config, per_seed),
            "per_seed": per_seed,
        }
        if config.snapshot_starts:
            summary["scale"]["snapshots"] = (
                f"SGD variant, updates c+1..c+{config.snapshot_window} from the checkpoints c = "
                f"{', '.join(map(str, config.snapshot_starts))} (influences recorded at every "
                f"{config.settings['snapshot_record_every']}th; mean per recorded update)"
            )
        atomic_write_json(out / "experiment.json", to_jsonable(summary))
        write_report(summary, out)
        summary["seed_commits"] = seed_commits
        if results is None and len(config.seeds) < MIN_SEEDS:
            log(
                f"[othello] {len(config.seeds)} seed(s) < {MIN_SEEDS}: the seed records are written "
                f"({seed_record_path(res_path, config.seeds[0]).parent}), the combined results file is not; "
                f"combine ≥ {MIN_SEEDS} seeds with --from-records"
            )
            summary["results_file"] = None
            return summary
        full = f"{1.0:g}" if "1" in summary["by_fraction"] else sorted(summary["by_fraction"])[-1]
        write_results(
            res_path,
            experiment=EXPERIMENT,
            name=config.name,
            command=command,
            config={
                "experiment": to_jsonable(config),
                "ntp": config.ntp_config(config.seeds[0], initial=False).to_dict(),
            },
            seeds=config.seeds,
            scale=summary["scale"],
            quality=quality,
            numbers={
                "influence": summary["by_fraction"][full]["influence"],
                "by_fraction": {f: v["influence"] for f, v in summary["by_fraction"].items()},
                "snapshots": {
                    c: {"eval": v["eval"], "influence": v["influence"]} for c, v in summary["snapshots"].items()
                },
            },
            tests={
                "hypotheses": summary["by_fraction"][full]["tests"],
                "null": summary["by_fraction"][full]["null_tests"],
                "by_fraction": {f: v["tests"] for f, v in summary["by_fraction"].items()},
                "snapshots": {c: v["tests"] for c, v in summary["snapshots"].items()},
                "alpha": ALPHA,
            },
            data_hashes={f"seed-{s}": v["data_hashes"] for s, v in per_seed.items()},
            runs=[
                {
                    "seed": s,
                    "commits": seed_commits.get(s),
                    "final_eval": v["train"]["trained"]["final_eval"],
                    "train_seconds": v["train"]["trained"]["seconds"],
                    "probes": v["probes"],
                    "initial_probes": v["initial_probes"],
                    "wilcoxon_items": v["aggregates"][full]["wilcoxon_items"],
                }
                for s, v in per_seed.items()
            ],
            extra={
                "sign": "positive influence moves the feature toward its final value; mismatch "
                "without a ½ (the paper's convention)",
                "pooling": "per seed: mean of integrated influence over items (layer k < L, "
                "position, cell); k = L apart; CIs and tests over seeds",
            },
        )
        summary["results_file"] = str(res_path)
    return summary
