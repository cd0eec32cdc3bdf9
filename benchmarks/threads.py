"""How much do torch's CPU thread counts change an ``ntp train`` run, and what do they buy?

Trains the same configuration (same seed, same data) with 1 and with 2 torch threads and reports, per run
pair: whether the final weights are bit-identical, the largest absolute and relative weight difference,
the final-loss difference, and wall / CPU time per step of each.  Matrix products split their reductions
across threads, so the summation order (and with it the last bits) can depend on the thread count; the
difference then grows with training like any perturbation of a chaotic optimiser.

    python benchmarks/threads.py [--task cond-majority] [--steps 200] [--d-model 64]

Writes nothing; prints one table (the figures quoted in docs/reliability.md and benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from originlens.train.ntp import NTPConfig, Trainer


def train(cfg: NTPConfig, threads: int, out: Path) -> tuple[dict[str, torch.Tensor], float, float, float]:
    torch.set_num_threads(threads)
    wall, cpu = time.perf_counter(), time.process_time()
    tr = Trainer(cfg, out)
    tr.run()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return (
        {k: v.detach().clone() for k, v in tr.model.state_dict().items()},
        float(tr.last_loss),
        wall / cfg.steps,
        cpu / cfg.steps,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="cond-majority")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    cfg = NTPConfig(
        task=a.task,
        d_model=a.d_model,
        batch_size=a.batch_size,
        steps=a.steps,
        seed=a.seed,
        eval_size=256,
        eval_every=0,
        probe_every=0,
        checkpoint_every=0,
        log_every=a.steps,
    )
    with tempfile.TemporaryDirectory() as tmp:
        w1, l1, s1, c1 = train(cfg, 1, Path(tmp) / "t1")
        w1b, l1b, _, _ = train(cfg, 1, Path(tmp) / "t1b")
        w2, l2, s2, c2 = train(cfg, 2, Path(tmp) / "t2")
    same_1 = all(torch.equal(w1[k], w1b[k]) for k in w1)
    same_12 = all(torch.equal(w1[k], w2[k]) for k in w1)
    abs_d = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    rel_d = max(float((w1[k] - w2[k]).norm() / w1[k].norm().clamp_min(1e-30)) for k in w1)
    print(f"{a.task}, d={a.d_model}, batch {a.batch_size}, {a.steps} steps, seed {a.seed}, torch {torch.__version__}")
    print("| comparison | bit-identical | max abs Δw | max rel ‖Δw‖/‖w‖ | Δ final loss |")
    print("|---|---|---|---|---|")
    print(
        f"| 1 thread vs 1 thread (control) | {same_1} | "
        f"{max(float((w1[k] - w1b[k]).abs().max()) for k in w1):.1e} | — | {abs(l1 - l1b):.2e} |"
    )
    print(
        f"| 1 thread vs 2 threads | {same_12} | {abs_d:.1e} | {rel_d:.1e} | {abs(l1 - l2):.2e} ({l1:.6f} vs {l2:.6f}) |"
    )
    print(
        f"time per step: 1 thread {s1 * 1e3:.1f} ms wall / {c1 * 1e3:.1f} ms CPU; "
        f"2 threads {s2 * 1e3:.1f} ms wall / {c2 * 1e3:.1f} ms CPU (ratio wall {s1 / s2:.2f}×)"
    )


if __name__ == "__main__":
    main()
