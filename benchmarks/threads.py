"""How much do torch's CPU thread counts change an ``ntp train`` run, and what do they buy?

Trains the same configuration (same seed, same data) with 1 and with 2 torch threads and reports, per run
pair: whether the final weights are bit-identical, the largest absolute and relative weight difference,
the final-loss difference, and wall / CPU time per step of each.  Matrix products split their reductions
across threads, so the summation order (and with it the last bits) can depend on the thread count; the
difference then grows with training like any perturbation of a chaotic optimiser.

    python benchmarks/threads.py [--task cond-majority] [--steps 200] [--d-model 64]
    python benchmarks/threads.py --wait-policy [--steps 100] [--repeat 3]

``--wait-policy`` measures instead what the ``originlens`` command's default ``OMP_WAIT_POLICY=PASSIVE``
buys: the same ``ntp train`` command in fresh processes with 1 thread, 2 threads whose OpenMP workers spin
while waiting (``ACTIVE``, the OpenMP runtime's choice when nothing is set) and 2 passive threads; CPU
time (the children's user + system) and wall time per step, medians of ``--repeat`` runs, and whether
the two 2-thread runs wrote bit-identical models (the policy changes waiting, not arithmetic).  Profile
behind it: with ACTIVE workers most of a small model's CPU time is the workers' spin loop between
operations of a few microseconds each, which on a shared machine takes the core from the process that
has work.

Writes nothing; prints one table (the figures quoted in docs/reliability.md and benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import subprocess
import sys
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


def policy_run(policy: str, threads: int, a: argparse.Namespace, out: Path) -> tuple[float, float, str]:
    """One ``originlens ntp train`` in a fresh process: (wall s/step, CPU s/step, sha256 of the model)."""
    cmd = [sys.executable, "-m", "originlens", "-q", "ntp", "train", "--task", a.task, "--d-model", str(a.d_model)]
    cmd += ["--batch-size", str(a.batch_size), "--steps", str(a.steps), "--seed", str(a.seed), "--eval-every", "0"]
    cmd += ["--probe-every", "0", "--checkpoint-every", "0", "--eval-size", "256", "--threads", str(threads)]
    cmd += ["--out", str(out)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run(cmd, check=True, env={**os.environ, "OMP_WAIT_POLICY": policy}, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    digest = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    return wall / a.steps, cpu / a.steps, digest


def wait_policy(a: argparse.Namespace) -> None:
    cases = [("PASSIVE", 1), ("ACTIVE", 2), ("PASSIVE", 2)]
    times: dict[tuple[str, int], list[tuple[float, float]]] = {c: [] for c in cases}
    digests: dict[tuple[str, int], str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.repeat):  # interleaved, so a change of load hits every case alike
            for policy, threads in cases:
                w, c, d = policy_run(policy, threads, a, Path(tmp) / f"{policy}-{threads}-{r}")
                times[(policy, threads)].append((w, c))
                digests[(policy, threads)] = d
    print(f"{a.task}, d={a.d_model}, batch {a.batch_size}, {a.steps} steps, medians of {a.repeat} fresh processes")
    print("| threads, OMP_WAIT_POLICY | wall ms/step | CPU ms/step | CPU vs 1 thread |")
    print("|---|---|---|---|")
    base = statistics.median(c for _, c in times[("PASSIVE", 1)])
    for policy, threads in cases:
        w = statistics.median(x for x, _ in times[(policy, threads)])
        c = statistics.median(x for _, x in times[(policy, threads)])
        spread = max(x for _, x in times[(policy, threads)]) - min(x for _, x in times[(policy, threads)])
        print(f"| {threads}, {policy} | {w * 1e3:.1f} | {c * 1e3:.1f} (spread {spread * 1e3:.1f}) | {c / base:.2f}× |")
    same = digests[("ACTIVE", 2)] == digests[("PASSIVE", 2)]
    print(f"2 threads ACTIVE vs PASSIVE: models bit-identical: {same}")
    if not same:
        raise SystemExit("the wait policy changed the result")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", default="cond-majority")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--wait-policy", action="store_true", help="compare OpenMP wait policies instead")
    ap.add_argument("--repeat", type=int, default=3, help="fresh processes per case (--wait-policy)")
    a = ap.parse_args()
    if a.wait_policy:
        wait_policy(a)
        return
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
