"""Residual-stream activations of an :class:`~originlens.lm.adapter.LMAdapter` over a token array.

* :func:`as_sequences`: token windows ``(N, T+1)`` (a corpus directory's ``tokens.npy`` or any 2-D integer
  array) → model inputs ``(N, L)``, with BOS prepended when asked and cropped to the model's context;
* :func:`site_residuals`: the stream at one site for a batch, without running the blocks above it;
* :func:`collect_activations`: activations at a site over many windows (BOS position excluded).

Caveat: sequences are used as stored (no document boundaries inside windows are respected).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import CompatibilityError, InputError
from ..progress import progress


class _Stop(Exception):
    """Raised by a hook to end a forward pass once the wanted site is reached."""

    def __init__(self, x: Tensor) -> None:
        super().__init__()
        self.x = x


def as_sequences(tokens: Any, adapter: Any, *, prepend_bos: bool = True) -> Tensor:
    """``tokens`` ``(N, T)`` integer ids → int64 ``(N, L)``: ``[BOS] + row`` when ``prepend_bos`` and the
    model has a BOS id, cropped to ``adapter.max_seq_len``.  Ids are checked against the vocabulary."""
    arr = np.asarray(tokens)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"token array of shape {arr.shape} / dtype {arr.dtype}", "pass (N, T) integer token ids")
    if arr.size == 0:
        raise InputError("the token array is empty", "pass a corpus with at least one window")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= adapter.vocab_size:
        raise CompatibilityError(
            f"the corpus has token ids in [{lo}, {hi}] but the model's vocabulary is [0, {adapter.vocab_size})",
            "tokenize the corpus with the model's tokenizer",
        )
    t = torch.from_numpy(arr.astype(np.int64))
    if prepend_bos and adapter.bos_id is not None:
        t = torch.cat([torch.full((t.shape[0], 1), int(adapter.bos_id), dtype=torch.int64), t], dim=1)
    if adapter.max_seq_len is not None and t.shape[1] > adapter.max_seq_len:
        t = t[:, : adapter.max_seq_len]
    return t.contiguous()


def site_residuals(adapter: Any, tokens: Tensor, k: int) -> Tensor:
    """The residual stream ``resid.k`` ``(B, T, d)`` of a clean run (blocks above k are not run)."""

    def stop(x: Tensor, _k: int) -> None:
        raise _Stop(x)

    with torch.no_grad():
        try:
            adapter.run(tokens, hooks={k: stop})
        except _Stop as s:
            return s.x
    raise RuntimeError(f"the adapter never reached residual site {k}")  # pragma: no cover


def collect_activations(
    adapter: Any,
    sequences: Tensor,
    k: int,
    *,
    batch_size: int = 32,
    max_tokens: int | None = None,
    skip_first: bool = True,
    desc: str = "activations",
) -> Tensor:
    """Activations at ``resid.k`` for every position of ``sequences`` ``(N, L)`` → ``(n, d)``.

    ``skip_first`` drops position 0 (the BOS token, whose stream is atypical); ``max_tokens`` stops early.
    """
    out: list[Tensor] = []
    n = 0
    dev = adapter.device
    first = 1 if skip_first and sequences.shape[1] > 1 else 0
    for start in progress(range(0, sequences.shape[0], batch_size), desc=desc, unit="batch"):
        x = site_residuals(adapter, sequences[start : start + batch_size].to(dev), k)[:, first:]
        x = x.reshape(-1, x.shape[-1]).detach()
        out.append(x)
        n += x.shape[0]
        if max_tokens is not None and n >= max_tokens:
            break
    acts = torch.cat(out)
    return acts[:max_tokens] if max_tokens is not None else acts
