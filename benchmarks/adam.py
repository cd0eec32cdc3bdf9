"""Adam's share of a small-model training step on CPU, single-tensor vs ``foreach`` implementation.

    python benchmarks/adam.py [--steps 30] [--threads 1]

The trainer uses ``torch.optim.Adam`` with torch's default implementation, which on CPU tensors is the
single-tensor loop.  This measures, on the Majority-sized GPT (L = 2, d = 128, 4 heads, T = 21, batch
256), the process CPU time of ``optimizer.step()`` with ``foreach=False`` and ``foreach=True`` (median
over steps after 5 warm-up steps), the whole step (forward + backward + Adam) for scale, and whether the
two implementations give bit-identical parameters (they must: the attribution replay re-runs the real
optimizer).  Profile behind it: the step is 15 parameter tensors of ≤ 65,536 numbers; the per-tensor
dispatch the ``foreach`` kernels save is a few microseconds each, about what their list handling costs.

Prints one line per implementation and the ratio; writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from originlens.models.gpt import GPT, GPTConfig


def run(foreach: bool, steps: int) -> tuple[list[torch.Tensor], float, float]:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=16, seq_len=21, n_layer=2, d_model=128, n_head=4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=foreach)
    x = torch.randint(0, 16, (256, 21), generator=torch.Generator().manual_seed(1))
    adam, whole = [], []
    for _ in range(steps):
        t0 = time.process_time()
        opt.zero_grad()
        model.loss(x).backward()
        t1 = time.process_time()
        opt.step()
        t2 = time.process_time()
        adam.append(t2 - t1)
        whole.append(t2 - t0)
    return [p.detach().clone() for p in model.parameters()], statistics.median(adam[5:]), statistics.median(whole[5:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    p1, a1, w1 = run(False, a.steps)
    p2, a2, w2 = run(True, a.steps)
    same = all(torch.equal(x, y) for x, y in zip(p1, p2))
    print(f"single-tensor Adam: {a1 * 1e3:.2f} ms CPU of a {w1 * 1e3:.1f} ms step ({100 * a1 / w1:.1f} %)")
    print(f"foreach Adam:       {a2 * 1e3:.2f} ms CPU of a {w2 * 1e3:.1f} ms step ({100 * a2 / w2:.1f} %)")
    print(f"single / foreach = {a1 / a2:.2f}; parameters bit-identical: {same}")


if __name__ == "__main__":
    main()
