"""Any Hugging Face causal LM behind the :class:`~originlens.lm.adapter.LMAdapter` protocol, through nnsight.

:class:`GenericHFAdapter` is the residual-stream backend for architectures without a hand-written entry
in :mod:`.hf_families` (tested on Qwen2, Mistral, Phi, OPT and GPT-J; the table's GPT-2, Llama and Gemma-2
give the hand-written adapter's numbers exactly).  Residual sites are read and replaced inside an nnsight trace
(``NNsight(model).trace(...)``): ``resid.k`` for k < L is the first input of decoder layer k, ``resid.L``
the first input of the final normalisation, so ``resid.0`` is the embedding output as the model feeds
it to block 1 (positions and Gemma's √d scaling included) and ``resid.L`` the last block's output
**before** the final norm.  A hook's returned tensor is written back as that input, so it replaces the
stream from there on (the contract of :class:`~originlens.lm.hf.HFAdapter`; both run the model's own
forward).

Nothing is named per family.  The decoder layers are the model's ``nn.ModuleList`` with
``num_hidden_layers`` entries (the one holding the most parameters if several have that length); the
final norm is the normalisation module registered next to that list (``norm``, ``ln_f``,
``final_layer_norm``, ``final_layernorm``, …).  :meth:`GenericHFAdapter.unembed` is that norm, the
output embedding and the config's final-logit post-processing (Gemma-2's soft-capping
``c · tanh(z / c)``, Cohere's ``logit_scale``, Granite's ``logits_scaling``), cast to the dtype of the
model's own logits where the model casts them (GPT-J in transformers 4.x: float32).  Construction runs a
4-token probe and refuses (:class:`~originlens.errors.CompatibilityError`) a model whose logits are not
``unembed(resid.L)`` — an architecture doing more after its last block than these pieces — instead of
returning wrong residuals silently.

Shapes: tokens ``(B, T)`` int64; logits ``(B, T, V)``; residuals L+1 tensors ``(B, T, d)`` in the
model's dtype and device.

Caveats:

* ``nnsight`` (``pip install nnsight``; 0.8 tested) is imported only when an adapter is built.
  Importing it has process-wide effects: by default it mounts a ``.save`` method on every Python object
  and patches ``Tensor.backward``; wrapping a model instruments each of its submodules (inert outside
  a trace).  nnsight compiles a trace's body from this module's source file at the first call, so the
  file must be present and unchanged since import.
* ``single_token_states`` and ``qk_weights`` (only ``lm compare`` uses them) need the per-family layout
  of attention weights and raise :class:`~originlens.errors.ConfigError`; use a family of
  :mod:`.hf_families` for ``lm compare``.
* No cached ablation: Q(w) uses its hooks method (a whole re-run per intervention), no incremental
  decoding (generation re-runs the prefix).
* One trace at a time per adapter (not thread-safe); each call costs a few tenths of a millisecond of
  CPU more than plain torch hooks (``benchmarks/generic_backend.py``).
* Models whose decoder layers do not receive the stream as their first argument, encoder-decoder models
  and multimodal wrappers are not covered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from ..errors import CompatibilityError, ConfigError
from .adapter import LMAdapter, ResidHook, TokenStates, apply_hooks, normalise_hooks
from .hf import HFModule, check_tokens, stop_ids_of, wrap_loaded

INSTALL = "pip install nnsight"
NORM_NAMES = ("norm", "ln_f", "final_layer_norm", "final_layernorm", "norm_f", "final_norm", "ln_final")
_PROBE = 4  # tokens of the construction-time check


def require_nnsight() -> Any:
    """The ``nnsight`` module, or :class:`ConfigError` naming the install command."""
    try:
        import nnsight
    except ImportError:
        raise ConfigError("the generic Hugging Face backend needs the optional package nnsight", INSTALL) from None
    return nnsight


def has_nnsight() -> bool:
    """Whether ``nnsight`` can be imported (without importing it)."""
    import importlib.util
    import sys

    if "nnsight" in sys.modules:
        return sys.modules["nnsight"] is not None
    return importlib.util.find_spec("nnsight") is not None


# --------------------------------------------------------------------------------------------------
# Finding the decoder layers and the final norm
# --------------------------------------------------------------------------------------------------


def _n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def find_layers(model: nn.Module) -> str:
    """Dotted name of the ``nn.ModuleList`` of decoder layers: length ``config.num_hidden_layers`` (when
    the config says), the most parameters among candidates; :class:`CompatibilityError` if there is none."""
    n = getattr(model.config, "num_hidden_layers", None)
    cands = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) > 0 and (n is None or len(m) == int(n)) and _n_params(m) > 0
    ]
    if not cands:
        raise CompatibilityError(
            f"no list of {n} decoder layers found in {type(model).__name__}",
            "use a decoder-only causal LM of transformers",
        )
    return max(cands, key=lambda c: _n_params(c[1]))[0]


def find_final_norm(model: nn.Module, layers_path: str) -> str:
    """Dotted name of the final normalisation: a norm-named sibling of the layer list, registered after it
    (the last one when several are)."""
    parent_path, _, list_name = layers_path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    names = list(parent._modules)
    after = names[names.index(list_name) + 1 :] + names[: names.index(list_name)]
    found = [
        c
        for c in after
        if parent._modules[c] is not None and (c in NORM_NAMES or "norm" in type(parent._modules[c]).__name__.lower())
    ]
    if not found:
        raise CompatibilityError(
            f"no final normalisation found next to {layers_path} in {type(model).__name__}",
            "this architecture needs a hand-written adapter (lm/hf_families.py)",
        )
    return f"{parent_path}.{found[0]}" if parent_path else found[0]


def _envoy_at(root: Any, path: str, model: nn.Module) -> Any:
    """The nnsight envoy of submodule ``path`` (nnsight renames children that clash with its own
    attributes ``E_<name>``)."""
    env, mod = root, model
    for part in path.split("."):
        mod = mod._modules[part]  # type: ignore[assignment]
        nxt = getattr(env, part, None)
        if getattr(nxt, "_module", None) is not mod:
            nxt = getattr(env, f"E_{part}")
        env = nxt
    return env


# --------------------------------------------------------------------------------------------------
# Adapter
# --------------------------------------------------------------------------------------------------


class GenericHFAdapter(HFModule, LMAdapter):
    """Any Hugging Face causal LM behind the adapter protocol (see the module docstring).

    ``bos_id`` defaults to the config's ``bos_token_id``; ``stop_ids`` to the generation config's
    ``eos_token_id``.  ``check=False`` skips the construction-time probe.
    """

    family = "hf-generic"

    def __init__(self, model: Any, *, bos_id: int | None = None, source: str | None = None, check: bool = True):
        nnsight = require_nnsight()
        cfg = model.config
        self.module = model.eval()
        self.config = cfg
        self.model_type = getattr(cfg, "model_type", "")
        self.source = source
        self.layers_path = find_layers(model)
        self.norm_path = find_final_norm(model, self.layers_path)
        self.n_layers = len(self.layers)
        self.d_model = int(getattr(cfg, "hidden_size", 0) or self.module.get_input_embeddings().weight.shape[1])
        self.n_heads = int(getattr(cfg, "num_attention_heads", 0) or 0)
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_seq_len = getattr(cfg, "max_position_embeddings", None)
        self.bos_id = bos_id if bos_id is not None else getattr(cfg, "bos_token_id", None)
        self.stop_ids = stop_ids_of(model)
        self._nnsight = nnsight
        self._root = nnsight.NNsight(model)
        self._layer_envs = _envoy_at(self._root, self.layers_path, model)
        self._norm_env = _envoy_at(self._root, self.norm_path, model)
        self.logits_dtype: torch.dtype | None = None  # set by the probe when the model casts its logits
        if check:
            self._check_unembedding()

    # -- pieces -----------------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return self.module.get_submodule(self.layers_path)

    @property
    def final_norm(self) -> nn.Module:
        return self.module.get_submodule(self.norm_path)

    def _check_unembedding(self) -> None:
        """Refuse a model whose logits are not ``unembed(resid.L)`` or whose stream is not ``d_model`` wide."""
        T = _PROBE if self.max_seq_len is None else max(1, min(_PROBE, int(self.max_seq_len)))
        probe = (torch.arange(T, device=self.device)[None] * 7919) % self.vocab_size
        with torch.no_grad():
            logits, res = self.run(probe, return_residuals=True)
            again = self.unembed(res[-1])
        if res[0].shape[-1] != self.d_model:
            self.d_model = int(res[0].shape[-1])
        if logits.dtype != again.dtype:  # e.g. GPT-J in transformers 4.x returns float32 logits
            self.logits_dtype = logits.dtype
            again = again.to(logits.dtype)
        tol = 1e-4 if logits.dtype in (torch.float32, torch.float64) else 3e-2
        err = float((again.float() - logits.float()).abs().max()) / (float(logits.float().abs().max()) + 1e-6)
        if not err <= tol:
            raise CompatibilityError(
                f"{type(self.module).__name__}: the logits are not final norm ({self.norm_path}) + output "
                f"embedding of the last block's output (relative difference {err:.2g})",
                "this architecture needs a hand-written adapter (lm/hf_families.py)",
            )

    # -- protocol ---------------------------------------------------------------------------------
    def run(
        self,
        tokens: Tensor,
        *,
        hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
        return_residuals: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        tokens = check_tokens(self, tokens)
        hk = normalise_hooks(hooks, self.n_layers)
        L = self.n_layers
        sites = [k for k in range(L + 1) if return_residuals or k in hk]
        envs = [self._layer_envs[k] if k < L else self._norm_env for k in sites]
        residuals: list[Tensor | None] = [None] * (L + 1)
        out: list[Any] = []
        # The body runs interleaved with the forward: each ``.input`` read waits for that module to be
        # called, each assignment replaces what it receives.  Sites are visited in execution order.
        with self._root.trace(input_ids=tokens, use_cache=False):
            for k, env in zip(sites, envs, strict=True):
                x = env.input
                y = apply_hooks(k, x, hk)
                if y is not x:
                    env.input = y
                residuals[k] = y
            out.append(self._root.output)
        logits = out[0].logits if hasattr(out[0], "logits") else out[0][0]
        return (logits, residuals) if return_residuals else logits  # type: ignore[return-value]

    def unembed(self, h: Tensor) -> Tensor:
        """Logits of residual states ``h`` ``(..., d)``: final norm, output embedding, then the config's
        final-logit post-processing (``final_logit_softcapping``, ``logit_scale``, ``logits_scaling``)."""
        z = self.module.get_output_embeddings()(self.final_norm(h))
        cfg = self.config
        scale = getattr(cfg, "logit_scale", None)
        if isinstance(scale, (int, float)) and scale:
            z = z * scale
        div = getattr(cfg, "logits_scaling", None)
        if isinstance(div, (int, float)) and div:
            z = z / div
        cap = getattr(cfg, "final_logit_softcapping", None)
        z = z if not cap else torch.tanh(z / cap) * cap
        return z if self.logits_dtype is None else z.to(self.logits_dtype)

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        raise ConfigError(
            f"single-token states (lm compare) are not available for {self.model_type!r} through the generic backend",
            "they need a hand-written family (GPT-2, GPT-NeoX/Pythia, Llama, Gemma-2: backend 'hf')",
        )

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        raise ConfigError(
            f"query/key weights (lm compare) are not available for {self.model_type!r} through the generic backend",
            "they need a hand-written family (GPT-2, GPT-NeoX/Pythia, Llama, Gemma-2: backend 'hf')",
        )


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def load_generic(
    path_or_id: str | os.PathLike,
    revision: str | None = None,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    local_files_only: bool | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
    allow_pickled_weights: bool = False,
) -> GenericHFAdapter:
    """:class:`GenericHFAdapter` of a local Hugging Face directory or hub id, loaded as
    :func:`~originlens.lm.hf_hub.load_hf_model` does (any architecture)."""
    require_nnsight()  # before reading any weight
    return cast(
        GenericHFAdapter,
        wrap_loaded(
            GenericHFAdapter,
            path_or_id,
            revision,
            dtype=dtype,
            local_files_only=local_files_only,
            trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation,
            device=device,
            allow_pickled_weights=allow_pickled_weights,
            any_architecture=True,
        ),
    )
