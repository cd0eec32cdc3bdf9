"""The synthetic-world experiments of arXiv 2603.14087 at the paper's configuration, planned to a time budget
on one accelerator: the toy regime grids (Majority, Conditioned Majority; 2 layers, d = 128, 4 heads, batch
256, Adam 1e-3, 3,000 steps, up to 10 seeds × 4 regimes) and OthelloGPT with influence attribution (6
layers, d = 256, 4 heads, batch 1,024, 5,000 steps; the 16 central cells by feature type).

``run_paper_scale(PaperScaleConfig(budget_minutes=8), OUT)``:

1. **calibrate** (bounded by ``calibration_share`` of the budget, 35 %; ≈ 90 s on an H200): steps/s of
   one paper-config Conditioned Majority model, of the paper's OthelloGPT, and the replay's cost per
   attributed update (decomposition only, and with the influences recorded) on a short throw-away Othello
   run, in its own process stopped at that bound (the Othello experiment is skipped if it does not
   finish); on CUDA also the Othello step under bf16 autocast, for the achieved-FLOP/s figure only (no
   result is trained in bf16); or, with ``calibration``, the numbers of an earlier results file measured
   on the same device with the same matrix-product precision (:func:`reused_calibration`);
2. **toy grids**: :func:`~originlens.experiments.toy_grid.run_toy_grid` at the ``paper`` scale for each
   task, the seeds grown in turn (3, then 5, then 10) while the measured rate of the previous round says
   the next one fits the toy share of the budget; the runs of a round are trained ``jobs`` at a time in
   single-threaded worker processes sharing the device (resumable: a later round trains only its new
   seeds);
3. **Othello**: :func:`~originlens.experiments.othello.run_othello` at the ``paper`` scale with the
   overrides the plan needs to fit what is left (:func:`plan_othello`: training is never cut; the number of
   seeds, then the attributed positions, then the number of strata; the fraction of training sampled is
   reported); every cut is a deviation in the results file; it runs in its own process with the
   machine's threads;
4. writes the experiments' own results files (``toy-grid/<task>-paper``, ``othello/othello-paper`` under
   ``results``), this run's record ``paper-scale/<name>`` (calibration, plan, throughput, achieved FLOP/s,
   what was cut and why, the verdict of every claim whose results file this run wrote),
   ``OUT/paper-scale-runs.tar.gz`` (the run
   directories without checkpoints, pools and models) and prints the summary table.

The clock is checked between units of work and inside them (runs still training at the deadline
checkpoint and stop; the Othello process is sent SIGTERM, then killed after a grace of at most half the
reserve); a unit that would not finish before the deadline is not started, and what finished is written
(the record says what was skipped).  ``smoke=True`` runs the same
code end to end on the CPU at tiny size (toy scale ``ci`` with fewer steps, Othello scale ``ci``) in under
a minute — the test suite runs it.

Settings on CUDA: TF32 products (``matmul_precision="tf32"``: 10-bit mantissa inputs, float32 accumulation
and storage; training and its replay alike, so the replay repeats training; ``"highest"`` turns it off),
deterministic kernels (so that the attribution replay repeats training; its checks run with
``replay_rtol`` as a guard), the trainer's fast path (no host synchronisation inside the step loop;
bit-identical to the per-step path).  Caveats: how far TF32 moves the pathway components is measured by
emulation on a CPU only (``benchmarks/tf32_emulation.py``: ≈ 7e-4 relative, the sum identity to 7.5e-8;
``--matmul-precision highest`` is the conservative choice); the toy models are
trained as separate processes sharing the GPU, not vmapped together — stacking 40 of them with
``torch.func.vmap`` measured slower than 8 processes on an H200 (``benchmarks/stacked_models.py``: 6.1× vs
7.6× one process stepping them in turn; torch has no batching rule for the memory-efficient attention
backward), and processes keep the trainer, evaluation, probes and checkpoints every experiment uses.

Parts: :mod:`.paper_scale_calibration` (the measurements), :mod:`.paper_scale_report` (summary table,
docs section, archive), :mod:`.paper_scale_units` (units in their own process, stopped at the deadline); this module holds the configuration, the plans and the run.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ..errors import BudgetExceeded, ConfigError
from ..progress import log
from ..runs import to_jsonable
from ..storage import atomic_write_json, read_json
from .paper_scale_calibration import SMOKE_OTHELLO, SMOKE_TOY, calibrate, calibrate_othello
from .paper_scale_config import EXPERIMENT, OTHELLO_CALIBRATION, PaperScaleConfig
from .paper_scale_report import archive_runs, othello_line, summary_table, toy_line
from .paper_scale_units import run_until
from .results import write_results

__all__ = ["Clock", "othello_step", "plan_othello", "reused_calibration", "run_paper_scale", "spread"]


class Clock:
    """The run's deadline: ``left()`` seconds remain of the budget less the reserve (kept for stopping the
    last unit — :attr:`grace`, at most half of it — and for the records, the archive and the summary)."""

    def __init__(self, budget_s: float, reserve_s: float) -> None:
        self.t0 = time.time()
        self.deadline = self.t0 + budget_s - reserve_s
        self.grace = min(15.0, reserve_s / 2)

    def left(self) -> float:
        return self.deadline - time.time()

    def elapsed(self) -> float:
        return time.time() - self.t0


# ------------------------------------------------------------------------------------------------ plans
def spread(positions: list[int], n: int) -> list[int]:
    """``n`` of ``positions`` spread evenly over the game (the first and the last kept)."""
    ps = sorted(positions)
    if n >= len(ps):
        return ps
    if n == 1:
        return [ps[len(ps) // 2]]
    return sorted({ps[round(j * (len(ps) - 1) / (n - 1))] for j in range(n)})


def othello_step(cal: dict[str, Any]) -> float:
    """Seconds per Othello training update for the plan: the step alone in the run's own precision
    (:func:`~.paper_scale_calibration.step_alone`, ≥ 20 updates with nothing else in the window) where the
    calibration has it — the trainer's evaluations, probes and files are its ``othello_other_seconds`` —
    else the trainer-timed step of older calibrations."""
    alone = cal.get("othello_step_alone") or {}
    for key in ("tf32", "fp32"):
        if "seconds" in alone.get(key, {}):
            return float(alone[key]["seconds"])
    return float(cal["othello_step_seconds"])


def plan_othello(seconds: float, cal: dict[str, Any], settings: dict[str, Any], seeds: int) -> dict[str, Any] | None:
    """What of the Othello experiment at the ``paper`` scale fits ``seconds`` (None when not even one seed
    trained in full and one stratum fits).

    Training is never cut (an early prefix of training has no board features to attribute): per seed,
    run 1 trains all ``steps`` with checkpoints, then one stratified segment per stratum (``burn_in``
    decomposed + ``stratum_updates`` recorded updates from a checkpoint, the first moment carried) at the
    attributed sites.  Cuts, in order: seeds (→ 1), attributed positions (14 → 7 → 4 → 2 → 1, spread over
    the game; the paper tracks one position per run), strata (10 → 5 → 2 → 1: the fraction of training
    sampled, reported).  The replay's cost per update is calibrated at ``calibration_sites`` sites (84 when
    not recorded) and scaled linearly with the number of sites; a 1.5 safety factor covers what the
    calibration did not see."""
    step, dec, rec = othello_step(cal), cal["decomposed_update_seconds"], cal["recorded_update_seconds"]
    cal_sites = int(cal.get("calibration_sites", 84))
    # pool, evaluations (11 of the trained model, 1 of the null) and probes, loading the replay
    # and the trainer's construction (measured on a small pool: the paper's pool costs more, hence the 5 s)
    fixed = (
        2.0 * cal.get("attribution_fixed_seconds", 0.0)
        + 12 * cal.get("othello_other_seconds", 5.0)
        + cal.get("othello_setup_seconds", 0.0)
        + 5.0
    )
    steps, layers = int(settings["steps"]), int(settings["n_layer"])
    b, n = int(settings["burn_in"]), int(settings["stratum_updates"])
    positions = list(settings["positions"])

    def cost(n_pos: int, strata: int) -> float:
        scale = n_pos * layers / cal_sites
        per_stratum = (b * dec + n * rec) * scale + 2 * cal.get("othello_other_seconds", 5.0)  # + its curve point
        return 1.5 * (steps * step + fixed + strata * per_stratum)

    for n_seeds in sorted({seeds, 1}, reverse=True):
        for n_pos in [k for k in (len(positions), 7, 4, 2, 1) if k <= len(positions)]:
            for strata in [k for k in (int(settings["strata"]), 5, 2, 1) if k <= int(settings["strata"])]:
                if n_seeds * cost(n_pos, strata) <= seconds:
                    pos = spread(positions, n_pos)
                    return {
                        "steps": steps,
                        "positions": pos,
                        "check_positions": [pos[len(pos) // 2]],
                        "strata": strata,
                        "seeds": n_seeds,
                        "sampled_fraction": strata * n / steps,
                        "predicted_seconds": n_seeds * cost(n_pos, strata),
                    }
    return None


def _toy_round_seconds(rate: float | None, runs: int, cal: dict[str, Any], steps: int, jobs: int) -> float:
    """Predicted seconds for ``runs`` more toy runs: from the measured seconds per run of the previous
    round, else from the single-model calibration with no gain from sharing (the safe side)."""
    if rate is not None:
        return runs * rate
    # a trained run and its 0-step null: data, evaluation and probes twice (the calibration run had the
    # grid's data and eval sizes)
    per_run = steps * cal["toy_step_seconds"] + 2 * cal["toy_other_seconds"]
    # processes sharing a GPU: on an H200, 16 trainers ran at 40 steps/s each against 111 for one alone
    # (5.8×; benchmarks/RESULTS.md): count a third of the processes, at most a third of the CPUs
    gain = min(jobs, 2) if cal.get("device") == "cpu" else max(1, min(jobs, (os.cpu_count() or 3)) // 3)
    # once per worker, side by side: its start (2 s) and its first trainer's construction (imports included)
    return runs * per_run / gain + 2.0 + cal.get("toy_setup_seconds", 0.0)


# --------------------------------------------------------------------------------------------------- run
def run_paper_scale(
    config: PaperScaleConfig, out: str | Path, *, results: str | Path = "results", command: str | None = None
) -> dict[str, Any]:
    """Calibrate, plan, run what fits, write the records, the archive and the summary; returns the record."""
    import torch

    from ..devices import DETERMINISTIC_ENV, resolve_device
    from ..train.grid import worker_pool
    from .claims import CLAIMS
    from .othello_config import OthelloConfig
    from .toy_grid import ToyGridConfig, run_toy_grid

    device = resolve_device(config.device)  # before anything is written
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    if config.smoke and device.type != "cpu":
        raise ConfigError("the smoke run is a CPU check", "drop --smoke, or use --device cpu")
    reused = None
    if config.calibration is not None:
        reused = reused_calibration(config.calibration, device_name, config.matmul_precision)
        if device.type == "cpu":
            log(
                f"[paper-scale] note: a CPU's name does not identify it; {config.calibration} may come from another machine"
            )
        if device.type == "cuda" and reused.get("deterministic_kernels") is False:
            os.environ[DETERMINISTIC_ENV] = "0"
    out, results = Path(out), Path(results)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(config.budget_minutes * 60.0, min(config.reserve_seconds, config.budget_minutes * 6.0))
    os.environ.setdefault(DETERMINISTIC_ENV, "1")  # spawned workers inherit it
    jobs = config.jobs or (min(16, os.cpu_count() or 1) if device.type == "cuda" else 2)
    rtol = config.replay_rtol if device.type == "cuda" else 0.0
    command = command or f"python: run_paper_scale({config!r}, {str(out)!r})"
    record: dict[str, Any] = {
        "device": str(device),
        "device_name": device_name,
        "jobs": jobs,
        "budget_seconds": config.budget_minutes * 60.0,
        "units": [],
        "skipped": [],
        "errors": [],
    }
    log(f"[paper-scale] {record['device_name']}: budget {config.budget_minutes:g} min, {jobs} processes")

    # 1. calibration, bounded by its share of the budget (or reused from an earlier run on this device)
    if reused is not None:
        cal = reused
        othello = config.othello and all(k in cal for k in OTHELLO_CALIBRATION)
        if config.othello and not othello:
            record["skipped"].append(f"Othello: {config.calibration} has no complete Othello calibration")
    else:
        cal, othello = _measure(config, device, out, clock, record)
    record["calibration"] = cal
    record["deterministic_kernels"] = os.environ.get(DETERMINISTIC_ENV) != "0" and device.type == "cuda"
    if "toy_steps_per_second" not in cal:
        tasks: list[str] = []
    else:
        tasks = list(config.tasks)
        log(f"[paper-scale] calibration {cal['seconds']:.0f} s: toy {cal['toy_steps_per_second']:.0f} steps/s")
    if othello:
        log(
            f"[paper-scale] Othello {cal['othello_steps_per_second']:.1f} steps/s "
            f"({cal['othello_flops_per_second'] / 1e12:.1f} TFLOP/s), attributed update "
            f"{cal['recorded_update_seconds']:.2f} s recorded / {cal['decomposed_update_seconds']:.2f} s decomposed only"
        )

    # 2. toy grids, seeds grown in rounds while they fit
    toy_deadline = time.time() + (config.toy_share if othello else 1.0) * clock.left()
    toy_over: dict[str, Any] = {"device": str(device), "matmul_precision": config.matmul_precision}
    if config.smoke:
        toy_over.update(SMOKE_TOY)
    if config.toy_steps is not None:
        toy_over["steps"] = config.toy_steps
    toy_scale = "ci" if config.smoke else "paper"
    toy_steps = int(toy_over.get("steps", 3000))
    rate: float | None = None  # measured seconds per (trained + null) run of the last round
    done_seeds = {task: 0 for task in tasks}
    written: set[Path] = set()  # results files this run wrote (the only ones its verdicts are judged from)
    toy_records: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:  # one pool of workers (and CUDA contexts) for every round and task
        pool = stack.enter_context(worker_pool(jobs)) if jobs > 1 and tasks else None
        for n_seeds in config.seed_rounds if tasks else ():
            new_runs = sum(4 * (n_seeds - done_seeds[task]) for task in tasks)
            need = _toy_round_seconds(rate, new_runs, cal, toy_steps, jobs)
            if need > toy_deadline - time.time():
                record["skipped"].append(
                    f"toy round of {n_seeds} seeds: predicted {need:.0f} s, {max(0.0, toy_deadline - time.time()):.0f} s left"
                )
                break
            t = time.time()
            for task in tasks:
                tc = ToyGridConfig(
                    task=task, scale=toy_scale, seeds=list(range(n_seeds)), overrides=dict(toy_over), jobs=jobs
                )
                path = results / "toy-grid" / f"{tc.name}.json"
                try:
                    summary = run_toy_grid(
                        tc,
                        out / "toy-grid" / tc.name,
                        results=path,
                        command=command,
                        deadline=toy_deadline,
                        executor=pool,
                    )
                except BudgetExceeded as exc:
                    record["skipped"].append(
                        f"toy grid {task}, {n_seeds} seeds: stopped at the deadline ({exc.what}); "
                        + (f"the {done_seeds[task]}-seed results stand" if done_seeds[task] else "no results")
                    )
                    log(f"[paper-scale] toy grid {task} at {n_seeds} seeds: stopped at the deadline")
                    continue
                except Exception as exc:  # a failed unit is reported, the others still run
                    record["errors"].append(f"toy grid {task}, {n_seeds} seeds: {type(exc).__name__}: {exc}")
                    log(f"[paper-scale] toy grid {task} failed: {exc}")
                    continue
                toy_records[task] = {"results_file": str(path), "seeds": n_seeds, "summary": toy_line(summary)}
                written.add(path)
                done_seeds[task] = n_seeds
            rate = (time.time() - t) / max(1, new_runs)
            record["units"].append(
                {"unit": f"toy grids, {n_seeds} seeds", "seconds": time.time() - t, "runs": new_runs}
            )
            log(f"[paper-scale] toy grids at {n_seeds} seeds: {time.time() - t:.0f} s; {clock.left():.0f} s left")
    record["toy"] = toy_records
    if rate is not None:
        record["toy_throughput"] = {
            "seconds_per_run": rate,
            "models_steps_per_second": toy_steps / rate / 2,  # a trained run and its 0-step null per (regime, seed)
            "jobs": jobs,
        }

    # 3. Othello, planned to what is left
    if othello:
        oth_base = OthelloConfig(scale="ci" if config.smoke else "paper", seeds=[0])
        settings = {**oth_base.settings, **(SMOKE_OTHELLO if config.smoke else {})}
        plan = plan_othello(clock.left(), cal, settings, config.othello_seeds)
        record["othello_plan"] = plan
        if plan is None:
            record["skipped"].append(f"Othello: not even a sixteenth of training fits in {clock.left():.0f} s")
        else:
            overrides = {k: plan[k] for k in ("positions", "check_positions", "strata")}
            if config.smoke:
                overrides = {**SMOKE_OTHELLO, **overrides}
            overrides = {k: v for k, v in overrides.items() if v != oth_base.settings.get(k)}
            oc = OthelloConfig(
                scale=oth_base.scale,
                seeds=list(range(plan["seeds"])),
                overrides=overrides,
                device=str(device),
                matmul_precision=config.matmul_precision,
                replay_rtol=rtol,
            )
            path = results / "othello" / f"{oc.name}.json"
            t = time.time()
            status = run_until(
                _othello_child,
                (oc, str(out / "othello"), str(path), command),
                clock.left(),
                grace=clock.grace,
                single_threaded=False,  # alone on the machine, as calibrated
            )
            if status == "finished" and (out / "othello" / "experiment.json").is_file():
                summary = read_json(out / "othello" / "experiment.json")
                record["othello"] = {"results_file": str(path), "summary": othello_line(summary)}
                written.add(path)
            elif status == "deadline":
                record["skipped"].append("Othello: stopped at the deadline (checkpoints kept; no results file)")
            else:
                record["errors"].append(f"Othello: {status} (see the log above)")
            record["units"].append(
                {
                    "unit": "othello",
                    "seconds": time.time() - t,
                    "predicted": plan["predicted_seconds"],
                    "status": status,
                }
            )

    # 4. verdicts, record, archive, summary
    from .results import load_all

    # judged from this run's files only: a results root may hold earlier runs' files of the same names
    mine = {f"{p.parent.name}/{p.stem}" for p in written}
    recs = {k: v for k, v in load_all(results).items() if k in mine}
    verdicts = {}
    for c in CLAIMS:
        key = next((k for k in c.sources if k.endswith("-paper")), None)
        key = key and (key.removesuffix("-paper") + "-ci" if config.smoke else key)
        if key in recs and c.judge is not None:
            v = c.judge(recs[key])
            verdicts[c.key] = {"results": key, "verdict": v.verdict, "ours": v.ours, "paper": c.paper_number}
    record["verdicts"] = verdicts
    record["wall_seconds"] = clock.elapsed()
    archive = archive_runs(out)
    record["archive"] = f"OUT/{archive.name}"  # OUT: the --out directory
    name = "smoke-cpu" if config.smoke else f"{device.type}-{config.budget_minutes:g}min"
    path = write_results(
        results / EXPERIMENT / f"{name}.json",
        experiment=EXPERIMENT,
        name=name,
        command=command,
        config=to_jsonable(config),
        seeds=[],
        scale={
            "name": "paper" if not config.smoke else "smoke",
            "summary": f"the paper's configurations on {record['device_name']} within {config.budget_minutes:g} "
            "minutes; cuts listed per experiment",
            "deviations": record["skipped"],
        },
        numbers={k: record[k] for k in ("calibration", "toy_throughput", "othello_plan") if k in record},
        extra={k: v for k, v in record.items() if k not in ("calibration", "toy_throughput", "othello_plan")},
    )
    record["results_file"] = str(path)
    print(summary_table(record))
    return record


def reused_calibration(path: str | Path, device_name: str, matmul_precision: str) -> dict[str, Any]:
    """The calibration of an earlier paper-scale results file, for a run on the same device with the same
    matrix-product precision (:class:`ConfigError` otherwise); ``reused_from`` names the file and
    ``seconds`` is 0 (nothing measured)."""
    from .results import read_results

    rec = read_results(Path(path))
    if rec.get("experiment") != EXPERIMENT or "calibration" not in rec.get("numbers", {}):
        raise ConfigError(
            f"{path} is not a paper-scale results file with a calibration", "pass results/paper-scale/NAME.json"
        )
    if rec.get("device_name") != device_name:
        raise ConfigError(
            f"{path} was calibrated on {rec.get('device_name')!r}, this run is on {device_name!r}",
            "calibrate afresh (drop --calibration)",
        )
    if rec.get("config", {}).get("matmul_precision") != matmul_precision:
        raise ConfigError(
            f"{path} was calibrated with matmul precision {rec.get('config', {}).get('matmul_precision')!r}",
            f"calibrate afresh, or pass --matmul-precision {rec.get('config', {}).get('matmul_precision')}",
        )
    cal = dict(rec["numbers"]["calibration"])
    # its kernels: a run that fell back to non-deterministic ones was timed with them, and this run adopts them
    cal.update(
        reused_from=str(path),
        seconds=0.0,
        measured_seconds=cal.get("seconds"),
        deterministic_kernels=rec.get("deterministic_kernels"),
    )
    return cal


def _measure(
    config: PaperScaleConfig, device: Any, out: Path, clock: Clock, record: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Measure the calibration within its share of the budget; returns it and whether Othello can run
    (errors go to ``record``)."""
    from ..devices import DETERMINISTIC_ENV

    cal_deadline = clock.t0 + config.calibration_share * (clock.deadline - clock.t0)
    cal: dict[str, Any] = {"device": device.type}
    othello = config.othello
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        t = time.time()
        try:
            cal = calibrate(config, device, Path(tmp), deadline=cal_deadline)
        except BudgetExceeded as exc:
            record["errors"].append(f"calibration: the toy model did not finish within its share ({exc.what})")
            othello = False
        for attempt in range(2 if othello else 0):
            status = run_until(
                _calibrate_othello_child,
                (config, str(device), str(Path(tmp) / f"attempt-{attempt}"), str(Path(tmp) / "othello.json")),
                cal_deadline - time.time(),
                grace=clock.grace,
                single_threaded=False,  # as the Othello unit runs
            )
            if status == "finished":
                cal.update(read_json(Path(tmp) / "othello.json"))
                break
            what = "did not finish (or start) within the calibration's share" if status == "deadline" else status
            record["errors"].append(f"Othello calibration (attempt {attempt + 1}): {what}")
            log(f"[paper-scale] Othello calibration: {what}")
            retry = status != "deadline" and attempt == 0 and device.type == "cuda"
            if retry and os.environ.get(DETERMINISTIC_ENV) != "0":
                os.environ[DETERMINISTIC_ENV] = "0"  # retry without deterministic kernels (workers inherit it)
                record["errors"][-1] += "; retried without deterministic kernels"
            else:
                othello = False
                break
        cal["seconds"] = time.time() - t
    return cal, othello


def _calibrate_othello_child(config: PaperScaleConfig, device: str, work: str, path: str) -> None:
    """The Othello calibration in its own process (so that its share of the budget can stop it); the
    measurements are written to ``path`` (JSON)."""

    import torch

    cal: dict[str, Any] = {}
    calibrate_othello(config, torch.device(device), Path(work), cal)
    atomic_write_json(path, to_jsonable(cal))


def _othello_child(oc: Any, out: str, path: str, command: str) -> None:
    """The Othello unit in its own process (so that the deadline can stop it wherever it is): run 1 trains,
    the strata follow one segment at a time (each reopens the run from its checkpoints), then the analysis;
    the contiguous estimator check is a CPU-scale stage, left out here."""
    from .othello import run_othello

    for stage in ("train", "stratum", "combine"):
        run_othello(oc, out, results=path, command=command, stage=stage)
