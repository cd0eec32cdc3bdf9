"""The context search of the Q(w) score (:mod:`.qscore`): the top-activating (window, position) examples of
each feature with near-duplicate removal by token edit distance (:func:`find_top_contexts`,
:func:`within_edit_distance`), keeping the residual streams the ablation can start from."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError
from ..progress import progress
from .qscore_config import (
    Examples,
    QScoreConfig,
    SiteStreams,
)

# ----------------------------------------------------------------------------------------------------
# edit distance (for de-duplication)


def within_edit_distance(a: Sequence[int], b: Sequence[int], threshold: int) -> bool:
    """True when the Levenshtein distance of token lists ``a`` and ``b`` is ≤ ``threshold``.

    Cheap rejections first (length difference, multiset difference: every edit changes the token multiset
    by at most two), then a banded dynamic programme with early exit.
    """
    if threshold < 0:
        return False
    la, lb = len(a), len(b)
    if abs(la - lb) > threshold:
        return False
    ca, cb = Counter(a), Counter(b)
    sym = sum(((ca - cb) + (cb - ca)).values())
    if (sym + 1) // 2 > threshold:
        return False
    return _banded_within(a, b, threshold)


def _banded_within(a: Sequence[int], b: Sequence[int], threshold: int) -> bool:
    """The banded dynamic programme of :func:`within_edit_distance` (no cheap rejections)."""
    la, lb = len(a), len(b)
    if abs(la - lb) > threshold:
        return False
    big = threshold + 1
    prev = [j if j <= threshold else big for j in range(lb + 1)]
    for i in range(1, la + 1):
        lo, hi = max(1, i - threshold), min(lb, i + threshold)
        cur = [big] * (lb + 1)
        cur[0] = i if i <= threshold else big
        ai = a[i - 1]
        best = cur[0] if lo == 1 else big
        for j in range(lo, hi + 1):
            v = prev[j - 1] + (ai != b[j - 1])
            if prev[j] + 1 < v:
                v = prev[j] + 1
            if cur[j - 1] + 1 < v:
                v = cur[j - 1] + 1
            cur[j] = v if v < big else big
            if cur[j] < best:
                best = cur[j]
        if best > threshold:
            return False
        prev = cur
    return prev[lb] <= threshold


# ----------------------------------------------------------------------------------------------------
# context selection


def _eligible_mask(L: int, first: int, K: int, device: torch.device) -> Tensor:
    pos = torch.arange(L, device=device)
    return (pos >= first) & (pos + K <= L - 1)


def find_top_contexts(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    features: Sequence[int],
    config: QScoreConfig,
    *,
    first: int = 1,
    return_streams: bool = False,
) -> Examples | tuple[Examples, SiteStreams]:
    """Top-activating contexts of ``features`` (rules in the module docstring).

    ``sequences (N, L)`` are model inputs (BOS included when used); ``first`` is the first position a
    feature may be ablated at (1 after a BOS).  Returns the selected examples, ordered by feature then by
    descending activation; with ``return_streams`` also the :class:`SiteStreams` of the selected windows
    (for :func:`ablation_kl`).  While scanning, streams are kept only for windows that are candidates of
    some feature (truncated to the longest prefix those candidates need) and only while they fit
    ``config.max_stream_bytes``; windows left out are simply re-run by :func:`ablation_kl`.

    The stream at site k comes from ``adapter.run_to(tokens, k)`` when the adapter has it (llama2.c: the
    fused block code), else from :func:`originlens.sae.activations.site_residuals`.
    """
    from ..sae.activations import site_residuals

    config.validate()
    K = config.max_offset
    N, L = sequences.shape
    if first > L - 1 - K:
        raise InputError(
            f"windows of {L} tokens (BOS included) leave no position with {K} following tokens",
            f"use longer windows (≥ {first + K + 1} tokens) or a smaller --max-offset",
        )
    feats = torch.as_tensor(list(features), dtype=torch.long)
    F = feats.shape[0]
    P = config.n_contexts * config.pool_factor
    dev = adapter.device
    feats_dev = feats.to(sae.W_enc.device)
    pool_v = torch.full((F, 0), -math.inf, dtype=torch.float64)
    pool_i = torch.zeros((F, 0), dtype=torch.long)
    pool_p = torch.zeros((F, 0), dtype=torch.long)
    max_any = torch.full((F,), -math.inf, dtype=torch.float64)
    elig = _eligible_mask(L, first, K, torch.device("cpu"))
    allowed = elig if config.position_rule == "restrict" else (torch.arange(L) >= first)
    run_to = getattr(adapter, "run_to", None)
    kept_streams: dict[int, Tensor] = {}
    kept_bytes = 0
    with torch.no_grad():
        for s in progress(range(0, N, config.scan_batch_size), desc="finding contexts", unit="batch"):
            tok = sequences[s : s + config.scan_batch_size]
            x = run_to(tok.to(dev), k) if run_to is not None else site_residuals(adapter, tok.to(dev), k)
            a = sae.encode_subset(x.to(sae.W_enc.device), feats_dev).cpu()  # (B, L, F)
            # maxima in the SAE's dtype, then float64: the same values (widening is exact and monotone)
            max_any = torch.maximum(max_any, a[:, first:].amax(dim=(0, 1)).double())
            a = a.masked_fill(~allowed[None, :, None], -math.inf)
            v, p = a.max(dim=1)  # (B, F)
            v = v.double()
            if config.position_rule == "drop":
                v = v.masked_fill(~elig[p], -math.inf)
            idx = torch.arange(s, s + tok.shape[0]).expand(F, -1)
            cv = torch.cat([pool_v, v.T], dim=1)
            order = torch.sort(cv, dim=1, descending=True, stable=True).indices[:, :P]
            pool_v = cv.gather(1, order)
            pool_i = torch.cat([pool_i, idx], dim=1).gather(1, order)
            pool_p = torch.cat([pool_p, p.T], dim=1).gather(1, order)
            if return_streams:
                kept_bytes = _keep_streams(
                    kept_streams, kept_bytes, x, s, pool_v, pool_i, pool_p, K, config.max_stream_bytes
                )
    out_f, out_i, out_p, out_a = [], [], [], []
    skipped: dict[int, str] = {}
    seq_np = sequences.numpy()
    for j, f in enumerate(feats.tolist()):
        if not max_any[j] > 0:
            skipped[f] = "dead"
            continue
        vs, ids, ps = pool_v[j].tolist(), pool_i[j].tolist(), pool_p[j].tolist()
        n_cand = sum(v > 0 for v in vs)  # the pool is sorted: candidates come first
        for c in _dedup_greedy(seq_np, ids[:n_cand], ps[:n_cand], first, K, config.dedup_distance, config.n_contexts):
            out_f.append(f)
            out_i.append(ids[c])
            out_p.append(ps[c])
            out_a.append(vs[c])
        if n_cand == 0:
            skipped[f] = "no eligible context"
    ex = Examples(
        np.array(out_f, dtype=np.int64),
        np.array(out_i, dtype=np.int64),
        np.array(out_p, dtype=np.int64),
        np.array(out_a, dtype=np.float64),
        skipped,
    )
    if not return_streams:
        return ex
    return ex, SiteStreams(k, {w: kept_streams[w] for w in sorted(set(out_i)) if w in kept_streams})


def _dedup_greedy(
    seq_np: np.ndarray, ids: list[int], ps: list[int], first: int, K: int, threshold: int, n_keep: int
) -> list[int]:
    """Greedy de-duplication of one feature's candidates (in order): candidate c (text = window
    ``ids[c]`` from ``first`` through token ``ps[c] + K``) is kept unless within token edit distance
    ``threshold`` of a kept one; stops after ``n_keep``.  Same result as calling
    :func:`within_edit_distance` on every pair, but its cheap lower bounds (length difference,
    multiset difference) are computed with numpy for all kept texts at once."""
    if threshold < 0 or len(ids) <= 1:
        return list(range(min(n_keep, len(ids))))
    texts = [seq_np[i, first : p + K + 1] for i, p in zip(ids, ps)]
    lens = np.array([t.shape[0] for t in texts], dtype=np.int64)
    vocab, inv = np.unique(np.concatenate(texts), return_inverse=True)
    U = len(vocab)
    counts = np.bincount(
        np.repeat(np.arange(len(texts)) * U, lens) + inv.reshape(-1), minlength=len(texts) * U
    ).reshape(len(texts), U)
    kept = [0]
    for c in range(1, len(texts)):
        if len(kept) >= n_keep:
            break
        ks = np.array(kept)
        bound = np.maximum(np.abs(lens[ks] - lens[c]), (np.abs(counts[ks] - counts[c]).sum(1) + 1) // 2)
        near = ks[bound <= threshold]
        if near.size and any(_banded_within(texts[c].tolist(), texts[q].tolist(), threshold) for q in near):
            continue
        kept.append(c)
    return kept


def _keep_streams(
    kept: dict[int, Tensor],
    nbytes: int,
    x: Tensor,
    s: int,
    pool_v: Tensor,
    pool_i: Tensor,
    pool_p: Tensor,
    K: int,
    budget: int,
) -> int:
    """Update the streams kept during the context search: drop windows that left every feature's pool of
    candidates, add the windows of this batch (rows of ``x``, first window ``s``) still in some pool,
    truncated to the longest prefix their candidates need, while the total stays ≤ ``budget`` bytes."""
    live = pool_v > 0
    wins, inv = np.unique(pool_i[live].numpy(), return_inverse=True)
    longest = np.zeros(len(wins), dtype=np.int64)
    np.maximum.at(longest, inv, pool_p[live].numpy() + K)
    need = dict(zip(wins.tolist(), longest.tolist()))
    for w in [w for w in kept if w not in need]:
        t = kept.pop(w)
        nbytes -= t.numel() * t.element_size()
    for w in sorted(w for w in need if w >= s):
        t = x[w - s, : need[w]]
        b = t.numel() * t.element_size()
        if nbytes + b <= budget:
            kept[w] = t.clone()
            nbytes += b
    return nbytes
