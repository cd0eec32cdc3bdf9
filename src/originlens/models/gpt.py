"""GPT-2-style decoder for the gradient-pathways lab (arXiv 2603.14087).

Architecture: pre-LayerNorm GPT-2 decoder; token + learned absolute position embeddings; ``n_layer``
blocks ``x + attn(ln_1(x))`` then ``x + mlp(ln_2(x))`` (MLP width ``mlp_ratio·d``, GELU tanh
approximation); final LayerNorm; LM head tied to the token embedding by default; dropout 0 by default;
GPT-2 initialisation (std 0.02, residual output projections std ``0.02/sqrt(2L)``, zero biases).

Training regimes (``GPTConfig.regime``; the myopic and untied regimes of arXiv 2603.14087):

* ``standard``: fused ``scaled_dot_product_attention`` (``attn_impl="sdpa"``) or the eager path
  (``attn_impl="eager"``: ``softmax(mask(QKᵀ·scale)) @ V``).
* ``myopic``: in every attention layer the keys and values of positions ``j ≠ t`` are detached
  for query ``t``; the diagonal stays live.  Forward values are bit-identical to the **eager** standard
  path (same kernels on the same values; the SDPA path differs from eager by rounding only).  Myopia is
  per instance (``model.is_myopic``), per call (``model(tokens, myopic=True)``) or temporary
  (``with model.myopic(): ...``); there is no global state.
* ``untied`` with ``untie_at=[m1, m2, ...]`` or ``"all"``: one independent parameter copy per
  position range ``[0, m1), [m1, m2), ..., [m_last, n_positions)`` (0-based range indices).  Each
  range's tokens go through their own copy (LayerNorms, Q/K/V, output projection, MLP); attention is
  one causal attention over the whole prefix, so a later range reads earlier ranges' keys/values **with
  gradient**.  ``untie_scope="everything"`` (the default: the paper's untied model, a complete second
  model, see ``docs/protocol.md``) duplicates the blocks, the embeddings, the final LayerNorm and the
  head; ``"blocks"`` duplicates only the blocks.  ``untie_init`` =
  ``"independent"`` draws every copy separately, ``"shared"`` copies range 0's initial state into every
  range.
* ``myopic+untied``: both; cross-range key/value reads are myopic as well.

Residual sites and hooks (TransformerLens spirit): the site ``"resid.{k}"``, k = 0..L, is the residual
stream r^k (B, T, d) after k blocks: k = 0 right after the embedding sum, k ≥ 1 after block k's MLP
residual add, k = L **before** the final LayerNorm.  ``model(tokens, hooks={"resid.1": fn})`` (or
``model.run_with_hooks``) calls ``fn(tensor, site)`` with the tensor the next stage is about to consume
and a :class:`ResidSite` (``site.positions`` = the absolute positions the tensor covers); a returned
tensor of the same shape replaces it, ``None`` keeps it.  ``return_residuals=True`` returns the tensors
the downstream computation actually consumes (after any hook replacement), so ``retain_grad()``,
``torch.autograd.grad`` or tensor hooks on them give true adjoints.  Example (stop-gradient at
position i): ``lambda h, site: h + m_i * (h.detach() - h)``.

Losses: :func:`position_losses` returns ``ω_{b,t} ℓ_{b,t}`` (B, T−1) where logits at t predict
token t+1; ``λ_t`` is its column sum and the training loss is the total sum.  Default weights are
``1/(B(T−1))``; express masking through the weights, never by dropping entries.

Caveats: myopic/eager attention materialises the (B, H, T, T) score matrix; untied ranges are processed
by a Python loop over ranges (fine for a few ranges; ``untie_at="all"`` costs one small matmul per
position and layer); between blocks the untied stream is held as one tensor per range and concatenated
only at residual sites that are hooked or returned.  No KV cache.

Size: one model in one file, as nanoGPT's ``model.py``: the configuration, the attention kernels, the block
with its untied copies, the residual-site hooks and the loss are read together whenever the model changes,
and the pathway decomposition (:mod:`originlens.attribution.structured`) mirrors this block line by line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import CompatibilityError, ConfigError, InputError
from ..sites import site_name

REGIMES = ("standard", "myopic", "untied", "myopic+untied")
UNTIE_SCOPES = ("blocks", "everything")
UNTIE_INITS = ("independent", "shared")
ATTN_IMPLS = ("sdpa", "eager")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
INIT_STD = 0.02
LN_EPS = 1e-5

Hook = Callable[[torch.Tensor, "ResidSite"], "torch.Tensor | None"]


# ----------------------------------------------------------------------------------------------------
# Configuration


@dataclass
class GPTConfig:
    """Hyper-parameters of :class:`GPT` (validated on construction; raises ``ConfigError``)."""

    vocab_size: int
    seq_len: int
    n_layer: int
    d_model: int
    n_head: int
    mlp_ratio: int = 4
    tie_embeddings: bool = True
    regime: str = "standard"  # one of REGIMES
    untie_at: Sequence[int] | str | None = None  # range boundaries (0 < m < seq_len, increasing) or "all"
    untie_scope: str = "everything"  # "everything" (the paper's untied model) | "blocks"
    untie_init: str = "independent"  # "independent" | "shared"
    n_positions: int | None = None  # position-table size; None = seq_len
    dtype: str = "float32"  # key of DTYPES (a torch.dtype is accepted and normalised)
    dropout: float = 0.0
    attn_impl: str = "sdpa"  # standard-regime kernel: "sdpa" | "eager"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "n_layer", "d_model", "n_head", "mlp_ratio"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(
                    f"GPTConfig.{name} must be a positive integer, got {v!r}", f"set {name} to an integer ≥ 1"
                )
        if self.d_model % self.n_head:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_head={self.n_head}", "choose n_head dividing d_model"
            )
        if self.regime not in REGIMES:
            raise ConfigError(f"unknown regime {self.regime!r}", f"use one of: {', '.join(REGIMES)}")
        if self.untie_scope not in UNTIE_SCOPES:
            raise ConfigError(f"unknown untie_scope {self.untie_scope!r}", f"use one of: {', '.join(UNTIE_SCOPES)}")
        if self.untie_init not in UNTIE_INITS:
            raise ConfigError(f"unknown untie_init {self.untie_init!r}", f"use one of: {', '.join(UNTIE_INITS)}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ConfigError(f"unknown attn_impl {self.attn_impl!r}", f"use one of: {', '.join(ATTN_IMPLS)}")
        if isinstance(self.dtype, torch.dtype):
            names = {v: k for k, v in DTYPES.items()}
            if self.dtype not in names:
                raise ConfigError(f"unsupported dtype {self.dtype}", f"use one of: {', '.join(DTYPES)}")
            self.dtype = names[self.dtype]
        if self.dtype not in DTYPES:
            raise ConfigError(f"unsupported dtype {self.dtype!r}", f"use one of: {', '.join(DTYPES)}")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            raise ConfigError(f"dropout must be in [0, 1), got {self.dropout!r}", "set dropout=0 (default)")
        if self.n_positions is None:
            self.n_positions = self.seq_len
        if (
            isinstance(self.n_positions, bool)
            or not isinstance(self.n_positions, int)
            or self.n_positions < self.seq_len
        ):
            raise ConfigError(
                f"n_positions={self.n_positions!r} must be an integer ≥ seq_len={self.seq_len}",
                "leave n_positions unset (= seq_len) or enlarge it",
            )
        self._check_untie_at()

    def _check_untie_at(self) -> None:
        untied = "untied" in self.regime
        if self.untie_at is None:
            if untied:
                raise ConfigError(
                    f"regime {self.regime!r} needs untie_at",
                    "pass untie_at=[m, ...] (range boundaries) or untie_at='all'",
                )
            return
        if not untied:
            raise ConfigError(
                f"untie_at={self.untie_at!r} given but regime is {self.regime!r}",
                "use regime='untied' or 'myopic+untied', or drop untie_at",
            )
        if isinstance(self.untie_at, str):
            if self.untie_at != "all":
                raise ConfigError(
                    f"untie_at={self.untie_at!r} is not understood",
                    "pass a list of increasing positions or the string 'all'",
                )
            if self.seq_len < 2:
                raise ConfigError("untie_at='all' needs seq_len ≥ 2", "increase seq_len")
            return
        try:
            bounds = list(self.untie_at)
        except TypeError:
            raise ConfigError(f"untie_at={self.untie_at!r} is not a list", "pass e.g. untie_at=[10]") from None
        if not bounds or any(isinstance(m, bool) or not isinstance(m, int) for m in bounds):
            raise ConfigError(
                f"untie_at={self.untie_at!r} must be a non-empty list of integers", "pass e.g. untie_at=[10]"
            )
        bad = [m for m in bounds if not 0 < m < self.seq_len]
        if bad:
            raise ConfigError(
                f"untie_at boundaries {bad} are outside (0, seq_len={self.seq_len})",
                f"use boundaries 1..{self.seq_len - 1}",
            )
        if any(b <= a for a, b in zip(bounds, bounds[1:])):
            raise ConfigError(
                f"untie_at={bounds} is not strictly increasing", "sort the boundaries and remove duplicates"
            )
        self.untie_at = tuple(bounds)

    # -- derived --------------------------------------------------------------------------------------
    @property
    def myopic(self) -> bool:
        return self.regime.startswith("myopic")

    @property
    def untied(self) -> bool:
        return "untied" in self.regime

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def ranges(self) -> list[tuple[int, int]]:
        """Position ranges ``[(start, stop), ...]`` with one parameter copy each (one range if not untied)."""
        if self.untie_at is None:
            bounds: list[int] = []
        elif self.untie_at == "all":
            bounds = list(range(1, self.seq_len))
        else:
            bounds = list(cast("Sequence[int]", self.untie_at))  # validated: a tuple of boundaries
        assert self.n_positions is not None  # set by __post_init__
        edges = [0, *bounds, self.n_positions]
        return list(zip(edges[:-1], edges[1:]))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if isinstance(d["untie_at"], tuple):
            d["untie_at"] = list(d["untie_at"])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "GPTConfig") -> GPTConfig:
        """Build from a mapping (unknown keys, wrong types: ConfigError; see ``originlens.config``)."""
        from ..config import from_mapping

        return from_mapping(cls, d, where=where)


@dataclass(frozen=True)
class ResidSite:
    """What a hook is told about the tensor it receives: site name, layer k and covered positions."""

    name: str  # "resid.{k}"
    layer: int  # k (blocks applied)
    positions: slice  # absolute positions of the tensor's dim 1 (always slice(0, T): no KV cache)


# ----------------------------------------------------------------------------------------------------
# Attention


def causal_self_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    myopic: bool = False,
    impl: str = "sdpa",
    dropout_p: float = 0.0,
    future: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal multi-head attention ``(B, H, T, hd) × 3 -> (B, H, T, hd)``.

    ``myopic=False, impl="sdpa"``: fused kernel (falls back to eager where the kernel lacks support,
    e.g. forward-mode AD on CPU).  ``impl="eager"``: ``softmax(mask(QKᵀ·scale)) @ V``.
    ``myopic=True`` (always eager): ``S = where(I, QKᵀ, Q sg(K)ᵀ)·scale``, causal mask,
    softmax, ``O = A @ sg(V) + diag(A)[..., None] * (V − sg(V))``.  The live diagonal of S is added as
    ``diag(sg(Q)·K − sg(sg(Q)·K))`` (value exactly 0, gradient ``q_t`` into ``k_t``) so that the values
    are bit-identical to the eager path without a second T×T matmul.  ``future`` is an optional
    precomputed (T, T) bool mask of the entries j > t.
    """
    T, hd = q.shape[-2], q.shape[-1]
    if not myopic and impl == "sdpa":
        try:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        except NotImplementedError:  # e.g. forward-mode AD (torch.func.jvp) on the CPU kernel: go eager
            pass
    if future is None:
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scale = 1.0 / math.sqrt(hd)
    if myopic:
        scores = q @ k.detach().transpose(-2, -1)
        diag_live = (q.detach() * k).sum(-1)  # (B, H, T)
        scores = scores + torch.diag_embed(diag_live - diag_live.detach())  # + 0, live in k_t
    else:
        scores = q @ k.transpose(-2, -1)
    att = torch.softmax((scores * scale).masked_fill(future, float("-inf")), dim=-1)
    if dropout_p > 0.0:
        att = F.dropout(att, dropout_p, training=True)
    if myopic:
        v_det = v.detach()
        return att @ v_det + att.diagonal(dim1=-2, dim2=-1).unsqueeze(-1) * (v - v_det)
    return att @ v


# ----------------------------------------------------------------------------------------------------
# Modules (one "copy" = the parameters of one position range)


class EmbedCopy(nn.Module):
    """Token and position embedding tables of one range (or of all positions)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        dt = cfg.torch_dtype
        assert cfg.n_positions is not None  # set by GPTConfig.__post_init__
        self.wte = nn.Embedding(cfg.vocab_size, cfg.d_model, dtype=dt)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.d_model, dtype=dt)

    def forward(self, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """(B, t) tokens at absolute positions start..start+t−1 -> (B, t, d)."""
        return self.wte(tokens) + self.wpe.weight[start : start + tokens.shape[1]]


class BlockCopy(nn.Module):
    """Weights of one transformer block for one position range."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        d, dt = cfg.d_model, cfg.torch_dtype
        self.ln_1 = nn.LayerNorm(d, eps=LN_EPS, dtype=dt)
        self.attn_qkv = nn.Linear(d, 3 * d, dtype=dt)  # rows: [W_Q; W_K; W_V]
        self.attn_out = nn.Linear(d, d, dtype=dt)  # residual projection
        self.ln_2 = nn.LayerNorm(d, eps=LN_EPS, dtype=dt)
        self.mlp_in = nn.Linear(d, cfg.mlp_ratio * d, dtype=dt)
        self.mlp_out = nn.Linear(cfg.mlp_ratio * d, d, dtype=dt)  # residual projection


class Block(nn.Module):
    """One pre-LN block whose parameters are copied per position range (a single copy when tied)."""

    def __init__(self, cfg: GPTConfig, n_copies: int) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout
        self.copies = nn.ModuleList(BlockCopy(cfg) for _ in range(n_copies))

    def forward(
        self, x: torch.Tensor, spans: list[tuple[int, int, int]], attention: Callable[..., torch.Tensor]
    ) -> torch.Tensor:
        """x (B, T, d) -> (B, T, d).  ``spans`` = [(copy, start, stop)] covering 0..T."""
        return _cat(self.forward_parts(_split(x, spans), spans, attention))

    def forward_parts(
        self, xs: list[torch.Tensor], spans: list[tuple[int, int, int]], attention: Callable[..., torch.Tensor]
    ) -> list[torch.Tensor]:
        """The block on the residual stream held as one (B, stop − start, d) tensor per span.

        Bit-identical values and gradients to splitting one (B, T, d) stream per range and concatenating
        the range outputs (the same kernels on the same operands; only copies differ); the model passes
        these parts from block to block and concatenates them only where a residual site is observed.
        """
        B, d = xs[0].shape[0], xs[0].shape[2]
        T, H = sum(xr.shape[1] for xr in xs), self.n_head
        copies = [cast(BlockCopy, self.copies[r]) for r, _, _ in spans]
        p = self.dropout if self.training else 0.0
        if len(xs) == 1:  # one copy: the plain block
            c, x = copies[0], xs[0]
            q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in c.attn_qkv(c.ln_1(x)).split(d, dim=2))
            h = x + _drop(c.attn_out(attention(q, k, v).transpose(1, 2).reshape(B, T, d)), p)
            return [h + _drop(c.mlp_out(F.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh")), p)]
        # per range: Q, K, V from its own copy, joined along T (one cat each) for attention over the prefix
        qkv = [c.attn_qkv(c.ln_1(xr)).split(d, dim=2) for c, xr in zip(copies, xs)]
        q, k, v = (torch.cat([z[i] for z in qkv], dim=1).view(B, T, H, d // H).transpose(1, 2) for i in range(3))
        # (B, T, H, hd) split per range; each range's (B·t, d) rows gathered once for its output projection,
        # then matmul and bias add as F.linear does for such strided input
        ys = attention(q, k, v).transpose(1, 2).split([xr.shape[1] for xr in xs], dim=1)
        out = []
        for c, xr, yr in zip(copies, xs, ys):
            t = xr.shape[1]
            proj = torch.mm(yr.reshape(B * t, d), c.attn_out.weight.t()).view(B, t, d) + c.attn_out.bias
            h = xr + _drop(proj, p)
            out.append(h + _drop(c.mlp_out(F.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh")), p))
        return out


class HeadCopy(nn.Module):
    """Final LayerNorm and (when not tied) the LM head of one range (or of all positions)."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=LN_EPS, dtype=cfg.torch_dtype)
        self.lm_head = (
            None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False, dtype=cfg.torch_dtype)
        )


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _split(x: torch.Tensor, spans: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    """Views of x (B, T, ...) per span along T (one split op: its backward is a single cat)."""
    return [x] if len(spans) == 1 else list(x.split([b - a for _, a, b in spans], dim=1))


def _parts(x: torch.Tensor, spans: list[tuple[int, int, int]]) -> list[torch.Tensor]:
    """Contiguous copies of x's spans (x itself for one span): the per-range LayerNorms and linear
    layers read them without a copy of their own, in the forward and the backward pass."""
    return [x] if len(spans) == 1 else [xr.contiguous() for xr in _split(x, spans)]


def _drop(x: torch.Tensor, p: float) -> torch.Tensor:
    return F.dropout(x, p, training=True) if p > 0.0 else x


_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.copies\.(\d+)\.")
_OUTER_KEY = re.compile(r"^(embed|head)\.(\d+)\.")


# ----------------------------------------------------------------------------------------------------
# The model


class GPT(nn.Module):
    """Pre-LN GPT-2-style decoder with named residual sites and standard/myopic/untied regimes.

    Parameter names: ``embed.{e}.wte/wpe``, ``blocks.{k−1}.copies.{r}.{ln_1,attn_qkv,attn_out,ln_2,
    mlp_in,mlp_out}`` (block k = ``blocks[k−1]``, range r), ``head.{e}.ln_f`` (and ``head.{e}.lm_head``
    when untied from the embedding); ``e`` is 0 unless ``untie_scope="everything"`` (then e = r).
    """

    _future: torch.Tensor  # (n_positions, n_positions) bool buffer: True above the diagonal

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.is_myopic = config.myopic
        self.attn_impl = config.attn_impl
        # the token-id range check reads the batch's min/max (a host synchronisation on GPUs): callers that
        # validated their ids once (the trainer's fast path, :meth:`trusted_tokens`) switch it off
        self.check_token_range = True
        self.ranges = config.ranges()
        n_copies = len(self.ranges)
        self._outer_per_range = config.untied and config.untie_scope == "everything"
        n_outer = n_copies if self._outer_per_range else 1
        self.embed = nn.ModuleList(EmbedCopy(config) for _ in range(n_outer))
        self.blocks = nn.ModuleList(Block(config, n_copies) for _ in range(config.n_layer))
        self.head = nn.ModuleList(HeadCopy(config) for _ in range(n_outer))
        n = config.n_positions
        assert n is not None  # set by GPTConfig.__post_init__
        self.register_buffer("_future", torch.ones(n, n, dtype=torch.bool).triu(1), persistent=False)
        self._init_weights()

    # -- initialisation and state ---------------------------------------------------------------------
    def _init_weights(self) -> None:
        resid_std = INIT_STD / math.sqrt(2 * self.config.n_layer)
        with torch.no_grad():
            for name, mod in self.named_modules():
                if isinstance(mod, nn.Linear):
                    std = resid_std if name.endswith(("attn_out", "mlp_out")) else INIT_STD
                    nn.init.normal_(mod.weight, 0.0, std)
                    if mod.bias is not None:
                        nn.init.zeros_(mod.bias)
                elif isinstance(mod, nn.Embedding):
                    nn.init.normal_(mod.weight, 0.0, INIT_STD)
                elif isinstance(mod, nn.LayerNorm):
                    nn.init.ones_(mod.weight)
                    nn.init.zeros_(mod.bias)
        if self.config.untie_init == "shared":
            self.load_state_dict(self._replicated(self.state_dict()))

    def _replicated(self, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This model's state with every range copy taken from copy 0 of ``state``."""
        out = {}
        for key in self.state_dict():
            src = _BLOCK_KEY.sub(lambda m: f"blocks.{m.group(1)}.copies.0.", key)
            src = _OUTER_KEY.sub(lambda m: f"{m.group(1)}.0.", src)
            if src not in state:
                raise CompatibilityError(
                    f"state dict has no entry {src!r} (needed for {key!r})",
                    "load a state dict of a GPT with the same architecture",
                )
            out[key] = state[src]
        return out

    @classmethod
    def from_state_dict(
        cls, state_dict: Mapping[str, torch.Tensor], config: GPTConfig, *, replicate: bool = False
    ) -> GPT:
        """Build a model from ``config`` and load ``state_dict``.

        The same state dict loads into standard and myopic models (same keys).  ``replicate=True`` fills
        every range copy from copy 0 (e.g. a standard model's weights into an untied model).
        """
        model = cls(config)
        sd = model._replicated(state_dict) if replicate else dict(state_dict)
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as exc:
            raise CompatibilityError(
                f"state dict does not fit this GPTConfig ({str(exc).splitlines()[0]})",
                "use the config the weights were trained with, or replicate=True "
                "to load a single-copy model into an untied one",
            ) from None
        return model

    def save(self, path: str | os.PathLike, metadata: Mapping[str, Any] | None = None) -> None:
        """Write weights and config to a safetensors file (kind ``"gpt"``); ``metadata={"vocab_hash": h}``
        records the vocabulary (checked by :meth:`load`; ``ntp train`` always records it when known)."""
        from ..storage import save_tensors

        meta = {"config": self.config.to_dict(), **(metadata or {})}
        save_tensors(path, self.state_dict(), kind="gpt", metadata=meta)

    @classmethod
    def load(cls, path: str | os.PathLike, *, expect_vocab_hash: str | None = None, **config_overrides: Any) -> GPT:
        """Load a file written by :meth:`save`; ``config_overrides`` e.g. ``regime="myopic"``.

        ``expect_vocab_hash`` (:func:`originlens.storage.vocab_hash` of the data or tokenizer the model is
        used with): a file whose metadata records another ``vocab_hash`` is refused with a
        :class:`CompatibilityError`; files without one (older files, bare weights) load unchecked.
        """
        from ..storage import load_tensors

        arrays, meta = load_tensors(path, kind="gpt")
        got = meta.get("vocab_hash")
        if expect_vocab_hash is not None and got is not None and got != str(expect_vocab_hash):
            raise CompatibilityError(
                f"{path} was trained on another vocabulary (hash {got}) than the data it is used with "
                f"(hash {expect_vocab_hash})",
                "use the model trained on this corpus / tokenizer, or tokenize the data with the model's tokenizer",
            )
        if "config" not in meta:
            raise CompatibilityError(f"{path} has no GPT config in its metadata", "save it with GPT.save")
        config = GPTConfig.from_dict({**json.loads(meta["config"]), **config_overrides})
        return cls.from_state_dict({k: torch.from_numpy(v.copy()) for k, v in arrays.items()}, config)

    # -- introspection --------------------------------------------------------------------------------
    @property
    def regime(self) -> str:
        """Current regime (reflects a ``myopic()`` context)."""
        if self.config.untied:
            return "myopic+untied" if self.is_myopic else "untied"
        return "myopic" if self.is_myopic else "standard"

    @property
    def hook_names(self) -> list[str]:
        """Valid hook sites: ``resid.0`` .. ``resid.L``."""
        return [site_name(k) for k in range(self.config.n_layer + 1)]

    def num_params(self) -> int:
        """Number of trainable scalars (tied tensors counted once)."""
        return sum(p.numel() for p in self.parameters())

    def param_groups_by_range(self) -> dict[int | str, dict[str, nn.Parameter]]:
        """Parameters by owner: keys ``0..R−1`` (range copies, 0-based) and ``"shared"``.

        ``"shared"`` holds what every range uses: embeddings, final LN and head unless
        ``untie_scope="everything"`` on an untied model (then they belong to their range).
        """
        groups: dict[int | str, dict[str, nn.Parameter]] = {r: {} for r in range(len(self.ranges))}
        groups["shared"] = {}
        for name, p in self.named_parameters():
            m = _BLOCK_KEY.match(name) or (_OUTER_KEY.match(name) if self._outer_per_range else None)
            groups[int(m.group(2)) if m else "shared"][name] = p
        return groups

    # -- regimes --------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def myopic(self, enabled: bool = True) -> Iterator[GPT]:
        """Temporarily switch this instance (only) to myopic attention (or off with ``enabled=False``)."""
        previous = self.is_myopic
        self.is_myopic = bool(enabled)
        try:
            yield self
        finally:
            self.is_myopic = previous

    @contextlib.contextmanager
    def trusted_tokens(self) -> Iterator[GPT]:
        """Within the block, forward passes skip the token-id range check (shape and dtype are still
        checked): for callers that validated every id once on the host, so that no step waits for the
        device.  Out-of-range ids then fail inside the embedding (a device-side assert on CUDA)."""
        previous = self.check_token_range
        self.check_token_range = False
        try:
            yield self
        finally:
            self.check_token_range = previous

    def check_tokens(self, tokens: torch.Tensor) -> None:
        """Validate a batch of token ids (shape, dtype and range: one host read) whatever
        :attr:`check_token_range` says — for callers that then run its forward passes inside
        :meth:`trusted_tokens`."""
        previous = self.check_token_range
        self.check_token_range = True
        try:
            self._check_tokens(tokens)
        finally:
            self.check_token_range = previous

    # -- forward --------------------------------------------------------------------------------------
    def _check_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise InputError(
                f"tokens must be a (B, T) tensor, got {getattr(tokens, 'shape', type(tokens))}",
                "pass a 2-D LongTensor of token ids",
            )
        if tokens.dtype not in (torch.int64, torch.int32):
            raise InputError(f"tokens must be integers, got {tokens.dtype}", "convert with tokens.long()")
        B, T = tokens.shape
        assert self.config.n_positions is not None  # set by GPTConfig.__post_init__
        if T < 1 or self.config.n_positions < T or B < 1:
            raise InputError(
                f"tokens of shape {tuple(tokens.shape)}: need B ≥ 1 and 1 ≤ T ≤ n_positions={self.config.n_positions}",
                "crop the sequences or enlarge n_positions",
            )
        if not self.check_token_range:
            return tokens.long()
        lo, hi = torch.stack(torch.aminmax(tokens)).tolist()  # one host read
        if lo < 0 or hi >= self.config.vocab_size:
            raise InputError(
                f"token ids span [{lo}, {hi}] outside the vocabulary [0, {self.config.vocab_size})",
                "use the tokenizer/vocabulary the model was built for",
            )
        return tokens.long()

    def _spans(self, T: int) -> list[tuple[int, int, int]]:
        return [(r, a, min(b, T)) for r, (a, b) in enumerate(self.ranges) if a < T]

    def _normalise_hooks(self, hooks: Mapping[str, Hook | Sequence[Hook]] | None) -> dict[int, list[Hook]]:
        if not hooks:
            return {}
        out = {}
        for name, fns in hooks.items():
            if name not in self.hook_names:
                raise ConfigError(f"unknown hook site {name!r}", f"valid sites: {', '.join(self.hook_names)}")
            out[int(name.split(".")[1])] = [fns] if callable(fns) else list(fns)
        return out

    def _site(self, k: int, x: torch.Tensor, hooks: dict[int, list[Hook]]) -> torch.Tensor:
        for fn in hooks.get(k, ()):
            new = fn(x, ResidSite(site_name(k), k, slice(0, x.shape[1])))
            if new is not None:
                if not isinstance(new, torch.Tensor) or new.shape != x.shape:
                    raise InputError(
                        f"hook at resid.{k} returned {getattr(new, 'shape', type(new))}, "
                        f"expected a tensor of shape {tuple(x.shape)}",
                        "return None or a tensor of the same shape",
                    )
                x = new
        return x

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        return_residuals: bool = False,
        hooks: Mapping[str, Hook | Sequence[Hook]] | None = None,
        myopic: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens (B, T) -> logits (B, T, V) [, residuals: list of L+1 tensors (B, T, d)].

        ``myopic`` overrides the instance setting for this call; ``hooks`` maps ``"resid.{k}"`` to a
        hook or a list of hooks (see the module docstring).
        """
        tokens = self._check_tokens(tokens)
        T = tokens.shape[1]
        hook_map = self._normalise_hooks(hooks)
        use_myopic = self.is_myopic if myopic is None else bool(myopic)
        p = self.config.dropout if self.training else 0.0

        def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return causal_self_attention(
                q, k, v, myopic=use_myopic, impl=self.attn_impl, dropout_p=p, future=self._future[:T, :T]
            )

        spans = self._spans(T)
        outer = spans if self._outer_per_range else [(0, 0, T)]
        # the stream is kept as per-span parts between blocks and concatenated only at observed sites
        observed = set(hook_map) | (set(range(self.config.n_layer + 1)) if return_residuals else set())
        xs = [self.embed[e](tokens[:, a:b], a) for e, a, b in outer]
        x: torch.Tensor | None = None
        if len(outer) != len(spans) or p > 0.0 or 0 in observed:
            x = self._site(0, _drop(_cat(xs), p), hook_map)
            xs = _parts(x, spans)
        residuals = [x]
        for k, block in enumerate(self.blocks, start=1):
            xs, x = cast(Block, block).forward_parts(xs, spans, attention), None
            if k in observed:
                x = self._site(k, _cat(xs), hook_map)
                xs = _parts(x, spans)
                residuals.append(x)
        logits = self._head_logits(xs, x, outer)
        return (logits, cast("list[torch.Tensor]", residuals)) if return_residuals else logits

    def forward_from(self, k: int, x: torch.Tensor, *, myopic: bool | None = None) -> torch.Tensor:
        """Continue a forward pass from residual site ``resid.k``: x (B, T, d) -> logits (B, T, V).

        ``forward_from(k, residuals[k])`` equals ``forward`` (no hooks); used to re-run only the blocks
        above an intervention site (e.g. Q(w) ablations), skipping the unchanged blocks below it.
        """
        if not 0 <= k <= self.config.n_layer:
            raise ConfigError(f"residual site {k} out of range", f"use 0..{self.config.n_layer}")
        T = x.shape[1]
        use_myopic = self.is_myopic if myopic is None else bool(myopic)
        p = self.config.dropout if self.training else 0.0

        def attention(q: torch.Tensor, kk: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return causal_self_attention(
                q, kk, v, myopic=use_myopic, impl=self.attn_impl, dropout_p=p, future=self._future[:T, :T]
            )

        spans = self._spans(T)
        outer = spans if self._outer_per_range else [(0, 0, T)]
        xs = _parts(x, spans)
        for block in self.blocks[k:]:
            xs = cast(Block, block).forward_parts(xs, spans, attention)
        return self._head_logits(xs, x if k == self.config.n_layer else None, outer)

    def _head_logits(
        self, xs: list[torch.Tensor], x: torch.Tensor | None, outer: list[tuple[int, int, int]]
    ) -> torch.Tensor:
        """Logits from the final stream: its per-span parts ``xs`` or, when given, the whole tensor ``x``."""
        if len(outer) == len(xs) and x is None:
            return _cat([self._logits(e, xe) for (e, _, _), xe in zip(outer, xs)])
        x = _cat(xs) if x is None else x
        return _cat([self._logits(e, xe) for (e, _, _), xe in zip(outer, _split(x, outer))])

    def _logits(self, e: int, h: torch.Tensor) -> torch.Tensor:
        head = cast(HeadCopy, self.head[e])
        w = cast(EmbedCopy, self.embed[e]).wte.weight if head.lm_head is None else head.lm_head.weight
        return F.linear(head.ln_f(h), w)

    def run_with_hooks(
        self,
        tokens: torch.Tensor,
        hooks: Mapping[str, Hook | Sequence[Hook]],
        *,
        return_residuals: bool = False,
        myopic: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """``forward`` with hooks (TransformerLens-style spelling)."""
        return self(tokens, hooks=hooks, return_residuals=return_residuals, myopic=myopic)

    def loss(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        weights: torch.Tensor | None = None,
        *,
        hooks: Mapping[str, Hook | Sequence[Hook]] | None = None,
        myopic: bool | None = None,
    ) -> torch.Tensor:
        """Training loss ``L = Σ_{b,t} ω_{b,t} ℓ_{b,t}`` (default ω = 1/(B(T−1)), i.e. the mean CE).

        tokens (B, T); targets (B, T−1) default ``tokens[:, 1:]``; weights (B, T−1) see
        :func:`position_losses`.
        """
        logits = self(tokens, hooks=hooks, myopic=myopic)
        return position_losses(logits, tokens, weights, targets=targets).sum()


# ----------------------------------------------------------------------------------------------------
# Losses


def reference_weights(
    batch: int, seq_len: int, *, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None
) -> torch.Tensor:
    """ω_{b,t} = 1/(B(T−1)) as a (B, T−1) tensor (batch mean, then mean over the T−1 positions)."""
    return torch.full((batch, seq_len - 1), 1.0 / (batch * (seq_len - 1)), dtype=dtype, device=device)


def position_losses(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    targets: torch.Tensor | None = None,
) -> torch.Tensor:
    """Weighted per-position losses ``ω_{b,t} ℓ_{b,t}``, shape (B, T−1).

    ``logits`` (B, T, V), ``tokens`` (B, T); ``ℓ_{b,t} = −log p(targets[b,t] | x_{b,≤t})`` with
    ``targets = tokens[:, 1:]`` by default (else a (B, T−1) tensor).  ``λ_t = out[:, t].sum()`` and the
    training loss is ``out.sum()``.  ``weights`` (B, T−1) default to :func:`reference_weights`; put masks
    into the weights (e.g. ``mask / mask.sum()``) so that Σ_t λ_t stays the training loss.
    """
    if logits.dim() != 3 or tokens.dim() != 2 or logits.shape[:2] != tokens.shape:
        raise InputError(
            f"logits {tuple(logits.shape)} and tokens {tuple(tokens.shape)} do not match",
            "pass logits (B, T, V) computed from tokens (B, T)",
        )
    B, T, V = logits.shape
    if T < 2:
        raise InputError("next-token losses need T ≥ 2 tokens", "use longer sequences")
    if targets is None:
        targets = tokens[:, 1:]
    if targets.shape != (B, T - 1):
        raise InputError(
            f"targets have shape {tuple(targets.shape)}, expected {(B, T - 1)}",
            "pass one target per loss position t = 0..T−2",
        )
    ce = F.cross_entropy(logits[:, :-1].reshape(-1, V), targets.reshape(-1).long(), reduction="none")
    ce = ce.view(B, T - 1)
    if weights is None:
        return ce / (B * (T - 1))
    if weights.shape != (B, T - 1):
        raise InputError(
            f"weights have shape {tuple(weights.shape)}, expected {(B, T - 1)}", "pass ω as a (B, T−1) tensor"
        )
    return ce * weights.to(ce.dtype)
