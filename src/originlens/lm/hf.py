"""Hugging Face causal language models behind the :class:`~originlens.lm.adapter.LMAdapter` protocol.

:class:`HFAdapter` wraps a ``transformers`` model of one of the supported families:

* ``gpt2`` (``GPT2LMHeadModel``): learned absolute positions; ``c_attn`` is a ``Conv1D`` whose weight is
  stored ``(in, out)`` with output columns ``[Q | K | V]``, each split into heads;
* ``gpt_neox`` (``GPTNeoXForCausalLM``, the Pythia models): rotary positions (often on a fraction of
  each head), ``query_key_value`` rows grouped **per head** as ``[q_h | k_h | v_h]``; with the parallel
  residual ``out = x + attn(ln1 x) + mlp(ln2 x)`` the "no MLP" representation is still
  ``E_attn = resid_pre + attn_out``;
* ``llama`` (``LlamaForCausalLM``): RMSNorm, rotary positions with ``rotate_half`` pairs ``(j, j + dh/2)``,
  grouped-query attention (query head h reads key/value head ``h // (H / H_kv)``);
* ``gemma2`` (``Gemma2ForCausalLM``, the model of arXiv 2603.14087 §9): Llama's attention layout with
  ``head_dim`` independent of d/H, embeddings scaled by √d inside the model (the residual sites see the
  scaled stream), the attention and MLP outputs normalised again before they join the residual
  (``post_attention_layernorm``: the "no MLP" state is ``resid_pre + post_attention_layernorm(attn_out)``),
  and final-logit soft-capping ``c · tanh(z / c)`` (applied by :meth:`HFAdapter.unembed` too).  Its
  attention-logit soft-capping and sliding windows act inside attention and need nothing here.

Residual sites (``resid.k``) are implemented with forward *pre*-hooks on decoder layer k (k < L) and on
the final normalisation (k = L), so a hook's return value is what the model consumes from there on.
``single_token_states`` runs every token as its own length-1 sequence (position 0; rotary embeddings are
the identity there and GPT-2 adds ``wpe[0]``), capturing layer inputs, attention-module outputs and
layer outputs.

:func:`load_hf` loads a local directory (always offline) or a hub id with ``revision=``; the hub path
fails with an :class:`~originlens.errors.InputError` that says how to use a local directory when the hub
cannot be reached (the loading itself: :mod:`.hf_hub`; the families' layouts: :mod:`.hf_families`; both
re-exported here).  ``transformers`` is the optional extra ``originlens[hf]``; it is imported lazily.

Q(w)'s cached ablation (:meth:`HFAdapter.run_cached`, :meth:`HFAdapter.run_positions_from`) uses the
model's own key/value cache (``past_key_values``) with per-row past lengths expressed as an attention mask
and explicit position ids.

Caveats: query/key **biases** (GPT-2, NeoX) are not part of ``qk_weights`` (as for our GPT); models are
put in eval mode; ``run`` re-runs whole sequences (no cache); ``trust_remote_code`` is always passed,
False unless the caller asks (a model's own code never runs through a prompt); other architectures raise :class:`~originlens.errors.CompatibilityError`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import ConfigError, InputError
from .adapter import LMAdapter, ResidHook, TokenStates, apply_hooks, normalise_hooks
from .hf_families import family_of
from .hf_hub import load_hf_model, resolve_hf_source, resolved_commit

_CHUNK = 4096  # tokens per batch in single_token_states


# --------------------------------------------------------------------------------------------------
# Adapter
# --------------------------------------------------------------------------------------------------


def _cached_kv(cache: Any, j: int) -> tuple[Tensor, Tensor]:
    """Layer j's ``(keys, values)`` of a transformers cache (``cache.layers`` from 4.56 on)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return layers[j].keys, layers[j].values
    return cache.key_cache[j], cache.value_cache[j]


def _replace_first(args: tuple, kwargs: dict, x: Tensor) -> tuple[tuple, dict]:
    if args:
        return (x, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": x}


def _first(args: tuple, kwargs: dict) -> Tensor:
    return args[0] if args else kwargs["hidden_states"]


def stop_ids_of(model: Any) -> tuple[int, ...]:
    """Tokens that end a generated text: the generation config's ``eos_token_id`` (an int or a list), else
    the model config's."""
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None) if gen is not None else None
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    return tuple(sorted({int(e) for e in ([eos] if isinstance(eos, int) else (eos or []))}))


def input_device(model: Any) -> torch.device:
    """The device of a transformers model's input embedding (its first parameter's when it has none)."""
    try:
        weight = model.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        weight = None
    return weight.device if isinstance(weight, Tensor) else next(iter(model.parameters())).device


def check_tokens(adapter: LMAdapter, tokens: Tensor) -> Tensor:
    """``tokens`` ``(B, T)`` checked against the adapter's context and vocabulary, as int64 on its device."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[1] < 1:
        raise InputError(
            f"tokens must be a (B, T) tensor with T >= 1, got {getattr(tokens, 'shape', type(tokens))}",
            "pass a 2-D LongTensor of token ids",
        )
    T = tokens.shape[1]
    if adapter.max_seq_len is not None and adapter.max_seq_len < T:
        raise ConfigError(
            f"sequence of {T} tokens exceeds the model's context of {adapter.max_seq_len}",
            f"use at most {adapter.max_seq_len} tokens per sequence",
        )
    lo, hi = (int(v) for v in torch.aminmax(tokens))
    if lo < 0 or hi >= adapter.vocab_size:
        raise InputError(
            f"token ids span [{lo}, {hi}] outside the vocabulary [0, {adapter.vocab_size})",
            "use the tokenizer that belongs to the model",
        )
    return tokens.long().to(adapter.device)


class HFModule:
    """What every adapter around a Hugging Face ``module`` shares: its parameters, its weights by name and
    the device its inputs go to (the input embedding's: a ``device_map`` may spread the layers)."""

    module: Any  # a transformers PreTrainedModel

    def parameters(self):
        return self.module.parameters()

    @property
    def device(self) -> torch.device:
        return input_device(self.module)

    def named_tensors(self) -> Mapping[str, Tensor]:
        return dict(self.module.state_dict())


class HFAdapter(HFModule, LMAdapter):
    """A Hugging Face causal LM (GPT-2, GPT-NeoX/Pythia or Llama family) behind the adapter protocol.

    ``bos_id`` defaults to the config's ``bos_token_id``; ``stop_ids`` (tokens that end a generated
    text) to the generation config's ``eos_token_id`` (an int or a list).
    """

    family = "hf"

    def __init__(self, model: Any, *, bos_id: int | None = None, source: str | None = None) -> None:
        cfg = model.config
        self.arch = family_of(getattr(cfg, "model_type", ""))
        self.module = model.eval()
        self.config = cfg
        self.model_type = cfg.model_type
        self.source = source
        self.n_layers = int(cfg.num_hidden_layers)
        self.d_model = int(cfg.hidden_size)
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv_heads = int(self.arch.n_kv_heads(cfg))
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_seq_len = getattr(cfg, "max_position_embeddings", None)
        self.bos_id = bos_id if bos_id is not None else getattr(cfg, "bos_token_id", None)
        self.stop_ids = stop_ids_of(model)

    # -- pieces -----------------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return self.arch.layers(self.module)

    @property
    def final_norm(self) -> nn.Module:
        return self.arch.final_norm(self.module)

    def _check_tokens(self, tokens: Tensor) -> Tensor:
        return check_tokens(self, tokens)

    # -- protocol ---------------------------------------------------------------------------------
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

        def site(k: int):
            def pre_hook(module: nn.Module, args: tuple, kwargs: dict):
                x = apply_hooks(k, _first(args, kwargs), hk)
                residuals[k] = x
                return _replace_first(args, kwargs, x)

            return pre_hook

        handles = []
        try:
            for k in range(self.n_layers + 1):
                if return_residuals or k in hk:
                    mod = self.layers[k] if k < self.n_layers else self.final_norm
                    handles.append(mod.register_forward_pre_hook(site(k), with_kwargs=True))
            logits = self.module(input_ids=tokens, use_cache=False).logits
        finally:
            for h in handles:
                h.remove()
        return (logits, residuals) if return_residuals else logits  # type: ignore[return-value]

    # -- cached ablation (Q(w)): the model's own key/value cache -------------------------------------
    def run_cached(self, tokens: Tensor, k: int) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
        """A clean run with transformers' key/value cache (:meth:`LMAdapter.run_cached`): the last block's
        output, the stream at site k and the cached ``(keys, values)`` of the blocks above k, each
        ``(B, n_kv, T, head_dim)`` (keys as the model caches them, e.g. rotated)."""
        from transformers import DynamicCache

        tokens = self._check_tokens(tokens)
        k = self.check_site(k)
        got: dict[int, Tensor] = {}

        def grab(j: int):
            def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
                got[j] = _first(args, kwargs)

            return pre_hook

        handles = []
        try:
            for j in {k, self.n_layers}:
                mod = self.layers[j] if j < self.n_layers else self.final_norm
                handles.append(mod.register_forward_pre_hook(grab(j), with_kwargs=True))
            # a cache without the config: every layer keeps all positions (no sliding-window eviction)
            out = self._forward_cached(DynamicCache(), input_ids=tokens)
            cache = out.cache if "cache" in out else out.past_key_values
        finally:
            for h in handles:
                h.remove()
        past = [_cached_kv(cache, j) for j in range(k, self.n_layers)]
        return got[self.n_layers], got[k], past

    @property
    def cached_ablation_max_len(self) -> int | None:
        """Past + new positions :meth:`run_positions_from` can take: the sliding attention window of models
        that have one (Gemma-2, Mistral), else unlimited (None)."""
        w = getattr(self.config, "sliding_window", None)
        return int(w) if w else None

    def _forward_cached(self, cache: Any, **kwargs: Any) -> Any:
        """The model's forward with a key/value cache, under the keyword this transformers version uses
        (``cache`` from 5.x on, ``past_key_values`` before)."""
        import inspect

        params = inspect.signature(self.module.forward).parameters
        key = "cache" if "cache" in params else "past_key_values"
        return self.module(**kwargs, use_cache=True, **{key: cache})

    def run_positions_from(self, k: int, x: Tensor, start: Tensor, past: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        """:meth:`LMAdapter.run_positions_from` through the model's own forward: the n new positions run
        with the cached clean past (rows' pasts right-padded; a 2-D attention mask hides each row's
        entries at positions ≥ ``start[b]``) and explicit position ids ``start[b] + i``; the stream entering
        block k is replaced by ``x`` (blocks below k run on placeholder tokens and zero pasts, their output
        discarded).  Models with a sliding window need ``past length + n ≤ window`` (the mask is built
        from cache indices, which equal positions only then)."""
        from transformers import DynamicCache

        k = self.check_site(k)
        B, n, _ = x.shape
        if k == self.n_layers:
            return self.unembed(x)
        dev = x.device
        start = start.to(dev)
        # columns at or past every row's start are masked for all rows: drop them, so the keys never
        # outnumber the positions the model has (GPT-2's eager attention in transformers 4.x slices its
        # causal mask buffer by key count)
        P = min(int(past[0][0].shape[2]), int(start.max()) if B else 0)
        past = [(kk[:, :, :P], vv[:, :, :P]) for kk, vv in past]
        window = self.cached_ablation_max_len
        if window is not None and P + n > window:
            raise ConfigError(
                f"the cached ablation of this model needs past + new positions ≤ its sliding window {window}, "
                f"got {P} + {n}",
                "use shorter windows, or the hooks method of Q(w)",
            )
        cache = DynamicCache()
        for j in range(self.n_layers if P else 0):
            kv = past[j - k] if j >= k else tuple(torch.zeros_like(t) for t in past[0])
            cache.update(kv[0], kv[1], j)
        mask = torch.cat(
            [torch.arange(P, device=dev)[None, :] < start[:, None], torch.ones(B, n, dtype=torch.bool, device=dev)], 1
        ).long()
        positions = start[:, None] + torch.arange(n, device=dev)[None, :]

        def put(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return _replace_first(args, kwargs, x)

        handle = self.layers[k].register_forward_pre_hook(put, with_kwargs=True)
        try:
            out = self._forward_cached(
                cache,
                input_ids=torch.zeros(B, n, dtype=torch.long, device=dev),
                attention_mask=mask,
                position_ids=positions,
            )
        finally:
            handle.remove()
        return out.logits

    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        ids = token_ids.reshape(-1)
        pre: list[list[Tensor]] = [[] for _ in range(self.n_layers)]
        attn: list[list[Tensor]] = [[] for _ in range(self.n_layers)]
        post: list[list[Tensor]] = [[] for _ in range(self.n_layers)]

        def grab_pre(l: int):
            def fn(module, args, kwargs):
                pre[l].append(_first(args, kwargs)[:, 0])

            return fn

        def grab_out(store: list, l: int, delta: Callable[[Tensor], Tensor] = lambda x: x):
            def fn(module, args, kwargs, out):
                store[l].append(delta(out[0] if isinstance(out, tuple) else out)[:, 0])

            return fn

        handles = []
        try:
            for l, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(grab_pre(l), with_kwargs=True))
                handles.append(layer.register_forward_hook(grab_out(post, l), with_kwargs=True))
                handles.append(
                    self.arch.attention(layer).register_forward_hook(
                        grab_out(attn, l, functools.partial(self.arch.attn_delta, layer)), with_kwargs=True
                    )
                )
            for chunk in ids.split(_CHUNK):
                self.module(input_ids=self._check_tokens(chunk[:, None]), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        P = torch.stack([torch.cat(p) for p in pre])
        A = torch.stack([torch.cat(a) for a in attn])
        return TokenStates(P, P + A, torch.stack([torch.cat(p) for p in post]))

    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        if not 0 <= int(layer) < self.n_layers:
            raise ConfigError(
                f"layer {layer} out of range for a {self.n_layers}-layer model", f"use 0..{self.n_layers - 1}"
            )
        wq, wk = self.arch.qk(self.config, self.layers[int(layer)])
        return wq, wk.repeat_interleave(self.n_heads // wk.shape[0], dim=0)

    def unembed(self, h: Tensor) -> Tensor:
        """Logits of residual states ``h`` (..., d): final norm, output embedding, and the final-logit
        soft-capping ``c · tanh(z / c)`` of models that have one (Gemma-2: ``final_logit_softcapping``)."""
        z = self.module.get_output_embeddings()(self.final_norm(h))
        cap = getattr(self.config, "final_logit_softcapping", None)
        return z if not cap else torch.tanh(z / cap) * cap


# --------------------------------------------------------------------------------------------------
# Loading (the transformers and hub plumbing itself: .hf_hub)
# --------------------------------------------------------------------------------------------------


def load_hf(
    path_or_id: str | os.PathLike,
    revision: str | None = None,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    local_files_only: bool | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
    allow_pickled_weights: bool = False,
    device_map: str | dict[str, Any] | None = None,
) -> HFAdapter:
    """:class:`HFAdapter` of a local Hugging Face directory or hub id (see :func:`load_hf_model`; a local
    directory with only pickled ``pytorch_model.bin`` weights is refused unless ``allow_pickled_weights``;
    ``device_map`` is passed to ``from_pretrained``)."""
    return wrap_loaded(
        HFAdapter,
        path_or_id,
        revision,
        dtype=dtype,
        local_files_only=local_files_only,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        device=device,
        allow_pickled_weights=allow_pickled_weights,
        device_map=device_map,
    )


def wrap_loaded(cls: Any, path_or_id: str | os.PathLike, revision: str | None, **load_kw: Any) -> Any:
    """``cls(model)`` for the model :func:`load_hf_model` loads with ``load_kw``, with its source and, for
    a hub id, the resolved commit (``adapter.commit``; None for a local directory)."""
    model = load_hf_model(path_or_id, revision, **load_kw)
    adapter = cls(model, source=str(path_or_id) + (f"@{revision}" if revision else ""))
    adapter.commit = None if resolve_hf_source(path_or_id)[1] else resolved_commit(str(path_or_id), revision)
    return adapter
