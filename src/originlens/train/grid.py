"""The regime experiment (arXiv 2603.14087, the myopic and untied regimes): regimes × seeds, probe
quality of the NTP-useless feature per regime with t-intervals over seeds.

``run_grid(GridConfig(task=..., regimes=[...], seeds=[...], overrides={...}), DIR)`` trains every
(regime, seed) as an ordinary run directory ``DIR/<regime>/seed-<s>`` (``+`` in a regime name becomes
``_``), skipping finished runs and resuming interrupted ones, then writes ``DIR/grid.json`` and
``DIR/report.html`` (+ ``report.md``, ``figures/``) with a table and a bar plot with CI error bars.

Quality metric per run: mean test Pearson r of the final probes over the task's tracked layers,
tracked positions and tracked features, restricted to the NTP-useless feature type (type 1): for
Majority ``is_majority_*`` at positions 2–9 (the useful positions 10–19 have type 2), for Conditioned
Majority ``prev_is_<0>`` at positions 2–19; layers 1–2 (the tasks' tracked sites).  Over seeds: mean and
the two-sided t-interval ``mean ± t_{(1+c)/2, n−1} · s/√n`` (s the sample standard deviation, n the
number of seeds with a finite value; no interval for n < 2).

Caveat: the paper's expectations are qualitative; ``expectation_checks`` compares means (and whether the
intervals are separated), nothing more.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..models.gpt import REGIMES
from ..progress import log
from ..runs import to_jsonable
from ..storage import atomic_write_json, read_json
from ..tasks import get_task
from .ntp import LANGUAGE, NTPConfig, is_finished, load_probe_metrics, tracked_quality, train

EXPECTATIONS = {
    "cond-majority": "prev_is_<0> is learned under standard and untied training, not under myopic or "
    "myopic+untied training (pre-caching is its only source).",
    "majority": "is_majority_* at the input positions is reduced under myopic and under untied training and "
    "lowest under myopic+untied.",
}


@dataclass
class GridConfig:
    """Regimes × seeds of one task; ``overrides`` are :class:`NTPConfig` fields (steps, batch_size, ...)."""

    task: str = "cond-majority"
    regimes: list[str] = field(default_factory=lambda: list(REGIMES))
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.task == LANGUAGE:
            raise ConfigError(
                "the regime grid needs a task with probed features", "use --task majority, cond-majority or othello"
            )
        bad = [r for r in self.regimes if r not in REGIMES]
        if bad or not self.regimes:
            raise ConfigError(
                f"unknown regime(s) {bad}" if bad else "no regimes given",
                f"use a comma-separated subset of: {', '.join(REGIMES)}",
            )
        if len(set(self.regimes)) != len(self.regimes) or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError("regimes and seeds must not repeat", "remove the duplicates")
        if not self.seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ConfigError(f"seeds must be non-negative integers, got {self.seeds!r}", "e.g. --seeds 0,1,2")
        if not 0 < self.confidence < 1:
            raise ConfigError(f"confidence must be in (0, 1), got {self.confidence}", "use 0.95")
        for key in ("task", "regime", "seed"):
            if key in self.overrides:
                raise ConfigError(f"override {key!r} is set by the grid itself", "drop it from overrides")
        self.run_config(self.regimes[0], self.seeds[0])  # validate the overrides early

    def run_config(self, regime: str, seed: int) -> NTPConfig:
        return NTPConfig.from_dict({**self.overrides, "task": self.task, "regime": regime, "seed": int(seed)})


def run_dir_for(out: str | Path, regime: str, seed: int) -> Path:
    """``DIR/<regime>/seed-<s>`` (``+`` → ``_``)."""
    return Path(out) / regime.replace("+", "_") / f"seed-{int(seed)}"


def t_interval(values: Sequence[float], confidence: float = 0.95) -> dict[str, Any]:
    """Mean and two-sided t-interval of the finite ``values`` (``low``/``high`` None when n < 2)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    n = int(v.size)
    if n == 0:
        return {"n": 0, "mean": None, "sd": None, "low": None, "high": None}
    mean = float(v.mean())
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "low": None, "high": None}
    sd = float(v.std(ddof=1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half}


def run_quality(run_dir: str | Path, task_name: str) -> dict[str, Any]:
    """Probe quality of the NTP-useless (type 1) and useful (type 2) tracked features of a finished run,
    overall and per tracked layer, plus its final eval metrics."""
    tracked = get_task(task_name).tracked
    pm = load_probe_metrics(Path(run_dir) / "probe_metrics.npz")
    q = tracked_quality(pm, tracked.layers, tracked.positions, tracked.features)
    out: dict[str, Any] = {
        "useless": q.get("pearson_type1", float("nan")),
        "useful": q.get("pearson_type2", float("nan")),
        "all": q["pearson"],
        "useless_by_layer": {},
    }
    for k in tracked.layers:
        out["useless_by_layer"][str(k)] = tracked_quality(pm, [k], tracked.positions, tracked.features).get(
            "pearson_type1", float("nan")
        )
    summary = read_json(Path(run_dir) / "summary.json")
    out["final_eval"] = summary.get("final_eval", {})
    out["seconds"] = summary.get("seconds")
    return out


def expectation_checks(task: str, stats_by_regime: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pairwise orderings the paper's results imply: ``{"a > b": {"holds": mean_a > mean_b, "ci_separated":
    low_a > high_b}}``; pairs with a missing regime are omitted."""
    pairs = {
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
    }.get(task, [])
    out = {}
    for a, b in pairs:
        sa, sb = stats_by_regime.get(a), stats_by_regime.get(b)
        if not sa or not sb or sa["mean"] is None or sb["mean"] is None:
            continue
        sep = None if sa["low"] is None or sb["high"] is None else bool(sa["low"] > sb["high"])
        out[f"{a} > {b}"] = {"holds": bool(sa["mean"] > sb["mean"]), "ci_separated": sep}
    return out


@dataclass
class GridResult:
    out: Path
    summary: dict[str, Any]
    trained: list[str]
    skipped: list[str]


def _train_one(job: tuple[dict[str, Any], str, int, bool, int | None, float | None]) -> float | None:
    """One run of a grid (a process pool's task): config dict, run directory, torch threads, overwrite,
    verbosity of the parent, deadline (``time.time()``, or None).  Returns the seconds it trained, or None
    when the deadline had passed before it started (nothing written); raises
    :class:`~originlens.errors.BudgetExceeded` when it passed during training (checkpoint written)."""
    cfg_dict, run_dir, threads, overwrite, verbosity, deadline = job
    if deadline is not None and time.time() > deadline:
        return None
    import torch

    from ..progress import set_verbosity

    set_verbosity(verbosity)
    torch.set_num_threads(threads)
    t = time.time()
    train(NTPConfig.from_dict(cfg_dict), run_dir, resume=not overwrite, overwrite=overwrite, deadline=deadline)
    return time.time() - t


# Worker processes train with one thread: torch's (set in the worker) and, through the environment they
# are spawned with, the OpenMP/BLAS pools numpy and scipy start at import (the probes' ridge fits).  Without
# it every worker starts one BLAS thread per core: N workers on N cores run N² threads.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@contextlib.contextmanager
def worker_environment() -> Iterator[None]:
    """While open, processes spawned from here start single-threaded (:data:`WORKER_ENV`) with passive
    OpenMP waiting (unless the environment sets it); this process's own pools are unaffected (fixed at
    their start)."""
    saved = {k: os.environ.get(k) for k in (*WORKER_ENV, "OMP_WAIT_POLICY")}
    os.environ.update(WORKER_ENV)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def worker_pool(jobs: int) -> Iterator[Any]:
    """A pool of ``jobs`` spawned worker processes started single-threaded (:func:`worker_environment`), for
    :func:`train_runs` calls that share it."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with worker_environment(), ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as pool:
        yield pool


def train_runs(
    config: GridConfig,
    out: str | Path,
    *,
    jobs: int = 1,
    overwrite: bool = False,
    deadline: float | None = None,
    executor: Any = None,
) -> tuple[list[str], list[str]]:
    """Train every unfinished (regime, seed) run of ``config`` under ``out`` (all of them with
    ``overwrite``); returns the names trained and skipped.  ``jobs`` > 1 trains that many runs at once in
    worker processes (spawned, one torch thread each: on a few cores, independent small runs side by side
    beat more threads per run); ``jobs`` = 1 trains in this process with its thread count.  The thread
    count is recorded in each run (``environment.json``), as it decides the last bits of the weights.
    ``deadline`` (``time.time()``): runs still training then checkpoint and stop, and
    :class:`~originlens.errors.BudgetExceeded` is raised once the others have finished.  ``executor``: a
    pool from :func:`worker_pool` to train in instead of a new one (its workers, their imports and their
    CUDA contexts are kept between calls)."""
    from ..progress import _VERBOSITY

    todo, skipped = [], []
    for regime in config.regimes:
        for seed in config.seeds:
            cfg = config.run_config(regime, seed)
            d = run_dir_for(out, regime, seed)
            name = f"{regime}/seed-{seed}"
            if not overwrite and is_finished(d, cfg):
                skipped.append(name)
                log(f"{name}: finished, skipped", level=2)
            else:
                todo.append((name, (cfg.to_dict(), str(d), 1, overwrite, _VERBOSITY, deadline)))
    from ..errors import BudgetExceeded

    stopped: list[str] = []  # deadline reached while training: checkpoint written
    unstarted: list[str] = []  # deadline passed before the run started: nothing written

    def outcome(name: str, seconds: float | None, where: str) -> None:
        if seconds is None:
            unstarted.append(name)
        else:
            log(f"{name}: trained in {seconds:.1f} s{where}")

    if executor is None and (jobs <= 1 or len(todo) <= 1):
        import torch

        for name, (c, rd, _, ow, v, dl) in todo:
            try:
                outcome(name, _train_one((c, rd, torch.get_num_threads(), ow, v, dl)), "")
            except BudgetExceeded:
                stopped.append(name)
    else:
        with contextlib.ExitStack() as stack:
            pool = executor if executor is not None else stack.enter_context(worker_pool(min(jobs, len(todo))))
            futures = [(name, pool.submit(_train_one, job)) for name, job in todo]
            try:
                for name, fut in futures:
                    try:
                        outcome(name, fut.result(), " (worker process, 1 thread)")
                    except BudgetExceeded:
                        stopped.append(name)
            except BaseException:
                # a run failed (or this process was interrupted): runs not started are cancelled and the
                # running ones finish before the error propagates, so no worker of a shared pool is left
                # writing into a run directory the caller may be about to read or remove
                for _, fut in futures:
                    fut.cancel()
                for _, fut in futures:
                    if not fut.cancelled():
                        with contextlib.suppress(Exception):  # a second Ctrl-C still stops the wait
                            fut.result()
                raise
    if stopped or unstarted:
        parts = (
            [f"{len(stopped)} of {len(todo)} runs stopped with a checkpoint ({', '.join(stopped)})"] if stopped else []
        )
        if unstarted:
            parts.append(f"{len(unstarted)} not started ({', '.join(unstarted)})")
        raise BudgetExceeded(
            f"deadline reached: {'; '.join(parts)}", "continue with --resume (or give the runs more time)"
        )
    return [name for name, _ in todo], skipped


def run_grid(
    config: GridConfig, out: str | Path, *, overwrite: bool = False, report_only: bool = False, jobs: int = 1
) -> GridResult:
    """Train (or skip/resume) every run (``jobs`` at once, see :func:`train_runs`), then aggregate and
    write ``grid.json`` and the report."""
    out = Path(out)
    trained: list[str] = []
    skipped: list[str] = []
    t0 = time.time()
    if not report_only:
        trained, skipped = train_runs(config, out, jobs=jobs, overwrite=overwrite)
    summary = summarise_grid(config, out)
    summary["wall_seconds"] = time.time() - t0
    summary["trained"], summary["skipped"] = trained, skipped
    atomic_write_json(out / "grid.json", to_jsonable(summary))
    write_grid_report(summary, out)
    return GridResult(out, summary, trained, skipped)


def summarise_grid(config: GridConfig, out: str | Path) -> dict[str, Any]:
    """Per-run qualities and per-regime t-intervals of the finished runs under ``out``."""
    out = Path(out)
    runs, per_regime = [], {}
    for regime in config.regimes:
        by_layer: dict[str, list[float]]
        vals, by_layer, losses, accs, firsts = [], {}, [], [], []
        for seed in config.seeds:
            d = run_dir_for(out, regime, seed)
            if not is_finished(d, config.run_config(regime, seed)):
                runs.append({"regime": regime, "seed": seed, "dir": str(d), "finished": False})
                continue
            q = run_quality(d, config.task)
            runs.append({"regime": regime, "seed": seed, "dir": str(d), "finished": True, **q})
            vals.append(q["useless"])
            for k, v in q["useless_by_layer"].items():
                by_layer.setdefault(k, []).append(v)
            ev = q["final_eval"]
            losses.append(ev.get("eval_loss", float("nan")))
            accs.append(ev.get("legal_output_acc", ev.get("legal_acc", float("nan"))))
            firsts.append(ev.get("first_output_token_acc", float("nan")))
        per_regime[regime] = {
            "useless": t_interval(vals, config.confidence),
            "useless_by_layer": {k: t_interval(v, config.confidence) for k, v in by_layer.items()},
            "eval_loss": t_interval(losses, config.confidence),
            "legal_output_acc": t_interval(accs, config.confidence),
            "first_output_token_acc": t_interval(firsts, config.confidence),
        }
    missing = [f"{r['regime']}/seed-{r['seed']}" for r in runs if not r["finished"]]
    if len(missing) == len(runs):
        raise InputError(f"no finished runs under {out}", "run the grid without --report-only first")
    tracked = get_task(config.task).tracked
    return {
        "task": config.task,
        "regimes": config.regimes,
        "seeds": config.seeds,
        "overrides": config.overrides,
        "confidence": config.confidence,
        "metric": (
            "mean test Pearson r of the final ridge probes (alpha "
            f"{config.run_config(config.regimes[0], config.seeds[0]).probe_alpha}, 70/30 split of the "
            f"eval set) over layers {list(tracked.layers)}, positions {tracked.positions[0]}.."
            f"{tracked.positions[-1]} and features {list(tracked.features)}, restricted to the "
            "NTP-useless feature type (type 1)"
        ),
        "interval": "two-sided Student t-interval over seeds: mean ± t_{(1+c)/2, n-1} · sd / sqrt(n)",
        "expected": EXPECTATIONS.get(config.task, ""),
        "per_regime": per_regime,
        "checks": expectation_checks(config.task, {r: s["useless"] for r, s in per_regime.items()}),
        "runs": runs,
        "missing": missing,
    }


def _fmt(x: Any, digits: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def write_grid_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``DIR/report.html`` (+ ``report.md``): table per regime, bar plot with CI error bars, checks."""
    from ..report import Report, setup_matplotlib

    plt = setup_matplotlib()
    c = int(round(100 * summary["confidence"]))
    rep = Report(f"Regime grid: {summary['task']}")
    rep.text(f"Metric: {summary['metric']}. Interval: {summary['interval']} (c = {summary['confidence']}).")
    if summary["expected"]:
        rep.text(f"Expected (arXiv 2603.14087): {summary['expected']}")
    layers = sorted({k for s in summary["per_regime"].values() for k in s["useless_by_layer"]}, key=int)
    header = (
        ["regime", "seeds", "useless r (mean)", f"{c}% CI low", f"{c}% CI high"]
        + [f"layer {k} r" for k in layers]
        + ["eval loss", "output legal acc"]
    )
    rows = []
    for regime, s in summary["per_regime"].items():
        u = s["useless"]
        rows.append(
            [regime, u["n"], _fmt(u["mean"]), _fmt(u["low"]), _fmt(u["high"])]
            + [_fmt(s["useless_by_layer"][k]["mean"]) for k in layers]
            + [_fmt(s["eval_loss"]["mean"], 4), _fmt(s["legal_output_acc"]["mean"])]
        )
    rep.section("Probe quality of the NTP-useless feature per regime")
    rep.table(header, rows, caption="final probes; means over seeds")

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    names = list(summary["per_regime"])
    means = [summary["per_regime"][r]["useless"]["mean"] for r in names]
    xs = np.arange(len(names))
    heights = [m if m is not None else np.nan for m in means]
    lo = [
        (m - s["useless"]["low"]) if s["useless"]["low"] is not None else 0.0
        for m, s in zip(heights, summary["per_regime"].values())
    ]
    hi = [
        (s["useless"]["high"] - m) if s["useless"]["high"] is not None else 0.0
        for m, s in zip(heights, summary["per_regime"].values())
    ]
    ax.bar(xs, heights, yerr=[lo, hi], capsize=4, color="#0072B2", alpha=0.8)
    for i, r in enumerate(names):
        pts = [run["useless"] for run in summary["runs"] if run["regime"] == r and run.get("finished")]
        ax.plot([i] * len(pts), pts, "o", color="#D55E00", ms=3)
    ax.set_xticks(xs, names)
    ax.set_ylabel("probe Pearson r (NTP-useless)")
    ax.set_title(summary["task"])
    rep.figure(
        fig,
        f"Mean probe Pearson r of the NTP-useless feature per training regime with {c}% "
        "t-intervals over seeds (bars) and the individual seeds (dots).",
        name="grid.png",
    )

    if summary["checks"]:
        rep.section("Expected orderings")
        rep.table(
            ["ordering", "means agree", "CIs separated"],
            [
                [k, v["holds"], "—" if v["ci_separated"] is None else v["ci_separated"]]
                for k, v in summary["checks"].items()
            ],
        )
    rep.section("Runs")
    rep.table(
        ["regime", "seed", "useless r", "useful r", "eval loss", "seconds"],
        [
            [
                r["regime"],
                r["seed"],
                _fmt(r.get("useless")),
                _fmt(r.get("useful")),
                _fmt(r.get("final_eval", {}).get("eval_loss"), 4),
                _fmt(r.get("seconds"), 1),
            ]
            if r.get("finished")
            else [r["regime"], r["seed"], "not finished", "", "", ""]
            for r in summary["runs"]
        ],
    )
    rep.text(f"Overrides of the paper's defaults: {summary['overrides'] or 'none'}.")
    return rep.write(out)


def format_grid_table(summary: dict[str, Any]) -> str:
    """Plain-text table of the per-regime results (for the terminal)."""
    c = int(round(100 * summary["confidence"]))
    lines = [f"{'regime':<15} {'n':>2} {'useless r':>10} {f'{c}% CI':>17} {'eval loss':>10} {'out acc':>8}"]
    for regime, s in summary["per_regime"].items():
        u = s["useless"]
        ci = f"[{_fmt(u['low'])}, {_fmt(u['high'])}]"
        lines.append(
            f"{regime:<15} {u['n']:>2} {_fmt(u['mean']):>10} {ci:>17} "
            f"{_fmt(s['eval_loss']['mean'], 4):>10} {_fmt(s['legal_output_acc']['mean']):>8}"
        )
    for k, v in summary.get("checks", {}).items():
        lines.append(
            f"check {k}: means {'agree' if v['holds'] else 'DISAGREE'}"
            + ("" if v["ci_separated"] is None else f", CIs {'separated' if v['ci_separated'] else 'overlap'}")
        )
    return "\n".join(lines)
