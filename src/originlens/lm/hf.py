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
cannot be reached.  ``transformers`` is the optional extra ``originlens[hf]``; it is imported lazily.

Q(w)'s cached ablation (:meth:`HFAdapter.run_cached`, :meth:`HFAdapter.run_positions_from`) uses the
model's own key/value cache (``past_key_values``) with per-row past lengths expressed as an attention mask
and explicit position ids.

Caveats: query/key **biases** (GPT-2, NeoX) are not part of ``qk_weights`` (as for our GPT); models are
put in eval mode; ``run`` re-runs whole sequences (no cache); ``trust_remote_code`` is always passed,
False unless the caller asks (a model's own code never runs through a prompt); other architectures raise :class:`~originlens.errors.CompatibilityError`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..errors import CompatibilityError, ConfigError, InputError
from .adapter import LMAdapter, ResidHook, TokenStates, apply_hooks, normalise_hooks

INSTALL_FIX = "pip install 'originlens[hf]' (installs transformers)"
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_CHUNK = 4096  # tokens per batch in single_token_states


def require_transformers() -> Any:
    """The ``transformers`` module, or :class:`CompatibilityError` saying how to install it."""
    try:
        import transformers
    except ImportError:
        raise CompatibilityError(
            "Hugging Face models need the optional dependency 'transformers', which is not installed", INSTALL_FIX
        ) from None
    return transformers


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' progress bars and info/warning logs for the duration of a load/save."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    level = hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------------------------------
# Families: where the pieces of each architecture live
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    """Accessors for one architecture (``m`` is the ``*ForCausalLM`` model)."""

    layers: Callable[[Any], nn.ModuleList]
    final_norm: Callable[[Any], nn.Module]
    attention: Callable[[nn.Module], nn.Module]
    qk: Callable[[Any, nn.Module], tuple[Tensor, Tensor]]  # (W_Q (H, dh, d), W_K (H_kv, dh, d))
    n_kv_heads: Callable[[Any], int]
    # what the attention module's output adds to the residual stream (Gemma-2 normalises it first)
    attn_delta: Callable[[nn.Module, Tensor], Tensor] = lambda layer, out: out


def _gpt2_qk(cfg: Any, layer: nn.Module) -> tuple[Tensor, Tensor]:
    d, H = cfg.hidden_size, cfg.num_attention_heads
    w = layer.attn.c_attn.weight  # Conv1D: (in=d, out=3d), y = x @ w + b
    return w[:, :d].T.reshape(H, d // H, d), w[:, d : 2 * d].T.reshape(H, d // H, d)


def _neox_qk(cfg: Any, layer: nn.Module) -> tuple[Tensor, Tensor]:
    d, H = cfg.hidden_size, cfg.num_attention_heads
    w = layer.attention.query_key_value.weight.view(H, 3, d // H, d)  # rows per head: [q_h | k_h | v_h]
    return w[:, 0], w[:, 1]


def _llama_qk(cfg: Any, layer: nn.Module) -> tuple[Tensor, Tensor]:
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


def _family(model_type: str) -> _Family:
    if model_type not in FAMILIES:
        raise CompatibilityError(
            f"Hugging Face model type {model_type!r} is not supported",
            f"use one of: {', '.join(FAMILIES)} (GPT-2, GPT-NeoX/Pythia, Llama, Gemma-2)",
        )
    return FAMILIES[model_type]


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


class HFAdapter(LMAdapter):
    """A Hugging Face causal LM (GPT-2, GPT-NeoX/Pythia or Llama family) behind the adapter protocol.

    ``bos_id`` defaults to the config's ``bos_token_id``; ``stop_ids`` (tokens that end a generated
    text) to the generation config's ``eos_token_id`` (an int or a list).
    """

    family = "hf"

    def __init__(self, model: Any, *, bos_id: int | None = None, source: str | None = None) -> None:
        cfg = model.config
        self.arch = _family(getattr(cfg, "model_type", ""))
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
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None) if gen is not None else None
        if eos is None:
            eos = getattr(cfg, "eos_token_id", None)
        self.stop_ids = tuple(sorted({int(e) for e in ([eos] if isinstance(eos, int) else (eos or []))}))

    # -- pieces -----------------------------------------------------------------------------------
    @property
    def layers(self) -> nn.ModuleList:
        return self.arch.layers(self.module)

    @property
    def final_norm(self) -> nn.Module:
        return self.arch.final_norm(self.module)

    def parameters(self):
        return self.module.parameters()

    def named_tensors(self) -> Mapping[str, Tensor]:
        return dict(self.module.state_dict())

    def _check_tokens(self, tokens: Tensor) -> Tensor:
        if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.shape[1] < 1:
            raise InputError(
                f"tokens must be a (B, T) tensor with T >= 1, got {getattr(tokens, 'shape', type(tokens))}",
                "pass a 2-D LongTensor of token ids",
            )
        T = tokens.shape[1]
        if self.max_seq_len is not None and self.max_seq_len < T:
            raise ConfigError(
                f"sequence of {T} tokens exceeds the model's context of {self.max_seq_len}",
                f"use at most {self.max_seq_len} tokens per sequence",
            )
        lo, hi = (int(v) for v in torch.aminmax(tokens))
        if lo < 0 or hi >= self.vocab_size:
            raise InputError(
                f"token ids span [{lo}, {hi}] outside the vocabulary [0, {self.vocab_size})",
                "use the tokenizer that belongs to the model",
            )
        return tokens.long().to(self.device)

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
        P = int(past[0][0].shape[2])
        window = self.cached_ablation_max_len
        if window is not None and P + n > window:
            raise ConfigError(
                f"the cached ablation of this model needs past + new positions ≤ its sliding window {window}, "
                f"got {P} + {n}",
                "use shorter windows, or the hooks method of Q(w)",
            )
        dev = x.device
        start = start.to(dev)
        cache = DynamicCache()
        for j in range(self.n_layers):
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
        pre, attn, post = ([[] for _ in range(self.n_layers)] for _ in range(3))

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
                        grab_out(attn, l, lambda x, layer=layer: self.arch.attn_delta(layer, x)), with_kwargs=True
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
# Loading
# --------------------------------------------------------------------------------------------------


def is_hf_dir(path: str | os.PathLike) -> bool:
    """A directory with a ``config.json`` and model weights (safetensors or a PyTorch ``.bin``)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file() and any((p / w).is_file() for w in WEIGHT_FILES)


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (hub ids then read the cache only)."""
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _chain_names(exc: BaseException) -> set[str]:
    names, seen = set(), set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names.update(c.__name__ for c in type(e).__mro__)
        e = e.__cause__ or e.__context__
    return names


def hub_error(exc: BaseException, repo_id: str, revision: str | None) -> InputError:
    """Translate a hub failure of ``from_pretrained`` into a one-line :class:`InputError`."""
    names = _chain_names(exc)
    what = f"{repo_id!r}" + (f" at revision {revision!r}" if revision else "")
    local = (
        f"download it where the hub is reachable (`hf download {repo_id}"
        + (f" --revision {revision}" if revision else "")
        + " --local-dir DIR`) and pass the local "
        "directory DIR instead of the hub id"
    )
    if "RevisionNotFoundError" in names:
        return InputError(
            f"hub model {repo_id!r} has no revision {revision!r}",
            "check the revision (branch, tag or commit), e.g. Pythia's step1000",
        )
    if "RepositoryNotFoundError" in names or "GatedRepoError" in names:
        return InputError(
            f"hub model {repo_id!r} was not found (or is gated/private)",
            "check the model id, or log in if the model is gated",
        )
    if "LocalEntryNotFoundError" in names or "OfflineModeIsEnabled" in names or "ConnectError" in names:
        return InputError(
            f"could not load hub model {what}: the Hugging Face hub could not be reached "
            "(offline or no network) and the files are not in the local cache",
            local,
        )
    msg = " ".join(str(exc).split())[:200]
    return InputError(f"could not load hub model {what} ({msg})", local)


def resolve_hf_source(path_or_id: str | os.PathLike) -> tuple[str, bool]:
    """``(source, is_local)``: an existing Hugging Face directory, or a hub id (validated)."""
    p = Path(path_or_id)
    if p.exists():
        if not p.is_dir():
            raise InputError(
                f"{p} is a file, not a Hugging Face model directory",
                "pass the directory holding config.json and the weights",
            )
        if not (p / "config.json").is_file():
            raise InputError(
                f"{p} has no config.json: not a Hugging Face model directory",
                "pass the directory written by save_pretrained (config.json + weights)",
            )
        if not any((p / w).is_file() for w in WEIGHT_FILES):
            raise InputError(
                f"{p} has no model weights ({', '.join(WEIGHT_FILES)})", "pass a complete Hugging Face model directory"
            )
        return str(p), True
    s = str(path_or_id)
    if s.startswith((".", "/", "~")) or s.count("/") > 1 or not _HUB_ID.match(s):
        raise InputError(
            f"{s} is neither an existing directory nor a Hugging Face hub id",
            "pass a local model directory or a hub id such as EleutherAI/pythia-70m",
        )
    return s, False


def load_hf_model(
    path_or_id: str | os.PathLike,
    revision: str | None = None,
    *,
    dtype: torch.dtype | str | None = torch.float32,
    local_files_only: bool | None = None,
    trust_remote_code: bool = False,
    attn_implementation: str | None = None,
    device: str | torch.device | None = None,
    allow_pickled_weights: bool = False,
) -> Any:
    """The ``transformers`` causal LM of a local directory or hub id (eval mode).

        ``dtype=None`` keeps the stored dtype (``"auto"``); the default converts to float32.  A local
        directory is always read with ``local_files_only=True``; for a hub id the default follows
        ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``.  ``trust_remote_code`` is always passed explicitly
    (default False: a directory whose ``auto_map`` needs its own code is refused, never prompted for).
        A local directory is read with ``use_safetensors=True``: one holding only pickled PyTorch weights
        (``pytorch_model.bin``) is refused with an :class:`InputError` before anything is unpickled, unless
        ``allow_pickled_weights=True`` (then ``transformers`` reads them with ``torch.load(weights_only=True)``).
    """
    tf = require_transformers()
    source, local = resolve_hf_source(path_or_id)
    if (
        local
        and not allow_pickled_weights
        and not any((Path(source) / w).is_file() for w in WEIGHT_FILES if ".safetensors" in w)
    ):
        pickled = [w for w in WEIGHT_FILES if ".safetensors" not in w and (Path(source) / w).is_file()]
        raise InputError(
            f"{source} holds only pickled PyTorch weights ({', '.join(pickled)}), which originlens does not unpickle",
            "convert them to safetensors once, in a trusted environment (transformers: "
            "AutoModelForCausalLM.from_pretrained(DIR).save_pretrained(DIR, safe_serialization=True)), "
            "or pass allow_pickled_weights=True if you trust the file",
        )
    if local and revision is not None:
        raise ConfigError(
            f"revision={revision!r} given for the local directory {source}",
            "revisions only apply to hub ids; pass the directory of that revision",
        )
    lfo = True if local else (hub_offline() if local_files_only is None else bool(local_files_only))
    kw: dict[str, Any] = {"local_files_only": lfo}
    if revision is not None:
        kw["revision"] = revision
    # always explicit: ``None`` would let transformers *ask* on stdin and run the code on "y"
    kw["trust_remote_code"] = bool(trust_remote_code)
    with quiet_transformers():
        try:
            config = tf.AutoConfig.from_pretrained(source, **kw)
        except (OSError, ValueError) as exc:
            if not trust_remote_code and "trust_remote_code" in str(exc):
                raise InputError(
                    f"{source} defines its own model code (config.json 'auto_map'), which originlens "
                    "never runs unless asked",
                    "use a model of a built-in transformers architecture, or, if you trust the code, "
                    "load it from Python with load_hf and its trust_remote_code argument set",
                ) from None
            if local:
                raise InputError(
                    f"{source}/config.json could not be read ({' '.join(str(exc).split())[:200]})",
                    "pass a directory written by save_pretrained",
                ) from None
            raise hub_error(exc, source, revision) from None
        _family(getattr(config, "model_type", ""))  # fail before downloading weights
        mkw = dict(kw)
        mkw["dtype"] = "auto" if dtype is None else dtype
        if local and not allow_pickled_weights:
            mkw["use_safetensors"] = True  # never fall back to a pickled pytorch_model.bin
        if attn_implementation is not None:
            mkw["attn_implementation"] = attn_implementation
        try:
            model = tf.AutoModelForCausalLM.from_pretrained(source, config=config, **mkw)
        except (OSError, ValueError) as exc:
            if local:
                raise InputError(
                    f"the weights in {source} could not be loaded ({' '.join(str(exc).split())[:200]})",
                    "pass a complete directory written by save_pretrained",
                ) from None
            raise hub_error(exc, source, revision) from None
    if device is not None:
        model = model.to(device)
    return model.eval()


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
) -> HFAdapter:
    """:class:`HFAdapter` of a local Hugging Face directory or hub id (see :func:`load_hf_model`; a local
    directory with only pickled ``pytorch_model.bin`` weights is refused unless ``allow_pickled_weights``)."""
    model = load_hf_model(
        path_or_id,
        revision,
        dtype=dtype,
        local_files_only=local_files_only,
        trust_remote_code=trust_remote_code,
        attn_implementation=attn_implementation,
        device=device,
        allow_pickled_weights=allow_pickled_weights,
    )
    src = str(path_or_id) + (f"@{revision}" if revision else "")
    adapter = HFAdapter(model, source=src)
    adapter.commit = None if resolve_hf_source(path_or_id)[1] else resolved_commit(str(path_or_id), revision)  # type: ignore[attr-defined]
    return adapter


def resolved_commit(repo_id: str, revision: str | None) -> str | None:
    """The hub commit that ``revision`` (a branch, tag or commit; default ``main``) of ``repo_id`` resolved
    to, read from the local cache after a load (``…/snapshots/<commit>/config.json``); None if unknown."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    path = try_to_load_from_cache(repo_id, "config.json", revision=revision or "main")
    if not isinstance(path, str):
        return None
    snap = Path(path).parent
    return snap.name if snap.parent.name == "snapshots" else None
