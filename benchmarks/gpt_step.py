"""Training-step time of originlens.models.GPT per regime (forward + backward + Adam step), CPU.

Compares, in the same run and on the same batch:

* standard (SDPA) vs Hugging Face ``GPT2LMHeadModel`` with the same configuration (only if
  ``transformers`` is importable; otherwise a message says how to enable it);
* standard eager attention, myopic, untied (``untie_at=[10]``) and myopic+untied vs standard
  (target for myopic: ≤ 1.6×);
* our myopic attention vs a straightforward one (``where(I, QKᵀ, Q sg(K)ᵀ)``: two score matmuls),
  swapped into the same model.

Usage: ``.venv/bin/python benchmarks/gpt_step.py [--sizes majority,othello] [--steps 10]``.
Caveat: the figures are medians over a few steps on a shared 2-thread CPU; expect ±10 % noise.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import time

import torch

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
    "myopic+untied[10]": dict(regime="myopic+untied", untie_at=[10]),
}


def naive_attention(q, k, v, *, myopic=False, impl="sdpa", dropout_p=0.0, future=None):
    """Spec §3.1 formula written directly: two full score matmuls and ``where``."""
    T = q.shape[-2]
    eye = torch.eye(T, dtype=torch.bool, device=q.device)
    s = torch.where(eye, q @ k.transpose(-2, -1), q @ k.detach().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    a = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
    v_det = v.detach()
    return a @ v_det + torch.diagonal(a, dim1=-2, dim2=-1)[..., None] * (v - v_det)


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


def time_interleaved(steps_by_name: dict, steps: int, warmup: int) -> dict[str, float]:
    """Median ms/step per variant; variants are interleaved step by step so that load drift on a
    shared machine hits them alike."""
    times: dict[str, list[float]] = {n: [] for n in steps_by_name}
    for i in range(warmup + steps):
        for name, (step, ctx) in steps_by_name.items():
            with ctx():
                t0 = time.perf_counter()
                step()
                dt = time.perf_counter() - t0
            if i >= warmup:
                times[name].append(dt)
    return {n: 1000 * statistics.median(t) for n, t in times.items()}


def hf_model(cfg: dict):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError:
        return None
    hc = GPT2Config(vocab_size=cfg["vocab_size"], n_positions=cfg["seq_len"], n_embd=cfg["d_model"],
                    n_layer=cfg["n_layer"], n_head=cfg["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0, activation_function="gelu_new")
    try:
        return GPT2LMHeadModel(hc, attn_implementation="sdpa")
    except TypeError:  # older transformers
        hc._attn_implementation = "sdpa"
        return GPT2LMHeadModel(hc)


def run_size(name: str, steps: int, warmup: int) -> None:
    cfg, batch = SIZES[name]
    tokens = torch.randint(0, cfg["vocab_size"], (batch, cfg["seq_len"]), generator=torch.Generator().manual_seed(0))
    print(f"\n== {name}: L={cfg['n_layer']} d={cfg['d_model']} heads={cfg['n_head']} T={cfg['seq_len']} "
          f"batch={batch} (median of {steps} steps after {warmup} warm-up)")
    runs = {}
    for variant, kw in VARIANTS.items():
        torch.manual_seed(0)
        model = GPT(GPTConfig(**cfg, **kw))
        ctx = (lambda: patched_attention(naive_attention)) if variant.endswith("naive") else contextlib.nullcontext
        runs[variant] = (step_fn(model, (lambda m: lambda: m.loss(tokens))(model)), ctx)
    hf = hf_model(cfg)
    if hf is not None:
        hf.train()
        runs["HF GPT2LMHeadModel"] = (step_fn(hf, lambda: hf(input_ids=tokens, labels=tokens).loss),
                                      contextlib.nullcontext)
    results = time_interleaved(runs, steps, warmup)
    for variant, ms in results.items():
        print(f"  {variant:20s} {ms:8.1f} ms/step   ×{ms / results['standard']:.2f} vs standard", flush=True)
    print(f"  ratio myopic/standard         = {results['myopic'] / results['standard']:.2f} (target ≤ 1.6)")
    print(f"  ratio myopic/standard-eager   = {results['myopic'] / results['standard-eager']:.2f}")
    print(f"  ratio myopic-naive/myopic     = {results['myopic-naive'] / results['myopic']:.2f}")
    print(f"  ratio untied[10]/standard     = {results['untied[10]'] / results['standard']:.2f}")
    if hf is None:
        print("  HF GPT2LMHeadModel comparison skipped: `pip install transformers` to enable it")
    else:
        print(f"  ratio originlens-standard/HF  = {results['standard'] / results['HF GPT2LMHeadModel']:.2f}")


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
