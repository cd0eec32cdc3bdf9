"""Forward-mode Jacobian-vector products of a residual site, J_{k,i} v (arXiv 2603.14087, influence).

``J_{k,i} v`` is the change of the residual r^k_i (B, d) along a parameter direction v — the one quantity
the influences ⟨Δ_c, ∇R⟩ need (:mod:`.influence`).  For a tied GPT (one parameter range, no active
dropout) the JVPs are written out by hand (:func:`grouped_jvps`, ``jvp="manual"``): the sites of one
position i share one primal forward over positions ≤ i, the tangents of all their components travel
stacked through the blocks (x·dWᵀ as one batched matmul per linear layer, LayerNorm, attention and GELU
derivatives in closed form), each only up to its own block k, whose query row i alone is computed.
Otherwise (:func:`site_jvp`) ``torch.func.jvp`` with ``functional_call``, batched over tangents with
``vmap`` (positions ≤ i and blocks ≤ k only, the forward being stopped by a hook at resid.k); if
forward-mode AD fails for an op, the JVP is emulated by two reverse passes (``jvp="double_backward"``;
``"auto"`` falls back by itself).  Always the non-myopic graph, eager attention.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, cast

import torch
import torch.nn as nn

from ..errors import ConfigError
from ..sites import site_name
from .decompose import ParamDict, attention_impl, trainable_parameters
from .stopgrad import Site

# ----------------------------------------------------------------------------------------------------
# J_{k,i} v


class _Reached(Exception):
    """Raised by the hook at resid.k to stop the forward once r^k is computed."""

    def __init__(self, tensor: torch.Tensor) -> None:
        super().__init__("site reached")
        self.tensor = tensor


def _stop_at(k: int) -> dict[str, Callable]:
    def hook(h: torch.Tensor, site) -> None:
        raise _Reached(h)

    return {site_name(k): hook}


def _site_forward(model: nn.Module, tokens: torch.Tensor, site: Site, params: ParamDict | None = None) -> torch.Tensor:
    """r^k_i (B, d), non-myopic, computing only positions ≤ i and blocks ≤ k (causality)."""
    k, i = site
    kwargs = {"hooks": _stop_at(k), "myopic": False}
    try:
        if params is None:
            model(tokens[:, : i + 1], **kwargs)
        else:
            torch.func.functional_call(model, params, (tokens[:, : i + 1],), kwargs)
    except _Reached as stop:
        return stop.tensor[:, i]
    raise RuntimeError("the residual hook was not called")  # pragma: no cover


def site_jvp(
    model: nn.Module,
    tokens: torch.Tensor,
    site: Site,
    tangents: Sequence[ParamDict],
    *,
    jvp: Literal["auto", "manual", "forward", "double_backward"] = "auto",
) -> torch.Tensor:
    """``J_{k,i} v`` for each tangent v (name → tensor): returns (n, B, d), non-myopic eager graph."""
    names, params = trainable_parameters(model)
    if jvp not in ("auto", "manual", "forward", "double_backward"):
        raise ConfigError(f"unknown jvp mode {jvp!r}", "use 'auto', 'manual', 'forward' or 'double_backward'")
    if jvp == "manual" or (jvp == "auto" and manual_supported(model)):
        if not manual_supported(model):
            raise ConfigError("jvp='manual' needs a tied GPT without active dropout", "use jvp='auto'")
        return grouped_jvps(model, tokens, {site: tangents})[site]
    stacked = {n: torch.stack([t[n].to(p.dtype) for t in tangents]) for n, p in zip(names, params)}
    with attention_impl(model, "eager"):
        if jvp in ("auto", "forward"):
            primal = {n: p.detach() for n, p in zip(names, params)}

            def f(p: ParamDict) -> torch.Tensor:
                return _site_forward(model, tokens, site, p)

            try:
                with warnings.catch_warnings():  # torch's forward-AD internals call torch.jit.script
                    warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=DeprecationWarning)
                    return torch.func.vmap(lambda tan: torch.func.jvp(f, (primal,), (tan,))[1])(stacked)
            except (NotImplementedError, RuntimeError):
                if jvp == "forward":
                    raise
        return _jvp_double_backward(model, tokens, site, params, [stacked[n] for n in names])


def _jvp_double_backward(model, tokens, site, params, stacked) -> torch.Tensor:
    """J v = ∂/∂u ⟨Jᵀu, v⟩ (two reverse passes; exact, any differentiable op)."""
    with torch.enable_grad():
        r = _site_forward(model, tokens, site)
        u = torch.zeros_like(r, requires_grad=True)
        g = torch.autograd.grad(r, params, grad_outputs=u, create_graph=True, allow_unused=True)
        used = [(gj, vj) for gj, vj in zip(g, stacked) if gj is not None]
        out = []
        for j in range(stacked[0].shape[0]):
            (jv,) = torch.autograd.grad(
                [gj for gj, _ in used], u, grad_outputs=[vj[j] for _, vj in used], retain_graph=True, allow_unused=True
            )
            out.append(torch.zeros_like(r) if jv is None else jv.detach())
    return torch.stack(out)


# ----------------------------------------------------------------------------------------------------
# J_{k,i} v by hand (standard tied GPT): one primal per position, tangents stacked over sites and components


def manual_supported(model: nn.Module) -> bool:
    """True for a tied (one range, one embedding) GPT without active dropout: :func:`grouped_jvps` applies."""
    from ..models.gpt import GPT

    if not isinstance(model, GPT) or len(model.embed) != 1 or len(model.head) != 1:
        return False
    if any(len(cast(Any, b).copies) != 1 for b in model.blocks):
        return False
    return not (model.training and model.config.dropout > 0.0)


def _lin(x: torch.Tensor, dx: torch.Tensor, lin: nn.Linear, tw: torch.Tensor | None, tb: torch.Tensor | None):
    """y = x Wᵀ + b and its tangents (N, ...) = dx Wᵀ + x dWᵀ + db."""
    y = torch.nn.functional.linear(x, lin.weight, lin.bias)
    n, d_in, lead = dx.shape[0], x.shape[-1], x.shape[:-1]
    w_t = lin.weight.detach().t()
    if tw is None:
        dy = dx.reshape(-1, d_in) @ w_t
        dy = dy if tb is None else dy.view(n, -1, dy.shape[-1]) + tb.unsqueeze(1)
    else:  # x dWᵀ (+ db) as one batched matmul, then dx Wᵀ accumulated in place
        xe = x.reshape(1, -1, d_in).expand(n, -1, -1)
        dy = torch.bmm(xe, tw.transpose(1, 2)) if tb is None else torch.baddbmm(tb.unsqueeze(1), xe, tw.transpose(1, 2))
        dy.view(-1, dy.shape[-1]).addmm_(dx.reshape(-1, d_in), w_t)
    return y, dy.reshape(n, *lead, -1)


def _ln(x: torch.Tensor, dx: torch.Tensor, ln: nn.LayerNorm, tw: torch.Tensor | None, tb: torch.Tensor | None):
    """LayerNorm and its forward-mode derivative: dx̂ = rstd (dx − mean dx − x̂ mean(x̂ dx))."""
    y = torch.nn.functional.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)
    mu = x.mean(-1, keepdim=True)
    rstd = torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + ln.eps)
    xh = (x - mu) * rstd
    dxh = rstd * (dx - dx.mean(-1, keepdim=True) - xh * (xh * dx).mean(-1, keepdim=True))
    dy = dxh * cast(torch.Tensor, ln.weight).detach()
    shape = (-1, *([1] * (dx.dim() - 2)), x.shape[-1])
    if tw is not None:
        dy = dy + xh * tw.view(shape)
    if tb is not None:
        dy = dy + tb.view(shape)
    return y, dy


def _gelu(u: torch.Tensor, du: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GELU (tanh approximation) and its tangent."""
    c = math.sqrt(2.0 / math.pi)
    t = torch.tanh(c * (u + 0.044715 * u.pow(3)))
    slope = 0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * u * u)
    return torch.nn.functional.gelu(u, approximate="tanh"), du * slope


def _block(block: nn.Module, x: torch.Tensor, dx: torch.Tensor, tan: Callable, H: int, last_row: bool):
    """One pre-LN block on x (B, T, d) with tangents dx (N, B, T, d); ``last_row``: the output row T−1 only."""
    c = cast(Any, block).copies[0]
    B, T, d = x.shape
    N, hd = dx.shape[0], d // H
    a, da = _ln(x, dx, c.ln_1, tan("ln_1.weight"), tan("ln_1.bias"))
    qkv, dqkv = _lin(a, da, c.attn_qkv, tan("attn_qkv.weight"), tan("attn_qkv.bias"))
    q, k, v = (t.view(B, T, H, hd).transpose(1, 2) for t in qkv.split(d, dim=2))
    dq, dk, dv = (t.view(N, B, T, H, hd).transpose(2, 3) for t in dqkv.split(d, dim=3))
    if last_row:
        q, dq, x, dx = q[:, :, -1:], dq[:, :, :, -1:], x[:, -1:], dx[:, :, -1:]
    rows = q.shape[2]
    scale = 1.0 / math.sqrt(hd)
    scores = (q @ k.transpose(-2, -1)) * scale
    if rows > 1:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
    att = torch.softmax(scores, dim=-1)
    ds = (dq @ k.transpose(-2, -1) + q @ dk.transpose(-2, -1)) * scale
    datt = att * (ds - (att * ds).sum(-1, keepdim=True))
    o = (att @ v).transpose(1, 2).reshape(B, rows, d)
    do = (datt @ v + att @ dv).transpose(2, 3).reshape(N, B, rows, d)
    y, dy = _lin(o, do, c.attn_out, tan("attn_out.weight"), tan("attn_out.bias"))
    h, dh = x + y, dx + dy
    m, dm = _ln(h, dh, c.ln_2, tan("ln_2.weight"), tan("ln_2.bias"))
    u, du = _lin(m, dm, c.mlp_in, tan("mlp_in.weight"), tan("mlp_in.bias"))
    g, dg = _gelu(u, du)
    z, dz = _lin(g, dg, c.mlp_out, tan("mlp_out.weight"), tan("mlp_out.bias"))
    return h + z, dh + dz


def grouped_jvps(
    model: nn.Module, tokens: torch.Tensor, tangents: Mapping[Site, Sequence[ParamDict]]
) -> dict[Site, torch.Tensor]:
    """``J_{k,i} v`` (n, B, d) for every site and its tangents, by hand-written forward-mode derivatives.

    Sites of one position i share one primal forward over positions ≤ i; the tangents of all their
    components travel stacked, each only up to its own block k, and that block computes the query row i
    alone.  Same values as :func:`site_jvp` up to rounding; needs :func:`manual_supported`.
    """
    with torch.no_grad():
        return _grouped_jvps(model, tokens, tangents)


def _tangent_slicer(stacked: dict[str, torch.Tensor], prefix: str, lo: int, hi: int) -> Callable:
    """name → the live tangents lo..hi of parameter ``prefix + name`` (None: not trainable)."""

    def tan(name: str) -> torch.Tensor | None:
        t = stacked.get(prefix + name)
        return None if t is None else t[lo:hi]

    return tan


def _grouped_jvps(model, tokens, tangents) -> dict[Site, torch.Tensor]:
    names, params = trainable_parameters(model)
    dtype = {n: p.dtype for n, p in zip(names, params)}
    H, out = cast(Any, model).config.n_head, {}
    for i in sorted({s[1] for s in tangents}):
        sites = sorted(s for s in tangents if s[1] == i)  # by layer: the live tangents are a suffix
        sizes = [len(tangents[s]) for s in sites]
        starts = [sum(sizes[:j]) for j in range(len(sites))]
        stacked = {n: torch.cat([torch.stack([t[n].to(dtype[n]) for t in tangents[s]]) for s in sites]) for n in names}

        embed = cast(Any, model).embed[0]
        tok = tokens[:, : i + 1]
        x = embed(tok, 0)
        N = sum(sizes)
        dx = torch.zeros(N, *x.shape, dtype=x.dtype, device=x.device)
        if "embed.0.wte.weight" in stacked:
            dx = dx + stacked["embed.0.wte.weight"][:, tok]
        if "embed.0.wpe.weight" in stacked:
            dx = dx + stacked["embed.0.wpe.weight"][:, None, : i + 1]
        lo = 0  # tangents lo.. are live
        for j, s in enumerate(sites):
            if s[0] == 0:
                out[s] = dx[starts[j] - lo : starts[j] - lo + sizes[j], :, i]
        for k in range(1, max(s[0] for s in sites) + 1):
            blk = cast(Any, model).blocks[k - 1]
            live = [j for j, s in enumerate(sites) if s[0] >= k]
            lo_k = starts[live[0]]
            dx = dx[lo_k - lo :]
            lo = lo_k
            ending = [j for j in live if sites[j][0] == k]
            if ending:
                hi = starts[ending[-1]] + sizes[ending[-1]]

                t_end = _tangent_slicer(stacked, f"blocks.{k - 1}.copies.0.", lo, hi)

                _, d_end = _block(blk, x, dx[: hi - lo], t_end, H, last_row=True)
                for j in ending:
                    out[sites[j]] = d_end[starts[j] - lo : starts[j] - lo + sizes[j], :, 0]
                dx, lo = dx[hi - lo :], hi
            if lo == N:
                break

            t_full = _tangent_slicer(stacked, f"blocks.{k - 1}.copies.0.", lo, N)

            x, dx = _block(blk, x, dx, t_full, H, last_row=False)
    return out
