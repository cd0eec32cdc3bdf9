"""Small tensor operations of the one-hot attention model: the relative-position matrix DM(p) and the causal
softmax (diagonal kept).  Part of :mod:`originlens.models.assoc`."""

from __future__ import annotations

import torch


def diag_matrix(p: torch.Tensor, T: int) -> torch.Tensor:
    """DM(p) restricted to T positions: (T, T) with DM[t, t−d] = p[d] for t ≥ d, 0 above the diagonal."""
    t = torch.arange(T, device=p.device)
    off = t[:, None] - t[None, :]
    return torch.where(off >= 0, p[off.clamp(min=0)], torch.zeros((), dtype=p.dtype, device=p.device))


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    T = scores.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=scores.device).triu(1)
    return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
