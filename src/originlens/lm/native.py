""":class:`~originlens.lm.adapter.LMAdapter` implementations for the models this package defines itself:
our GPT (:class:`GPTAdapter`) and llama2.c checkpoints (:class:`Llama2cAdapter`).

Caveats: for an untied GPT, ``single_token_states`` uses the parameter copy of position 0 (a token fed
alone sits at position 0) and ``qk_weights`` the copy of range 0; ``run`` is the model's own forward
(regimes and untied ranges included).  The llama2.c ``run`` re-implements the block loop so that hooks
can replace residual streams; it is checked against the model's own forward in the tests.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..errors import ConfigError
from ..models.gpt import GPT
from .adapter import LMAdapter, ResidHook, TokenStates, apply_hooks, normalise_hooks
from .llama2c import Llama2cModel, rotary_angles


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

    def run(self, tokens: Tensor, *, hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
            return_residuals: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        hk = normalise_hooks(hooks, self.n_layers)
        gpt_hooks = {f"resid.{k}": [(lambda x, site, fn=fn, k=k: fn(x, k)) for fn in fns]
                     for k, fns in hk.items()}
        return self.module(tokens, hooks=gpt_hooks, return_residuals=return_residuals)

    def run_from(self, k: int, x: Tensor) -> Tensor:
        return self.module.forward_from(self.check_site(k), x)

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        m = self.module
        d = self.d_model
        x = m.embed[0].wte(token_ids.view(-1)) + m.embed[0].wpe.weight[0]
        pre, attn, post = [], [], []
        for block in m.blocks:
            c = block.copies[0]
            v = c.attn_qkv(c.ln_1(x))[:, 2 * d:]           # one key: softmax weight 1, output = value
            h = x + c.attn_out(v)
            out = h + c.mlp_out(F.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh"))
            pre.append(x), attn.append(h), post.append(out)
            x = out
        return TokenStates(torch.stack(pre), torch.stack(attn), torch.stack(post))

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        layer = _check_layer(layer, self.n_layers)
        w = self.module.blocks[layer].copies[0].attn_qkv.weight
        d, H = self.d_model, self.n_heads
        return w[:d].view(H, d // H, d), w[d:2 * d].view(H, d // H, d)

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

    def run(self, tokens: Tensor, *, hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
            return_residuals: bool = False) -> Tensor | tuple[Tensor, list[Tensor]]:
        m, cfg = self.module, self.module.cfg
        T = tokens.shape[1]
        if T > cfg.max_seq_len:
            raise ConfigError(f"sequence of {T} tokens exceeds max_seq_len {cfg.max_seq_len}",
                              f"use at most {cfg.max_seq_len} tokens per sequence")
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

    def run_from(self, k: int, x: Tensor) -> Tensor:
        k = self.check_site(k)
        cfg = self.module.cfg
        cos, sin = rotary_angles(torch.arange(x.shape[1]), cfg.head_dim, cfg.rope_theta)
        cos, sin = cos.to(x.device), sin.to(x.device)
        for layer in self.module.layers[k:]:
            x = layer(x, cos, sin, None)[0]
        return self.unembed(x)

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        m, cfg = self.module, self.module.cfg
        x = m.tok_embeddings(token_ids.view(-1))
        pre, attn, post = [], [], []
        for layer in m.layers:
            a = layer.attention
            v = a.wv(layer.attention_norm(x)).view(-1, cfg.n_kv_heads, cfg.head_dim)
            v = v.repeat_interleave(cfg.kv_group, dim=1).reshape(-1, cfg.n_heads * cfg.head_dim)
            h = x + a.wo(v)                                # position 0: no rotation, one key
            out = h + layer.feed_forward(layer.ffn_norm(h))
            pre.append(x), attn.append(h), post.append(out)
            x = out
        return TokenStates(torch.stack(pre), torch.stack(attn), torch.stack(post))

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        layer = _check_layer(layer, self.n_layers)
        wq, wk = self.module.attention_weights(layer)
        return wq, wk.repeat_interleave(self.module.cfg.kv_group, dim=0)

    def unembed(self, h: Tensor) -> Tensor:
        return self.module.norm(h) @ self.module.classifier_weight.T
