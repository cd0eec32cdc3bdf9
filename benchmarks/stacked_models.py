"""Many small models trained together: one vmapped step over M stacked GPTs vs M separate models stepped in
turn by one process vs M models trained by P processes sharing the device.

The toy grids of arXiv 2603.14087 train 4 regimes × 10 seeds of a 2-layer, d = 128 model (batch 256, T =
21); on a GPU one such model leaves the device idle (each step is a few hundred small kernels).  Three ways
to fill it, measured here on one configuration (Conditioned Majority, standard regime, Adam 1e-3):

* ``loop``: M models in one process, stepped one after another (the reference);
* ``vmap``: ``torch.func.stack_module_state`` + ``vmap(grad(loss))`` over the stacked parameters, Adam on
  the stacked tensors (elementwise, so per-model Adam exactly); the loss of model m equals its ``loop`` loss
  to float32 round-off (checked at the first step);
* ``processes``: M models split over P worker processes (spawned, one torch thread each), each stepping
  its share in turn — what ``run_toy_grid(jobs=P)`` does with whole runs.

Prints model-steps per second for each and the ratios to ``loop``.  ``--device cuda`` on a GPU; on the CPU
the figures are dominated by arithmetic (no launch overhead to amortise), and are recorded for contrast.

Usage: ``python benchmarks/stacked_models.py [--models 40] [--steps 20] [--device cpu] [--processes 2]``.
"""

from __future__ import annotations

import argparse
import copy
import multiprocessing as mp
import time
from typing import Any

import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.models import GPT, GPTConfig

CONFIG = dict(vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _models(m: int, device: torch.device) -> list[GPT]:
    out = []
    for s in range(m):
        torch.manual_seed(s)
        out.append(GPT(GPTConfig(**CONFIG)).to(device))
    return out


def _batch(m: int, b: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, CONFIG["vocab_size"], (m, b, CONFIG["seq_len"]), generator=g).to(device)


def loop_rate(m: int, steps: int, batch: int, device: torch.device) -> tuple[float, list[float]]:
    models = _models(m, device)
    opts = [torch.optim.Adam(x.parameters(), lr=1e-3) for x in models]
    x = _batch(m, batch, device)
    first: list[float] = []
    t0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            _sync(device)
            t0 = time.perf_counter()
        for j, (model, opt) in enumerate(zip(models, opts)):
            with model.trusted_tokens():
                loss = model.loss(x[j])
            if s == 0:
                first.append(float(loss.detach()))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    _sync(device)
    return m * steps / (time.perf_counter() - t0), first


def vmap_rate(m: int, steps: int, batch: int, device: torch.device) -> tuple[float, list[float]]:
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    models = _models(m, device)
    for model in models:
        model.check_token_range = False
    params, buffers = stack_module_state(models)  # type: ignore[arg-type]
    base = copy.deepcopy(models[0])
    base.check_token_range = False

    def loss_of(p: dict[str, Any], b: dict[str, Any], tokens: torch.Tensor) -> torch.Tensor:
        logits = functional_call(base, (p, b), (tokens[:, :-1],))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    step_fn = vmap(grad_and_value(loss_of), in_dims=(0, 0, 0))
    leaves = list(params.values())
    opt = torch.optim.Adam(leaves, lr=1e-3)
    x = _batch(m, batch, device)
    first: list[float] = []
    t0 = 0.0
    for s in range(steps + 1):
        if s == 1:
            _sync(device)
            t0 = time.perf_counter()
        grads, losses = step_fn(params, buffers, x)
        if s == 0:
            first = losses.tolist()
        for leaf, name in zip(leaves, params):
            leaf.grad = grads[name]
        opt.step()
    _sync(device)
    return m * steps / (time.perf_counter() - t0), first


def _worker(args: tuple[int, int, int, str]) -> float:
    m, steps, batch, device = args
    torch.set_num_threads(1)
    return loop_rate(m, steps, batch, torch.device(device))[0]


def process_rate(m: int, steps: int, batch: int, device: torch.device, processes: int) -> float:
    from concurrent.futures import ProcessPoolExecutor

    shares = [m // processes + (1 if j < m % processes else 0) for j in range(processes)]
    with ProcessPoolExecutor(max_workers=processes, mp_context=mp.get_context("spawn")) as pool:
        rates = list(pool.map(_worker, [(s, steps, batch, str(device)) for s in shares if s]))
    return sum(rates)  # the workers run side by side: their rates add (start-up excluded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=40)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--processes", type=int, default=2)
    args = ap.parse_args()
    device = torch.device(args.device)
    loop, first_loop = loop_rate(args.models, args.steps, args.batch, device)
    vm, first_vmap = vmap_rate(args.models, args.steps, args.batch, device)
    worst = max(abs(a - b) / abs(a) for a, b in zip(first_loop, first_vmap))
    proc = process_rate(args.models, args.steps, args.batch, device, args.processes)
    print(f"{args.models} models (2 layers, d 128, batch {args.batch}, T 21) on {device}, {args.steps} steps")
    print(f"  loop (one process, in turn): {loop:9.1f} model-steps/s")
    print(f"  vmap (stacked, one step):    {vm:9.1f} model-steps/s  {vm / loop:5.2f}× loop")
    print(f"  {args.processes} processes:                {proc:9.1f} model-steps/s  {proc / loop:5.2f}× loop")
    print(f"  first-step losses vmap vs loop: max relative difference {worst:.1e}")
    assert worst < 1e-4, "the vmapped models' losses differ from the models' own"
    emit("stacked_models.processes_over_loop", proc / loop, cpu=False)
    emit("stacked_models.vmap_over_loop", vm / loop, cpu=False)


if __name__ == "__main__":
    main()
