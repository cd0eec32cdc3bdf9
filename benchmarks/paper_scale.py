"""Throughput of the paper-scale units on this machine: one paper-config Conditioned Majority model (2
layers, d = 128, batch 256), the paper's OthelloGPT step (6 layers, d = 256, batch 1,024) with its achieved
FLOP/s, and with ``--attribution`` the Adam-variant replay per update (decomposed only, and with the
influences of 6 layers × 14 positions × 16 cells × 3 directions recorded) — the calibration of
``scripts/paper_scale.py`` run alone (``originlens.experiments.paper_scale.calibrate``).

Usage: ``python benchmarks/paper_scale.py [--device cpu|cuda] [--attribution] [--threads N]``.

``--deadline S [--jobs N]`` instead checks the budget's enforcement under load: the 8 paper-config
Conditioned Majority runs (4 regimes × 2 seeds, 3,000 steps) in a pool of N worker processes with a deadline
S seconds away; prints how long after the deadline ``train_runs`` returned (runs checkpointed or not
started) and the pool was closed.  On two CPU
cores the attribution at the paper's batch takes most of an hour (≈ 84 backward passes of batch 1,024 per
update), so it is off by default; the GPU figures are in benchmarks/RESULTS.md with the record they came
from.  Caveat: the toy figure includes the fast path only on a GPU (the CPU trainer reads the loss every
step, as it always did).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from originlens.devices import resolve_device
from originlens.experiments.paper_scale_calibration import calibrate, calibrate_othello
from originlens.experiments.paper_scale_config import PaperScaleConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--attribution", action="store_true")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--deadline", type=float, default=None, help="seconds: check the deadline instead")
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.deadline is not None:
        deadline_check(args.deadline, args.jobs, str(device))
        return
    cfg = PaperScaleConfig(device=args.device)
    with tempfile.TemporaryDirectory() as tmp:
        c0, t0 = time.process_time(), time.perf_counter()
        cal = calibrate(cfg, device, Path(tmp))
        calibrate_othello(cfg, device, Path(tmp) / "o", cal, attribution=args.attribution)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    print(f"{device} ({torch.get_num_threads()} threads), torch {torch.__version__}")
    print(f"  one Conditioned Majority model, paper config: {cal['toy_steps_per_second']:.1f} steps/s")
    print(
        f"  OthelloGPT, paper config: {cal['othello_steps_per_second']:.3f} steps/s, "
        f"{cal['othello_flops_per_second'] / 1e9:.1f} GFLOP/s ({cal['othello_step_flops'] / 1e12:.2f} TFLOP a step)"
    )
    if args.attribution:
        print(
            f"  replay: {cal['decomposed_update_seconds']:.2f} s a decomposed update, "
            f"{cal['recorded_update_seconds']:.2f} s with influences ({cal['attribution_overhead_per_tracked_step']:.0f} "
            "training steps)"
        )
    print(f"  whole benchmark: {wall:.0f} s wall, {cpu:.0f} s CPU")


def deadline_check(seconds: float, jobs: int, device: str) -> None:
    from originlens.errors import BudgetExceeded
    from originlens.progress import set_verbosity
    from originlens.train.grid import GridConfig, train_runs, worker_pool

    set_verbosity(0)
    grid = GridConfig(
        task="cond-majority",
        regimes=["standard", "myopic", "untied", "myopic+untied"],
        seeds=[0, 1],
        overrides=dict(steps=3000, device=device),
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        deadline = t0 + seconds
        with worker_pool(jobs) as pool:
            try:
                train_runs(grid, tmp, executor=pool, deadline=deadline)
                what = "all runs finished"
            except BudgetExceeded as exc:
                what = exc.what
            returned = time.time() - deadline
        closed = time.time() - deadline
    print(f"{device}, {jobs} worker processes, deadline {seconds:g} s after the start: {what}")
    print(f"  train_runs returned {returned:+.1f} s after the deadline; pool closed {closed:+.1f} s after it")


if __name__ == "__main__":
    main()
