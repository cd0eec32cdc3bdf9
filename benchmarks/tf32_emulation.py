"""How far TF32 matrix products move the pathway components, emulated on the CPU.

On a GPU, ``--matmul-precision tf32`` (the paper-scale run's default) rounds the operands of every float32
matrix product to TF32 (1 + 8 + 10 bits: the float32 exponent, a 10-bit mantissa) and accumulates in
float32.  This script emulates that on the CPU with a ``TorchDispatchMode`` that rounds both matrix operands
of every ``mm`` / ``bmm`` / ``addmm`` / ``baddbmm`` (forward and backward, the decomposition's hand-written
recursions included) and the query/key/value of fused attention to the nearest TF32 value (ties away from
zero, as ``cvt.rna.tf32.f32`` does), then compares:

* the exact decomposition at every site of a Majority-size model (2 layers, d = 128, 4 heads, T = 21,
  batch 256, weights perturbed from the initialisation), ``decompose(model, tokens, "all")``, float32 with
  and without the emulation, against the same in float64 (the reference);
* the sum identity G_dir + G_pre + G_sh = ∇L under the emulation (it holds by construction up to float32
  addition: G_pre is formed as a difference);
* the training loss and ∇L of one step.

Prints, per component, the deviation from float64 as max |Δ| / max |∇L| and as relative L2 norm, for
float32 and for emulated TF32 — the tolerance the pathway components have under TF32.  Caveat: an
emulation, not a GPU: cuBLAS may split products differently (split-K), and fused attention kernels may keep
some of their products in full float32; the emulation rounds them all, so it errs on the pessimistic side.

Usage: ``python benchmarks/tf32_emulation.py [--batch 256] [--seed 0]``.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from originlens.attribution import decompose
from originlens.models import GPT, GPTConfig

aten = torch.ops.aten


def to_tf32(x: torch.Tensor) -> torch.Tensor:
    """The nearest TF32 value of each float32 entry (10-bit mantissa; ties away from zero); other dtypes
    unchanged."""
    if x.dtype != torch.float32:
        return x
    i = x.contiguous().view(torch.int32)
    r = (i + 0x1000) & ~0x1FFF  # sign-magnitude: adding half an ulp to the bits rounds the magnitude
    finite = torch.isfinite(x)
    return torch.where(finite, r.view(torch.float32), x).view(x.shape)


# op → positions of its matrix operands
MATRIX_ARGS: dict[Any, tuple[int, ...]] = {
    aten.mm.default: (0, 1),
    aten.bmm.default: (0, 1),
    aten.addmm.default: (1, 2),
    aten.baddbmm.default: (1, 2),
    aten.addbmm.default: (1, 2),
    aten._scaled_dot_product_flash_attention_for_cpu.default: (0, 1, 2),
}


class TF32Emulation(TorchDispatchMode):
    """Rounds the matrix operands of float32 products to TF32 (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.rounded = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        pos = MATRIX_ARGS.get(func)
        if pos:
            args = tuple(to_tf32(a) if j in pos and isinstance(a, torch.Tensor) else a for j, a in enumerate(args))
            self.rounded += 1
        return func(*args, **kwargs)


def model_and_batch(batch: int, seed: int, dtype: torch.dtype) -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(seed)
    model = GPT(GPTConfig(vocab_size=5, seq_len=21, n_layer=2, d_model=128, n_head=4))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the initialisation
    g = torch.Generator().manual_seed(seed + 1)
    tokens = torch.randint(0, 5, (batch, 21), generator=g)
    return model.to(dtype), tokens


def flat(parts: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([v.detach().double().reshape(-1) for _, v in sorted(parts.items())])


def components(model: GPT, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every site's components, concatenated per component (float64)."""
    out = decompose(model, tokens, "all")
    names = ("direct", "precached", "shared", "full")
    return {n: torch.cat([flat(getattr(out[s], n)) for s in sorted(out)]) for n in names}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    m64, tok = model_and_batch(args.batch, args.seed, torch.float64)
    m32, _ = model_and_batch(args.batch, args.seed, torch.float32)
    ref = components(m64, tok)
    f32 = components(m32, tok)
    mode = TF32Emulation()
    with mode:
        t32 = components(m32, tok)
    scale = float(ref["full"].abs().max())
    print(f"Majority size (2 × 128, T 21), batch {args.batch}, all 63 sites; {mode.rounded} products rounded to TF32")
    print(
        f"  {'component':<10} {'float32 max|Δ|/max|∇L|':>24} {'TF32 max|Δ|/max|∇L|':>22} {'float32 rel L2':>15} {'TF32 rel L2':>12}"
    )
    for n in ("direct", "precached", "shared", "full"):
        row = []
        for got in (f32, t32):
            d = got[n] - ref[n]
            row.append((float(d.abs().max()) / scale, float(d.norm() / ref[n].norm().clamp_min(1e-300))))
        print(f"  {n:<10} {row[0][0]:>24.2e} {row[1][0]:>22.2e} {row[0][1]:>15.2e} {row[1][1]:>12.2e}")
    ident = t32["direct"] + t32["precached"] + t32["shared"] - t32["full"]
    print(
        f"  sum identity under TF32: max |G_dir + G_pre + G_sh − ∇L| / max|∇L| = {float(ident.abs().max()) / scale:.1e}"
    )


if __name__ == "__main__":
    main()
