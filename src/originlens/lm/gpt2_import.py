"""Import Hugging Face GPT-2 models as our :class:`~originlens.models.gpt.GPT` (the inverse of
:func:`originlens.lm.export.gpt_to_hf`).

:func:`gpt_from_hf` maps a ``GPT2LMHeadModel`` (in memory, or a local directory) onto a ``GPT`` whose
forward pass is the same function: GPT-2's ``Conv1D`` weights ``(in, out)`` become ``nn.Linear`` weights
``(out, in)``; ``c_attn``'s columns ``[W_Q | W_K | W_V]`` are ``attn_qkv``'s rows; LayerNorm ε 1e-5; the
tanh-approximated GELU (``gelu_new`` and ``gelu_pytorch_tanh`` compute the same function); a tied or untied
LM head.  Only what maps exactly is accepted; anything else is refused, one line each, before a model is
built: another activation, another LayerNorm ε, unscaled or layer-scaled attention
(``scale_attn_weights=False``, ``scale_attn_by_inverse_layer_idx``), cross-attention, an MLP width that is
not a whole multiple of the width, a state dict with missing or extra keys or other shapes.

Untied regimes (arXiv 2603.14087's *untied* model: one complete parameter copy per position range) take one
model per range (``untie_at=[m]``: two models, the second the paper's "complete second model"); with
``untie_scope="everything"`` (the default) every range also gets its own embeddings, final LayerNorm and
head; with ``"blocks"`` the models must share those tensors exactly.  Tokens of range 0 see only range 0,
so the untied model's logits there equal the first model's.

Dropout is not mapped: the returned model has dropout 0 (Hugging Face models are compared in eval mode).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import CompatibilityError, ConfigError
from ..models.gpt import GPT, LN_EPS, GPTConfig

TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")


def gpt_from_hf(
    models: Any,
    *,
    regime: str = "standard",
    untie_at: Sequence[int] | str | None = None,
    untie_scope: str = "everything",
    seq_len: int | None = None,
    dtype: str | torch.dtype | None = None,
) -> GPT:
    """A :class:`GPT` computing what ``models`` compute.

    ``models``: a ``GPT2LMHeadModel``, a local directory holding one, or — for an untied ``regime``
    (``"untied"``, ``"myopic+untied"``) — a sequence of them, one per position range of ``untie_at``.
    ``regime`` ``"myopic"`` builds the same weights as ``"standard"`` (myopia changes gradients only).
    ``seq_len`` defaults to the model's ``n_positions``; ``dtype`` to the first model's parameter dtype."""
    hf = [_as_model(m) for m in (models if isinstance(models, (list, tuple)) else [models])]
    gpt_cfg = _gpt_config(hf, regime=regime, untie_at=untie_at, untie_scope=untie_scope, seq_len=seq_len, dtype=dtype)
    n_ranges = len(gpt_cfg.ranges())
    if len(hf) != n_ranges:
        raise ConfigError(
            f"regime {regime!r} with untie_at={untie_at!r} has {n_ranges} position range(s) but {len(hf)} model(s) "
            "were given",
            f"give one GPT-2 model per range ({n_ranges})",
        )
    sds = [_checked_state_dict(m, gpt_cfg) for m in hf]
    outer_per_range = gpt_cfg.untied and gpt_cfg.untie_scope == "everything"
    if len(sds) > 1 and not outer_per_range:
        for key in _OUTER_KEYS:
            if key in sds[0] and any(not torch.equal(sds[0][key], sd[key]) for sd in sds[1:]):
                raise ConfigError(
                    f"untie_scope='blocks' shares {key}, but the models given hold different values",
                    "use untie_scope='everything' (each range its own embeddings and head) or models that share them",
                )
    state: dict[str, Tensor] = {}
    for r, sd in enumerate(sds):
        e = r if outer_per_range else 0
        if r == 0 or outer_per_range:
            state[f"embed.{e}.wte.weight"] = sd["transformer.wte.weight"]
            state[f"embed.{e}.wpe.weight"] = sd["transformer.wpe.weight"]
            state[f"head.{e}.ln_f.weight"] = sd["transformer.ln_f.weight"]
            state[f"head.{e}.ln_f.bias"] = sd["transformer.ln_f.bias"]
            if not gpt_cfg.tie_embeddings:
                state[f"head.{e}.lm_head.weight"] = sd["lm_head.weight"]
        for i in range(gpt_cfg.n_layer):
            p, q = f"transformer.h.{i}.", f"blocks.{i}.copies.{r}."
            for ours, theirs, transpose in _BLOCK_MAP:
                w = sd[p + theirs]
                state[q + ours] = w.T if transpose else w
    dt = gpt_cfg.torch_dtype
    state = {k: v.detach().to(dt).contiguous().clone() for k, v in state.items()}
    return GPT.from_state_dict(state, gpt_cfg).eval()


# ours, GPT-2's, transposed (Conv1D stores (in, out))
_BLOCK_MAP = (
    ("ln_1.weight", "ln_1.weight", False),
    ("ln_1.bias", "ln_1.bias", False),
    ("attn_qkv.weight", "attn.c_attn.weight", True),
    ("attn_qkv.bias", "attn.c_attn.bias", False),
    ("attn_out.weight", "attn.c_proj.weight", True),
    ("attn_out.bias", "attn.c_proj.bias", False),
    ("ln_2.weight", "ln_2.weight", False),
    ("ln_2.bias", "ln_2.bias", False),
    ("mlp_in.weight", "mlp.c_fc.weight", True),
    ("mlp_in.bias", "mlp.c_fc.bias", False),
    ("mlp_out.weight", "mlp.c_proj.weight", True),
    ("mlp_out.bias", "mlp.c_proj.bias", False),
)
_OUTER_KEYS = (
    "transformer.wte.weight",
    "transformer.wpe.weight",
    "transformer.ln_f.weight",
    "transformer.ln_f.bias",
    "lm_head.weight",
)


def _as_model(m: Any) -> Any:
    """A ``GPT2LMHeadModel`` for a model or a local directory (anything else refused)."""
    if isinstance(m, (str, os.PathLike)):
        from .hf_hub import load_hf_model

        if not os.path.isdir(m):
            raise ConfigError(f"{m} is not a local directory", "pass a GPT2LMHeadModel or its saved directory")
        m = load_hf_model(m, dtype=None, local_files_only=True)
    name = type(m).__name__
    if name != "GPT2LMHeadModel":
        raise ConfigError(
            f"gpt_from_hf maps GPT2LMHeadModel only, got {name}",
            "load a GPT-2 model (other architectures: originlens.load_adapter reads them without conversion)",
        )
    return m


def _gpt_config(
    hf: list[Any],
    *,
    regime: str,
    untie_at: Sequence[int] | str | None,
    untie_scope: str,
    seq_len: int | None,
    dtype: str | torch.dtype | None,
) -> GPTConfig:
    c = hf[0].config
    for other in hf[1:]:
        if other.config.to_diff_dict() != c.to_diff_dict():
            raise ConfigError(
                "the GPT-2 models given for the ranges have different configurations",
                "give copies of one architecture",
            )
    act = c.activation_function
    if act not in TANH_GELUS:
        raise ConfigError(
            f"activation_function {act!r} has no exact counterpart (our MLP uses the tanh-approximated GELU)",
            f"import a model with activation_function in {TANH_GELUS}",
        )
    if float(c.layer_norm_epsilon) != LN_EPS:
        raise ConfigError(
            f"layer_norm_epsilon {c.layer_norm_epsilon} ≠ our LayerNorm ε {LN_EPS}", "import a model with ε 1e-5"
        )
    for flag, want in (
        ("scale_attn_weights", True),
        ("scale_attn_by_inverse_layer_idx", False),
        ("add_cross_attention", False),
    ):
        if bool(getattr(c, flag, want)) != want:
            raise ConfigError(
                f"{flag}={getattr(c, flag)} has no counterpart in our GPT", f"import a model with {flag}={want}"
            )
    n_inner = c.n_inner if c.n_inner is not None else 4 * c.n_embd
    if n_inner % c.n_embd:
        raise ConfigError(
            f"MLP width {n_inner} is not a whole multiple of the width {c.n_embd}",
            "import a model with n_inner = k·n_embd",
        )
    if dtype is None:
        dtype = next(hf[0].parameters()).dtype
    dtype_name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    return GPTConfig(
        vocab_size=int(c.vocab_size),
        seq_len=int(seq_len if seq_len is not None else c.n_positions),
        n_layer=int(c.n_layer),
        d_model=int(c.n_embd),
        n_head=int(c.n_head),
        mlp_ratio=int(n_inner // c.n_embd),
        tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
        regime=regime,
        untie_at=untie_at,
        untie_scope=untie_scope,
        n_positions=int(c.n_positions),
        dtype=dtype_name,
    )


def _checked_state_dict(m: Any, cfg: GPTConfig) -> dict[str, Tensor]:
    """The model's state dict, every key the mapping reads present with the shape ``cfg`` implies (the
    attention's constant buffers of older ``transformers`` versions ignored)."""
    sd = {k: v for k, v in m.state_dict().items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    d, V, P, f = cfg.d_model, cfg.vocab_size, cfg.n_positions, cfg.mlp_ratio * cfg.d_model
    want: dict[str, tuple[int, ...]] = {
        "transformer.wte.weight": (V, d),
        "transformer.wpe.weight": (int(P or 0), d),
        "transformer.ln_f.weight": (d,),
        "transformer.ln_f.bias": (d,),
        "lm_head.weight": (V, d),
    }
    shapes = {
        "ln_1.weight": (d,),
        "ln_1.bias": (d,),
        "attn.c_attn.weight": (d, 3 * d),
        "attn.c_attn.bias": (3 * d,),
        "attn.c_proj.weight": (d, d),
        "attn.c_proj.bias": (d,),
        "ln_2.weight": (d,),
        "ln_2.bias": (d,),
        "mlp.c_fc.weight": (d, f),
        "mlp.c_fc.bias": (f,),
        "mlp.c_proj.weight": (f, d),
        "mlp.c_proj.bias": (d,),
    }
    for i in range(cfg.n_layer):
        want.update({f"transformer.h.{i}.{k}": s for k, s in shapes.items()})
    missing = sorted(set(want) - set(sd))
    extra = sorted(set(sd) - set(want))
    bad = sorted(k for k in want if k in sd and tuple(sd[k].shape) != want[k])
    if missing or extra or bad:
        parts = [
            f"missing {missing[:3]}{' …' if len(missing) > 3 else ''}" if missing else "",
            f"unexpected {extra[:3]}{' …' if len(extra) > 3 else ''}" if extra else "",
            f"other shapes {bad[:3]}" if bad else "",
        ]
        raise CompatibilityError(
            "the GPT-2 state dict does not match its config: " + "; ".join(p for p in parts if p),
            "load the model with the config it was saved with",
        )
    return sd
