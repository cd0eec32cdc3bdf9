"""The toy regime grids of arXiv 2603.14087 (regimes, the Majority and Conditioned Majority tasks, results) as an experiment
that can fail: regimes × seeds, an untrained-model null for every run, CIs over seeds, the paper's
orderings tested as hypotheses.

``run_toy_grid(ToyGridConfig(task="cond-majority", scale="cpu", seeds=[0, 1, 2, 3, 4]), OUT)``:

1. trains every (regime, seed) with :mod:`originlens.train.ntp` under ``OUT/trained/<regime>/seed-<s>``
   (resumable; finished runs are skipped) — the paper's protocol: Adam 1e-3, a fixed training set of
   102,400 sequences per seed, untied regimes split at m = 10 into two complete models;
2. fits the same probes on the **initial** model of every (regime, seed) (``OUT/initial/...``, 0 steps):
   the null that says how much of the feature is linearly decodable before any learning;
3. aggregates over seeds, the unit of replication: per regime the probe quality of the NTP-useless
   feature (mean test Pearson r over the tracked layers and positions, type-1 entries only — Majority's
   ``is_majority_*`` at positions 2–9, Conditioned Majority's ``prev_is_<0>`` at 2–19), Fisher-z
   intervals, the gain over the null, and the models' own quality (eval loss, output accuracy);
4. tests the paper's orderings (:data:`HYPOTHESES`) as one-sided paired tests over seeds (paired t on
   Fisher z with Holm's adjustment over the family, exact Wilcoxon beside it, power), and every regime
   against its own initial model;
5. writes ``OUT/experiment.json``, ``OUT/report.html`` (+ ``report.md``) and the results file
   (``results/toy-grid/<task>-<scale>.json`` unless ``results`` says otherwise).

Scales (:data:`SCALES`): ``paper`` is the paper's configuration (d = 128, 4 heads, 2 layers, batch 256,
3,000 steps, eval 10,240); ``cpu`` halves the width (d = 64) so that 4 regimes × 5 seeds of one task fit
in about an hour on two CPU cores; ``ci`` is a seconds-long regression check of the direction
(standard > myopic on Conditioned Majority), not a result.  Every departure from the paper is listed in
the results file's ``scale.deviations``.

Caveat: the paper reports its toy results qualitatively (bar plots, no numbers), so "paper" columns are
the expected orderings, not values.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..models.gpt import REGIMES
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from ..train.grid import GridConfig, run_dir_for, run_quality, train_runs
from ..train.ntp import COUNTING_TASKS, NTPConfig
from . import inference
from .config_checks import check_jobs, check_scale
from .results import default_results_path, write_results
from .toy_grid_report import write_report

EXPERIMENT = "toy-grid"
# Shared by every scale: only the final probes are needed (plus checkpoints for resuming).
COMMON = dict(eval_every=0, probe_every=0, checkpoint_every=500, keep_checkpoints=1, log_every=50)
SCALES: dict[str, dict[str, Any]] = {
    "paper": {},
    "cpu": dict(d_model=64),
    "ci": dict(d_model=32, batch_size=64, steps=1200, eval_size=1024, train_size=16384, checkpoint_every=0),
}
SCALE_NOTES = {
    "paper": "the paper's configuration",
    "cpu": "the paper's configuration at half width (d = 64), the largest that fits 4 regimes × 5 seeds "
    "in about an hour on 2 CPU cores",
    "ci": "a regression check of the direction in seconds; not a result",
}
# (a, b): the paper expects the NTP-useless feature's probe quality to be higher under regime a than b.
HYPOTHESES: dict[str, list[tuple[str, str]]] = {
    "cond-majority": [
        ("standard", "myopic"),
        ("standard", "myopic+untied"),
        ("untied", "myopic"),
        ("untied", "myopic+untied"),
    ],
    "majority": [
        ("standard", "myopic"),
        ("standard", "untied"),
        ("myopic", "myopic+untied"),
        ("untied", "myopic+untied"),
    ],
}
EXPECTED = {
    "cond-majority": "prev_is_<0> is learned under standard and untied training and not under myopic or "
    "myopic+untied training (pre-caching is its only source)",
    "majority": "is_majority_* at the input positions degrades under myopic or untied training and most under both",
}
ALPHA = 0.05
# The equivalence margin of reading A on the null-normalised gain scale: a gain within ± 0.1 (a tenth of
# the headroom above the untrained model's probe quality) counts as "not learned".  Fixed in the code and
# written in every results file; it was set after the d = 64 grid had been run and before the paper-width
# (d = 128, 10-seed) grid, which is its first test made blind to the data.
GAIN_MARGIN = 0.1
MARGIN_FIXED = (
    "set in the code after the d = 64 grids had been run (their data seen) and before the d = 128, 10-seed "
    "grids, which are its first blind test"
)
READINGS = {
    "A": "not learned without pre-caching: each myopic regime's gain is equivalent to 0 (TOST, ± margin)",
    "B": "substantially decreased: each myopic regime's gain is at most half of standard's (one-sided, Holm)",
}


@dataclass
class ToyGridConfig:
    """One task's grid; ``overrides`` are :class:`~originlens.train.ntp.NTPConfig` fields applied on top
    of the scale (each one is recorded as a deviation)."""

    task: str = "cond-majority"
    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    regimes: list[str] = field(default_factory=lambda: list(REGIMES))
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95
    jobs: int = 1

    def __post_init__(self) -> None:
        if self.task not in COUNTING_TASKS:
            raise ConfigError(
                f"the toy grid runs the counting tasks, not {self.task!r}", f"use --task {' or '.join(COUNTING_TASKS)}"
            )
        check_scale(self.scale, SCALES)
        check_jobs(self.jobs)
        self.grid(False)  # validates regimes, seeds and overrides

    def ntp_overrides(self, initial: bool) -> dict[str, Any]:
        ov = {**COMMON, **SCALES[self.scale], **self.overrides}
        if initial:
            ov.update(steps=0, checkpoint_every=0)
        return ov

    def grid(self, initial: bool) -> GridConfig:
        return GridConfig(
            task=self.task,
            regimes=list(self.regimes),
            seeds=list(self.seeds),
            overrides=self.ntp_overrides(initial),
            confidence=self.confidence,
        )

    @property
    def name(self) -> str:
        return f"{self.task}-{self.scale}"

    def deviations(self) -> list[str]:
        """Every difference from the paper's configuration (its hyper-parameter table)."""
        paper = NTPConfig(task=self.task)
        used = NTPConfig.from_dict({**self.ntp_overrides(False), "task": self.task})
        out = []
        for key in (
            "n_layer",
            "d_model",
            "n_head",
            "batch_size",
            "lr",
            "steps",
            "eval_size",
            "train_size",
            "untie_scope",
            "probe_alpha",
            "probe_train_frac",
            "betas",
            "eps",
        ):
            a, b = getattr(paper, key), getattr(used, key)
            if a != b:
                out.append(f"{key} {b} (paper {a})")
        if len(self.seeds) < 10:
            out.append(f"{len(self.seeds)} seeds (paper 10)")
        return out


def _train_all(
    grid: GridConfig, out: Path, jobs: int, deadline: float | None = None, executor: Any = None
) -> list[str]:
    return train_runs(grid, out, jobs=jobs, deadline=deadline, executor=executor)[0]


def _per_run(grid: GridConfig, out: Path, regime: str, seed: int) -> dict[str, Any]:
    d = run_dir_for(out, regime, seed)
    q = run_quality(d, grid.task)
    env = read_json(d / "environment.json")
    ev = q["final_eval"]
    return {
        "regime": regime,
        "seed": seed,
        "useless_r": q["useless"],
        "useful_r": q["useful"],
        "useless_by_layer": q["useless_by_layer"],
        "eval_loss": ev.get("eval_loss"),
        "legal_output_acc": ev.get("legal_output_acc"),
        "first_output_token_acc": ev.get("first_output_token_acc"),
        "seconds": q["seconds"],
        "data_hashes": env.get("data_hashes", {}),
    }


def summarise(config: ToyGridConfig, out: str | Path) -> dict[str, Any]:
    """Per-run values, per-regime CIs, hypothesis tests of the finished grid under ``out``."""
    out = Path(out)
    trained_grid, initial_grid = config.grid(False), config.grid(True)
    runs: list[dict[str, Any]] = []
    for regime in config.regimes:
        tr = [_per_run(trained_grid, out / "trained", regime, s) for s in config.seeds]
        ini = [_per_run(initial_grid, out / "initial", regime, s) for s in config.seeds]
        for trained, initial in zip(tr, ini):
            trained["initial_useless_r"] = initial["useless_r"]
            trained["initial_eval_loss"] = initial["eval_loss"]
        runs += tr
    return summarise_runs(config, runs)


def gain(r: float | None, r0: float | None) -> float | None:
    """The null-normalised gain (r − r₀) / (1 − r₀): the share of the headroom above the untrained
    model's probe quality that training closed (0: no better than the null; 1: a perfect probe)."""
    if r is None or r0 is None or not (math.isfinite(r) and math.isfinite(r0)) or r0 >= 1:
        return None
    return (r - r0) / (1 - r0)


def summarise_runs(config: ToyGridConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-regime CIs, the orderings and the readings from the per-run values (each run's trained and
    initial-model probe quality; what :func:`summarise` reads from the run directories, or a results
    file's ``runs``)."""
    for r in runs:
        r["gain"] = gain(r["useless_r"], r["initial_useless_r"])
    by = {(r["regime"], r["seed"]): r for r in runs}
    per_regime: dict[str, Any] = {}
    for regime in config.regimes:
        tr = [by[(regime, s)] for s in config.seeds]
        useless = [r["useless_r"] for r in tr]
        init = [r["initial_useless_r"] for r in tr]
        layers = sorted({k for r in tr for k in r["useless_by_layer"]}, key=int)
        per_regime[regime] = {
            "useless_r": inference.correlation_ci(useless, config.confidence),
            "useless_r_bootstrap": inference.bootstrap_ci(useless, config.confidence),
            "initial_useless_r": inference.correlation_ci(init, config.confidence),
            "gain": inference.mean_ci([r["gain"] for r in tr], config.confidence),
            "gain_over_initial": inference.paired_test(useless, init, alternative="greater"),
            "useful_r": inference.correlation_ci([r["useful_r"] for r in tr], config.confidence),
            "useless_r_by_layer": {
                k: inference.correlation_ci([r["useless_by_layer"][k] for r in tr], config.confidence) for k in layers
            },
            "eval_loss": inference.mean_ci([r["eval_loss"] for r in tr], config.confidence),
            "initial_eval_loss": inference.mean_ci([r["initial_eval_loss"] for r in tr], config.confidence),
            "legal_output_acc": inference.mean_ci(
                [r["legal_output_acc"] for r in tr], config.confidence, bounds=(0, 1)
            ),
            "first_output_token_acc": inference.mean_ci(
                [r["first_output_token_acc"] for r in tr], config.confidence, bounds=(0, 1)
            ),
            "seconds": inference.mean_ci([r["seconds"] for r in tr], config.confidence),
        }
    tests: dict[str, Any] = {}
    for a, b in HYPOTHESES[config.task]:
        if a in config.regimes and b in config.regimes:
            tests[f"{a} > {b}"] = inference.paired_test(
                [by[(a, s)]["gain"] for s in config.seeds],
                [by[(b, s)]["gain"] for s in config.seeds],
                alternative="greater",
                correlation=False,
                alpha=ALPHA,
            )
    adj = inference.holm({k: v["p_t"] for k, v in tests.items()})
    for k, v in tests.items():
        v["p_holm"] = adj[k]
        v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
    learned = {
        f"{r} > initial": {
            **per_regime[r]["gain_over_initial"],
            "holds": (per_regime[r]["gain_over_initial"]["p_t"] or 1.0) < ALPHA,
        }
        for r in config.regimes
    }
    hashes = {f"{r['regime']}/seed-{r['seed']}": r.get("data_hashes", {}) for r in runs}
    return {
        "task": config.task,
        "scale": config.scale,
        "per_regime": per_regime,
        "orderings": tests,
        "learned": learned,
        "readings": readings(config, by),
        "runs": runs,
        "data_hashes": hashes,
    }


def readings(config: ToyGridConfig, by: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any] | None:
    """Conditioned Majority's claim read two ways (:data:`READINGS`), each tested per myopic regime on
    the gains: (A) "not learned without pre-caching" — the regime's gain is equivalent to 0 within
    ± :data:`GAIN_MARGIN` (TOST); (B) "substantially decreased" — its gain is at most half of standard's
    (one-sided paired t of ½·gain(standard) − gain(regime) > 0, Holm over the myopic regimes).  None for
    a task without two readings or a grid without the standard regime."""
    if config.task != "cond-majority" or "standard" not in config.regimes:
        return None
    std = [by[("standard", s)]["gain"] for s in config.seeds]
    out: dict[str, Any] = {
        "margin": GAIN_MARGIN,
        "margin_fixed": MARGIN_FIXED,
        "statements": READINGS,
        "A": {},
        "B": {},
    }
    for regime in ("myopic", "myopic+untied"):
        if regime not in config.regimes:
            continue
        g = [by[(regime, s)]["gain"] for s in config.seeds]
        out["A"][regime] = inference.tost(g, GAIN_MARGIN, alpha=ALPHA)
        half = [None if x is None else 0.5 * x for x in std]
        out["B"][regime] = inference.paired_test(half, g, alternative="greater", correlation=False, alpha=ALPHA)
    adj = inference.holm({k: v["p_t"] for k, v in out["B"].items()})
    for k, v in out["B"].items():
        v["p_holm"] = adj[k]
        v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
    out["A_holds"] = bool(out["A"]) and all(v["equivalent"] for v in out["A"].values())
    out["B_holds"] = bool(out["B"]) and all(v["holds"] for v in out["B"].values())
    return out


def run_toy_grid(
    config: ToyGridConfig,
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
    deadline: float | None = None,
    executor: Any = None,
) -> dict[str, Any]:
    """Train (or resume) the grid and its initial-model nulls, aggregate, write the experiment record,
    the report and the results file; returns the record.  ``deadline`` (``time.time()``): runs still
    training then stop with a checkpoint and :class:`~originlens.errors.BudgetExceeded` is raised before
    anything is aggregated (a later call resumes them).  ``executor``: a shared
    :func:`~originlens.train.grid.worker_pool` to train in."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with exclusive(out):
        trained = _train_all(config.grid(False), out / "trained", config.jobs, deadline, executor)
        _train_all(config.grid(True), out / "initial", config.jobs, deadline, executor)
        summary = summarise(config, out)
        summary["wall_seconds_this_call"] = time.time() - t0
        summary["trained_this_call"] = len(trained)
        return _publish(config, summary, out, results, command or f"python: run_toy_grid({config!r}, {str(out)!r})")


def reanalyse_toy_grid(
    config: ToyGridConfig,
    record: dict[str, Any],
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """The statistics of this version recomputed from the runs recorded in a results file (``record``:
    its per-run trained and initial-model probe qualities), without the run directories; the new file
    names the record it was computed from (``reanalysed_from``: its commit and time).  ``config`` must
    describe the same grid (task, scale, seeds, regimes, overrides)."""
    from ..errors import InputError

    want = to_jsonable(config)
    got = (record.get("config") or {}).get("experiment") or {}
    same = {k: want[k] for k in ("task", "scale", "seeds", "regimes", "overrides")}
    theirs = {k: got.get(k) for k in same}
    if record.get("experiment") != EXPERIMENT or theirs != same:
        raise InputError(
            f"the results file is not a {EXPERIMENT} record of this grid (it has {theirs}, this grid is {same})",
            "pass the --task, --scale and --seeds the file was made with",
        )
    hashes = record.get("data_hashes") or {}
    runs = [{**r, "data_hashes": hashes.get(f"{r['regime']}/seed-{r['seed']}", {})} for r in record["runs"]]
    missing = [
        (rg, sd)
        for rg in config.regimes
        for sd in config.seeds
        if not any(r["regime"] == rg and r["seed"] == sd for r in runs)
    ]
    if missing:
        raise InputError(f"the results file lacks the runs {missing}", "reanalyse the grid it was made for")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with exclusive(out):
        summary = summarise_runs(config, runs)
        summary["reanalysed_from"] = {k: record.get(k) for k in ("git_commit", "created", "command")}
        return _publish(config, summary, out, results, command or f"python: reanalyse_toy_grid({config!r})")


def _publish(
    config: ToyGridConfig, summary: dict[str, Any], out: Path, results: str | Path | None, command: str
) -> dict[str, Any]:
    """The experiment record, the report and the results file of a summarised grid."""
    cfg0 = config.grid(False).run_config(config.regimes[0], config.seeds[0])
    scale = {
        "name": config.scale,
        "summary": SCALE_NOTES[config.scale],
        "model": f"{cfg0.n_layer} layers, d = {cfg0.d_model}, {cfg0.n_head} heads",
        "training": f"Adam lr {cfg0.lr}, batch {cfg0.batch_size}, {cfg0.steps} steps, "
        + (f"fixed training set of {cfg0.train_size} sequences" if cfg0.train_size else "fresh sequences every step"),
        "eval": f"{cfg0.eval_size} sequences; ridge probes (alpha {cfg0.probe_alpha}) on the first "
        f"{int(cfg0.probe_train_frac * 100)} %, Pearson r on the rest",
        "untied": f"split at m = 10, untie_scope {cfg0.untie_scope}",
        "deviations": config.deviations(),
    }
    summary["scale"] = scale
    summary["expected"] = EXPECTED[config.task]
    atomic_write_json(out / "experiment.json", to_jsonable(summary))
    write_report(summary, out)
    res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
    quality = {
        r: {
            k: summary["per_regime"][r][k]
            for k in ("eval_loss", "initial_eval_loss", "legal_output_acc", "first_output_token_acc")
        }
        for r in config.regimes
    }
    numbers = {
        r: {
            k: summary["per_regime"][r][k]
            for k in ("useless_r", "useless_r_bootstrap", "initial_useless_r", "gain", "useful_r", "useless_r_by_layer")
        }
        for r in config.regimes
    }
    extra: dict[str, Any] = {
        "metric": (
            "mean test Pearson r of the final ridge probes over the tracked layers "
            "and positions, NTP-useless (type 1) entries only; one value per run; gain = (r − r₀) / (1 − r₀) "
            "against the same probe on the untrained model of the same regime and seed"
        )
    }
    if summary.get("reanalysed_from"):
        extra["reanalysed_from"] = summary["reanalysed_from"]
    write_results(
        res_path,
        experiment=EXPERIMENT,
        name=config.name,
        command=command,
        config={"experiment": to_jsonable(config), "ntp": cfg0.to_dict()},
        seeds=config.seeds,
        scale=scale,
        numbers=numbers,
        quality=quality,
        data_hashes=summary["data_hashes"],
        tests={
            "orderings": summary["orderings"],
            "orderings_scale": "null-normalised gain, paired over seeds",
            "learned": summary["learned"],
            "readings": summary["readings"],
            "alpha": ALPHA,
            "expected": EXPECTED[config.task],
        },
        runs=[{k: v for k, v in r.items() if k != "data_hashes"} for r in summary["runs"]],
        extra=extra,
    )
    summary["results_file"] = str(res_path)
    return summary
