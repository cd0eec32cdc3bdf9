"""Structured per-site backpropagation for :class:`originlens.models.GPT` (fast path of ``decompose``).

The pathway components at a site are vector-Jacobian products ``G(k,i) = J_{k,i}ᵀ c`` with cotangents
c = d^k_i (direct) and p^k_i (pre-caching).  Generic autograd
computes each by a backward pass over the whole prefix; this module runs one cached forward and
hand-written backward passes whose structure keeps the per-site work small:

* **Adjoints.**  One cached forward (no autograd graph; the model's own modules, eager attention) and
  linear recursions from the top: d^{m−1} = M(d^m) (myopic block backward: only diagonal key/value
  reads), p^{m−1} = F(p^m) + X(d^m) (full block backward plus the off-diagonal key/value reads of d),
  p^L = 0, and the weight gradients of a^m = d^m + p^m (∇L).  Because p has its own recursion, its
  structural zeros are exact (p^L = 0, p^k_{T−2} = 0, and everything at i = T−1).
* **Fresh sources** (block k of a site (k, i), all positions of a layer in one batched call): the
  cotangent sits at position i only, so every weight gradient of block k is a sum of B outer
  products: MLP, output projection and query act at position i only, and the key/value weights get
  ``Σ_b q_{b,h,i} ⊗ Σ_j δS_{b,h,i,j} a_{b,j}`` and ``Σ_b δo_{b,h,i} ⊗ Σ_j A_{b,h,i,j} a_{b,j}``
  (attention-weighted input averages), never a contraction over positions per weight entry.  The
  adjoint sent to positions j ≤ i is Σ_h (δS_{hij} β_h + A_{hij} α_h), β_h = q_{hi}W_K[h],
  α_h = δo_{hi}W_V[h] (rank 2H per batch row), plus the query and residual paths at i.
  This adjoint stays in that low-rank form (:class:`FreshSpread`) until the block below needs it,
  and is then built for one position at a time.
* **Spread sources** (blocks below k): dense batched backward over the causal prefix 0..i only, all
  sources of one position stacked on a leading axis, weight gradients as batched GEMMs.  In the
  first block the adjoint at r^0 is never formed: δqkv is reduced over the batch rows of each
  position and token first, and only then multiplied by W_qkv (:func:`_qkv_to_embedding`).  Under
  myopic training sources never spread (other positions' keys/values are detached), so every block
  is handled at position i alone, batched over all sources.
* **∇L** from the sites when all of layer L is requested (cut identity, done by ``decompose``).

Cost (Majority size, all 63 sites, B = 256, float32, counted by ``torch.profiler``): 64 GFLOP of
matrix products against 12.7 for one training step (5.0×): the dense part 40 (Σ_i (i+1) batch rows per
source through a full block backward, itself 3.1 training steps), fresh sources 12, the adjoint
recursions 7, the cached forward 4.  Every per-site weight gradient is a contraction over its own
batch rows (rank B at the site's block, B·(i+1) rows below it), so these products are what an exact
per-site result costs here; they take about half of the CPU time, the rest is memory traffic (head
layouts, causal-prefix copies, LayerNorm backward, elementwise products).  Linear maps run against
cached contiguous Wᵀ (:func:`_times`), which is faster on CPU for inner dimension d.  See
``benchmarks/decompose.py``.

Supported (:func:`supported`): a GPT with one parameter range (standard or myopic regime, tied or
untied head, any width, heads, MLP ratio), dropout inactive, no forward hooks on the module;
``decompose`` falls back to generic autograd otherwise (e.g. untied regimes).  The results equal the
stop-gradient definition to float64 round-off (tests).  Caveat: this module mirrors ``GPT``'s block
(pre-LN, GELU-tanh MLP, learned positions); an architecture change must be mirrored here (the tests
compare it with the model and with the brute-force definition).

Size: one hand-written forward and backward pass; its stages share the saved intermediates of one layout
(per block: LayerNorm statistics, attention probabilities, MLP pre-activations, cached transposed
weights), so splitting it would export those private layouts between modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeGuard, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..models.gpt import GPT, Block, BlockCopy, EmbedCopy, HeadCopy, position_losses

Site = tuple[int, int]
ParamDict = dict[str, torch.Tensor]
GROUP_FLOATS = 16 << 20  # floats per group of positions (batched fresh pass working set)


def supported(model: nn.Module) -> TypeGuard[GPT]:
    """Whether the structured path applies (an originlens GPT with one parameter range, no hooks)."""
    if not isinstance(model, GPT) or len(model.ranges) != 1:
        return False
    if model._forward_pre_hooks or model._forward_hooks:  # e.g. inside a stop_gradient context
        return False
    return not (model.training and model.config.dropout > 0.0)


# ----------------------------------------------------------------------------------------------------
# cached forward


@dataclass
class _Block:
    """Forward values of one block (B, T, ...), its weights and its parameter-name prefix."""

    x1: torch.Tensor  # LN1 input r^{m−1} (B, T, d)
    mean1: torch.Tensor  # (B, T, 1)
    xhat1: torch.Tensor  # LN1 normalised input
    rstd1: torch.Tensor  # (B, T, 1)
    a: torch.Tensor  # LN1 output
    q: torch.Tensor  # (B, H, T, hd)
    k: torch.Tensor
    v: torch.Tensor
    att: torch.Tensor  # (B, H, T, T)
    o: torch.Tensor  # (B, T, d) heads merged, before W_o
    x2: torch.Tensor  # LN2 input y
    mean2: torch.Tensor
    xhat2: torch.Tensor
    rstd2: torch.Tensor
    c: torch.Tensor  # LN2 output
    gelu_grad: torch.Tensor  # GELU'(pre-activation) (B, T, F)
    h: torch.Tensor  # GELU output (B, T, F)
    prefix: str  # "blocks.{m}.copies.0."
    mod: BlockCopy
    wt: dict[str, torch.Tensor] = field(default_factory=dict)  # contiguous Wᵀ per linear, on demand


def _times(blk: _Block, x: torch.Tensor, name: str) -> torch.Tensor:
    """``x @ W`` for the block's linear ``name`` (weight W stored (out, in)), as a GEMM against a cached
    contiguous Wᵀ: faster than ``x @ W`` on CPU when the inner dimension is small."""
    wt = blk.wt.get(name)
    if wt is None:
        wt = blk.wt[name] = cast(nn.Linear, getattr(blk.mod, name)).weight.detach().t().contiguous()
    return F.linear(x, wt)


def _layer_norm(x: torch.Tensor, ln: nn.LayerNorm) -> tuple[torch.Tensor, ...]:
    """(output, x̂, 1/σ, mean) of a LayerNorm — the output from the same kernel as ``ln(x)``."""
    out, mean, rstd = torch.native_layer_norm(x, list(ln.normalized_shape), ln.weight, ln.bias, ln.eps)
    return out, (x - mean) * rstd, rstd, mean


class Forward:
    """One cached forward of ``tokens`` (B, T) through a supported GPT (eager attention, no graph)."""

    def __init__(self, model: GPT, tokens: torch.Tensor) -> None:
        cfg = model.config
        self.model, self.tokens = model, tokens
        self.H, self.d = cfg.n_head, cfg.d_model
        self.hd = self.d // self.H
        self.scale = 1.0 / math.sqrt(self.hd)
        B, T = tokens.shape
        self.B, self.T = B, T
        self._z0: torch.Tensor | None = None  # W_qkv(γ⊙x̂) of block 1, on demand
        with torch.no_grad():
            x = model.embed[0](tokens, 0)
            self.residuals = [x]
            self.blocks: list[_Block] = []
            future = model._future[:T, :T]
            for m, block in enumerate(model.blocks):
                c = cast(BlockCopy, cast(Block, block).copies[0])
                a, xhat1, rstd1, mean1 = _layer_norm(x, c.ln_1)
                qkv = c.attn_qkv(a)
                q, k, v = (t.view(B, T, self.H, self.hd).transpose(1, 2) for t in qkv.split(self.d, dim=2))
                scores = q @ k.transpose(-2, -1)  # as GPT's eager attention
                att = torch.softmax((scores * self.scale).masked_fill(future, float("-inf")), dim=-1)
                o = (att @ v).transpose(1, 2).reshape(B, T, self.d)
                y = x + c.attn_out(o)
                cc, xhat2, rstd2, mean2 = _layer_norm(y, c.ln_2)
                hpre = c.mlp_in(cc)
                h = F.gelu(hpre, approximate="tanh")
                gg = torch.ops.aten.gelu_backward(hpre.new_ones(()).expand_as(hpre), hpre, approximate="tanh")
                x = y + c.mlp_out(h)
                self.blocks.append(
                    _Block(
                        x1=self.residuals[-1],
                        mean1=mean1,
                        xhat1=xhat1,
                        rstd1=rstd1,
                        a=a,
                        q=q,
                        k=k,
                        v=v,
                        att=att,
                        o=o,
                        x2=y,
                        mean2=mean2,
                        xhat2=xhat2,
                        rstd2=rstd2,
                        c=cc,
                        gelu_grad=gg,
                        h=h,
                        prefix=f"blocks.{m}.copies.0.",
                        mod=c,
                    )
                )
                self.residuals.append(x)

    @property
    def n_layer(self) -> int:
        return len(self.blocks)

    def head_backward(
        self, weights: torch.Tensor | None, targets: torch.Tensor | None
    ) -> tuple[torch.Tensor, float, ParamDict]:
        """∂L/∂r^L (B, T, d), L, and the gradients of the head parameters (final LN, LM head / tied wte)."""
        model = self.model
        xL = self.residuals[-1].detach().requires_grad_(True)
        head = cast(HeadCopy, model.head[0])
        named: list[tuple[str, torch.Tensor]] = [
            ("head.0.ln_f.weight", head.ln_f.weight),
            ("head.0.ln_f.bias", head.ln_f.bias),
        ]
        named.append(
            ("embed.0.wte.weight", cast(EmbedCopy, model.embed[0]).wte.weight)
            if head.lm_head is None
            else ("head.0.lm_head.weight", head.lm_head.weight)
        )
        named = [(n, p) for n, p in named if p.requires_grad]
        with torch.enable_grad():
            logits = model._logits(0, xL)
            loss = position_losses(logits, self.tokens, weights, targets=targets).sum()
            g = torch.autograd.grad(loss, [xL] + [p for _, p in named], allow_unused=True)
        grads = {n: (torch.zeros_like(p) if gi is None else gi) for (n, p), gi in zip(named, g[1:])}
        return g[0], float(loss.detach()), grads


# ----------------------------------------------------------------------------------------------------
# building blocks (leading source axis n)


def _ln_backward(
    blk: _Block, which: int, g: torch.Tensor, sel, sums: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Adjoint of the input of LayerNorm ``which`` (1 or 2) of a block from the adjoint g (n, ..., d) of its
    output, for the cached rows ``sel(t)`` matching g's middle axes (native fused kernel); with ``sums``
    also the per-source weight/bias gradients Σ g⊙x̂ and Σ g over all but the leading axis."""
    ln = blk.mod.ln_1 if which == 1 else blk.mod.ln_2
    x, mean, rstd, xhat = (
        sel(t)
        for t in (
            (blk.x1, blk.mean1, blk.rstd1, blk.xhat1) if which == 1 else (blk.x2, blk.mean2, blk.rstd2, blk.xhat2)
        )
    )
    shp = g.shape
    stat = shp[:-1] + (1,)
    out = torch.ops.aten.native_layer_norm_backward(
        g,
        x.expand(shp),
        [shp[-1]],
        mean.expand(stat).contiguous(),
        rstd.expand(stat).contiguous(),
        ln.weight,
        None,
        [True, False, False],
    )[0]
    if not sums:
        return out, None, None
    return out, _sum(g * xhat), _sum(g)


def _wgrad(delta: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Σ over the middle axes of delta ⊗ x: delta (n, ..., o) with x (..., i) shared by all sources,
    or x (n, ..., i) per source → (n, o, i)."""
    n, o, i = delta.shape[0], delta.shape[-1], x.shape[-1]
    dt = delta.reshape(n, -1, o).transpose(1, 2)
    if x.dim() == delta.dim():  # per-source rows
        return dt @ x.reshape(n, -1, i)
    return dt @ x.reshape(-1, i)


def _sum(delta: torch.Tensor) -> torch.Tensor:
    return delta.reshape(delta.shape[0], -1, delta.shape[-1]).sum(1)


def _heads(x: torch.Tensor, H: int) -> torch.Tensor:
    """(..., P, d) → (..., H, P, hd)."""
    *lead, P, d = x.shape
    return x.reshape(*lead, P, H, d // H).transpose(-3, -2)


def _merge3(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Three (..., H, P, hd) tensors → (..., P, 3d), heads merged, in one buffer (``None`` = zeros)."""
    *lead, H, P, hd = k.shape
    out = k.new_empty((*lead, P, 3, H, hd))
    for c, x in enumerate((q, k, v)):
        if x is None:
            out[..., c, :, :].zero_()
        else:
            out[..., c, :, :].copy_(x.transpose(-3, -2))
    return out.view(*lead, P, 3 * H * hd)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """(..., H, P, hd) → (..., P, d)."""
    *lead, H, P, hd = x.shape
    return x.transpose(-3, -2).reshape(*lead, P, H * hd)


@dataclass
class _MLPBack:
    dy: torch.Tensor  # adjoint of y (after the attention residual add)
    dh: torch.Tensor  # adjoint of the MLP pre-activation
    dc: torch.Tensor  # adjoint of the LN2 output
    ln_w: torch.Tensor | None
    ln_b: torch.Tensor | None


def _mlp_backward(blk: _Block, E: torch.Tensor, c_sl, sums: bool) -> _MLPBack:
    """MLP + LN2 backward for adjoint E (n, ..., d) at the block output; ``c_sl`` selects the cached rows
    matching E's middle axes (a prefix slice, a position, or per-source gathered tensors)."""
    dh = _times(blk, E, "mlp_out").mul_(c_sl(blk.gelu_grad))
    dc = _times(blk, dh, "mlp_in")
    dln, lw, lb = _ln_backward(blk, 2, dc, c_sl, sums)
    return _MLPBack(dy=dln.add_(E), dh=dh, dc=dc, ln_w=lw, ln_b=lb)


class _Grads(dict):
    """Per-source weight gradients of one block, (n, *shape) each, keyed by full parameter name."""

    def __init__(self, blk: _Block) -> None:
        super().__init__()
        self.prefix = blk.prefix

    def put(self, name: str, value: torch.Tensor) -> None:
        self[self.prefix + name] = value


def _put_mlp(g: _Grads, mb: _MLPBack, E: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> None:
    assert mb.ln_w is not None and mb.ln_b is not None  # built with sums=True
    g.put("mlp_out.weight", _wgrad(E, h))
    g.put("mlp_out.bias", _sum(E))
    g.put("mlp_in.weight", _wgrad(mb.dh, c))
    g.put("mlp_in.bias", _sum(mb.dh))
    g.put("ln_2.weight", mb.ln_w)
    g.put("ln_2.bias", mb.ln_b)


# ----------------------------------------------------------------------------------------------------
# dense (spread) block backward


def dense_backward(
    fw: Forward, m: int, E: torch.Tensor, *, myopic: bool = False, wgrad: bool = True, to_embedding: bool = False
) -> tuple[_Grads, torch.Tensor | None]:
    """Backward of block m (0-based) for adjoints E (n, B, P, d) at its output over positions < P, with
    per-source weight gradients (unless ``wgrad=False``).  ``myopic``: keys/values of other positions
    detached.  Returns (grads (n, ...), adjoint (n, B, P, d) at the block input).  ``to_embedding``
    (first block, full graph): the adjoint at r^0 is not formed; the wte/wpe gradients it would give
    are returned among the grads instead (:func:`_qkv_to_embedding`) and the adjoint is None."""
    blk = fw.blocks[m]
    P = E.shape[2]
    pre = lambda t: t[:, :P]
    g = _Grads(blk)
    mb = _mlp_backward(blk, E, pre, wgrad)
    dy = mb.dy
    if wgrad:
        _put_mlp(g, mb, E, blk.h[:, :P], blk.c[:, :P])
        g.put("attn_out.weight", _wgrad(dy, blk.o[:, :P]))
        g.put("attn_out.bias", _sum(dy))
    do = _heads(_times(blk, dy, "attn_out"), fw.H)  # (n, B, H, P, hd)
    A = blk.att[:, :, :P, :P]
    q, k, v = blk.q[:, :, :P], blk.k[:, :, :P], blk.v[:, :, :P]
    dA = do @ v.transpose(-2, -1)  # (n, B, H, P, P)
    dS = A * (dA - (A * dA).sum(-1, keepdim=True)) * fw.scale
    dq = dS @ k
    if myopic:
        dk = dS.diagonal(dim1=-2, dim2=-1).unsqueeze(-1) * q
        dv = A.diagonal(dim1=-2, dim2=-1).unsqueeze(-1) * do
    else:
        dk = dS.transpose(-2, -1) @ q
        dv = A.transpose(-2, -1) @ do
    dqkv = _merge3(dq, dk, dv)  # (n, B, P, 3d)
    if to_embedding:
        g.update(_qkv_to_embedding(fw, blk, dqkv, dy))
        return g, None
    da = _times(blk, dqkv, "attn_qkv")
    dln, lw, lb = _ln_backward(blk, 1, da, pre, wgrad)
    if wgrad:
        assert lw is not None and lb is not None  # sums=wgrad
        g.put("attn_qkv.weight", _wgrad(dqkv, blk.a[:, :P]))
        g.put("attn_qkv.bias", _sum(dqkv))
        g.put("ln_1.weight", lw)
        g.put("ln_1.bias", lb)
    return g, dln.add_(dy)


def _qkv_to_embedding(fw: Forward, blk: _Block, dqkv: torch.Tensor, dy: torch.Tensor) -> dict[str, torch.Tensor]:
    """QKV/LN1 weight gradients and wte/wpe gradients of the first block from δqkv (n, B, P, 3d) and the
    residual adjoint dy (n, B, P, d), without the (n, B, P, d) adjoint at r^0 or the δqkv·W product.

    With a = γ⊙x̂ + β: Σ δqkv⊗a = G diag(γ) + (Σ δqkv)⊗β, G = Σ δqkv⊗x̂; LN1 weight gradient
    Σ (δqkv W)⊙x̂ = Σ_c W_c ⊙ G_c, bias (Σ δqkv) W.  The adjoint at r^0 is dy + rstd (γ⊙δa − m1 − x̂ m2),
    δa = δqkv W, m1 = δqkv·(Wγ)/d, m2 = δqkv·z/d with z = W(γ⊙x̂) (once per forward); its sums over the
    batch (wpe rows) and over the rows of each token (wte rows) reduce δqkv first, then multiply by W.
    """
    W, gamma, beta = blk.mod.attn_qkv.weight, blk.mod.ln_1.weight, blk.mod.ln_1.bias
    n, B, P, d3 = dqkv.shape
    d = d3 // 3
    xhat, rstd = blk.xhat1[:, :P], blk.rstd1[:, :P]  # (B, P, d), (B, P, 1)
    G = _wgrad(dqkv, xhat)  # (n, 3d, d)
    gb = _sum(dqkv)  # (n, 3d)
    pre = blk.prefix
    out = {
        pre + "attn_qkv.weight": G * gamma + gb.unsqueeze(-1) * beta,
        pre + "attn_qkv.bias": gb,
        pre + "ln_1.weight": (G * W).sum(1),
        pre + "ln_1.bias": gb @ W,
    }
    if fw._z0 is None:
        fw._z0 = (blk.xhat1 * gamma) @ W.t()  # (B, T, 3d)
    w1 = (dqkv @ (W @ gamma)).unsqueeze(-1) * rstd / d  # (n, B, P, 1): rstd·m1
    w2 = torch.linalg.vecdot(dqkv, fw._z0[:, :P]).unsqueeze(-1) * rstd / d  # rstd·m2
    emb = cast(EmbedCopy, fw.model.embed[0])
    V = emb.wte.weight.shape[0]
    wpe = dqkv.new_zeros((n,) + tuple(emb.wpe.weight.shape))
    tok = fw.tokens[:, :P].reshape(-1)
    if V <= 32:  # row sums per token and per position as GEMMs with a (V + P, B·P) indicator
        rows = torch.arange(B * P, device=dqkv.device)
        ind = dqkv.new_zeros((V + P, B * P))
        ind[tok, rows] = 1.0
        ind[V + rows % P, rows] = 1.0
        tw = (
            ((ind * rstd.reshape(1, -1)) @ dqkv.reshape(n, B * P, d3)) @ W * gamma
            + ind @ (dy - w1).reshape(n, B * P, d)
            - (ind * w2.reshape(n, 1, B * P)) @ xhat.reshape(B * P, d)
        )  # (n, V + P, d)
        wpe[:, :P] = tw[:, V:]
        out["embed.0.wte.weight"] = tw[:, :V].contiguous()
        out["embed.0.wpe.weight"] = wpe
        return out
    rq = dqkv * rstd  # (n, B, P, 3d)
    wpe[:, :P] = (
        (rq.sum(1) @ W) * gamma
        - w1.sum(1)
        + dy.sum(1)
        - (w2[..., 0].permute(2, 0, 1) @ xhat.transpose(0, 1)).transpose(0, 1)
    )
    idx = (tok.reshape(1, -1) + V * torch.arange(n, device=dqkv.device)[:, None]).reshape(-1)
    t1 = dqkv.new_zeros((n * V, d3)).index_add_(0, idx, rq.reshape(-1, d3))
    wte = (t1 @ W) * gamma
    wte.index_add_(0, idx, dy.reshape(-1, d) - w1.reshape(-1, 1))
    wte.index_add_(0, idx, (w2 * xhat).reshape(-1, d), alpha=-1.0)
    out["embed.0.wte.weight"] = wte.view(n, V, d)
    out["embed.0.wpe.weight"] = wpe
    return out


# ----------------------------------------------------------------------------------------------------
# fresh sources: cotangent at one position per source


def _gather(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rows at per-source positions: t (B, T, X) → (N, B, X)."""
    return t.index_select(1, pos).transpose(0, 1)


def fresh_backward(
    fw: Forward, m: int, e: torch.Tensor, pos: torch.Tensor, *, myopic: bool, pos_host: Sequence[int] | None = None
) -> tuple[_Grads, torch.Tensor | FreshSpread]:
    """Backward of block m for cotangents e (N, B, d) at per-source positions ``pos`` (N,) of its output.

    Returns (grads (N, ...), adjoint at the block input): under ``myopic`` a tensor (N, B, d) at each
    source's position; in the full graph a :class:`FreshSpread` (the adjoint over positions 0..pos in
    low-rank form; the LN1 gradients come with its materialisation).  ``pos_host``: the same positions
    as a host list (no device read of ``pos`` then).
    """
    blk = fw.blocks[m]
    H, hd, d = fw.H, fw.hd, fw.d
    N, B = e.shape[0], e.shape[1]
    P = (max(pos_host) if pos_host is not None else int(pos.max())) + 1
    ar = torch.arange(N, device=e.device)
    at = lambda t: _gather(t, pos)
    g = _Grads(blk)
    mb = _mlp_backward(blk, e, at, True)
    _put_mlp(g, mb, e, at(blk.h), at(blk.c))
    dy = mb.dy  # (N, B, d)
    g.put("attn_out.weight", _wgrad(dy, at(blk.o)))
    g.put("attn_out.bias", _sum(dy))
    # attention pieces in (B, H, N, ·) layout: the cached keys/values (B, H, P, hd) are shared by sources
    do = _times(blk, dy, "attn_out").view(N, B, H, hd).permute(1, 2, 0, 3)  # (B, H, N, hd)
    A = blk.att[:, :, :, :P].index_select(2, pos)  # (B, H, N, P): row pos[n]
    q_i = blk.q.index_select(2, pos)  # (B, H, N, hd)
    k, v = blk.k[:, :, :P], blk.v[:, :, :P]  # (B, H, P, hd)
    dA = do @ v.transpose(-2, -1)  # (B, H, N, P)
    dS = A * (dA - (A * dA).sum(-1, keepdim=True)) * fw.scale
    dq = (dS @ k).permute(2, 0, 1, 3).reshape(N, B, d)
    W = blk.mod.attn_qkv.weight
    a_i = at(blk.a)  # (N, B, d)
    if myopic:
        dS_ii = dS[:, :, ar, pos].unsqueeze(-1)  # (B, H, N, 1)
        A_ii = A[:, :, ar, pos].unsqueeze(-1)
        dk = (dS_ii * q_i).permute(2, 0, 1, 3).reshape(N, B, d)
        dv = (A_ii * do).permute(2, 0, 1, 3).reshape(N, B, d)
        dqkv = torch.cat([dq, dk, dv], dim=-1)
        g.put("attn_qkv.weight", _wgrad(dqkv, a_i))
        g.put("attn_qkv.bias", _sum(dqkv))
        dln, lw, lb = _ln_backward(blk, 1, dqkv @ W, at, True)
        assert lw is not None and lb is not None  # sums=True
        g.put("ln_1.weight", lw)
        g.put("ln_1.bias", lb)
        return g, dln.add_(dy)
    # key/value weights through attention-weighted input averages Σ_j δS_ij a_j and Σ_j A_ij a_j
    R = 2 * H
    coef = torch.cat([dS, A], dim=1)  # (B, 2H, N, P): δS (K), A (V)
    left = torch.cat([q_i, do], dim=1)  # (B, 2H, N, hd): q_i (K), δo (V)
    avg = coef.reshape(B, R * N, P) @ blk.a[:, :P]  # (B, 2H·N, d)
    gkv = left.permute(1, 2, 3, 0).reshape(R * N, hd, B) @ avg.view(B, R, N, d).permute(1, 2, 0, 3).reshape(R * N, B, d)
    gkv = gkv.view(R, N, hd, d).permute(1, 0, 2, 3).reshape(N, 2 * d, d)  # rows: K heads, then V heads
    g.put("attn_qkv.weight", torch.cat([_wgrad(dq, a_i), gkv], dim=1))
    bkv = (left * coef.sum(-1, keepdim=True)).sum(0)  # (2H, N, hd): Σ_b Σ_j of δk_j, δv_j
    g.put("attn_qkv.bias", torch.cat([_sum(dq), bkv.permute(1, 0, 2).reshape(N, 2 * d)], dim=1))
    # adjoint of the LN1 output: Σ_h δS_hj β_h + A_hj α_h at positions ≤ i, plus the query path at i
    W_kv = W[d:].view(R, hd, d)  # per head: W_K[h] then W_V[h]
    ba = (left.permute(1, 2, 0, 3).reshape(R, N * B, hd) @ W_kv).view(R, N, B, d)  # β_h, α_h
    qa = dq @ W[:d]  # (N, B, d): query path at pos
    return g, FreshSpread(blk, coef, ba, qa, dy, pos, pos_host)


class FreshSpread:
    """The adjoint that fresh sources send to the block input, kept in low-rank form until needed:
    E_{n,b,j} = LN1ᵀ(Σ_r coef[b,r,n,j] ba[r,n,b] + [j = pos_n] qa[n,b])_{b,j} + [j = pos_n] dy[n,b].

    :meth:`materialize` builds it over positions 0..i for the sources at position i only (the dense
    pass below works per position), together with their LN1 weight/bias gradients."""

    def __init__(
        self,
        blk: _Block,
        coef: torch.Tensor,
        ba: torch.Tensor,
        qa: torch.Tensor,
        dy: torch.Tensor,
        pos: torch.Tensor,
        pos_host: Sequence[int] | None = None,
    ) -> None:
        self.blk, self.coef, self.ba, self.qa, self.dy, self.pos = blk, coef, ba, qa, dy, pos
        self.pos_host = list(pos_host) if pos_host is not None else None

    def rows_at(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for r, i in enumerate(self.pos_host if self.pos_host is not None else self.pos.tolist()):
            out.setdefault(i, []).append(r)
        return out

    def materialize(self, rows: list[int], i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(E (n, B, i+1, d), Σ da⊙x̂ (n, d), Σ da (n, d)) for sources ``rows`` (all at position i)."""
        P = i + 1
        idx = torch.tensor(rows, dtype=torch.long, device=self.qa.device)
        c = self.coef.index_select(2, idx)[..., :P].permute(2, 0, 3, 1)  # (n, B, P, R)
        b = self.ba.index_select(1, idx).transpose(0, 1).transpose(1, 2)  # (n, B, R, d)
        da = c @ b  # (n, B, P, d)
        da[:, :, i] += self.qa.index_select(0, idx)
        E, lw, lb = _ln_backward(self.blk, 1, da, lambda t: t[:, :P], True)
        assert lw is not None and lb is not None  # sums=True
        E[:, :, i] += self.dy.index_select(0, idx)
        return E, lw, lb


def embedding_grads(fw: Forward, E: torch.Tensor, pos: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Gradients of wte and wpe (n, ...) for adjoints E at r^0: (n, B, P, d) over positions < P, or
    (n, B, d) at per-source positions ``pos`` (n,)."""
    emb = cast(EmbedCopy, fw.model.embed[0])
    n, d = E.shape[0], E.shape[-1]
    V = emb.wte.weight.shape[0]
    wte = E.new_zeros((n * V, d))
    wpe = E.new_zeros((n,) + tuple(emb.wpe.weight.shape))
    if pos is None:
        P = E.shape[2]
        idx = (fw.tokens[:, :P].reshape(1, -1) + V * torch.arange(n, device=E.device)[:, None]).reshape(-1)
        wte.index_add_(0, idx, E.reshape(-1, d))
        wpe[:, :P] = E.sum(1)
    else:
        tok = fw.tokens[:, pos].transpose(0, 1)  # (n, B)
        idx = (tok + V * torch.arange(n, device=E.device)[:, None]).reshape(-1)
        wte.index_add_(0, idx, E.reshape(-1, d))
        wpe[torch.arange(n, device=E.device), pos] = E.sum(1)
    return {"embed.0.wte.weight": wte.view(n, V, d), "embed.0.wpe.weight": wpe}


# ----------------------------------------------------------------------------------------------------
# adjoints and the full gradient


@dataclass
class StructuredAdjoints:
    """a^k, d^k, p^k (each a list over k = 0..L of (B, T, d)), L and ∇L (name → tensor)."""

    full: list[torch.Tensor]
    direct: list[torch.Tensor]
    precached: list[torch.Tensor]
    loss: float
    grad: ParamDict


def _adjoint_block(
    fw: Forward, m: int, d: torch.Tensor, p: torch.Tensor | None, wgrad: bool
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """One step of the standard-regime recursions through block m (0-based): d^{m−1} = M(d^m),
    p^{m−1} = F(p^m) + X(d^m) (``p=None``: p^m = 0) and, with ``wgrad``, the block's weight gradients
    of a^m = d^m + p^m (its part of ∇L).

    X uses explicitly masked (off-diagonal) attention, so p keeps exact zeros wherever d and p vanish
    at and after a position.
    """
    blk = fw.blocks[m]
    E = d[None] if p is None else torch.stack([d, p])  # (1 or 2, B, T, d)
    mb = _mlp_backward(blk, E, lambda t: t, False)
    g = _Grads(blk)
    if wgrad:
        E_a, dh_a, dc_a, dy_a = (
            E.sum(0, keepdim=True),
            mb.dh.sum(0, keepdim=True),
            mb.dc.sum(0, keepdim=True),
            mb.dy.sum(0, keepdim=True),
        )
        g.put("mlp_out.weight", _wgrad(E_a, blk.h))
        g.put("mlp_out.bias", _sum(E_a))
        g.put("mlp_in.weight", _wgrad(dh_a, blk.c))
        g.put("mlp_in.bias", _sum(dh_a))
        g.put("ln_2.weight", _sum(dc_a * blk.xhat2))
        g.put("ln_2.bias", _sum(dc_a))
        g.put("attn_out.weight", _wgrad(dy_a, blk.o))
        g.put("attn_out.bias", _sum(dy_a))
    do = _heads(_times(blk, mb.dy, "attn_out"), fw.H)  # (n, B, H, T, hd)
    A, q, k, v = blk.att, blk.q, blk.k, blk.v
    dA = do @ v.transpose(-2, -1)
    dS = A * (dA - (A * dA).sum(-1, keepdim=True)) * fw.scale
    dq = dS @ k  # queries are live in both graphs
    eye = torch.eye(fw.T, dtype=torch.bool, device=d.device)
    dk_myo = dS[0].diagonal(dim1=-2, dim2=-1).unsqueeze(-1) * q
    dv_myo = A.diagonal(dim1=-2, dim2=-1).unsqueeze(-1) * do[0]
    dk_x = dS[0].masked_fill(eye, 0.0).transpose(-2, -1) @ q  # off-diagonal reads of d
    dv_x = A.masked_fill(eye, 0.0).transpose(-2, -1) @ do[0]
    if p is None:
        rows = [
            _merge3(dq[0], dk_myo, dv_myo),
            _merge3(None, dk_x, dv_x),
        ]
    else:
        dk_p = dS[1].transpose(-2, -1) @ q
        dv_p = A.transpose(-2, -1) @ do[1]
        rows = [
            _merge3(dq[0], dk_myo, dv_myo),
            _merge3(dq[1], dk_p + dk_x, dv_p + dv_x),
        ]
    dqkv = torch.stack(rows)  # (2, B, T, 3d): d (myopic), p
    da = _times(blk, dqkv, "attn_qkv")  # (2, B, T, d)
    if wgrad:
        dqkv_a, da_a = dqkv.sum(0, keepdim=True), da.sum(0, keepdim=True)
        g.put("attn_qkv.weight", _wgrad(dqkv_a, blk.a))
        g.put("attn_qkv.bias", _sum(dqkv_a))
        g.put("ln_1.weight", _sum(da_a * blk.xhat1))
        g.put("ln_1.bias", _sum(da_a))
    back, _, _ = _ln_backward(blk, 1, da, lambda t: t)
    back[0] += mb.dy[0]
    if p is not None:
        back[1] += mb.dy[1]
    return {n: t[0] for n, t in g.items()}, back[0], back[1]


@torch.no_grad()
def adjoints(
    fw: Forward,
    names: Iterable[str],
    weights: torch.Tensor | None,
    targets: torch.Tensor | None,
    myopic: bool,
    block_grads: bool = True,
) -> StructuredAdjoints:
    """All adjoints and ∇L of the training graph (myopic or standard) from the cached forward.

    ``block_grads=False`` skips the gradients of the blocks and embeddings (``grad`` then holds the head
    parameters only): the caller sums them from the sites at layer L (cut identity, see ``decompose``).
    """
    gL, loss, head = fw.head_backward(weights, targets)
    L = fw.n_layer
    a: list = [None] * (L + 1)
    d: list = [None] * (L + 1)
    p: list = [None] * (L + 1)
    a[L], d[L], p[L] = gL, gL, torch.zeros_like(gL)
    grads: dict[str, torch.Tensor] = {}
    g: dict[str, torch.Tensor]
    for m in range(L - 1, -1, -1):  # block m+1 (0-based m)
        if myopic:
            g, a_in = dense_backward(fw, m, a[m + 1][None], myopic=True, wgrad=block_grads)
            assert a_in is not None  # to_embedding=False
            a[m], d[m], p[m] = a_in[0], a_in[0], torch.zeros_like(gL)
            grads.update({n: t[0] for n, t in g.items()})
        else:
            g, d[m], p[m] = _adjoint_block(fw, m, d[m + 1], None if m == L - 1 else p[m + 1], block_grads)
            a[m] = d[m] + p[m]
            grads.update(g)
    if block_grads:
        grads.update({n: t[0] for n, t in embedding_grads(fw, a[0][None]).items()})
    for n, t in head.items():
        grads[n] = grads[n] + t if n in grads else t
    full = {n: grads[n] for n in names if n in grads}
    return StructuredAdjoints(full=a, direct=d, precached=p, loss=loss, grad=full)


# ----------------------------------------------------------------------------------------------------
# per-site components


@dataclass
class _Job:
    site: Site
    comp: str
    cot: torch.Tensor  # (B, d) cotangent at r^k_i


@torch.no_grad()
def site_components(
    fw: Forward, adj: StructuredAdjoints, sites: list[Site], names: list[str], myopic: bool, chunk_size: int
) -> tuple[dict[Site, dict[str, ParamDict]], ParamDict]:
    """``{site: {"direct": G_dir, "precached": G_pre}}`` for every site (name → tensor) and the zero
    tensors used for every exactly-zero entry (one per parameter, shared by all sites: parameters a
    site's cotangent cannot reach, and components whose cotangent vanishes).

    Sources are processed in groups of consecutive positions holding at most ``chunk_size`` sources.
    """
    params = dict(fw.model.named_parameters())
    zero = {n: torch.zeros_like(params[n]) for n in names}
    out: dict[Site, dict[str, ParamDict]] = {s: {} for s in sites}
    jobs: list[_Job] = []
    candidates = [
        ((k, i), comp, src[:, i])
        for k, i in sites
        for comp, src in (("direct", adj.direct[k]), ("precached", adj.precached[k]))
        if not (myopic and comp == "precached")
    ]
    # which cotangent rows vanish, for every site at once: one host read
    nonzero = torch.stack([torch.count_nonzero(row) for _, _, row in candidates]).tolist() if candidates else []
    for (site, comp, row), nz in zip(candidates, nonzero):
        if nz == 0:
            out[site][comp] = dict(zero)
        else:
            jobs.append(_Job(site, comp, row))
    if myopic:
        for site in sites:
            out[site]["precached"] = dict(zero)
    jobs.sort(key=lambda j: j.site[1])
    # groups of consecutive positions whose batched fresh pass stays moderate (≈ GROUP_FLOATS floats:
    # B·d·(2H + 4) per source) and at most chunk_size sources (memory bound)
    per_source = fw.B * fw.d * (2 * fw.H + 4)
    group: list[_Job] = []
    for j, job in enumerate(jobs):
        group.append(job)
        nxt = jobs[j + 1] if j + 1 < len(jobs) else None
        if (
            nxt is None
            or len(group) >= chunk_size
            or (nxt.site[1] != job.site[1] and (len(group) + 1) * per_source > GROUP_FLOATS)
        ):
            _group_pass(fw, group, names, zero, myopic, out)
            group = []
    return out, zero


def _group_pass(fw: Forward, jobs: list[_Job], names: list[str], zero: ParamDict, myopic: bool, out) -> None:
    """Top-down pass for a group of sources: fresh at their own layer (batched over the group's
    positions), spread below it (dense per position; myopic: batched at each source's position)."""
    L = fw.n_layer
    dev = fw.tokens.device
    collected: list[dict[str, torch.Tensor]] = [{} for _ in jobs]

    def keep(idx: list[int], g: dict[str, torch.Tensor]) -> None:
        for r, j in enumerate(idx):
            collected[j].update({n: t[r] for n, t in g.items()})

    def gather(i: int, parts: list) -> tuple[list[int], torch.Tensor]:
        """Job indices and adjoints (n, B, i+1, d) at position i (lazy fresh parts materialised)."""
        idx, Es = [], []
        for part in parts:
            if isinstance(part[1], FreshSpread):
                ids, fs, rows = part
                E, lw, lb = fs.materialize(rows, i)
                keep(ids, {fs.blk.prefix + "ln_1.weight": lw, fs.blk.prefix + "ln_1.bias": lb})
            else:
                ids, E = part
            idx += ids
            Es.append(E)
        return idx, Es[0] if len(Es) == 1 else torch.cat(Es)

    pending: dict[int, list] = {}  # position → adjoint parts at r^k
    for k in range(L, -1, -1):
        fresh = [j for j, job in enumerate(jobs) if job.site[0] == k]
        pos_f = torch.tensor([jobs[j].site[1] for j in fresh], dtype=torch.long, device=dev)
        e_f = torch.stack([jobs[j].cot for j in fresh]) if fresh else None
        if k == 0:
            for i in sorted(pending):
                idx, E = gather(i, pending[i])
                keep(
                    idx,
                    embedding_grads(
                        fw, E, torch.full((len(idx),), i, dtype=torch.long, device=dev) if myopic else None
                    ),
                )
            if fresh:
                assert e_f is not None
                keep(fresh, embedding_grads(fw, e_f, pos_f))
            break
        m = k - 1
        new: dict[int, list] = {}
        E_in: torch.Tensor | FreshSpread | None
        if myopic and pending:  # everything stays at its position
            idx = [j for parts in pending.values() for ids, _ in parts for j in ids]
            E = torch.cat([E for parts in pending.values() for _, E in parts])
            pos_list = [jobs[j].site[1] for j in idx]
            pos = torch.tensor(pos_list, dtype=torch.long, device=dev)
            g, E_in = fresh_backward(fw, m, E, pos, myopic=True, pos_host=pos_list)
            assert isinstance(E_in, torch.Tensor)  # myopic: a tensor, not a FreshSpread
            keep(idx, g)
            for r, j in enumerate(idx):
                new.setdefault(jobs[j].site[1], []).append(([j], E_in[r : r + 1]))
        else:
            for i in sorted(pending):
                idx, E = gather(i, pending[i])
                g, E_in = dense_backward(fw, m, E, to_embedding=m == 0)
                keep(idx, g)
                if E_in is not None:
                    new.setdefault(i, []).append((idx, E_in))
        if fresh:
            assert e_f is not None
            g, spread = fresh_backward(fw, m, e_f, pos_f, myopic=myopic, pos_host=[jobs[j].site[1] for j in fresh])
            keep(fresh, g)
            if myopic:
                assert isinstance(spread, torch.Tensor)
                for r, j in enumerate(fresh):
                    new.setdefault(jobs[j].site[1], []).append(([j], spread[r : r + 1]))
            else:
                assert isinstance(spread, FreshSpread)
                for i, rows in spread.rows_at().items():
                    new.setdefault(i, []).append(([fresh[r] for r in rows], spread, rows))
        pending = new
    for j, job in enumerate(jobs):
        got = collected[j]
        out[job.site][job.comp] = {n: got[n] if n in got else zero[n] for n in names}


def auto_chunk(fw: Forward, chunk_bytes: int) -> int:
    """Sources per group so that ~``chunk_bytes`` hold their adjoints and backward intermediates."""
    cfg = fw.model.config
    item = fw.residuals[0].element_size()
    per = fw.B * fw.T * (6 * fw.d + 3 * cfg.mlp_ratio * fw.d) * item + 3 * fw.B * fw.H * fw.T * fw.T * item
    return int(max(1, min(256, chunk_bytes // max(per, 1))))
