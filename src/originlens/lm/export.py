"""Export our models to Hugging Face directories: GPT → GPT-2, llama2.c → Llama.

* :func:`gpt_to_hf`: an :class:`~originlens.models.gpt.GPT` (one parameter copy: regime ``standard``,
  or ``myopic`` whose forward pass is the standard one) becomes a ``GPT2LMHeadModel`` directory.  Our
  ``nn.Linear`` weights ``(out, in)`` become GPT-2's ``Conv1D`` weights ``(in, out)``; ``attn_qkv`` rows
  ``[W_Q; W_K; W_V]`` are exactly GPT-2's ``c_attn`` columns; the MLP uses ``gelu_pytorch_tanh`` (the
  same tanh-approximated GELU); LayerNorm eps 1e-5; tied or untied LM head.
* :func:`llama2c_to_hf`: a :class:`~originlens.lm.llama2c.Llama2cModel` becomes a ``LlamaForCausalLM``
  directory.  llama2.c rotates adjacent pairs ``(2j, 2j+1)`` of each head, Hugging Face Llama rotates
  ``(j, j + dh/2)`` (``rotate_half``), both with frequency ``theta^(-2j/dh)``; so the rows of each
  query/key head are permuted by :func:`llama2c_to_rotate_half` (even rows first, then odd rows).  The
  permutation is the same for queries and keys, so every attention score is unchanged, and
  ``x W_Q[h]ᵀ W_K[h] x'`` is invariant.  ``generation_config.json`` lists BOS (1) and EOS (2) as stop
  tokens, because a llama2.c story ends when BOS is produced.

The directories are written with ``save_pretrained`` (``config.json``, ``model.safetensors``,
``generation_config.json``) inside :func:`~originlens.outputs.atomic_directory`.  A ``tokenizer.json``
can be copied in (``tokenizer=``).  Caveats: needs the optional ``transformers`` extra; untied GPT
regimes (position-dependent weights) have no GPT-2 equivalent and are refused; Hugging Face's RMSNorm
computes in float32 whatever the model dtype, so float64 llama2.c models agree only to float32 accuracy.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from ..errors import ConfigError, InputError
from ..models.gpt import GPT, LN_EPS, Block, BlockCopy, EmbedCopy, HeadCopy
from ..outputs import OutputKind, atomic_directory
from .hf_hub import quiet_transformers, require_transformers
from .llama2c import Block as LlamaBlock
from .llama2c import Llama2cModel
from .llama2c_tokenizer import BOS_ID, EOS_ID


def llama2c_to_rotate_half(w: Tensor, n_heads: int) -> Tensor:
    """Permute the rows of a query/key weight ``(n_heads * dh, d)`` from llama2.c's adjacent-pair
    rotary layout to Hugging Face's ``rotate_half`` layout: head row ``j`` ← ``2j`` and ``j + dh/2`` ←
    ``2j + 1``."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, hd // 2, 2, -1).transpose(1, 2).reshape(w.shape)


def rotate_half_to_llama2c(w: Tensor, n_heads: int) -> Tensor:
    """Inverse of :func:`llama2c_to_rotate_half`."""
    hd = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, hd // 2, -1).transpose(1, 2).reshape(w.shape)


# --------------------------------------------------------------------------------------------------
# GPT -> GPT-2
# --------------------------------------------------------------------------------------------------


def gpt2_config_dict(model: GPT, *, bos_id: int | None = None, eos_id: int | None = None) -> dict[str, Any]:
    """``GPT2Config`` keyword arguments describing ``model``."""
    cfg = model.config
    if cfg.untied:
        raise ConfigError(
            f"a GPT in regime {cfg.regime!r} has position-dependent weights and no GPT-2 equivalent",
            "export a standard (or myopic) model",
        )
    return dict(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.n_positions,
        n_embd=cfg.d_model,
        n_layer=cfg.n_layer,
        n_head=cfg.n_head,
        n_inner=cfg.mlp_ratio * cfg.d_model,
        activation_function="gelu_pytorch_tanh",
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        layer_norm_epsilon=LN_EPS,
        scale_attn_weights=True,
        scale_attn_by_inverse_layer_idx=False,
        reorder_and_upcast_attn=False,
        tie_word_embeddings=cfg.tie_embeddings,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        use_cache=True,
    )


def gpt2_state_dict(model: GPT) -> dict[str, Tensor]:
    """``GPT2LMHeadModel`` state dict holding ``model``'s weights (Conv1D weights transposed)."""
    sd: dict[str, Tensor] = {}
    emb, head = cast(EmbedCopy, model.embed[0]), cast(HeadCopy, model.head[0])
    sd["transformer.wte.weight"] = emb.wte.weight
    sd["transformer.wpe.weight"] = emb.wpe.weight
    for i, block in enumerate(cast("Iterable[Block]", model.blocks)):
        c, p = cast(BlockCopy, block.copies[0]), f"transformer.h.{i}."
        sd[p + "ln_1.weight"], sd[p + "ln_1.bias"] = c.ln_1.weight, c.ln_1.bias
        sd[p + "attn.c_attn.weight"], sd[p + "attn.c_attn.bias"] = c.attn_qkv.weight.T, c.attn_qkv.bias
        sd[p + "attn.c_proj.weight"], sd[p + "attn.c_proj.bias"] = c.attn_out.weight.T, c.attn_out.bias
        sd[p + "ln_2.weight"], sd[p + "ln_2.bias"] = c.ln_2.weight, c.ln_2.bias
        sd[p + "mlp.c_fc.weight"], sd[p + "mlp.c_fc.bias"] = c.mlp_in.weight.T, c.mlp_in.bias
        sd[p + "mlp.c_proj.weight"], sd[p + "mlp.c_proj.bias"] = c.mlp_out.weight.T, c.mlp_out.bias
    sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"] = head.ln_f.weight, head.ln_f.bias
    sd["lm_head.weight"] = emb.wte.weight if head.lm_head is None else head.lm_head.weight
    return {k: v.detach().contiguous() for k, v in sd.items()}


def gpt_to_hf_model(model: GPT, *, bos_id: int | None = None, eos_id: int | None = None) -> Any:
    """An in-memory ``GPT2LMHeadModel`` with ``model``'s weights (eval mode)."""
    tf = require_transformers()
    with quiet_transformers():
        config = tf.GPT2Config(**gpt2_config_dict(model, bos_id=bos_id, eos_id=eos_id))
        config.dtype = model.config.dtype
        hf = tf.GPT2LMHeadModel(config).to(model.config.torch_dtype)
    _load_exact(hf, gpt2_state_dict(model))
    return hf.eval()


# --------------------------------------------------------------------------------------------------
# llama2.c -> Llama
# --------------------------------------------------------------------------------------------------


def llama_config_dict(model: Llama2cModel) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments describing ``model``."""
    c = model.cfg
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.dim,
        intermediate_size=c.hidden_dim,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(c.rope_theta)},
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=c.shared_classifier,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        use_cache=True,
    )


def llama_state_dict(model: Llama2cModel) -> dict[str, Tensor]:
    """``LlamaForCausalLM`` state dict holding ``model``'s weights (rotary rows permuted)."""
    c = model.cfg
    sd: dict[str, Tensor] = {"model.embed_tokens.weight": model.tok_embeddings.weight}
    for i, layer in enumerate(cast("Iterable[LlamaBlock]", model.layers)):
        p, a, f = f"model.layers.{i}.", layer.attention, layer.feed_forward
        sd[p + "self_attn.q_proj.weight"] = llama2c_to_rotate_half(a.wq.weight, c.n_heads)
        sd[p + "self_attn.k_proj.weight"] = llama2c_to_rotate_half(a.wk.weight, c.n_kv_heads)
        sd[p + "self_attn.v_proj.weight"] = a.wv.weight
        sd[p + "self_attn.o_proj.weight"] = a.wo.weight
        sd[p + "mlp.gate_proj.weight"] = f.w1.weight
        sd[p + "mlp.up_proj.weight"] = f.w3.weight
        sd[p + "mlp.down_proj.weight"] = f.w2.weight
        sd[p + "input_layernorm.weight"] = layer.attention_norm.weight
        sd[p + "post_attention_layernorm.weight"] = layer.ffn_norm.weight
    sd["model.norm.weight"] = model.norm.weight
    sd["lm_head.weight"] = model.classifier_weight
    return {k: v.detach().contiguous() for k, v in sd.items()}


def llama2c_to_hf_model(model: Llama2cModel) -> Any:
    """An in-memory ``LlamaForCausalLM`` with ``model``'s weights (eval mode)."""
    tf = require_transformers()
    dtype = model.tok_embeddings.weight.dtype
    with quiet_transformers():
        config = tf.LlamaConfig(**llama_config_dict(model))
        hf = tf.LlamaForCausalLM(config).to(dtype)
        hf.generation_config = tf.GenerationConfig(bos_token_id=BOS_ID, eos_token_id=[BOS_ID, EOS_ID])
    _load_exact(hf, llama_state_dict(model))
    return hf.eval()


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def _load_exact(hf: Any, sd: Mapping[str, Tensor]) -> None:
    """Load ``sd`` into ``hf``; every parameter must be covered and every key used."""
    own = hf.state_dict()
    unexpected = sorted(set(sd) - set(own))
    missing = sorted(set(own) - set(sd))
    bad = [k for k in sd if k in own and own[k].shape != sd[k].shape]
    if unexpected or missing or bad:  # a bug in the mapping, not a user error
        raise RuntimeError(f"export mapping mismatch: missing {missing}, unexpected {unexpected}, shape {bad}")
    with torch.no_grad():
        for k, v in sd.items():
            own[k].copy_(v.to(own[k].dtype))


def _tokenizer_file(tokenizer: str | os.PathLike) -> Path:
    p = Path(tokenizer)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file() or f.suffix != ".json":
        raise InputError(f"no tokenizer.json at {p}", "pass a tokenizer.json file or a directory holding one")
    return f


def _invalid_hf_config(path: Path) -> str | None:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "not JSON"
    return None if isinstance(cfg, dict) and "model_type" in cfg else "it names no model_type"


# what ``save_pretrained`` writes (one or several weight shards) and the tokenizer copied beside it
OUTPUT = OutputKind(
    "model directory",
    "config.json",
    (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "model-*-of-*.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
    ),
    invalid=_invalid_hf_config,
)


def save_hf(
    hf_model: Any, out_dir: str | os.PathLike, *, tokenizer: str | os.PathLike | None = None, overwrite: bool = False
) -> Path:
    """Write ``hf_model`` with ``save_pretrained`` into ``out_dir`` atomically (+ ``tokenizer.json``)."""
    tok = _tokenizer_file(tokenizer) if tokenizer is not None else None
    out = Path(out_dir)
    with atomic_directory(out, overwrite=overwrite, output=OUTPUT) as tmp:
        with quiet_transformers():
            hf_model.save_pretrained(tmp)
        if tok is not None:
            shutil.copyfile(tok, tmp / "tokenizer.json")
    return out


def gpt_to_hf(
    model: GPT,
    out_dir: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    bos_id: int | None = None,
    eos_id: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Export ``model`` to a Hugging Face GPT-2 directory; returns its path."""
    return save_hf(
        gpt_to_hf_model(model, bos_id=bos_id, eos_id=eos_id), out_dir, tokenizer=tokenizer, overwrite=overwrite
    )


def llama2c_to_hf(
    model: Llama2cModel,
    out_dir: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path:
    """Export a llama2.c model to a Hugging Face Llama directory; returns its path."""
    return save_hf(llama2c_to_hf_model(model), out_dir, tokenizer=tokenizer, overwrite=overwrite)


def export_to_hf(model: GPT | Llama2cModel, out_dir: str | os.PathLike, **kw: Any) -> Path:
    """:func:`gpt_to_hf` or :func:`llama2c_to_hf` depending on the model's class."""
    if isinstance(model, GPT):
        return gpt_to_hf(model, out_dir, **kw)
    if isinstance(model, Llama2cModel):
        kw.pop("bos_id", None), kw.pop("eos_id", None)
        return llama2c_to_hf(model, out_dir, **kw)
    raise ConfigError(
        f"cannot export a {type(model).__name__} to Hugging Face format", "export an originlens GPT or a llama2.c model"
    )
