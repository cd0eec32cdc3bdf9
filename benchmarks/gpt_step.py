"""Training-step time of originlens.models.GPT per regime (forward + backward + Adam step), CPU.

Compares, in the same run and on the same batch:

* standard (SDPA) vs Hugging Face ``GPT2LMHeadModel`` with the same configuration (only if
  ``transformers`` is importable; otherwise a message says how to enable it);
* standard eager attention, myopic, untied (``untie_at=[10]``) and myopic+untied vs standard
  (target for myopic: ≤ 1.6×);
* our myopic attention vs a straightforward one (``where(I, QKᵀ, Q sg(K)ᵀ)``: two score matmuls),
  swapped into the same model;
* untied[10] vs the previous untied block (``untied[10]-previous``: the stream concatenated after and split
  before every block, range outputs concatenated), swapped into the same model.

Usage: ``.venv/bin/python benchmarks/gpt_step.py [--sizes majority,othello] [--steps 10]``.

Profile of untied[10] vs standard (torch.profiler, Majority size, 1 thread, forward + backward): the
untied step runs the same matmuls, LayerNorms and GELUs, split per range (about the same arithmetic
time), plus data movement standard does not have: the concatenation of the per-range Q/K/V and of every
block's range outputs (and the concatenations their split backward passes make), strided per-range views
copied again inside LayerNorm and the output projection, and Adam over twice the block parameters.  The
untied path now keeps the stream per range between blocks and builds Q, K, V and the projection inputs
with one copy each (bit-identical results, ``tests/models/test_gpt.py``); what remains is the per-range
op count (two of each block op) and the Q/K/V concatenation, which attention over the whole prefix needs.
Caveat: on a shared CPU wall times swing with other users' load; the ratios use the median process CPU
time (all threads) and the minimum wall time, both far steadier than the median wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time

import torch
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.models import GPT, GPTConfig
from originlens.models import gpt as gpt_module

SIZES = {  # name: (config kwargs, batch)
    "majority": (dict(vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4), 256),
    "othello": (dict(vocab_size=67, seq_len=61, n_layer=6, d_model=256, n_head=4), 64),
}
VARIANTS = {
    "standard": dict(),
    "standard-eager": dict(attn_impl="eager"),
    "myopic": dict(regime="myopic"),
    "myopic-naive": dict(regime="myopic"),
    "untied[10]": dict(regime="untied", untie_at=[10]),
    "untied[10]-previous": dict(regime="untied", untie_at=[10]),
    "myopic+untied[10]": dict(regime="myopic+untied", untie_at=[10]),
}


def naive_attention(q, k, v, *, myopic=False, impl="sdpa", dropout_p=0.0, future=None):
    """The myopic attention formula written directly: two full score matmuls and ``where``."""
    T = q.shape[-2]
    eye = torch.eye(T, dtype=torch.bool, device=q.device)
    s = torch.where(eye, q @ k.transpose(-2, -1), q @ k.detach().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    a = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
    v_det = v.detach()
    return a @ v_det + torch.diagonal(a, dim1=-2, dim2=-1)[..., None] * (v - v_det)


def previous_block(self, xs, spans, attention):
    """The previous untied block: one (B, T, d) stream split per range and the range outputs (and Q/K/V)
    concatenated in every block; bit-identical results to ``Block.forward_parts``."""
    x = torch.cat(xs, dim=1) if len(xs) > 1 else xs[0]
    B, T, d = x.shape
    parts = list(x.split([b - a for _, a, b in spans], dim=1)) if len(spans) > 1 else [x]
    copies = [self.copies[r] for r, _, _ in spans]
    qkv = torch.cat([c.attn_qkv(c.ln_1(xr)) for c, xr in zip(copies, parts)], dim=1)
    q, k, v = (t.view(B, T, self.n_head, d // self.n_head).transpose(1, 2) for t in qkv.split(d, dim=2))
    y = attention(q, k, v).transpose(1, 2).reshape(B, T, d)
    out = []
    for c, xr, yr in zip(copies, parts, y.split([b - a for _, a, b in spans], dim=1)):
        h = xr + c.attn_out(yr)
        out.append(h + c.mlp_out(torch.nn.functional.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh")))
    return list(torch.cat(out, dim=1).split([b - a for _, a, b in spans], dim=1))


@contextlib.contextmanager
def patched_block(fn):
    saved = gpt_module.Block.forward_parts
    gpt_module.Block.forward_parts = fn
    try:
        yield
    finally:
        gpt_module.Block.forward_parts = saved


@contextlib.contextmanager
def patched_attention(fn):
    saved = gpt_module.causal_self_attention
    gpt_module.causal_self_attention = fn
    try:
        yield
    finally:
        gpt_module.causal_self_attention = saved


def step_fn(model: torch.nn.Module, loss_fn):
    """One training step (zero_grad, forward, backward, Adam step) as a closure."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()

    return step


def time_interleaved(steps_by_name: dict, steps: int, warmup: int) -> dict[str, dict[str, float]]:
    """Per variant: median and min wall ms/step and median process-CPU ms/step.

    Variants are interleaved step by step so that load drift on a shared machine hits them alike; the
    CPU time (all threads) is much less sensitive to other users' load than wall time.
    """
    wall: dict[str, list[float]] = {n: [] for n in steps_by_name}
    cpu: dict[str, list[float]] = {n: [] for n in steps_by_name}
    for i in range(warmup + steps):
        for name, (step, ctx) in steps_by_name.items():
            with ctx():
                t0, c0 = time.perf_counter(), time.process_time()
                step()
                t1, c1 = time.perf_counter(), time.process_time()
            if i >= warmup:
                wall[name].append(1000 * (t1 - t0))
                cpu[name].append(1000 * (c1 - c0))
    return {
        n: {"wall": statistics.median(wall[n]), "wall_min": min(wall[n]), "cpu": statistics.median(cpu[n])}
        for n in steps_by_name
    }


def hf_model(cfg: dict):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    hc = GPT2Config(
        vocab_size=cfg["vocab_size"],
        n_positions=cfg["seq_len"],
        n_embd=cfg["d_model"],
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function="gelu_new",
    )
    try:
        return GPT2LMHeadModel(hc, attn_implementation="sdpa")
    except TypeError:  # older transformers
        hc._attn_implementation = "sdpa"
        return GPT2LMHeadModel(hc)


def run_size(name: str, steps: int, warmup: int) -> None:
    cfg, batch = SIZES[name]
    tokens = torch.randint(0, cfg["vocab_size"], (batch, cfg["seq_len"]), generator=torch.Generator().manual_seed(0))
    print(
        f"\n== {name}: L={cfg['n_layer']} d={cfg['d_model']} heads={cfg['n_head']} T={cfg['seq_len']} "
        f"batch={batch} (median of {steps} steps after {warmup} warm-up)"
    )
    runs = {}
    for variant, kw in VARIANTS.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(**cfg, **kw))
        ctx = contextlib.nullcontext
        if variant.endswith("naive"):
            ctx = lambda: patched_attention(naive_attention)
        elif variant.endswith("previous"):
            ctx = lambda: patched_block(previous_block)
        runs[variant] = (step_fn(model, (lambda m: lambda: m.loss(tokens))(model)), ctx)
    hf = hf_model(cfg)
    if hf is not None:
        hf.train()
        runs["HF GPT2LMHeadModel"] = (
            step_fn(hf, lambda: hf(input_ids=tokens, labels=tokens).loss),
            contextlib.nullcontext,
        )
    res = time_interleaved(runs, steps, warmup)
    print(f"  {'variant':20s} {'wall med':>9s} {'wall min':>9s} {'cpu med':>9s}  (ms/step)  cpu ratio vs standard")
    for variant, r in res.items():
        print(
            f"  {variant:20s} {r['wall']:9.1f} {r['wall_min']:9.1f} {r['cpu']:9.1f}             "
            f"×{r['cpu'] / res['standard']['cpu']:.2f}",
            flush=True,
        )

    def ratio(a: str, b: str) -> str:
        return f"{res[a]['cpu'] / res[b]['cpu']:.2f} (cpu), {res[a]['wall_min'] / res[b]['wall_min']:.2f} (min wall)"

    print(f"  ratio myopic/standard         = {ratio('myopic', 'standard')}   target ≤ 1.6")
    print(f"  ratio myopic/standard-eager   = {ratio('myopic', 'standard-eager')}")
    print(f"  ratio myopic-naive/myopic     = {ratio('myopic-naive', 'myopic')}")
    print(f"  ratio untied[10]/standard     = {ratio('untied[10]', 'standard')}   goal ≤ 1.2")
    print(f"  ratio untied-previous/untied  = {ratio('untied[10]-previous', 'untied[10]')}")
    if hf is None:
        print("  HF GPT2LMHeadModel comparison skipped: `pip install transformers` to enable it")
    else:
        print(f"  ratio originlens-standard/HF  = {ratio('standard', 'HF GPT2LMHeadModel')}")
        emit(f"gpt_step.{name}.hf_over_ours", res["HF GPT2LMHeadModel"]["cpu"] / res["standard"]["cpu"], cpu=True)

    def cpu_ratio(a: str, b: str) -> float:
        return float(res[a]["cpu"] / res[b]["cpu"])

    # speed-ups (higher is better): standard over myopic (goal: myopic ≤ 1.6× standard), the naive myopic
    # attention over ours, standard over untied[10] (goal: untied ≤ 1.2× standard)
    emit(f"gpt_step.{name}.standard_over_myopic", cpu_ratio("standard", "myopic"), cpu=True, goal=1 / 1.6)
    emit(f"gpt_step.{name}.naive_over_myopic", cpu_ratio("myopic-naive", "myopic"), cpu=True)
    emit(f"gpt_step.{name}.standard_over_untied", cpu_ratio("standard", "untied[10]"), cpu=True, goal=1 / 1.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="majority,othello")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name in args.sizes.split(","):
        run_size(name, args.steps, args.warmup)


if __name__ == "__main__":
    main()
