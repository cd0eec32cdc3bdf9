"""Where the pieces of each supported Hugging Face architecture live (``gpt2``, ``gpt_neox``, ``llama``,
``gemma2``): per family the attribute paths of layers, norms and attention projections, and how to read a
layer's query/key weights per head.  :func:`family_of` refuses other architectures with a
:class:`~originlens.errors.CompatibilityError`.  The layouts are described in :mod:`.hf`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from ..errors import CompatibilityError


@dataclass(frozen=True)
class _Family:
    """Accessors for one architecture (``m`` is the ``*ForCausalLM`` model)."""

    layers: Callable[[Any], nn.ModuleList]
    final_norm: Callable[[Any], nn.Module]
    attention: Callable[[Any], nn.Module]  # decoder layer -> its attention module
    qk: Callable[[Any, Any], tuple[Tensor, Tensor]]  # (W_Q (H, dh, d), W_K (H_kv, dh, d))
    n_kv_heads: Callable[[Any], int]
    # what the attention module's output adds to the residual stream (Gemma-2 normalises it first)
    attn_delta: Callable[[Any, Tensor], Tensor] = lambda layer, out: out


def _gpt2_qk(cfg: Any, layer: Any) -> tuple[Tensor, Tensor]:
    d, H = cfg.hidden_size, cfg.num_attention_heads
    w = layer.attn.c_attn.weight  # Conv1D: (in=d, out=3d), y = x @ w + b
    return w[:, :d].T.reshape(H, d // H, d), w[:, d : 2 * d].T.reshape(H, d // H, d)


def _neox_qk(cfg: Any, layer: Any) -> tuple[Tensor, Tensor]:
    d, H = cfg.hidden_size, cfg.num_attention_heads
    w = layer.attention.query_key_value.weight.view(H, 3, d // H, d)  # rows per head: [q_h | k_h | v_h]
    return w[:, 0], w[:, 1]


def _llama_qk(cfg: Any, layer: Any) -> tuple[Tensor, Tensor]:
    a = layer.self_attn
    H, Hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size
    dh = a.head_dim
    return a.q_proj.weight.view(H, dh, d), a.k_proj.weight.view(Hkv, dh, d)


FAMILIES: dict[str, _Family] = {
    "gpt2": _Family(
        lambda m: m.transformer.h,
        lambda m: m.transformer.ln_f,
        lambda l: l.attn,
        _gpt2_qk,
        lambda c: c.num_attention_heads,
    ),
    "gpt_neox": _Family(
        lambda m: m.gpt_neox.layers,
        lambda m: m.gpt_neox.final_layer_norm,
        lambda l: l.attention,
        _neox_qk,
        lambda c: c.num_attention_heads,
    ),
    "llama": _Family(
        lambda m: m.model.layers,
        lambda m: m.model.norm,
        lambda l: l.self_attn,
        _llama_qk,
        lambda c: c.num_key_value_heads or c.num_attention_heads,
    ),
    "gemma2": _Family(
        lambda m: m.model.layers,
        lambda m: m.model.norm,
        lambda l: l.self_attn,
        _llama_qk,
        lambda c: c.num_key_value_heads or c.num_attention_heads,
        attn_delta=lambda layer, out: layer.post_attention_layernorm(out),
    ),
}


def family_of(model_type: str) -> _Family:
    if model_type not in FAMILIES:
        raise CompatibilityError(
            f"Hugging Face model type {model_type!r} is not supported",
            f"use one of: {', '.join(FAMILIES)} (GPT-2, GPT-NeoX/Pythia, Llama, Gemma-2)",
        )
    return FAMILIES[model_type]
