""":class:`~originlens.lm.adapter.LMAdapter` implementations for the models this package defines itself:
our GPT (:class:`GPTAdapter`) and llama2.c checkpoints (:class:`Llama2cAdapter`).

Caveats: for an untied GPT, ``single_token_states`` uses the parameter copy of position 0 (a token fed
alone sits at position 0) and ``qk_weights`` the copy of range 0; ``run`` is the model's own forward
(regimes and untied ranges included).  The llama2.c ``run`` re-implements the block loop so that hooks
can replace residual streams; it is checked against the model's own forward in the tests.  Both adapters
implement the optional cached partial forward (``run_cached`` / ``run_positions_from``, used by Q(w)); for
llama2.c it runs its own fused block code (:func:`_llama_block`, equal to the model's blocks up to
round-off), for our GPT the model's blocks with a key/value-recording attention (single parameter copy
only: not for untied models; forward values only, no myopic gradient semantics).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..models.gpt import GPT, BlockCopy, EmbedCopy, causal_self_attention
from ..models.gpt import Block as GPTBlock
from ..sites import site_name
from .adapter import LMAdapter, ResidHook, TokenStates, apply_hooks, normalise_hooks, past_attention_mask
from .llama2c import Block as LlamaBlock
from .llama2c import KVCache, Llama2cModel, rotary_angles


def _check_layer(layer: int, n_layers: int) -> int:
    if not 0 <= int(layer) < n_layers:
        raise ConfigError(f"layer {layer} out of range for a {n_layers}-layer model", f"use 0..{n_layers - 1}")
    return int(layer)


class GPTAdapter(LMAdapter):
    """Our :class:`~originlens.models.gpt.GPT` behind the adapter protocol."""

    family = "originlens-gpt"

    def __init__(self, model: GPT, bos_id: int | None = None) -> None:
        self.module = model
        cfg = model.config
        self.n_layers, self.d_model, self.n_heads = cfg.n_layer, cfg.d_model, cfg.n_head
        self.vocab_size, self.max_seq_len = cfg.vocab_size, cfg.n_positions
        self.bos_id = bos_id

    def parameters(self):
        return self.module.parameters()

    def run(
        self,
        tokens: Tensor,
        *,
        hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
        return_residuals: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        hk = normalise_hooks(hooks, self.n_layers)
        gpt_hooks = {site_name(k): [(lambda x, site, fn=fn, k=k: fn(x, k)) for fn in fns] for k, fns in hk.items()}
        return self.module(tokens, hooks=gpt_hooks, return_residuals=return_residuals)

    def run_from(self, k: int, x: Tensor) -> Tensor:
        return self.module.forward_from(self.check_site(k), x)

    @property
    def supports_cached_ablation(self) -> bool:
        """Cached partial forwards need one parameter copy (not untied) and no active dropout."""
        m = self.module
        return not m.config.untied and not (m.training and m.config.dropout > 0)

    def _cached_site(self, k: int) -> int:
        if not self.supports_cached_ablation:
            raise ConfigError(
                "cached partial forwards need a GPT with one parameter copy and no active dropout",
                "use run / run_from (untied models), or call module.eval()",
            )
        return self.check_site(k)

    def run_cached(self, tokens: Tensor, k: int) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
        k, m = self._cached_site(k), self.module
        tokens = m._check_tokens(tokens)
        T = tokens.shape[1]
        past: list[tuple[Tensor, Tensor]] = []

        def attention(q: Tensor, kk: Tensor, v: Tensor) -> Tensor:
            past.append((kk, v))
            return causal_self_attention(
                q, kk, v, myopic=m.is_myopic, impl=m.attn_impl, future=m.get_buffer("_future")[:T, :T]
            )

        x = resid_k = m.embed[0](tokens, 0)
        for i, block in enumerate(m.blocks, start=1):
            x = block(x, [(0, 0, T)], attention)
            if i == k:
                resid_k = x
        return x, resid_k, past[k:]

    def run_cached_from(self, k: int, x: Tensor) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """:meth:`run_cached` from the stream at site k ``x (B, T, d)``: ``(resid_L, past)``, only the blocks
        above k run (e.g. on streams kept by the Q(w) context search)."""
        k, m = self._cached_site(k), self.module
        T = x.shape[1]
        past: list[tuple[Tensor, Tensor]] = []

        def attention(q: Tensor, kk: Tensor, v: Tensor) -> Tensor:
            past.append((kk, v))
            return causal_self_attention(
                q, kk, v, myopic=m.is_myopic, impl=m.attn_impl, future=m.get_buffer("_future")[:T, :T]
            )

        for block in m.blocks[k:]:
            x = block(x, [(0, 0, T)], attention)
        return x, past

    def run_positions_from(self, k: int, x: Tensor, start: Tensor, past: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        k, m = self._cached_site(k), self.module
        n = x.shape[1]
        start = start.to(x.device)
        P = int(start.max()) if start.numel() else 0
        mask = past_attention_mask(start, n, P)
        layers = iter(past)

        def attention(q: Tensor, kk: Tensor, v: Tensor) -> Tensor:
            pk, pv = next(layers)
            return F.scaled_dot_product_attention(
                q, torch.cat([pk[:, :, :P], kk], 2), torch.cat([pv[:, :, :P], v], 2), attn_mask=mask
            )

        for block in m.blocks[k:]:
            x = block(x, [(0, 0, n)], attention)
        return m._logits(0, x)

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        m = self.module
        d = self.d_model
        emb = cast(EmbedCopy, m.embed[0])
        x = emb.wte(token_ids.view(-1)) + emb.wpe.weight[0]
        pre: list[Tensor] = []
        attn: list[Tensor] = []
        post: list[Tensor] = []
        for block in cast("Iterable[GPTBlock]", m.blocks):
            c = cast(BlockCopy, block.copies[0])
            v = c.attn_qkv(c.ln_1(x))[:, 2 * d :]  # one key: softmax weight 1, output = value
            h = x + c.attn_out(v)
            out = h + c.mlp_out(F.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh"))
            pre.append(x)
            attn.append(h)
            post.append(out)
            x = out
        return TokenStates(torch.stack(pre), torch.stack(attn), torch.stack(post))

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        layer = _check_layer(layer, self.n_layers)
        w = cast(BlockCopy, cast(GPTBlock, self.module.blocks[layer]).copies[0]).attn_qkv.weight
        d, H = self.d_model, self.n_heads
        return w[:d].view(H, d // H, d), w[d : 2 * d].view(H, d // H, d)

    def unembed(self, h: Tensor) -> Tensor:
        return self.module._logits(0, h)


class Llama2cAdapter(LMAdapter):
    """A :class:`~originlens.lm.llama2c.Llama2cModel` behind the adapter protocol (BOS id 1)."""

    family = "llama2c"

    def __init__(self, model: Llama2cModel) -> None:
        self.module = model
        cfg = model.cfg
        self.n_layers, self.d_model, self.n_heads = cfg.n_layers, cfg.dim, cfg.n_heads
        self.vocab_size, self.max_seq_len = cfg.vocab_size, cfg.max_seq_len
        self.bos_id = 1

    def parameters(self):
        return self.module.parameters()

    def run(
        self,
        tokens: Tensor,
        *,
        hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
        return_residuals: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        m, cfg = self.module, self.module.cfg
        T = tokens.shape[1]
        if cfg.max_seq_len < T:
            raise ConfigError(
                f"sequence of {T} tokens exceeds max_seq_len {cfg.max_seq_len}",
                f"use at most {cfg.max_seq_len} tokens per sequence",
            )
        hk = normalise_hooks(hooks, self.n_layers)
        cos, sin = rotary_angles(torch.arange(T), cfg.head_dim, cfg.rope_theta)
        cos, sin = cos.to(tokens.device), sin.to(tokens.device)
        h = apply_hooks(0, m.tok_embeddings(tokens), hk)
        residuals = [h]
        for i, layer in enumerate(m.layers, start=1):
            h = apply_hooks(i, layer(h, cos, sin, None)[0], hk)
            residuals.append(h)
        logits = self.unembed(h)
        return (logits, residuals) if return_residuals else logits

    def decode(self, tokens: Tensor, cache: KVCache | None) -> tuple[Tensor, KVCache]:
        cache = KVCache(self.n_layers) if cache is None else cache
        return self.module(tokens, cache=cache), cache

    def run_from(self, k: int, x: Tensor) -> Tensor:
        k = self.check_site(k)
        cfg = self.module.cfg
        cos, sin = rotary_angles(torch.arange(x.shape[1]), cfg.head_dim, cfg.rope_theta)
        cos, sin = cos.to(x.device), sin.to(x.device)
        for layer in self.module.layers[k:]:
            x = layer(x, cos, sin, None)[0]
        return self.unembed(x)

    def run_cached(self, tokens: Tensor, k: int) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
        k, m, cfg = self.check_site(k), self.module, self.module.cfg
        T = tokens.shape[1]
        if cfg.max_seq_len < T:
            raise ConfigError(
                f"sequence of {T} tokens exceeds max_seq_len {cfg.max_seq_len}",
                f"use at most {cfg.max_seq_len} tokens per sequence",
            )
        x = resid_k = m.tok_embeddings(tokens)
        rot = _rotations(torch.arange(T, device=tokens.device), cfg, x.dtype)
        mask = _causal_mask(T, x.dtype, x.device)
        past = []
        for i, layer in enumerate(m.layers, start=1):
            x, kv = _llama_block(layer, cfg, x, rot, mask)
            if i == k:
                resid_k = x
            if i > k:
                past.append(kv)
        return x, resid_k, past

    def run_to(self, tokens: Tensor, k: int) -> Tensor:
        """The stream at site k ``(B, T, d)`` of a clean run, blocks above k not run (the fused block code of
        :meth:`run_cached`: equal to :meth:`run`'s residuals up to round-off)."""
        k, m, cfg = self.check_site(k), self.module, self.module.cfg
        T = tokens.shape[1]
        if cfg.max_seq_len < T:
            raise ConfigError(
                f"sequence of {T} tokens exceeds max_seq_len {cfg.max_seq_len}",
                f"use at most {cfg.max_seq_len} tokens per sequence",
            )
        x = m.tok_embeddings(tokens)
        if k == 0:
            return x
        rot = _rotations(torch.arange(T, device=tokens.device), cfg, x.dtype)
        mask = _causal_mask(T, x.dtype, x.device)
        for layer in m.layers[:k]:
            x = _llama_block(layer, cfg, x, rot, mask)[0]
        return x

    def run_cached_from(self, k: int, x: Tensor) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """:meth:`run_cached` from the stream at site k ``x (B, T, d)``: ``(resid_L, past)``, only the blocks
        above k run (e.g. on streams kept by the Q(w) context search)."""
        k, cfg = self.check_site(k), self.module.cfg
        T = x.shape[1]
        rot = _rotations(torch.arange(T, device=x.device), cfg, x.dtype)
        mask = _causal_mask(T, x.dtype, x.device)
        past = []
        for layer in self.module.layers[k:]:
            x, kv = _llama_block(layer, cfg, x, rot, mask)
            past.append(kv)
        return x, past

    def run_positions_from(self, k: int, x: Tensor, start: Tensor, past: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        k, cfg = self.check_site(k), self.module.cfg
        B, n, _ = x.shape
        start = start.to(x.device)
        P = int(start.max()) if start.numel() else 0
        rot = _rotations(start[:, None] + torch.arange(n, device=x.device), cfg, x.dtype)[:, None]
        mask = torch.zeros((), dtype=x.dtype, device=x.device).masked_fill(
            ~past_attention_mask(start, n, P), float("-inf")
        )[:, :, None]
        for layer, (pk, pv) in zip(self.module.layers[k:], past):
            x = _llama_block(layer, cfg, x, rot, mask, (pk[:, :, :P], pv[:, :, :P]))[0]
        return self.unembed(x)

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        m, cfg = self.module, self.module.cfg
        x = m.tok_embeddings(token_ids.view(-1))
        pre: list[Tensor] = []
        attn: list[Tensor] = []
        post: list[Tensor] = []
        for layer in cast("Iterable[LlamaBlock]", m.layers):
            a = layer.attention
            v = a.wv(layer.attention_norm(x)).view(-1, cfg.n_kv_heads, cfg.head_dim)
            v = v.repeat_interleave(cfg.kv_group, dim=1).reshape(-1, cfg.n_heads * cfg.head_dim)
            h = x + a.wo(v)  # position 0: no rotation, one key
            out = h + layer.feed_forward(layer.ffn_norm(h))
            pre.append(x)
            attn.append(h)
            post.append(out)
            x = out
        return TokenStates(torch.stack(pre), torch.stack(attn), torch.stack(post))

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        layer = _check_layer(layer, self.n_layers)
        wq, wk = self.module.attention_weights(layer)
        return wq, wk.repeat_interleave(self.module.cfg.kv_group, dim=0)

    def unembed(self, h: Tensor) -> Tensor:
        return self.module.norm(h) @ self.module.classifier_weight.T


def _llama_block(
    layer, cfg, x: Tensor, rot: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None = None
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One llama2.c block, written for speed: x ``(B, T, d)`` → (output, (keys, values) of x's positions,
    each ``(B, n_kv, T, hd)``, keys rotated).  ``rot``: complex rotations ``(T, hd/2)`` or
    ``(B, 1, T, hd/2)`` (:func:`_rotations`); ``mask``: additive, ``(T, T)`` causal without ``past``
    (:func:`_causal_mask`), else ``(B, 1, 1, T, P + T)`` over ``[past | x]`` keys.  Equal to
    :class:`~originlens.lm.llama2c.Block` up to round-off (tested): norm weights and the 1/√hd score scale
    folded into the projections, fused q/k/v, head-major layout, grouped-query attention without
    repeated keys, causal attention in two query halves (the first half reads only the first half)."""
    a, ff, (B, T, d), hd = layer.attention, layer.feed_forward, x.shape, cfg.head_dim
    H, Hkv = cfg.n_heads, cfg.n_kv_heads
    w = torch.cat([a.wq.weight * hd**-0.5, a.wk.weight, a.wv.weight]) * layer.attention_norm.weight
    qkv = F.linear(_rms(x, layer.attention_norm.eps), w).view(B, T, H + 2 * Hkv, hd)
    qkv = qkv.transpose(1, 2).contiguous()
    qk = torch.view_as_real(torch.view_as_complex(qkv[:, : H + Hkv].reshape(B, H + Hkv, T, hd // 2, 2)) * rot)
    qk = qk.reshape(B, H + Hkv, T, hd)
    q, kk, v = qk[:, :H], qk[:, H:], qkv[:, H + Hkv :]
    if past is not None:
        out = _attend(q, torch.cat([past[0], kk], 2), torch.cat([past[1], v], 2), mask)
    elif T >= 16:
        m = T // 2
        out = torch.cat(
            [_attend(q[:, :, :m], kk[:, :, :m], v[:, :, :m], mask[:m, :m]), _attend(q[:, :, m:], kk, v, mask[m:])], 2
        )
    else:
        out = _attend(q, kk, v, mask)
    h = torch.addmm(x.reshape(-1, d), out.transpose(1, 2).reshape(B * T, H * hd), a.wo.weight.T)  # x + wo(out)
    hn = _rms(h, layer.ffn_norm.eps)
    g = F.linear(hn, ff.w1.weight * layer.ffn_norm.weight)
    u = F.linear(hn, ff.w3.weight * layer.ffn_norm.weight)
    return torch.addmm(h, F.silu(g).mul_(u), ff.w2.weight.T).view(B, T, d), (kk, v)


def _attend(q: Tensor, keys: Tensor, vals: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention of pre-scaled queries: q ``(B, H, T, hd)``, keys/values ``(B, n_kv, S, hd)``,
    additive mask broadcastable to ``(B, n_kv, H/n_kv, T, S)``."""
    B, H, T, hd = q.shape
    Hkv = keys.shape[1]
    s = torch.matmul(q.reshape(B, Hkv, H // Hkv * T, hd), keys.transpose(-1, -2))  # query heads grouped
    s = s.view(B, Hkv, H // Hkv, T, -1).add_(mask)
    return torch.matmul(torch.softmax(s.view(B, Hkv, H // Hkv * T, -1), dim=-1), vals).view(B, H, T, hd)


def _causal_mask(T: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Additive causal mask ``(T, T)``: 0 on and below the diagonal, −inf above."""
    return torch.full((T, T), float("-inf"), dtype=dtype, device=device).triu_(1)


def _rms(x: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x²) + eps)`` (RMSNorm without its weight)."""
    return x * torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()


def _rotations(positions: Tensor, cfg, dtype: torch.dtype) -> Tensor:
    """Complex rotary factors ``exp(i·θ)`` ``(*positions.shape, hd/2)`` of the model's rotary angles."""
    cos, sin = rotary_angles(positions.reshape(-1).cpu(), cfg.head_dim, cfg.rope_theta)
    rot = torch.complex(cos.to(dtype), sin.to(dtype)).to(positions.device)
    return rot.view(*positions.shape, cfg.head_dim // 2)
