"""Benchmark: corpus statistics in 1 process vs 2 processes under torchrun (gloo, CPU), same windows.

Each process is limited to one thread (``NUMBA_NUM_THREADS=1``, ``OMP_NUM_THREADS=1``) so the comparison
measures the scaling of the sharded all-gather path itself; the 1-process run uses the same command
(``originlens stats``).  Also prints the single process with all cores' threads for reference.
The results are checked equal (counts exactly, floats to 1e-12).

Usage: ``python benchmarks/distributed_stats.py [--windows N] [--vocab V] [--seq-len T]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def run(nproc: int, tokens: Path, V: int, out: Path, threads: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "NUMBA_NUM_THREADS": str(threads), "ORIGINLENS_QUIET": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "originlens",
        "-q",
        "stats",
        "--tokens",
        str(tokens),
        "--vocab-size",
        str(V),
        "--out",
        str(out),
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--windows", type=int, default=16384)
    ap.add_argument("--vocab", type=int, default=1000)
    ap.add_argument("--seq-len", type=int, default=64)
    args = ap.parse_args()
    from originlens.stats import load_statistics

    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, args.vocab + 1)
    tokens = rng.choice(args.vocab, size=(args.windows, args.seq_len + 1), p=p / p.sum()).astype(np.int32)
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        np.save(d / "tokens.npy", tokens)
        t1 = run(1, d / "tokens.npy", args.vocab, d / "one", 1)
        t2 = run(2, d / "tokens.npy", args.vocab, d / "two", 1)
        tall = run(1, d / "tokens.npy", args.vocab, d / "all", os.cpu_count() or 1)
        a, b = load_statistics(d / "one"), load_statistics(d / "two")
        np.testing.assert_array_equal(a.bigram, b.bigram)
        worst = 0.0
        for k, v in a.as_dict().items():  # float sums in another order: round-off only
            np.testing.assert_allclose(b.as_dict()[k], v, rtol=1e-10, atol=1e-15)
            worst = max(worst, float(np.max(np.abs(b.as_dict()[k] - v)) / max(np.max(np.abs(v)), 1e-300)))
    print(f"statistics |V|={args.vocab} T={args.seq_len} N={args.windows} (wall time incl. process start)")
    print(f"  1 process, 1 thread : {t1:7.2f} s")
    print(f"  2 processes, 1 thread each: {t2:7.2f} s   speed-up {t1 / t2:.2f}x")
    print(f"  1 process, {os.cpu_count()} threads: {tall:7.2f} s")
    print(f"  counts identical; worst float difference {worst:.1e} of the largest entry")


if __name__ == "__main__":
    main()
