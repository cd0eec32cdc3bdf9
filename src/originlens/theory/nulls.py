"""Null baselines for the leading-term cosines of a trained one-hot attention model (arXiv 2601.19208 §5.1).

The comparison itself: :func:`originlens.theory.leading_terms.leading_terms` gives the target of each weight kind (``W_O`` → B̄,
``V`` → Φ̄ᵀB̄ᵀ, ``W`` → Q̄, ``P`` → Δ; weights are named ``W_O``, ``W.l``, ``V.l``, ``P.l``).
:func:`baseline_cosines` puts each learned matrix's cosine with its leading term next to the same cosine
against (a) leading terms of an unrelated corpus, restricted to the tokens both vocabularies share
(:func:`shared_token_index`), (b) leading terms of a disjoint sample of the same corpus, (c) raw PMI
matrices (:func:`pmi_matrix`, from :func:`cooccurrence_counts`) and (d) a random Gaussian matrix
(:func:`random_cosine`).  All matrices are |V| × |V| (``P``: T), compared in float64.

Definitions of the baselines (documented choices, not from the paper):

* PMI of a pair distribution with counts c(a, b): ``PMI[a, b] = log(c(a,b) · n / (c(a,·) c(·,b)))``
  with n the total count and the marginals of the same pair distribution; pairs never observed (and
  tokens never seen) get 0.  Kinds: ``"bigram"`` (current x_t, next x_{t+1}) compared with W_O;
  ``"context"`` (prefix token x_m, target x_{t+1}) for all m ≤ t — rows = prefix (key) token, columns =
  target — compared with V (rows = key token); ``"query_key"`` (query x_t, key x_m, m ≤ t) compared with
  W.  Unlike Φ̄ the context counts are unweighted (no 1/(t+1)).
* Unrelated-corpus baseline: both the learned matrix and the null leading term are restricted to the
  shared tokens (by string; special tokens such as ``<unk>`` excluded) and the *true* cosine on the same
  restriction is reported next to it.  Without vocabularies the alignment is by id (same size only).
* Same-corpus baseline: statistics of windows disjoint from the ones the targets were computed on
  (:func:`originlens.theory.tracking.same_corpus_sample`: held-out windows first, then training windows
  outside the statistics sample, same count).  Because SGD trains on all windows this baseline is
  expected to be *high*: it shows how much of the agreement is generic to the corpus rather than
  specific to the target sample (a weak null).
* Random baseline: cosine with one i.i.d. N(0, 1) matrix of the same shape (≈ N(0, 1/numel)).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..errors import CompatibilityError, ConfigError, InputError
from .leading_terms import cosine, leading_terms, statistic_of

# weight kind -> name of its leading-term statistic
PMI_KIND = {"W_O": "bigram", "V": "context", "W": "query_key"}
SPECIAL_TOKENS = ("<unk>", "<eot>", "<pad>", "<s>", "</s>")


# ----------------------------------------------------------------------------------------------
# leading terms


def _kind(name: str) -> str:
    """Weight kind of a weight name: ``"W.2"`` → ``"W"``, ``"W_O"`` → ``"W_O"``."""
    return name.split(".")[0]


def check_shapes(weights: Mapping[str, np.ndarray], stats: Any) -> None:
    B, D = statistic_of(stats, "bigram"), statistic_of(stats, "positional")
    V, T = weights["W_O"].shape[0], weights["P.1"].shape[0]
    if B.shape != (V, V) or D.shape != (T,):
        raise CompatibilityError(
            f"statistics are {B.shape[0]}×{B.shape[1]} with T = {D.shape[0]}; the model has |V| = {V}, T = {T}",
            "use statistics of the run's own corpus (RUN/statistics) without a restricted token set",
        )


# ----------------------------------------------------------------------------------------------
# baselines


def shared_token_index(
    vocab_a: Sequence[str] | None,
    vocab_b: Sequence[str] | None,
    *,
    size_a: int | None = None,
    size_b: int | None = None,
    exclude: Iterable[str] = SPECIAL_TOKENS,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Indices ``(ia, ib, tokens)`` with ``vocab_a[ia[k]] == vocab_b[ib[k]] == tokens[k]`` for the tokens
    both vocabularies hold (order of ``vocab_a``), special tokens excluded.

    Without vocabularies (both None) the alignment is by id and needs ``size_a == size_b``.
    """
    if vocab_a is None or vocab_b is None:
        if vocab_a is None and vocab_b is None and size_a is not None and size_a == size_b:
            idx = np.arange(int(size_a))
            return idx, idx.copy(), [str(i) for i in idx]
        raise CompatibilityError(
            "cannot align the null statistics with the run: "
            + (
                "one side has no vocabulary"
                if (vocab_a is None) != (vocab_b is None)
                else f"sizes differ ({size_a} vs {size_b}) and there are no vocabularies"
            ),
            "use statistics computed from a corpus directory (they carry vocab.json)",
        )
    skip = set(exclude)
    pos_b = {t: i for i, t in enumerate(vocab_b)}
    ia, ib, toks = [], [], []
    for i, t in enumerate(vocab_a):
        if t in skip or t not in pos_b:
            continue
        ia.append(i)
        ib.append(pos_b[t])
        toks.append(t)
    return np.asarray(ia, dtype=np.int64), np.asarray(ib, dtype=np.int64), toks


def cooccurrence_counts(tokens: Any, vocab_size: int, kind: str, *, chunk: int = 256) -> np.ndarray:
    """Dense (|V|, |V|) int64 pair counts over windows ``tokens`` (N, T+1).

    ``kind``: ``"bigram"`` (x_t, x_{t+1}); ``"context"`` (x_m, x_{t+1}) for m ≤ t (rows = prefix token);
    ``"query_key"`` (x_t, x_m) for m ≤ t (rows = query token).
    """
    if kind not in ("bigram", "context", "query_key"):
        raise ConfigError(f"unknown co-occurrence kind '{kind}'", "use bigram, context or query_key")
    arr = np.asarray(tokens)
    if arr.ndim != 2 or arr.shape[1] < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"tokens must be an (N, T+1) integer array, got {arr.dtype} {arr.shape}", "pass windows")
    V = int(vocab_size)
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= V):
        raise InputError(f"token ids outside 0..{V - 1}", "pass the right vocab_size")
    T = arr.shape[1] - 1
    t_idx, m_idx = np.tril_indices(T)  # pairs (t, m) with m ≤ t
    counts = np.zeros(V * V, dtype=np.int64)
    for s in range(0, arr.shape[0], chunk):
        c = np.asarray(arr[s : s + chunk], dtype=np.int64)
        x, y = c[:, :-1], c[:, 1:]
        if kind == "bigram":
            flat = x * V + y
        elif kind == "context":
            flat = x[:, m_idx] * V + y[:, t_idx]
        else:
            flat = x[:, t_idx] * V + x[:, m_idx]
        counts += np.bincount(flat.ravel(), minlength=V * V)
    return counts.reshape(V, V)


def pmi_from_counts(counts: np.ndarray) -> np.ndarray:
    """PMI[a, b] = log(c(a,b)·n / (c(a,·)·c(·,b))) where c(a,b) > 0, else 0 (float64)."""
    c = np.asarray(counts, dtype=np.float64)
    n = c.sum()
    out = np.zeros_like(c)
    if n <= 0:
        return out
    row, col = c.sum(1), c.sum(0)
    nz = c > 0
    a, b = np.nonzero(nz)
    out[a, b] = np.log(c[a, b]) + math.log(n) - np.log(row[a]) - np.log(col[b])
    return out


def pmi_matrix(tokens: Any, vocab_size: int, kind: str) -> np.ndarray:
    """Raw PMI of a co-occurrence kind (see :func:`cooccurrence_counts` and the module docstring)."""
    return pmi_from_counts(cooccurrence_counts(tokens, vocab_size, kind))


def random_cosine(shape: tuple[int, ...], other: np.ndarray, seed: int = 0) -> float:
    """Cosine of ``other`` with one i.i.d. N(0, 1) matrix (float64, numpy seed ``seed``)."""
    g = np.random.default_rng(seed).standard_normal(shape)
    return cosine(g, other)


def baseline_cosines(
    weights: Mapping[str, Any],
    stats: Any,
    *,
    vocab: Sequence[str] | None = None,
    null_stats: Any = None,
    null_vocab: Sequence[str] | None = None,
    same_corpus_stats: Any = None,
    pmi: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per weight: cosine with its leading term next to the null baselines (see module docstring).

    Keys per weight name: ``leading_term``; ``null_corpus`` and ``leading_term_shared`` (both on the shared
    tokens) and ``n_shared``; ``same_corpus``; ``pmi``; ``random``.  Missing inputs give no key.
    """
    w = {
        k: (v.detach().cpu().numpy() if torch.is_tensor(v) else np.asarray(v, dtype=np.float64))
        for k, v in weights.items()
    }
    check_shapes(w, stats)
    lt = leading_terms(stats)
    null_lt = leading_terms(null_stats) if null_stats is not None else None
    same_lt = leading_terms(same_corpus_stats) if same_corpus_stats is not None else None
    ia = ib = np.empty(0, dtype=np.int64)  # token alignment with the null corpus (set below)
    if null_lt is not None:
        ia, ib, _ = shared_token_index(vocab, null_vocab, size_a=lt["W_O"].shape[0], size_b=null_lt["W_O"].shape[0])
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(sorted(w, key=_order_key)):
        k = _kind(name)
        M = np.asarray(w[name], dtype=np.float64)
        rec: dict[str, Any] = {"leading_term": cosine(M, lt[k])}
        if null_lt is not None:
            if k == "P":
                if null_lt["P"].shape == M.shape:
                    rec["null_corpus"] = cosine(M, null_lt["P"])
                    rec["leading_term_shared"] = rec["leading_term"]
                    rec["n_shared"] = int(M.shape[0])
            elif len(ia):
                sub = M[np.ix_(ia, ia)]
                rec["null_corpus"] = cosine(sub, null_lt[k][np.ix_(ib, ib)])
                rec["leading_term_shared"] = cosine(sub, lt[k][np.ix_(ia, ia)])
                rec["n_shared"] = len(ia)
        if same_lt is not None:
            rec["same_corpus"] = cosine(M, same_lt[k])
        if pmi is not None and k in PMI_KIND and PMI_KIND[k] in pmi:
            rec["pmi"] = cosine(M, pmi[PMI_KIND[k]])
        rec["random"] = random_cosine(M.shape, M, seed + i)
        out[name] = rec
    return out


def _order_key(name: str) -> tuple[int, int]:
    if name == "W_O":
        return (0, 0)
    k, _, l = name.partition(".")
    return ({"W": 1, "V": 2, "P": 3}.get(k, 9), int(l) if l.isdigit() else 0)
