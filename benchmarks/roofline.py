"""Roofline context: this machine's measured limits and the fraction of them our main kernels reach.

    python benchmarks/roofline.py [--threads 1] [--repeat 5]

Limits, measured in the same run (process CPU time, median of ``--repeat``):

* GEMM throughput: ``torch.mm`` of two n × n matrices (n = 1,024 and 2,048) in float32 and float64,
  2n³ flops per product → GFLOP/s per CPU-second (so a loaded machine does not deflate it much).
* Copy bandwidth: ``dst.copy_(src)`` of 64 M float32 (256 MiB), 2 × 256 MiB moved per copy → GB/s.

Workloads (1 thread by default, CPU time, median of ``--repeat``):

* GPT training step, Majority size (L = 2, d = 128, 4 heads, T = 21, batch 256), forward + backward:
  flops counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and attention only).
* One-hot attention model, one SGD step of the path implementation at |V| = 1,000, T = 64, L = 3, batch
  512: the step's 75 |V|³ products (3 × 25 products, forward and the two backward matmuls of each) alone
  are 2 × 75 × |V|³ flops; the rest of the step (memory-bound gathers and T-sized batched products) is
  not counted, so the fraction is a lower bound.

Each workload's fraction is its achieved GFLOP/s over the float32 GEMM limit at the same thread count.
The pathway decomposition is given in training steps instead (``benchmarks/decompose.py``): its
hand-written backward uses tensor hooks that torch's flop counter cannot follow.  Othello generation and
the corpus statistics are integer / sparse work with no flop roofline (their
figures are speed-ups in their own benchmarks).  Prints one table; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode


def cpu_median(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return statistics.median(times)


def counted_flops(fn: Callable[[], object]) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def gemm_gflops(n: int, dtype: torch.dtype, repeat: int) -> float:
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype)
    t = cpu_median(lambda: torch.mm(a, b, out=c), repeat)
    return 2 * n**3 / t / 1e9


def copy_gbs(repeat: int) -> float:
    src = torch.ones(64 * 1024 * 1024, dtype=torch.float32)
    dst = torch.empty_like(src)
    t = cpu_median(lambda: dst.copy_(src), repeat)
    return 2 * src.numel() * 4 / t / 1e9


def gpt_workloads(repeat: int) -> list[tuple[str, float, float]]:
    from originlens.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4))
    tokens = torch.randint(0, 5, (256, 21))

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model.loss(tokens).backward()

    flops = counted_flops(step)
    return [("GPT step (fwd + bwd), Majority size, batch 256", flops / 1e9, cpu_median(step, repeat))]


def assoc_workload(repeat: int) -> tuple[str, float, float]:
    import numpy as np

    from originlens.models.assoc import AssocConfig, AssocModel

    V, T, L, B = 1000, 64, 3, 512
    model = AssocModel(AssocConfig(vocab_size=V, seq_len=T, n_layers=L, init="gaussian", init_std=0.02))
    rng = np.random.default_rng(0)
    batch = torch.from_numpy(rng.zipf(1.3, size=(B, T + 1)).clip(1, V) - 1)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model.accumulate_gradients(batch, impl="paths")

    flops = 2 * 75 * V**3  # the |V|³ products only (3 × 25 at L = 3): a lower bound of the step's flops
    return (
        f"one-hot model step, paths, |V| {V}, T {T}, L {L}, batch {B} (|V|³ products only)",
        flops / 1e9,
        cpu_median(step, max(1, repeat // 2)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-assoc", action="store_true", help="skip the one-hot model (its step takes seconds)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    limits = {f"GEMM float32, n={n}": gemm_gflops(n, torch.float32, a.repeat) for n in (1024, 2048)} | {
        f"GEMM float64, n={n}": gemm_gflops(n, torch.float64, a.repeat) for n in (1024, 2048)
    }
    peak32 = max(v for k, v in limits.items() if "float32" in k)
    print(f"torch {torch.__version__}, {a.threads} thread(s); process CPU time, medians of {a.repeat}")
    print("| limit | measured |")
    print("|---|---|")
    for k, v in limits.items():
        print(f"| {k} | {v:.1f} GFLOP/s per CPU-second |")
    print(f"| copy, 256 MiB float32 | {copy_gbs(a.repeat):.1f} GB/s (read + write) |")
    work = gpt_workloads(a.repeat)
    if not a.no_assoc:
        work.append(assoc_workload(a.repeat))
    print()
    print("| workload | GFLOP | CPU s | GFLOP/s | fraction of the float32 GEMM limit |")
    print("|---|---|---|---|---|")
    for name, gflop, sec in work:
        print(f"| {name} | {gflop:.2f} | {sec:.3f} | {gflop / sec:.1f} | {gflop / sec / peak32:.0%} |")


if __name__ == "__main__":
    main()
