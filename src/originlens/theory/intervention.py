"""The causal intervention and the held-out losses of a trained one-hot attention model
(arXiv 2601.19208 §5.1, Table 3 and Eq. 12).

* :func:`intervention_losses` (Table 3): for one weight at a time, remove its projection onto its
  leading term (:func:`project_out`: ``M − (⟨M, T⟩ / ‖T‖²) T``, float64) and recompute the mean
  cross-entropy; the model is restored afterwards.
* :func:`heldout_losses`: the trained model, the leading-term model of Eq. 12, a bigram-path and an add-1
  conditional bigram baseline, and the uniform loss ln |V|, on the same windows.

Losses are :func:`mean_loss`: mean cross-entropy of an
:class:`~originlens.models.assoc.AssocModel` over all positions of token windows (N, T+1), in batches,
without gradients, sums accumulated in float64.  The projected weight is loaded into the model in its
own dtype, so a float32 model keeps a small residual along the leading term (``residual_cos`` ≈ 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import InputError
from .leading_terms import LeadingTermModel, conditional_bigram_loss, leading_terms
from .nulls import _kind, check_shapes

# float64 cross-entropy is taken over at most this many logits at a time (128 MiB), so that a large
# vocabulary's (batch, T, |V|) logits are not copied to float64 whole (the copy and log-softmax of a
# 256 × 200 × 3,000 batch alone were 2.4 GB)
CE_CHUNK_ELEMENTS = 1 << 24


def summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """Σ over positions of −log softmax(logits)[target], each row in float64, rows taken in chunks of
    at most :data:`CE_CHUNK_ELEMENTS` logits (one float64 call on all rows, up to float64 rounding).
    ``logits`` (..., |V|), ``targets`` (...) with the same leading shape."""
    flat = logits.reshape(-1, logits.shape[-1])
    tgt = targets.reshape(-1)
    rows = max(1, CE_CHUNK_ELEMENTS // max(1, flat.shape[1]))
    total = 0.0
    for i in range(0, flat.shape[0], rows):
        total += float(F.cross_entropy(flat[i : i + rows].double(), tgt[i : i + rows], reduction="sum"))
    return total


def windows_per_batch(batch_size: int, seq_len: int, vocab_size: int) -> int:
    """``batch_size``, lowered so that one batch's (windows, T, |V|) logits hold at most 2^25 numbers
    (256 MiB in float64): at |V| = 3,000 and T = 200 that is 55 windows instead of 256."""
    return max(1, min(int(batch_size), (1 << 25) // max(1, int(seq_len) * int(vocab_size))))


def mean_loss(model: Any, tokens: Any, *, batch_size: int = 256) -> float:
    """Mean cross-entropy of an :class:`~originlens.models.assoc.AssocModel` over all positions of
    ``tokens`` (N, T+1), in batches of at most ``batch_size`` windows (fewer for a large |V|·T, see
    :func:`windows_per_batch`), without gradients (sums accumulated in float64)."""
    arr = np.asarray(tokens)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 2:
        raise InputError(f"tokens must be (N, T+1) with N ≥ 1, got {arr.shape}", "pass token windows")
    batch_size = windows_per_batch(batch_size, arr.shape[1] - 1, int(model.vocab_size))
    # the weights do not change during the pass, so the path implementation's batch-independent products
    # are computed once for all batches (AssocModel caches them): choose the implementation for all N
    # windows, not per batch (per batch, a small batch would pick the gather path and lose that reuse)
    impl = model.choose_impl(arr.shape[0], arr.shape[1] - 1)
    total, count = 0.0, 0
    dev = next(model.parameters()).device
    with torch.no_grad():
        for s in range(0, arr.shape[0], int(batch_size)):
            b = torch.from_numpy(np.asarray(arr[s : s + batch_size], dtype=np.int64)).to(dev)
            logits = model(b[:, :-1], impl=impl)
            total += summed_cross_entropy(logits, b[:, 1:])
            del logits
            count += b[:, 1:].numel()
    return total / count


def project_out(M: Any, T: Any) -> np.ndarray:
    """``M − (⟨M, T⟩ / ‖T‖²) T`` in float64 (M unchanged when T = 0): removes M's component along T."""
    M = np.asarray(M.detach().cpu().numpy() if torch.is_tensor(M) else M, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    if M.shape != T.shape:
        raise InputError(f"cannot project a {M.shape} matrix onto a {T.shape} target", "pass matching shapes")
    tt = float(np.vdot(T, T))
    return M.copy() if tt == 0 else M - (float(np.vdot(M, T)) / tt) * T


def intervention_losses(
    model: Any, stats: Any, tokens: Any, *, names: Sequence[str] | None = None, batch_size: int = 256
) -> dict[str, Any]:
    """Table 3: for one weight at a time, remove its projection onto its leading term and recompute the
    mean cross-entropy on ``tokens`` (the model is restored afterwards).

    Returns ``{"original": loss, "losses": {name: {"loss", "delta", "coef", "residual_cos"}}}`` where
    ``coef`` = ⟨M,T⟩/‖T‖² (the removed multiple of T) and ``residual_cos`` = cos(M', T) of the weight as
    loaded into the model (≈ 0; float32 models round).
    """
    lt = leading_terms(stats)
    check_shapes({n: p.detach().cpu().numpy() for n, p in model.named_weights()}, stats)
    base = mean_loss(model, tokens, batch_size=batch_size)
    out: dict[str, Any] = {"original": base, "losses": {}}
    names = list(names) if names is not None else [n for n, _ in model.named_weights()]
    for name in names:
        p = model.param(name)
        T = lt[_kind(name)]
        keep = p.detach().clone()
        M = keep.cpu().numpy().astype(np.float64)
        tt = float(np.vdot(T, T))
        coef = float(np.vdot(M, T)) / tt if tt > 0 else float("nan")
        with torch.no_grad():
            p.copy_(torch.from_numpy(project_out(M, T)).to(p.dtype))
        try:
            loss = mean_loss(model, tokens, batch_size=batch_size)
            resid = p.detach().cpu().numpy().astype(np.float64)
            rcos = (
                float(np.vdot(resid, T) / (np.linalg.norm(resid) * math.sqrt(tt)))
                if tt > 0 and np.linalg.norm(resid) > 0
                else float("nan")
            )
        finally:
            with torch.no_grad():
                p.copy_(keep)
        out["losses"][name] = {"loss": loss, "delta": loss - base, "coef": coef, "residual_cos": rcos}
    return out


def heldout_losses(
    model: Any, stats: Any, s: int, lr: float, eval_tokens: Any, train_tokens: Any, *, batch_size: int = 256
) -> dict[str, float]:
    """Mean cross-entropy on ``eval_tokens`` of: the trained model; the leading-term model of Eq. 12 with
    the scalars of step s (``leading_term_eq12``, L_eff = 1 as printed) and with the predicted weights in a
    full L-layer model in the trained model's dtype (``leading_term_full``); its residual-only bigram path c_O·X B̄ (``bigram_path``);
    an add-1 conditional bigram fitted on ``train_tokens`` (``conditional_bigram``); uniform (ln |V|)."""
    V = int(model.vocab_size)
    lt = LeadingTermModel(stats, int(s), float(lr))
    ev = np.asarray(eval_tokens, dtype=np.int64)
    batch_size = windows_per_batch(batch_size, ev.shape[1] - 1 if ev.ndim == 2 else 1, V)
    trained = mean_loss(model, ev, batch_size=batch_size)
    # one model's cached path products at a time (at |V| = 3,000 the float64 model's alone are 3.8 GB)
    if hasattr(model, "release_workspace"):
        model.release_workspace()
    param = next(model.parameters())
    # the predicted weights in the trained model's own dtype (float32 halves the products' memory)
    full = lt.as_model(model.n_layers, dtype=str(param.dtype).removeprefix("torch.")).to(param.device)
    full_loss = mean_loss(full, ev, batch_size=batch_size)
    del full
    return {
        "trained": trained,
        "leading_term_eq12": lt.loss(ev, batch_size=batch_size),
        "leading_term_full": full_loss,
        "bigram_path": lt.bigram_loss(ev, batch_size=batch_size),
        "conditional_bigram": conditional_bigram_loss(np.asarray(train_tokens), ev, V, k=1.0),
        "uniform": math.log(V),
    }
