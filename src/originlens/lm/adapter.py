"""One small protocol for every language model the ``lm`` tools analyse: :class:`LMAdapter`.

The leading-term comparison over checkpoints (arXiv 2601.19208), SAE training, Q(w) (arXiv 2603.14087
§9), steering and look-ahead only need a handful of things from a model; each supported family
(our GPT, llama2.c checkpoints, Hugging Face causal LMs, optionally TransformerLens) implements them
once in a subclass of :class:`LMAdapter`:

* sizes: ``n_layers``, ``d_model``, ``n_heads``, ``vocab_size``, ``max_seq_len``, ``bos_id``;
* ``run(tokens, hooks=..., return_residuals=...)``: logits ``(B, T, V)``, optionally the L+1 residual
  streams, with hooks at residual sites;
* ``single_token_states(token_ids)``: each token fed **alone** (length-1 sequence, no BOS) and the
  per-layer ``E_pre`` / ``E_attn`` / ``E_post`` representations of the Pythia protocol;
* ``qk_weights(layer)``: the per-head query and key matrices (key heads expanded to query heads);
* ``unembed(h)``: final normalisation and unembedding of a residual vector.

Residual sites use one naming for every family (TransformerLens spirit): ``"resid.{k}"``, k = 0..L, is
the residual stream after k blocks (k = 0: the embedding output, the input of block 1; k = L: the last
block's output **before** the final normalisation).  A hook is ``fn(x, k) -> Tensor | None`` where
``x`` is ``(B, T, d)``; returning a tensor of the same shape replaces the stream from there on.
TransformerLens' ``blocks.{l}.hook_resid_post`` is ``resid.{l+1}`` and ``hook_resid_pre`` is
``resid.{l}`` (see :func:`site_from_hook_name`).

Caveats: adapters run on whatever device and dtype the wrapped model has; the protocol has no KV cache
(generation in :mod:`originlens.lm.steering` re-runs the prefix, fine for short samples).  The optional
pair :meth:`LMAdapter.run_cached` / :meth:`LMAdapter.run_positions_from` (check
:attr:`LMAdapter.supports_cached_ablation`) keeps a clean run's keys/values so that an intervention at
one position re-runs only a few positions above its site (used by Q(w), :mod:`originlens.lm.qscore`).
An adapter whose cached path holds only up to some number of positions (a sliding attention window)
says so in an optional ``cached_ablation_max_len`` attribute; Q(w) then uses another method for longer
windows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import Tensor

from ..errors import ConfigError
from ..sites import parse_site

ResidHook = Callable[[Tensor, int], "Tensor | None"]


@dataclass
class TokenStates:
    """Per-layer representations of tokens fed alone (the Pythia protocol), each ``(L, n, d)``.

    ``pre[l]`` is the input of block l+1 (resid_pre), ``attn[l] = pre[l] + attn_out`` ("no MLP"),
    ``post[l]`` the block output (resid_post, MLP included).  No normalisation, no unembedding.
    """

    pre: Tensor
    attn: Tensor
    post: Tensor


class LMAdapter(ABC):
    """A causal language model seen through the protocol of this module (see the module docstring)."""

    family: str = "abstract"
    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    max_seq_len: int | None
    bos_id: int | None

    @abstractmethod
    def run(
        self,
        tokens: Tensor,
        *,
        hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None,
        return_residuals: bool = False,
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        """tokens ``(B, T)`` int64 → logits ``(B, T, V)`` [, residuals: L+1 tensors ``(B, T, d)``].

        ``hooks`` maps residual index k (0..L) to a hook or a list of hooks.  Returned residuals are the
        tensors the model consumed after any replacement.
        """

    @abstractmethod
    def single_token_states(self, token_ids: Tensor) -> TokenStates:
        """token_ids ``(n,)`` → :class:`TokenStates` with tensors ``(L, n, d)`` (each token alone)."""

    @abstractmethod
    def qk_weights(self, layer: int) -> tuple[Tensor, Tensor]:
        """``(W_Q, W_K)`` of 0-based ``layer``, each ``(n_heads, head_dim, d)``; q_h = W_Q[h] x.

        Key heads are repeated for grouped-query attention, so index h pairs query and key heads.
        """

    @abstractmethod
    def unembed(self, h: Tensor) -> Tensor:
        """Final normalisation + unembedding: ``(..., d)`` → logits ``(..., V)``."""

    def run_from(self, k: int, x: Tensor) -> Tensor:
        """Continue from residual site k: x ``(B, T, d)`` (the stream after k blocks) → logits ``(B, T, V)``.

        Only the blocks above the site run, so an intervention at site k costs L−k blocks instead of L.
        Adapters that cannot start mid-model raise ``NotImplementedError`` (callers then fall back to
        :meth:`run` with a replacing hook); check :attr:`supports_run_from`.
        """
        raise NotImplementedError

    @property
    def supports_run_from(self) -> bool:
        return type(self).run_from is not LMAdapter.run_from

    def decode(self, tokens: Tensor, cache: Any | None) -> tuple[Tensor, Any]:
        """Incremental decoding (optional; see :attr:`supports_decode`): ``tokens`` ``(B, T)`` following the
        positions held by ``cache`` (None: from position 0) → logits ``(B, T, V)`` and the extended cache,
        equal (to round-off) to :meth:`run` on the whole prefix.  Generation uses it to run one token per
        step instead of re-running the prefix."""
        raise NotImplementedError

    @property
    def supports_decode(self) -> bool:
        return type(self).decode is not LMAdapter.decode

    def run_cached(self, tokens: Tensor, k: int) -> tuple[Tensor, Tensor, list[tuple[Tensor, Tensor]]]:
        """Clean run keeping what :meth:`run_positions_from` needs (optional; see
        :attr:`supports_cached_ablation`).  tokens ``(B, T)`` → ``(resid_L, resid_k, past)``:

        * ``resid_L`` ``(B, T, d)``: the last block's output (``adapter.unembed(resid_L)`` are the logits);
        * ``resid_k`` ``(B, T, d)``: the stream at site k;
        * ``past``: L−k pairs ``(keys, values)``, one per block above the site, each ``(B, n_kv, T, hd)``.
          Their contents are the adapter's own (e.g. rotated keys); only axis 0 (batch) and axis 2
          (position) are part of the contract, so callers may select rows and truncate positions.
        """
        raise NotImplementedError

    def run_positions_from(self, k: int, x: Tensor, start: Tensor, past: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
        """Re-run a few positions from site k over a cached clean prefix (optional).

        ``x (B, n, d)`` is the site-k stream at positions ``start[b] .. start[b]+n−1`` of row b;
        ``start (B,)`` int64; ``past`` as returned by :meth:`run_cached` (rows aligned with x, position
        axis ≥ ``max(start)``; entries at positions ≥ ``start[b]`` are ignored).  Returns the logits
        ``(B, n, V)`` of those positions, equal (up to round-off) to :meth:`run_from` on the whole prefix
        with x in place of its last n positions: a causal model's earlier positions do not depend on them.
        """
        raise NotImplementedError

    @property
    def supports_cached_ablation(self) -> bool:
        return type(self).run_positions_from is not LMAdapter.run_positions_from

    # ---- conveniences built on the abstract methods -------------------------------------------------

    @property
    def device(self) -> torch.device:
        return next(iter(self.parameters())).device

    def parameters(self):  # pragma: no cover - overridden by every adapter
        raise NotImplementedError

    def named_tensors(self) -> Mapping[str, Tensor]:
        """Every weight by name (used for checkpoint hashing); adapters override when cheaper."""
        return dict(self.module.state_dict())  # type: ignore[attr-defined]

    def residuals(self, tokens: Tensor) -> list[Tensor]:
        """The L+1 residual streams ``(B, T, d)`` of a clean run."""
        with torch.no_grad():
            return cast("tuple[Tensor, list[Tensor]]", self.run(tokens, return_residuals=True))[1]

    def logits(self, tokens: Tensor, hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None = None) -> Tensor:
        """Logits ``(B, T, V)``, with optional residual hooks."""
        return self.run(tokens, hooks=hooks)  # type: ignore[return-value]

    def check_site(self, k: int | str) -> int:
        """A residual index from an int or a site name, validated against this model."""
        if isinstance(k, str):
            return parse_site(k, self.n_layers)
        if not 0 <= int(k) <= self.n_layers:
            raise ConfigError(
                f"residual site {k} is out of range for a {self.n_layers}-layer model", f"use 0..{self.n_layers}"
            )
        return int(k)


def past_attention_mask(start: Tensor, n: int, past_len: int) -> Tensor:
    """Boolean attention mask ``(B, 1, n, past_len + n)`` (True = attend) of n new positions
    ``start[b] + i`` over ``[past keys 0..past_len−1 | the n new keys]``: a past key j is visible when
    ``j < start[b]``, a new key i′ when ``i′ ≤ i`` (used by :meth:`LMAdapter.run_positions_from`)."""
    dev = start.device
    old = torch.arange(past_len, device=dev)[None, :] < start[:, None]  # (B, past_len)
    new = torch.ones(n, n, dtype=torch.bool, device=dev).tril()  # (n, n)
    B = start.shape[0]
    return torch.cat([old[:, None, :].expand(B, n, past_len), new.expand(B, n, n)], dim=2)[:, None]


def normalise_hooks(
    hooks: Mapping[int, ResidHook | Sequence[ResidHook]] | None, n_layers: int
) -> dict[int, list[ResidHook]]:
    """``{k: [fn, ...]}`` with keys validated (ints or site names)."""
    out: dict[int, list[ResidHook]] = {}
    for key, fns in (hooks or {}).items():
        k = parse_site(key, n_layers) if isinstance(key, str) else int(key)
        if not 0 <= k <= n_layers:
            raise ConfigError(f"hook at residual site {k} is out of range", f"use 0..{n_layers}")
        out.setdefault(k, []).extend([fns] if callable(fns) else list(fns))
    return out


def apply_hooks(k: int, x: Tensor, hooks: dict[int, list[ResidHook]]) -> Tensor:
    """Run the hooks of site k on ``x``; each may return a same-shape replacement."""
    for fn in hooks.get(k, ()):
        new = fn(x, k)
        if new is not None:
            if not isinstance(new, Tensor) or new.shape != x.shape:
                raise ConfigError(
                    f"hook at resid.{k} returned {getattr(new, 'shape', type(new))}, expected shape {tuple(x.shape)}",
                    "return None or a same-shape tensor",
                )
            x = new
    return x
