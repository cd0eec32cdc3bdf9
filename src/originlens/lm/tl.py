"""TransformerLens models behind the :class:`~originlens.lm.adapter.LMAdapter` protocol (optional).

:class:`TLAdapter` is duck-typed on the subset of ``HookedTransformer``'s API it needs, so it never
imports ``transformer_lens`` (not a dependency).  TransformerLens 3 has ``HookedTransformer``;
TransformerLens 4 removed it, and its ``TransformerBridge`` (also in 3, ``transformer_lens.model_bridge``)
has the same subset and works as is.  The attributes are looked up without being evaluated (several are
properties that compute stacked weights):

* ``cfg.n_layers``, ``cfg.d_model``, ``cfg.n_heads``, ``cfg.d_vocab``, ``cfg.n_ctx`` (and optionally
  ``cfg.n_key_value_heads``);
* ``run_with_hooks(tokens, fwd_hooks=[(name, fn), ...])`` → logits, with hooks ``fn(tensor, hook)``
  that may return a replacement, at ``blocks.{l}.hook_resid_pre`` / ``blocks.{l}.hook_resid_post``;
* ``run_with_cache(tokens, names_filter=...)`` → ``(logits, cache)`` with ``cache[name]`` for
  ``blocks.{l}.hook_resid_pre``, ``hook_attn_out`` and ``hook_resid_post``;
* ``W_Q`` ``(L, H, d, dh)``, ``W_K`` ``(L, H or H_kv, d, dh)``, ``ln_final``, ``W_U`` ``(d, V)``,
  ``b_U`` ``(V,)``, ``parameters()``.

Site ``resid.k`` is ``blocks.{k}.hook_resid_pre`` for k < L and ``blocks.{L-1}.hook_resid_post`` for
k = L (the hook point the next stage consumes; TransformerLens fires ``resid_post`` of block l before
``resid_pre`` of block l+1 on the same tensor, so one name per site is enough).

Caveats: ``HookedTransformer``'s default processing (``fold_ln``, ``center_writing_weights``,
``center_unembed``) changes the residual basis and the unembedding: residuals and ``qk_weights`` are
those of the processed model, which differ from the Hugging Face model's (load with
``HookedTransformer.from_pretrained_no_processing`` to compare with :class:`~originlens.lm.hf.HFAdapter`).
A ``TransformerBridge`` (``TransformerBridge.boot_transformers``) runs the Hugging Face weights
unprocessed, so its residuals are the Hugging Face model's, until ``enable_compatibility_mode()`` folds
them as ``HookedTransformer`` did.  Its ``W_K`` is already repeated to the query heads.
Query/key biases ``b_Q``/``b_K`` are not part of ``qk_weights``.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import CompatibilityError, ConfigError, InputError
from .adapter import LMAdapter, ResidHook, TokenStates, normalise_hooks

_CHUNK = 4096  # tokens per run_with_cache call in single_token_states
_REQUIRED = ("cfg", "run_with_hooks", "run_with_cache", "W_Q", "W_K", "ln_final", "W_U", "b_U", "parameters")


def _has(obj: Any, name: str) -> bool:
    """Whether ``obj`` has attribute ``name``, found without running a property or ``__getattr__``
    (``hasattr`` would compute stacked weights, and propagates anything but AttributeError): the class
    and instance dictionaries, then a torch module's registered submodules and parameters."""
    try:
        inspect.getattr_static(obj, name)
        return True
    except AttributeError:
        pass
    d = getattr(obj, "__dict__", {})
    return any(isinstance(d.get(reg), dict) and name in d[reg] for reg in ("_modules", "_parameters", "_buffers"))


class TLAdapter(LMAdapter):
    """A TransformerLens ``HookedTransformer`` or ``TransformerBridge`` (or anything with that API subset)
    as an adapter."""

    family = "transformer_lens"

    def __init__(self, model: Any, *, bos_id: int | None = None) -> None:
        missing = [a for a in _REQUIRED if not _has(model, a)]
        if missing:
            raise CompatibilityError(
                f"{type(model).__name__} lacks {', '.join(missing)} of the HookedTransformer API",
                "pass a TransformerLens HookedTransformer (TransformerLens 3) or TransformerBridge (3 and 4)",
            )
        cfg = model.cfg
        self.module = model
        self.n_layers, self.d_model, self.n_heads = int(cfg.n_layers), int(cfg.d_model), int(cfg.n_heads)
        self.vocab_size = int(cfg.d_vocab)
        self.max_seq_len = getattr(cfg, "n_ctx", None)
        if bos_id is None:
            bos_id = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
        self.bos_id = bos_id

    def parameters(self):
        return self.module.parameters()

    def named_tensors(self) -> Mapping[str, Tensor]:
        return dict(self.module.state_dict())

    def hook_name(self, k: int) -> str:
        """The TransformerLens hook point of residual site k."""
        return f"blocks.{k}.hook_resid_pre" if k < self.n_layers else f"blocks.{k - 1}.hook_resid_post"

    def _check_tokens(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2:
            raise InputError(
                f"tokens must be a (B, T) tensor, got {getattr(tokens, 'shape', type(tokens))}",
                "pass a 2-D LongTensor of token ids",
            )
        if self.max_seq_len is not None and tokens.shape[1] > self.max_seq_len:
            raise ConfigError(
                f"sequence of {tokens.shape[1]} tokens exceeds n_ctx {self.max_seq_len}",
                f"use at most {self.max_seq_len} tokens per sequence",
            )
        return tokens.long()

    def run(
        self,
        tokens: Tensor,
        *,
        hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
        return_residuals: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        tokens = self._check_tokens(tokens)
        hk = normalise_hooks(hooks, self.n_layers)
        residuals: list[Tensor | None] = [None] * (self.n_layers + 1)
        fwd_hooks = []
        for k in range(self.n_layers + 1):
            if k not in hk and not return_residuals:
                continue

            def fn(x: Tensor, hook: Any = None, k: int = k) -> Tensor:
                for user in hk.get(k, ()):
                    new = user(x, k)
                    if new is not None:
                        if not isinstance(new, Tensor) or new.shape != x.shape:
                            raise ConfigError(
                                f"hook at resid.{k} returned {getattr(new, 'shape', type(new))}, "
                                f"expected shape {tuple(x.shape)}",
                                "return None or a same-shape tensor",
                            )
                        x = new
                residuals[k] = x
                return x

            fwd_hooks.append((self.hook_name(k), fn))
        logits = self.module.run_with_hooks(tokens, fwd_hooks=fwd_hooks)
        return (logits, residuals) if return_residuals else logits  # type: ignore[return-value]

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        names = {
            f"blocks.{l}.{h}"
            for l in range(self.n_layers)
            for h in ("hook_resid_pre", "hook_attn_out", "hook_resid_post")
        }
        caches = [
            self.module.run_with_cache(self._check_tokens(chunk[:, None]), names_filter=lambda name: name in names)[1]
            for chunk in token_ids.reshape(-1).split(_CHUNK)
        ]

        def stack(h: str) -> Tensor:
            return torch.stack([torch.cat([c[f"blocks.{l}.{h}"][:, 0] for c in caches]) for l in range(self.n_layers)])

        pre = stack("hook_resid_pre")
        return TokenStates(pre, pre + stack("hook_attn_out"), stack("hook_resid_post"))

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        if not 0 <= int(layer) < self.n_layers:
            raise ConfigError(
                f"layer {layer} out of range for a {self.n_layers}-layer model", f"use 0..{self.n_layers - 1}"
            )
        wq = self.module.W_Q[int(layer)].transpose(-1, -2)  # (H, d, dh) -> (H, dh, d)
        wk = self.module.W_K[int(layer)].transpose(-1, -2)
        return wq, wk.repeat_interleave(self.n_heads // wk.shape[0], dim=0)

    def unembed(self, h: Tensor) -> Tensor:
        return self.module.ln_final(h) @ self.module.W_U + self.module.b_U
