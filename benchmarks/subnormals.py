"""The one-hot attention model's first steps from zero init, with and without flushing subnormal floats.

From zero init (Definition 3.1 of arXiv 2601.19208) the weights grow like powers of t = sη, so at small η
the |V|³ path products of the first steps fall below float32's normal range; x86 cores process such
operands in microcode.  The model flushes them to zero while it computes
(``originlens.models.assoc.workers.subnormals_flushed``); this script trains the same steps with the flush
switched off (``FLUSH_SUBNORMALS = False``) and on, in one process, and prints seconds per step (wall and
CPU), the ratio, and the largest weight difference between the two runs.

    python benchmarks/subnormals.py [--vocab 500] [--seq-len 32] [--batch 512] [--steps 6] [--lr 0.005]

Figures: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from _emit import emit

from originlens.models.assoc import AssocConfig, AssocModel, workers


def run(tokens: torch.Tensor, args, flush: bool) -> tuple[float, float, dict[str, torch.Tensor]]:
    workers.FLUSH_SUBNORMALS = flush
    m = AssocModel(AssocConfig(vocab_size=args.vocab, seq_len=args.seq_len, n_layers=3, impl="paths"))
    opt = torch.optim.SGD(m.parameters(), lr=args.lr)
    walls, cpus = [], []
    try:
        for s in range(args.steps):
            batch = tokens[(s * args.batch) % len(tokens) :][: args.batch]
            w, c = time.perf_counter(), time.process_time()
            opt.zero_grad()
            m.accumulate_gradients(batch)
            opt.step()
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
    finally:
        workers.FLUSH_SUBNORMALS = True
    skip = min(2, args.steps - 1)  # steps 1–2: zero factors, no subnormals yet
    return float(np.mean(walls[skip:])), float(np.mean(cpus[skip:])), m.weights()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=500)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.005)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    p = 1.0 / np.arange(1, args.vocab + 1)  # Zipf-like token frequencies
    tokens = torch.from_numpy(rng.choice(args.vocab, size=(4 * args.batch, args.seq_len + 1), p=p / p.sum()))
    w_off, c_off, a = run(tokens, args, flush=False)
    w_on, c_on, b = run(tokens, args, flush=True)
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    scale = max(float(a[k].abs().max()) for k in a)
    print(
        f"|V|={args.vocab} T={args.seq_len} L=3 batch={args.batch} η={args.lr} steps 3..{args.steps} "
        f"threads={args.threads}"
    )
    print(f"  subnormals kept    {w_off:.3f} s/step [{c_off:.3f} CPU s]")
    print(f"  subnormals flushed {w_on:.3f} s/step [{c_on:.3f} CPU s]")
    print(f"  speed-up {w_off / w_on:.2f}x wall, {c_off / c_on:.2f}x CPU; max |Δw| {diff:.2e} (max |w| {scale:.2e})")
    emit("subnormals.kept_over_flushed", c_off / c_on, cpu=True)


if __name__ == "__main__":
    main()
