"""Benchmark: one SGD epoch of the Def. 3.1 model, fast one-hot path vs the dense one-hot implementation.

Both runs use :func:`originlens.train.train_assoc` with the same data, zero init, learning rate and
batch order; only ``impl`` differs (``"paths"``: path expansion over the one-hot input, ``"dense"``:
straightforward one-hot matmuls; optionally ``"gather"``: first layer gathered, deeper layers dense).
The per-step losses must agree (float32: relative 1e-4; float64: 1e-10) and the final weights to 100× that
(relative Frobenius norm per tensor), or the script exits with status 1.

    .venv/bin/python benchmarks/assoc_train.py                      # |V|=1000, T=64, L=3, N=2048, B=512
    .venv/bin/python benchmarks/assoc_train.py --threads 1,2 --repeat 3 --batch 2048
    .venv/bin/python benchmarks/assoc_train.py --impls paths,gather,dense --tokens zipf
    .venv/bin/python benchmarks/assoc_train.py --sections --threads 1,2 --repeat 3   # where a paths step goes

``--sections`` times the parts of one ``accumulate_gradients`` step of the paths implementation
(batch-independent products, the chunked pass over the batch, the products' backward; wall seconds,
minimum over ``--repeat``) instead of training epochs.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.progress import set_verbosity
from originlens.train import AssocTrainConfig, train_assoc


def make_tokens(kind: str, n: int, T: int, V: int, seed: int = 0) -> np.ndarray:
    """``random``: i.i.d. uniform ids; ``zipf``: a Zipfian first-order Markov chain (storyworld-like
    frequency profile: a few very frequent tokens, a long tail)."""
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.integers(0, V, (n, T + 1))
    ranks = np.arange(1, V + 1)
    base = 1.0 / ranks
    base /= base.sum()
    succ = rng.integers(0, V, (V, 8))  # each token has 8 favoured successors
    out = np.empty((n, T + 1), dtype=np.int64)
    out[:, 0] = rng.choice(V, n, p=base)
    for t in range(1, T + 1):
        prev = out[:, t - 1]
        fav = rng.random(n) < 0.6
        out[:, t] = np.where(fav, succ[prev, rng.integers(0, 8, n)], rng.choice(V, n, p=base))
    return out


def run_once(impl: str, tokens: np.ndarray, args) -> tuple[float, float, np.ndarray, dict]:
    """``(wall seconds, process CPU seconds, per-step losses, final weights)`` of one epoch."""
    cfg = AssocTrainConfig(
        n_layers=args.layers,
        lr=args.lr,
        epochs=1,
        batch_size=args.batch,
        dtype=args.dtype,
        impl=impl,
        stats_source="none",
        grad_chunk=args.batch,
    )
    t0, c0 = time.perf_counter(), time.process_time()
    run = train_assoc(tokens, args.vocab, cfg)
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0
    losses = np.array([run.losses[s] for s in sorted(run.losses)])
    return secs, cpu, losses, {k: v.double() for k, v in run.model.weights().items()}


def sections(tokens: np.ndarray, args) -> dict[str, float]:
    """Wall seconds of the parts of one paths step (products, pass, products' backward; min over repeats)."""
    from originlens.models import assoc

    model = assoc.AssocModel(
        assoc.AssocConfig(
            vocab_size=args.vocab,
            seq_len=args.seq_len,
            n_layers=args.layers,
            init="gaussian",
            init_std=0.01,
            dtype=args.dtype,
            impl="paths",
        )
    )
    batch = torch.as_tensor(tokens[: args.batch])
    spent: dict[str, float] = {}
    originals = {
        "products": (assoc.paths.Products, "__init__"),
        "pass": (assoc.model, "path_pass"),  # the name the model module calls
        "products backward": (assoc.paths.Products, "backward"),
    }
    saved = {k: getattr(o, n) for k, (o, n) in originals.items()}

    def timed(key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0

        return wrapper

    best: dict[str, float] = {}
    model.accumulate_gradients(batch, impl="paths")  # allocates the scratch buffers
    try:
        for k, (o, n) in originals.items():
            setattr(o, n, timed(k, saved[k]))
        for _ in range(args.repeat):
            spent.clear()
            model.zero_grad()
            t0 = time.perf_counter()
            model.accumulate_gradients(batch, impl="paths")
            spent["step"] = time.perf_counter() - t0
            best = {k: min(v, best.get(k, v)) for k, v in spent.items()}
    finally:
        for k, (o, n) in originals.items():
            setattr(o, n, saved[k])
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--n", type=int, default=2048, help="sequences (one epoch)")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--lr", type=float, default=20.0, help="large enough that every weight moves in a few steps")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--tokens", default="zipf", choices=["random", "zipf"])
    p.add_argument("--impls", default="paths,dense", help="comma list of paths, gather, dense (dense is the baseline)")
    p.add_argument("--threads", default="2", help="torch threads, or a comma list (e.g. 1,2) measured in turn")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="epochs per implementation, interleaved; the minimum is reported (shared machines)",
    )
    p.add_argument("--sections", action="store_true", help="time the parts of one paths step instead")
    args = p.parse_args(argv)
    set_verbosity(0)
    tokens = make_tokens(args.tokens, args.n, args.seq_len, args.vocab)
    if args.sections:
        for threads in [int(t) for t in str(args.threads).split(",") if t.strip()]:
            torch.set_num_threads(threads)
            parts = sections(tokens, args)
            rest = parts["step"] - sum(v for k, v in parts.items() if k != "step")
            print(
                f"|V|={args.vocab} T={args.seq_len} L={args.layers} batch={args.batch} threads={threads} "
                f"(s, min of {args.repeat}): "
                + ", ".join(f"{k} {v:.3f}" for k, v in parts.items())
                + f", other {rest:.3f}",
                flush=True,
            )
        return 0
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    if "dense" not in impls:
        impls.append("dense")
    ok = True
    for threads in [int(t) for t in str(args.threads).split(",") if t.strip()]:
        torch.set_num_threads(threads)
        print(
            f"|V|={args.vocab} T={args.seq_len} L={args.layers} N={args.n} batch={args.batch} dtype={args.dtype} "
            f"tokens={args.tokens} threads={threads} repeat={args.repeat}",
            flush=True,
        )
        times: dict[str, list[float]] = {i: [] for i in impls}
        cpus: dict[str, list[float]] = {i: [] for i in impls}
        losses, weights = {}, {}
        for _ in range(args.repeat):
            for impl in impls:
                secs, cpu, losses[impl], weights[impl] = run_once(impl, tokens, args)
                times[impl].append(secs)
                cpus[impl].append(cpu)
                print(
                    f"  {impl:7s} {secs:8.2f} s/epoch [{cpu:.2f} CPU s]  ({len(losses[impl])} steps, final loss {losses[impl][-1]:.6f})",
                    flush=True,
                )
        tol = 1e-4 if args.dtype == "float32" else 1e-10
        for impl in impls:
            err = float(np.max(np.abs(losses[impl] - losses["dense"]) / np.abs(losses["dense"])))
            if err > tol:
                print(f"  MISMATCH: {impl} losses differ from dense by {err:.2e} (> {tol})")
                ok = False
            werr = max(
                float((w - weights["dense"][k]).norm() / weights["dense"][k].norm().clamp_min(1e-300))
                for k, w in weights[impl].items()
            )
            if werr > 100 * tol:
                print(f"  MISMATCH: {impl} final weights differ from dense by {werr:.2e} (relative Frobenius)")
                ok = False
            elif impl != "dense":
                print(f"  {impl}: max relative loss difference {err:.1e}, weight difference {werr:.1e}")
        best = {i: min(t) for i, t in times.items()}
        best_cpu = {i: min(t) for i, t in cpus.items()}
        for impl in impls:
            if impl != "dense":
                print(
                    f"  speed-up {impl} vs dense (min of {args.repeat}): {best['dense']:.2f} / {best[impl]:.2f} s "
                    f"= {best['dense'] / best[impl]:.2f}x [CPU {best_cpu['dense'] / best_cpu[impl]:.2f}x]  "
                    f"[threads={threads}, batch={args.batch}]",
                    flush=True,
                )
                emit(
                    f"assoc_train.{impl}_vs_dense.threads{threads}",
                    best_cpu["dense"] / best_cpu[impl],
                    cpu=True,
                    goal=8,
                )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
