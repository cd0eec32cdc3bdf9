"""The synthetic-world experiments of arXiv 2603.14087 at the paper's configuration, planned to a time budget
on one accelerator: the toy regime grids (Majority, Conditioned Majority; 2 layers, d = 128, 4 heads, batch
256, Adam 1e-3, 3,000 steps, up to 10 seeds × 4 regimes) and OthelloGPT with influence attribution (6
layers, d = 256, 4 heads, batch 1,024, 5,000 steps; the 16 central cells by feature type).

``run_paper_scale(PaperScaleConfig(budget_minutes=8), OUT)``:

1. **calibrate** (a few percent of the budget): steps/s of one paper-config Conditioned Majority model,
   of the paper's OthelloGPT, and the replay's cost per attributed update (decomposition only, and with the
   influences recorded) on a short throw-away Othello run; on CUDA also the Othello step under bf16
   autocast, for the achieved-FLOP/s figure only (no result is trained in bf16);
2. **toy grids**: :func:`~originlens.experiments.toy_grid.run_toy_grid` at the ``paper`` scale for each
   task, the seeds grown in turn (3, then 5, then 10) while the measured rate of the previous round says
   the next one fits the toy share of the budget; the runs of a round are trained ``jobs`` at a time in
   worker processes sharing the device (resumable: a later round trains only its new seeds);
3. **Othello**: :func:`~originlens.experiments.othello.run_othello` at the ``paper`` scale with the
   overrides the plan needs to fit what is left (:func:`plan_othello`: the attributed prefix, the
   recording stride, the snapshots, the number of seeds and — last — the training steps); every cut is a
   deviation in the results file;
4. writes the experiments' own results files (``toy-grid/<task>-paper``, ``othello/othello-paper`` under
   ``results``), this run's record ``paper-scale/<name>`` (calibration, plan, throughput, achieved FLOP/s,
   what was cut and why, the verdict of every claim it touched), ``OUT/paper-scale-runs.tar.gz`` (the run
   directories without checkpoints, pools and models) and prints the summary table.

The clock is checked between units of work; a unit that would not finish before the deadline is not
started, and what finished is written (the record says what was skipped).  ``smoke=True`` runs the same
code end to end on the CPU at tiny size (toy scale ``ci`` with fewer steps, Othello scale ``ci``) in under
a minute — the test suite runs it.

Settings on CUDA, and why they leave the science unchanged: TF32 products (``matmul_precision="tf32"``:
10-bit mantissa inputs, float32 accumulation; the decomposition identities are checked in the records at
the measured tolerance), deterministic kernels (so the attribution replay repeats training; the replay's
checks run with ``replay_rtol`` as a guard), the trainer's fast path (no host synchronisation inside the
step loop; bit-identical to the per-step path).  Caveat: the toy models are trained as separate processes
sharing the GPU, not vmapped together (their trainer, evaluation, probes and checkpoints stay the ones
every other experiment uses).
"""

from __future__ import annotations

import math
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BudgetExceeded, ConfigError
from ..progress import log
from ..runs import to_jsonable
from ..storage import read_json
from .results import write_results

EXPERIMENT = "paper-scale"
TOY_TASKS = ("cond-majority", "majority")
SEED_ROUNDS = (3, 5, 10)
# the paper's Othello numbers (Fig. 6: mean influence per component and type, useful / useless)
PAPER_OTHELLO = {"direct": (7.61, -0.97), "pre-cached": (-0.66, 1.80), "shared": (8.64, 6.42)}
# published dense peaks (FLOP/s) of the accelerators this is meant for, by the name torch reports
PEAKS = {"H200": {"tf32": 494.7e12, "bf16": 989.5e12}, "H100": {"tf32": 494.7e12, "bf16": 989.5e12}}
SMOKE_TOY = dict(steps=40, eval_size=256, train_size=2048, batch_size=32, d_model=16, n_head=2)
SMOKE_OTHELLO = dict(steps=20, eval_size=128, othello_pool=600, batch_size=8, snapshot_updates=0)


@dataclass
class PaperScaleConfig:
    """One budgeted run; ``jobs`` 0 = automatic (CUDA: min(16, CPUs) processes share the GPU; CPU: 2)."""

    budget_minutes: float = 8.0
    device: str = "auto"
    smoke: bool = False
    matmul_precision: str = "tf32"
    jobs: int = 0
    tasks: list[str] = field(default_factory=lambda: list(TOY_TASKS))
    seed_rounds: list[int] = field(default_factory=lambda: list(SEED_ROUNDS))
    othello: bool = True
    othello_seeds: int = 3
    toy_steps: int | None = None  # override of the toy grids' 3,000 steps (a deviation; for trial runs)
    toy_share: float = 0.4  # of the time left after calibration
    replay_rtol: float = 1e-3  # on CUDA (0 on the CPU: bit-exact)
    reserve_seconds: float = 20.0  # kept for the records, the archive and the summary

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_minutes, (int, float)) and 0 < self.budget_minutes <= 600):
            raise ConfigError(f"budget_minutes={self.budget_minutes!r} must lie in (0, 600]", "e.g. 8")
        if bad := set(self.tasks) - set(TOY_TASKS):
            raise ConfigError(f"unknown toy task(s) {sorted(bad)}", f"use {', '.join(TOY_TASKS)}")
        if not self.seed_rounds or sorted(self.seed_rounds) != list(self.seed_rounds) or self.seed_rounds[0] < 1:
            raise ConfigError(f"seed_rounds {self.seed_rounds} must be increasing counts ≥ 1", "e.g. 3,5,10")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 0:
            raise ConfigError(f"jobs must be an integer ≥ 0 (0: automatic), got {self.jobs!r}", "e.g. --jobs 8")
        if not 0 < self.toy_share < 1:
            raise ConfigError(f"toy_share={self.toy_share} must lie in (0, 1)", "e.g. 0.4")
        if self.toy_steps is not None and (isinstance(self.toy_steps, bool) or self.toy_steps < 1):
            raise ConfigError(f"toy_steps={self.toy_steps!r} must be ≥ 1", "e.g. 300")
        if not 1 <= self.othello_seeds <= 10:
            raise ConfigError(f"othello_seeds={self.othello_seeds} must lie in 1..10", "e.g. 3")
        from ..devices import check_device_spec, check_matmul_precision

        self.device = check_device_spec(self.device)
        self.matmul_precision = check_matmul_precision(self.matmul_precision)


class Clock:
    """The run's deadline: ``left()`` seconds remain of the budget less the reserve."""

    def __init__(self, budget_s: float, reserve_s: float) -> None:
        self.t0 = time.time()
        self.deadline = self.t0 + budget_s - reserve_s

    def left(self) -> float:
        return self.deadline - time.time()

    def elapsed(self) -> float:
        return time.time() - self.t0


# ------------------------------------------------------------------------------------------ calibration
def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_training(cfg: Any, run_dir: Path, first: int) -> tuple[float, Any, float]:
    """Train ``cfg`` in ``run_dir``; seconds per update over updates first+1..steps (device synchronised at
    both ends), the trainer, and the run's seconds besides its updates (set-up, evaluation, probes)."""
    from ..train.ntp import Trainer

    tr = Trainer(cfg, run_dir, overwrite=True)
    marks: dict[int, float] = {}

    def mark(t: Any) -> None:
        if t.step in (first, cfg.steps):
            _sync(t.device)
            marks[t.step] = time.perf_counter()

    tr.add_callback("on_step_end", mark)
    t0 = time.perf_counter()
    tr.run()
    wall = time.perf_counter() - t0
    per_step = (marks[cfg.steps] - marks[first]) / (cfg.steps - first)
    return per_step, tr, max(0.0, wall - cfg.steps * per_step)


def gpt_step_flops(n_layer: int, d_model: int, vocab: int, batch: int, seq: int, mlp_ratio: int = 4) -> float:
    """FLOPs of one training update of the GPT (forward + backward ≈ 3 × forward): 2 per multiply-add in
    the projections (4d² + 2·ratio·d² per token per layer), the attention scores and mixing (2·T·d per
    token per layer, causal: half of the full T × T) and the unembedding (d·|V| per token)."""
    per_token = n_layer * (2 * (4 + 2 * mlp_ratio) * d_model**2 + 2 * seq * d_model) + 2 * d_model * vocab
    return 3.0 * per_token * batch * seq


def calibrate(config: PaperScaleConfig, device: Any, work: Path) -> dict[str, Any]:
    """Measured throughput of the toy model (see the module docstring; Othello: :func:`calibrate_othello`)."""
    from ..train.ntp import NTPConfig

    cal: dict[str, Any] = {"device": device.type}
    toy_over: dict[str, Any] = dict(SMOKE_TOY) if config.smoke else {}
    toy_steps = 30 if config.smoke else 300
    toy = NTPConfig(
        task="cond-majority",
        **{**toy_over, "steps": toy_steps},
        log_every=toy_steps,
        eval_every=0,
        probe_every=0,
        checkpoint_every=0,
        device=str(device),
        matmul_precision=config.matmul_precision,
    )
    s, _, other = _timed_training(toy, work / "toy", toy_steps // 3)
    cal["toy_step_seconds"] = s
    cal["toy_other_seconds"] = other
    cal["toy_steps_per_second"] = 1.0 / s
    return cal


def calibrate_othello(config: PaperScaleConfig, device: Any, work: Path, cal: dict[str, Any]) -> None:
    """The Othello part of :func:`calibrate` (added to ``cal``): training steps, then the replay of a short
    throw-away run with and without influences recorded."""
    import torch

    from ..attribution.replay import attribute_run
    from .othello import OthelloConfig

    oth = OthelloConfig(
        scale="ci" if config.smoke else "paper",
        seeds=[0],
        device=str(device),
        matmul_precision=config.matmul_precision,
        overrides=dict(SMOKE_OTHELLO) if config.smoke else {},
    )
    ov = oth.ntp_config(0, initial=False)
    n = 6
    ocfg = ov.replace(
        steps=n,
        eval_size=256,
        probe_size=256,
        othello_pool=4096,
        eval_every=0,
        checkpoint_every=n // 2,
        log_every=1,
    )
    s, tr, other = _timed_training(ocfg, work / "othello", 2)
    cal["othello_other_seconds"] = other
    cal["othello_step_seconds"] = s
    cal["othello_steps_per_second"] = 1.0 / s
    gc = tr.gpt_config
    flops = gpt_step_flops(gc.n_layer, gc.d_model, gc.vocab_size, ocfg.batch_size, gc.seq_len - 1)
    cal["othello_step_flops"] = flops
    cal["othello_flops_per_second"] = flops / s
    sites = [(k, i) for k in oth.attr_layers for i in oth.settings["positions"]]
    t0 = time.perf_counter()
    res = attribute_run(
        work / "othello",
        sites=sites,
        features="tracked",
        optimizer="adam",
        segment=(0, n // 2),  # updates 1..3: one recorded, two decomposed only
        types=True,
        out=work / "othello" / "attribution",
        random_directions=2,
        overwrite=True,
        steps=[2],
        replay_rtol=config.replay_rtol if device.type == "cuda" else 0.0,
    )
    total = time.perf_counter() - t0
    br = res.info.get("seconds_breakdown", {})
    n_rec, n_warm = 1, n // 2 - 1
    cal["attribution_seconds"] = total
    cal["decomposed_update_seconds"] = br.get("warm_steps", 0.0) / max(1, n_warm)
    cal["recorded_update_seconds"] = br.get("recorded_steps", 0.0) / n_rec
    cal["attribution_fixed_seconds"] = max(0.0, total - br.get("warm_steps", 0.0) - br.get("recorded_steps", 0.0))
    cal["attribution_overhead_per_tracked_step"] = cal["recorded_update_seconds"] / cal["othello_step_seconds"]
    if device.type == "cuda":
        cal["othello_bf16_step_seconds"] = _bf16_step_seconds(tr, ocfg)
        cal["othello_bf16_flops_per_second"] = flops / cal["othello_bf16_step_seconds"]
        name = torch.cuda.get_device_name(device)
        peak = next((v for k, v in PEAKS.items() if k in name), None)
        if peak:
            cal["peak_flops"] = peak
            cal["othello_fraction_of_peak"] = {
                "tf32" if config.matmul_precision == "tf32" else "fp32_vs_tf32_peak": cal["othello_flops_per_second"]
                / peak["tf32"],
                "bf16_autocast": cal["othello_bf16_flops_per_second"] / peak["bf16"],
            }


def _bf16_step_seconds(tr: Any, cfg: Any, steps: int = 8) -> float:
    """Seconds per update of a copy of the trained Othello model under bf16 autocast (timing only)."""
    import copy

    import torch

    model = copy.deepcopy(tr.model).train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    x = tr.data.device_batch(0, tr.device, tr.gpt_config.vocab_size)
    t0 = 0.0
    for j in range(steps + 2):
        if j == 2:
            _sync(tr.device)
            t0 = time.perf_counter()
        with torch.autocast(tr.device.type, dtype=torch.bfloat16), model.trusted_tokens():
            loss = model.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    _sync(tr.device)
    return (time.perf_counter() - t0) / steps


# ------------------------------------------------------------------------------------------------ plans
def plan_othello(seconds: float, cal: dict[str, Any], settings: dict[str, Any], seeds: int) -> dict[str, Any] | None:
    """Overrides of the ``paper`` Othello scale that fit ``seconds`` (None when not even one seed of a
    tenth of training fits).  Cuts in order: snapshots, recording stride (1, 2, 5, 10, 20, 50), attributed
    prefix (all, ½, ⅕, 1/10, 1/20), seeds (→ 1), training steps (→ ½, ¼, …).  Seeds run one after another
    (a seed's model fills the GPU); cost per seed = steps × step + evaluations + attributed × decomposition
    + recorded × influence + snapshots, with a 1.5 safety factor for what the calibration did not see."""
    step, dec, rec = cal["othello_step_seconds"], cal["decomposed_update_seconds"], cal["recorded_update_seconds"]
    # pool, evaluations (11 of the trained model, 1 of the null) and probes, loading the replay
    fixed = 2.0 * cal.get("attribution_fixed_seconds", 0.0) + 12 * cal.get("othello_other_seconds", 5.0) + 5.0
    full = int(settings["steps"])

    def cost(steps: int, attributed: int, every: int, snapshots: int) -> float:
        recorded = math.ceil(attributed / every)
        snap = 10 * snapshots * rec if snapshots else 0.0
        return 1.5 * (steps * step + (attributed - recorded) * dec + recorded * rec + snap + fixed)

    steps = full
    while steps >= max(10, full // 16):
        for n_seeds in sorted({seeds, 1}, reverse=True):
            for frac in (1, 2, 5, 10, 20):
                attributed = max(1, steps // frac)
                for every in (1, 2, 5, 10, 20, 50):
                    if every > attributed:
                        continue
                    for snaps in (settings.get("snapshot_updates", 0), 0):
                        if n_seeds * cost(steps, attributed, every, snaps) <= seconds:
                            return {
                                "steps": steps,
                                "attribute_steps": None if attributed == full else attributed,
                                "record_every": every,
                                "snapshot_updates": snaps,
                                "seeds": n_seeds,
                                "predicted_seconds": n_seeds * cost(steps, attributed, every, snaps),
                            }
        steps //= 2
    return None


def _toy_round_seconds(rate: float | None, runs: int, cal: dict[str, Any], steps: int, jobs: int) -> float:
    """Predicted seconds for ``runs`` more toy runs: from the measured seconds per run of the previous
    round, else from the single-model calibration with no gain from sharing (the safe side)."""
    if rate is not None:
        return runs * rate
    # a trained run and its 0-step null: set-up, data, evaluation and probes twice (the calibration run had the
    # grid's data and eval sizes), plus a worker's start
    per_run = steps * cal["toy_step_seconds"] + 2 * cal["toy_other_seconds"] + 1.0
    # processes sharing a GPU: on an H200, 16 trainers ran at 40 steps/s each against 111 for one alone
    # (5.8×; benchmarks/RESULTS.md): count a third of the processes, at most a third of the CPUs
    gain = min(jobs, 2) if cal.get("device") == "cpu" else max(1, min(jobs, (os.cpu_count() or 3)) // 3)
    return runs * per_run / gain


# --------------------------------------------------------------------------------------------------- run
def run_paper_scale(
    config: PaperScaleConfig, out: str | Path, *, results: str | Path = "results", command: str | None = None
) -> dict[str, Any]:
    """Calibrate, plan, run what fits, write the records, the archive and the summary; returns the record."""
    import torch

    from ..devices import DETERMINISTIC_ENV, resolve_device
    from .claims import CLAIMS
    from .othello import OthelloConfig
    from .toy_grid import ToyGridConfig, run_toy_grid

    device = resolve_device(config.device)  # before anything is written
    out, results = Path(out), Path(results)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(config.budget_minutes * 60.0, min(config.reserve_seconds, config.budget_minutes * 6.0))
    if config.smoke and device.type != "cpu":
        raise ConfigError("the smoke run is a CPU check", "drop --smoke, or use --device cpu")
    os.environ.setdefault(DETERMINISTIC_ENV, "1")  # spawned workers inherit it
    jobs = config.jobs or (min(16, os.cpu_count() or 1) if device.type == "cuda" else 2)
    rtol = config.replay_rtol if device.type == "cuda" else 0.0
    command = command or f"python: run_paper_scale({config!r}, {str(out)!r})"
    record: dict[str, Any] = {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "jobs": jobs,
        "budget_seconds": config.budget_minutes * 60.0,
        "units": [],
        "skipped": [],
        "errors": [],
    }
    log(f"[paper-scale] {record['device_name']}: budget {config.budget_minutes:g} min, {jobs} processes")

    # 1. calibration
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        t = time.time()
        cal = calibrate(config, device, Path(tmp))
        othello = config.othello
        for attempt in range(2 if othello else 0):
            try:
                calibrate_othello(config, device, Path(tmp) / f"attempt-{attempt}", cal)
                break
            except Exception as exc:  # reported; the toy grids still run
                record["errors"].append(f"Othello calibration: {type(exc).__name__}: {exc}")
                log(f"[paper-scale] Othello calibration failed: {exc}")
                if attempt == 0 and device.type == "cuda" and os.environ.get(DETERMINISTIC_ENV) != "0":
                    os.environ[DETERMINISTIC_ENV] = "0"  # retry without deterministic kernels
                    torch.use_deterministic_algorithms(False)
                    record["errors"][-1] += " (retried without deterministic kernels)"
                else:
                    othello = False
                    break
        cal["seconds"] = time.time() - t
    record["calibration"] = cal
    record["deterministic_kernels"] = os.environ.get(DETERMINISTIC_ENV) != "0" and device.type == "cuda"
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
    done_seeds = {task: 0 for task in config.tasks}
    toy_records: dict[str, Any] = {}
    for n_seeds in config.seed_rounds:
        new_runs = sum(4 * (n_seeds - done_seeds[task]) for task in config.tasks)
        need = _toy_round_seconds(rate, new_runs, cal, toy_steps, jobs)
        if need > toy_deadline - time.time():
            record["skipped"].append(
                f"toy round of {n_seeds} seeds: predicted {need:.0f} s, {max(0.0, toy_deadline - time.time()):.0f} s left"
            )
            break
        t = time.time()
        for task in config.tasks:
            tc = ToyGridConfig(
                task=task, scale=toy_scale, seeds=list(range(n_seeds)), overrides=dict(toy_over), jobs=jobs
            )
            path = results / "toy-grid" / f"{tc.name}.json"
            try:
                summary = run_toy_grid(
                    tc, out / "toy-grid" / tc.name, results=path, command=command, deadline=toy_deadline
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
            toy_records[task] = {"results_file": str(path), "seeds": n_seeds, "summary": _toy_line(summary)}
            done_seeds[task] = n_seeds
        rate = (time.time() - t) / max(1, new_runs)
        record["units"].append({"unit": f"toy grids, {n_seeds} seeds", "seconds": time.time() - t, "runs": new_runs})
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
            record["skipped"].append(f"Othello: not even a tenth of training fits in {clock.left():.0f} s")
        else:
            overrides = {k: plan[k] for k in ("steps", "attribute_steps", "record_every", "snapshot_updates")}
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
            status = _run_until(_othello_child, (oc, str(out / "othello"), str(path), command), clock.left())
            if status == "finished" and (out / "othello" / "experiment.json").is_file():
                summary = read_json(out / "othello" / "experiment.json")
                record["othello"] = {"results_file": str(path), "summary": _othello_line(summary)}
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

    recs = load_all(results)
    verdicts = {}
    for c in CLAIMS:
        key = next((k for k in c.sources if k.endswith("-paper")), None)
        key = key and (key.removesuffix("-paper") + "-ci" if config.smoke else key)
        if key in recs and c.judge is not None:
            v = c.judge(recs[key])
            verdicts[c.key] = {"results": key, "verdict": v.verdict, "ours": v.ours, "paper": c.paper_number}
    record["verdicts"] = verdicts
    record["wall_seconds"] = clock.elapsed()
    archive = _archive(out)
    record["archive"] = str(archive)
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


def _othello_child(oc: Any, out: str, path: str, command: str) -> None:
    """The Othello unit in its own process (so that the deadline can stop it wherever it is)."""
    from .othello import run_othello

    run_othello(oc, out, results=path, command=command)


def _run_until(target: Any, args: tuple[Any, ...], seconds: float, grace: float = 15.0) -> str:
    """Run ``target(*args)`` in a spawned process for at most ``seconds``: ``"finished"``, ``"deadline"``
    (sent SIGTERM — a trainer checkpoints and stops — then killed after ``grace`` seconds) or
    ``"failed (exit code N)"``."""
    import multiprocessing as mp

    from ..train.grid import worker_environment

    with worker_environment():
        proc = mp.get_context("spawn").Process(target=target, args=args)
        proc.start()
    proc.join(max(0.0, seconds))
    if proc.is_alive():
        proc.terminate()
        proc.join(grace)
        if proc.is_alive():
            proc.kill()
            proc.join()
        return "deadline"
    return "finished" if proc.exitcode == 0 else f"failed (exit code {proc.exitcode})"


def _toy_line(summary: dict[str, Any]) -> dict[str, Any]:
    per = summary["per_regime"]
    return {
        "useless_r": {r: per[r]["useless_r"]["mean"] for r in per},
        "eval_loss": {r: per[r]["eval_loss"]["mean"] for r in per},
        "orderings_holding": [k for k, v in summary["orderings"].items() if v["holds"]],
        "orderings_failing": [k for k, v in summary["orderings"].items() if not v["holds"]],
    }


def _othello_line(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: summary[k] for k in ("verdict",) if k in summary} | {
        "legal_acc": summary.get("quality", {}).get("legal_acc", {}).get("mean"),
        "eval_loss": summary.get("quality", {}).get("eval_loss", {}).get("mean"),
    }


ARCHIVE_SKIP = (".safetensors", ".npy", ".lock")
ARCHIVE_MAX_FILE = 4 << 20


def _archive(out: Path) -> Path:
    """``OUT/paper-scale-runs.tar.gz``: every file under the run directories except checkpoints, models,
    pools and files over 4 MiB (configs, metrics, environments, reports, attribution tables stay)."""
    path = out / "paper-scale-runs.tar.gz"
    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        for p in sorted(out.rglob("*")):
            if (
                p.is_file()
                and not p.is_symlink()
                and p.suffix not in ARCHIVE_SKIP
                and p != tmp
                and p != path
                and p.stat().st_size <= ARCHIVE_MAX_FILE
            ):
                tar.add(p, arcname=str(p.relative_to(out)))
    shutil.move(tmp, path)
    return path


def summary_table(record: dict[str, Any]) -> str:
    """The printed summary: calibration, what ran, each claim's verdict with the paper's number beside ours."""
    cal = record.get("calibration", {})
    lines = [
        f"paper-scale run on {record['device_name']} ({record['wall_seconds']:.0f} s of "
        f"{record['budget_seconds']:.0f} s)",
        f"  one Conditioned Majority model: {cal.get('toy_steps_per_second', float('nan')):.0f} steps/s; "
        f"Othello paper config: {cal.get('othello_steps_per_second', float('nan')):.2f} steps/s, "
        f"{cal.get('othello_flops_per_second', float('nan')) / 1e12:.1f} TFLOP/s; attributed update "
        f"{cal.get('attribution_overhead_per_tracked_step', float('nan')):.1f}× a training step",
    ]
    if "toy_throughput" in record:
        tt = record["toy_throughput"]
        lines.append(
            f"  toy grids: {tt['seconds_per_run']:.1f} s per run, {tt['models_steps_per_second']:.0f} model-steps/s "
            f"with {tt['jobs']} processes sharing the device"
        )
    lines.append(f"  {'claim':<20} {'verdict':<15} {'paper':<40} ours")
    for key, v in record.get("verdicts", {}).items():
        lines.append(f"  {key:<20} {v['verdict']:<15} {v['paper'][:40]:<40} {v['ours']}")
    for s in record.get("skipped", []):
        lines.append(f"  skipped: {s}")
    for e in record.get("errors", []):
        lines.append(f"  ERROR: {e}")
    return "\n".join(lines)


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """The ``docs/results.md`` section of a paper-scale record: what ran, the measured throughput, the
    plan and what was skipped, the verdicts it reached."""
    cal = rec["numbers"].get("calibration", {})

    def f(v: Any, fmt: str) -> str:
        return "—" if v is None else format(v, fmt)

    out = [
        f"### {rec['name']} (`results/{key}.json`)",
        "",
        f"- command: `{rec['command']}`",
        f"- commit `{rec['git_commit']}`, {rec['created']}, {rec.get('device_name', '?')}, "
        f"{rec['machine']['cpus']} CPUs; torch {rec['versions'].get('torch', '?')}; "
        f"{rec.get('jobs', '?')} processes; deterministic kernels: {rec.get('deterministic_kernels')}",
        f"- {rec['scale']['summary']}; wall {f(rec.get('wall_seconds'), '.0f')} s of a "
        f"{f(rec.get('budget_seconds'), '.0f')} s budget",
        "",
        "| measured | value |",
        "|---|---|",
        f"| one Conditioned Majority model (paper config) | {f(cal.get('toy_steps_per_second'), '.0f')} steps/s |",
        f"| OthelloGPT, paper config (batch 1,024) | {f(cal.get('othello_steps_per_second'), '.1f')} steps/s, "
        f"{f((cal.get('othello_flops_per_second') or 0) / 1e12, '.1f')} TFLOP/s |",
        f"| the same under bf16 autocast (timing only) | "
        f"{f((cal.get('othello_bf16_flops_per_second') or 0) / 1e12, '.1f')} TFLOP/s |",
        f"| Adam-variant replay, decomposed update | {f(cal.get('decomposed_update_seconds'), '.2f')} s |",
        f"| … with influences recorded | {f(cal.get('recorded_update_seconds'), '.2f')} s "
        f"({f(cal.get('attribution_overhead_per_tracked_step'), '.0f')} training steps) |",
    ]
    frac = cal.get("othello_fraction_of_peak") or {}
    if frac:
        out.append(
            "| fraction of the dense peak | " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in frac.items()) + " |"
        )
    tt = rec["numbers"].get("toy_throughput")
    if tt:
        out.append(
            f"| toy grids, {tt['jobs']} processes sharing the device | {tt['models_steps_per_second']:.0f} "
            f"model-steps/s ({tt['seconds_per_run']:.1f} s per run) |"
        )
    out += [""]
    for s in rec.get("skipped", []):
        out.append(f"- skipped: {s}")
    for e in rec.get("errors", []):
        out.append(f"- error: {e}")
    for k, v in rec.get("verdicts", {}).items():
        out.append(f"- {k}: **{v['verdict']}** ({v['results']})")
    if rec.get("provenance_note"):
        out.append(f"- note: {rec['provenance_note']}")
    return out + [""]
