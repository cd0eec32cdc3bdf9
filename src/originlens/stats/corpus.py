"""Exact corpus statistics of arXiv 2601.19208, at corpus scale.

Objects (all averaged over the P counted (input position t, target x_{t+1}) pairs):

=====================  =================================  ==============================
attribute              definition                         rows × columns
=====================  =================================  ==============================
``bigram``             B̄ = (1/P) Σ Xᵀ(Y − c)               current token × next token
``interchangeability`` Σ = B̄ᵀB̄                             next × next (symmetric PSD)
``context``            Φ̄ = (1/P) Σ (Y − c)ᵀ A0 X           target token × prefix token
``value_target``       Φ̄ᵀB̄ᵀ                               key token × residual basis
``query_key``          Q̄ = (1/P) Σ Xᵀ Q_n X                query token × key token
``positional``         Δ[d] = (1/P) Σ Σ_t Q_n[t, t−d]      offset d = 0..T−1
=====================  =================================  ==============================

with c the centring constant (default 1/|V| of the model's softmax), A0 uniform causal attention and
Q_n[t, :] = J_t M_n[t, :] where M_n = (Y_n − c) Σ Φ̄ X_nᵀ.

How it scales: nothing of size N·T·|V| or T³ is materialised.  Bigram counts are a sparse matrix;
products with B̄ are sparse × dense plus rank-one corrections; the two O(N·T²) sums (context and
query-key) run in compiled kernels (:mod:`._kernels`).  Statistics accumulate in two passes because Q̄
needs the final Σ and Φ̄: :class:`FirstOrderSums` (bigram and context counts) and
:class:`SecondOrderSums` (query-key and positional sums).  Both are plain sums over sequences, so
shards can be computed separately and combined with ``merge`` (exact for the integer counts; the
floating-point sums agree to round-off, in a fixed summation order within a shard).

Caveats: padding is handled by the ``valid`` mask / ``pad_id`` (padded pairs are not counted and a pad
in a prefix counts as an out-of-set token, i.e. a zero row of X).  With a restricted token set
(``token_ids``), out-of-set tokens are zero rows of X and Y but their positions still count in P (P is
that of the unrestricted corpus).  Accumulators are float64; ``dtype`` only sets the output precision.
Outputs too large to hold at once: :func:`originlens.stats.stream_statistics` (:mod:`.stream`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from ..errors import CompatibilityError, ConfigError, InputError
from ..progress import progress
from . import _kernels

STAT_KEYS = ("bigram", "interchangeability", "context", "value_target", "query_key", "positional")


@dataclass
class CorpusStatistics:
    """The six statistics plus what is needed to interpret them.

    Matrices are K×K (K = number of kept tokens, = vocab_size without restriction); ``positional``
    has length T.  ``token_ids[k]`` is the original token id of row/column k (None = identity).
    """

    bigram: np.ndarray
    interchangeability: np.ndarray
    context: np.ndarray
    value_target: np.ndarray
    query_key: np.ndarray
    positional: np.ndarray
    n_pairs: int
    vocab_size: int
    seq_len: int
    centering: float
    unigram: np.ndarray | None = None
    token_ids: np.ndarray | None = None
    vocab: list[str] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        """Number of rows/columns K of the matrices."""
        return self.bigram.shape[0]

    def as_dict(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k) for k in STAT_KEYS}

    def index_of(self, token: str | int) -> int:
        """Row index of a token given as a string (needs ``vocab``) or an original id."""
        if isinstance(token, (int, np.integer)):
            tid = int(token)
            if self.token_ids is None:
                if not 0 <= tid < self.size:
                    raise InputError(f"token id {tid} outside 0..{self.size - 1}", "pass a valid id")
                return tid
            hit = np.nonzero(self.token_ids == tid)[0]
            if not len(hit):
                raise InputError(f"token id {tid} is not in the kept token set", "raise --top-k")
            return int(hit[0])
        if self.vocab is None:
            raise InputError(
                f"cannot look up '{token}': these statistics carry no vocabulary",
                "compute them from a corpus directory, or pass an integer id",
            )
        try:
            return self.vocab.index(token)
        except ValueError:
            if token != token.lower() and token.lower() in self.vocab:
                raise InputError(
                    f"token '{token}' is not in the vocabulary, but '{token.lower()}' is",
                    f"pass '{token.lower()}': the word tokenizer lower-cases every word",
                ) from None
            close = [v for v in self.vocab if v.startswith(token[:3])][:5]
            raise InputError(
                f"token '{token}' is not in the vocabulary",
                f"pick another word{(' (e.g. ' + ', '.join(close) + ')') if close else ''}",
            ) from None

    def token_name(self, k: int) -> str:
        if self.vocab is not None:
            return self.vocab[k]
        return str(int(self.token_ids[k]) if self.token_ids is not None else k)


# ----------------------------------------------------------------------------------------------
# input handling


def _check_tokens(tokens: Any, vocab_size: int) -> np.ndarray:
    if vocab_size is None or int(vocab_size) < 1:
        raise ConfigError(f"vocab size must be ≥ 1 (got {vocab_size})", "pass --vocab-size V with V ≥ 1")
    from ..data.store import check_window_array

    return check_window_array(tokens)


def _remap_table(vocab_size: int, token_ids: np.ndarray | None, pad_id: int | None) -> np.ndarray:
    if token_ids is None:
        table = np.arange(vocab_size, dtype=np.int32)
    else:
        token_ids = np.asarray(token_ids, dtype=np.int64)
        if token_ids.ndim != 1 or len(token_ids) == 0:
            raise ConfigError("token_ids must be a non-empty 1-D list of ids", "pass the kept token ids")
        if token_ids.min() < 0 or token_ids.max() >= vocab_size:
            raise ConfigError(f"token_ids must lie in 0..{vocab_size - 1}", "check the token set")
        if len(np.unique(token_ids)) != len(token_ids):
            raise ConfigError("token_ids contains duplicates", "pass each kept id once")
        table = np.full(vocab_size, -1, dtype=np.int32)
        table[token_ids] = np.arange(len(token_ids), dtype=np.int32)
    if pad_id is not None and 0 <= pad_id < vocab_size:
        table = table.copy()
        table[pad_id] = -1
    return table


def _prepare(
    chunk: np.ndarray, vocab_size: int, table: np.ndarray, pad_id: int | None, valid: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    chunk = np.asarray(chunk)
    lo, hi = int(chunk.min()), int(chunk.max())
    if lo < 0 or hi >= vocab_size:
        bad = hi if hi >= vocab_size else lo
        raise InputError(
            f"token id {bad} outside the vocabulary 0..{vocab_size - 1}",
            f"pass --vocab-size {hi + 1} or more, or rebuild the token file",
        )
    x = table[chunk[:, :-1]]
    y = table[chunk[:, 1:]]
    if valid is None:
        valid = np.ones(x.shape, dtype=bool)
    else:
        valid = np.asarray(valid, dtype=bool)
        if valid.shape != x.shape:
            raise InputError(
                f"mask shape {valid.shape} does not match (N, T) = {x.shape}",
                "pass one flag per (input position, target) pair",
            )
    if pad_id is not None:
        valid = valid & (chunk[:, :-1] != pad_id) & (chunk[:, 1:] != pad_id)
    return np.ascontiguousarray(x), np.ascontiguousarray(y), np.ascontiguousarray(valid)


def corpus_chunks(
    tokens: np.ndarray, chunk_size: int, mask: np.ndarray | None, desc: str
) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    n = tokens.shape[0]
    starts = range(0, n, chunk_size)
    for s in progress(starts, total=len(starts), desc=desc, unit="chunk"):
        e = min(n, s + chunk_size)
        yield np.asarray(tokens[s:e]), (None if mask is None else mask[s:e])


# ----------------------------------------------------------------------------------------------
# pass 1


class FirstOrderSums:
    """Sums behind B̄ and Φ̄ (and hence Σ and Φ̄ᵀB̄ᵀ), accumulated over sequences.

    Parameters: ``vocab_size`` (ids must be below it), ``seq_len`` T (windows are T+1 tokens),
    ``token_ids`` (kept token set, default all), ``centering`` c (default 1/vocab_size), ``pad_id``.
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        *,
        token_ids: np.ndarray | None = None,
        centering: float | None = None,
        pad_id: int | None = None,
    ) -> None:
        if int(vocab_size) < 1:
            raise ConfigError(f"vocab size must be ≥ 1 (got {vocab_size})", "pass --vocab-size V with V ≥ 1")
        self.vocab_size = int(vocab_size)
        self.seq_len = int(seq_len)
        self.token_ids = None if token_ids is None else np.asarray(token_ids, dtype=np.int64)
        self.table = _remap_table(self.vocab_size, self.token_ids, pad_id)
        self.K = self.vocab_size if self.token_ids is None else len(self.token_ids)
        self.centering = float(1.0 / self.vocab_size if centering is None else centering)
        if not math.isfinite(self.centering):
            raise ConfigError(
                f"centering must be a finite number, got {centering!r}",
                "omit it for the paper's 1/|V|, or pass e.g. --centering 0",
            )
        if pad_id is not None and (isinstance(pad_id, bool) or not 0 <= int(pad_id) < self.vocab_size):
            raise ConfigError(
                f"pad id {pad_id!r} is not a token id of this vocabulary (0..{self.vocab_size - 1})",
                "pass the id of the padding token, or omit --pad-id",
            )
        self.pad_id = pad_id
        self.n_pairs = 0
        self.unigram = np.zeros(self.K, dtype=np.int64)  # counted x_t in the set
        self.joint = sp.csr_matrix((self.K, self.K), dtype=np.int64)  # (x_t, x_{t+1}) counts
        self.context_raw = np.zeros((self.K, self.K), dtype=np.float64)
        self.prefix_parts = _kernels.empty_parts(self.K)
        self.weights = 1.0 / np.arange(1, self.seq_len + 1, dtype=np.float64)

    def update(self, tokens: np.ndarray, valid: np.ndarray | None = None) -> FirstOrderSums:
        """Add windows ``tokens`` (n, T+1) (optionally with a (n, T) mask of counted pairs)."""
        tokens = _check_tokens(tokens, self.vocab_size)
        if tokens.shape[1] != self.seq_len + 1:
            raise InputError(
                f"windows have {tokens.shape[1]} tokens, expected T+1 = {self.seq_len + 1}",
                "use one sequence length for all shards",
            )
        x, y, v = _prepare(tokens, self.vocab_size, self.table, self.pad_id, valid)
        self.n_pairs += int(v.sum())
        xin = v & (x >= 0)
        self.unigram += np.bincount(x[xin], minlength=self.K)
        both = xin & (y >= 0)
        a, b = x[both].astype(np.int64), y[both].astype(np.int64)
        if len(a):
            self.joint = self.joint + sp.csr_matrix((np.ones(len(a), dtype=np.int64), (a, b)), shape=(self.K, self.K))
        _kernels.context_kernel(x, y, v, self.weights, self.context_raw, self.prefix_parts)
        return self

    def _compatible(self, other: FirstOrderSums) -> None:
        same_ids = (self.token_ids is None and other.token_ids is None) or (
            self.token_ids is not None
            and other.token_ids is not None
            and np.array_equal(self.token_ids, other.token_ids)
        )
        if (self.vocab_size, self.seq_len, self.centering, self.pad_id) != (
            other.vocab_size,
            other.seq_len,
            other.centering,
            other.pad_id,
        ) or not same_ids:
            raise CompatibilityError(
                "cannot merge statistics of different vocabularies, lengths, token sets or centring",
                "compute every shard with the same settings",
            )

    def merge(self, other: FirstOrderSums) -> FirstOrderSums:
        """Add another shard's sums in place (exact for counts)."""
        self._compatible(other)
        self.n_pairs += other.n_pairs
        self.unigram += other.unigram
        self.joint = self.joint + other.joint
        self.context_raw += other.context_raw
        self.prefix_parts += other.prefix_parts
        return self

    # -- finalisation -------------------------------------------------------------------------
    def finalize(self, dtype: Any = np.float64, *, release: bool = False) -> FirstOrder:
        """B̄, Φ̄, Σ, Φ̄ᵀB̄ᵀ and the composed G = ΣΦ̄ needed by pass 2.

        Dense K×K work happens in ``dtype`` (float64 by default; float32 halves memory for large
        vocabularies).  ``release=True`` frees the raw context accumulator (no further merges).
        """
        if self.n_pairs == 0:
            raise InputError("no counted (position, target) pairs", "use a non-empty corpus / mask")
        out = np.dtype(dtype)
        P, c = float(self.n_pairs), self.centering
        alpha = self.unigram.astype(np.float64) / P  # Pr(x_t = a), kept tokens
        JP = (self.joint.astype(np.float64) / P).tocsr()
        JPo = JP.astype(out)
        bigram = JPo.toarray()
        bigram -= (c * alpha[:, None]).astype(out)  # B̄ = J/P − c α 1ᵀ
        prefix = self.prefix_parts.sum(axis=0) / P
        if release:
            context = self.context_raw
            self.context_raw = None  # type: ignore[assignment]
            context /= P
            context -= c * prefix[None, :]  # Φ̄ = F/P − c 1 μᵀ
            context = context.astype(out, copy=False)
        else:
            context = (self.context_raw / P).astype(out, copy=False)
            context -= (c * prefix[None, :]).astype(out)
        # Σ = B̄ᵀB̄ = (J/P)ᵀ(J/P) − c (J/P)ᵀα 1ᵀ − c 1 αᵀ(J/P) + c²(αᵀα) 1 1ᵀ
        ja = (JP.T @ alpha).astype(out)
        sigma = _gram_dense(JPo)
        sigma -= c * ja[:, None]
        sigma -= c * ja[None, :]
        sigma += out.type(c * c * float(alpha @ alpha))
        # B̄Φ̄ = (J/P)Φ̄ − c α (1ᵀΦ̄);  value target Φ̄ᵀB̄ᵀ = (B̄Φ̄)ᵀ;  G = ΣΦ̄ = B̄ᵀ(B̄Φ̄)
        colsum = context.sum(axis=0, dtype=np.float64)
        bphi = np.asarray(JPo @ context)
        bphi -= np.outer((c * alpha).astype(out), colsum.astype(out))
        G = np.asarray(JPo.T @ bphi)
        G -= (c * alpha_dot(alpha, bphi)).astype(out)[None, :]
        value_target = np.ascontiguousarray(bphi.T)
        del bphi
        return FirstOrder(
            bigram=bigram,
            context=context,
            interchangeability=sigma,
            value_target=value_target,
            composed=G,
            unigram=alpha,
            sums=self,
        )


def spans(n: int, step: int) -> list[tuple[int, int]]:
    """Blocks (start, stop) of 0..n of ``step`` items; a last block of one item joins the one before (a
    one-column block would be summed in another order by numpy's reductions)."""
    cuts = [*range(0, n, max(2, int(step))), n]
    if len(cuts) > 2 and cuts[-1] - cuts[-2] == 1:
        del cuts[-2]
    return list(zip(cuts[:-1], cuts[1:]))


def alpha_dot(alpha: np.ndarray, M: np.ndarray, width: int = 512) -> np.ndarray:
    """αᵀM (float64), summed over the rows of M in order: the same bits for any column block of M."""
    out = np.empty(M.shape[1], dtype=np.float64)
    for a, b in spans(M.shape[1], width):
        out[a:b] = (alpha[:, None] * M[:, a:b]).sum(axis=0)
    return out


def _gram_dense(A: sp.csr_matrix, block: int = 2048) -> np.ndarray:
    """Dense AᵀA of a sparse matrix, in row blocks so the sparse intermediate stays small."""
    K = A.shape[1]
    out = np.empty((K, K), dtype=A.dtype)
    At = A.T.tocsr()
    for s in range(0, K, block):
        out[s : s + block] = (At[s : s + block] @ A).toarray()
    return out


@dataclass
class FirstOrder:
    """Finalised first-order statistics plus the composed feature G = ΣΦ̄ for pass 2."""

    bigram: np.ndarray
    context: np.ndarray
    interchangeability: np.ndarray
    value_target: np.ndarray
    composed: np.ndarray
    unigram: np.ndarray
    sums: FirstOrderSums


# ----------------------------------------------------------------------------------------------
# pass 2


class SecondOrderSums:
    """Sums behind Q̄ and Δ; needs the finalised first-order statistics of the *whole* corpus.

    ``rows=(r0, r1)`` accumulates only rows r0..r1−1 of Q̄ (``qk_raw`` is (r1−r0) × K), so Q̄ can be
    computed in row blocks, one pass over the corpus each; Δ is accumulated only in the block with
    r0 = 0 (zero elsewhere).  Every block gives exactly the rows (and Δ) of the unblocked sums.
    """

    def __init__(self, first: FirstOrder, rows: tuple[int, int] | None = None) -> None:
        self.first = first
        s = first.sums
        self.K, self.seq_len, self.vocab_size = s.K, s.seq_len, s.vocab_size
        self.rows = (0, self.K) if rows is None else (int(rows[0]), int(rows[1]))
        if not 0 <= self.rows[0] < self.rows[1] <= self.K:
            raise ConfigError(f"row block {rows} is not within 0..{self.K}", "pass (r0, r1) with 0 ≤ r0 < r1 ≤ K")
        self.n_pairs = 0
        self.G = np.ascontiguousarray(first.composed)
        self.g_sub = (s.centering * self.G.sum(axis=0, dtype=np.float64)).astype(self.G.dtype)
        self.qk_raw = np.zeros((self.rows[1] - self.rows[0], self.K), dtype=np.float64)
        self.delta_parts = _kernels.empty_parts(self.seq_len)

    def update(self, tokens: np.ndarray, valid: np.ndarray | None = None) -> SecondOrderSums:
        s = self.first.sums
        tokens = _check_tokens(tokens, self.vocab_size)
        if tokens.shape[1] != self.seq_len + 1:
            raise InputError(
                f"windows have {tokens.shape[1]} tokens, expected T+1 = {self.seq_len + 1}",
                "use one sequence length for all shards",
            )
        x, y, v = _prepare(tokens, self.vocab_size, s.table, s.pad_id, valid)
        self.n_pairs += int(v.sum())
        _kernels.query_key_kernel(
            x, y, v, s.weights, self.G, self.g_sub, self.qk_raw, self.delta_parts, self.rows[0], self.rows[0] == 0
        )
        return self

    def merge(self, other: SecondOrderSums) -> SecondOrderSums:
        if other.rows != self.rows:
            raise CompatibilityError(
                f"cannot merge row blocks {other.rows} and {self.rows} of Q̄", "merge shards of the same row block"
            )
        if other.first is not self.first and not np.array_equal(other.G, self.G):
            raise CompatibilityError(
                "second-order shards were computed against different first-order statistics",
                "finalise pass 1 once and share it across shards",
            )
        self.n_pairs += other.n_pairs
        self.qk_raw += other.qk_raw
        self.delta_parts += other.delta_parts
        return self

    def finalize(self, dtype: Any = np.float64) -> tuple[np.ndarray, np.ndarray]:
        P = float(self.first.sums.n_pairs)
        if self.n_pairs != self.first.sums.n_pairs:
            raise CompatibilityError(
                f"pass 2 saw {self.n_pairs} pairs but pass 1 saw {P:.0f}", "run both passes over the same corpus"
            )
        q = (self.qk_raw / P).astype(dtype, copy=False)
        delta = (self.delta_parts.sum(axis=0) / P).astype(dtype, copy=False)
        return q, delta


# ----------------------------------------------------------------------------------------------
# one-call API


def corpus_statistics(
    tokens: np.ndarray | Iterable[np.ndarray],
    vocab_size: int,
    *,
    token_ids: np.ndarray | None = None,
    top_k: int | None = None,
    centering: float | None = None,
    pad_id: int | None = None,
    mask: np.ndarray | None = None,
    dtype: Any = np.float64,
    chunk_size: int = 1024,
    vocab: list[str] | None = None,
) -> CorpusStatistics:
    """All six statistics of a token array ``tokens`` (N, T+1) of ids < ``vocab_size``.

    ``top_k`` keeps the K most frequent input tokens (ties by id) — matrices become K×K;
    ``token_ids`` gives the kept set explicitly.  ``centering`` defaults to 1/vocab_size.
    ``mask`` (N, T) marks counted pairs; ``pad_id`` excludes pairs touching a pad.
    ``tokens`` may be a memory-mapped array (read in chunks of ``chunk_size`` windows).  Everything is
    held in memory (several K×K arrays at the peak); :func:`~originlens.stats.stream_statistics`
    writes the same values to disk as they are computed.
    """
    arr, first_sums = first_pass(
        tokens, vocab_size, token_ids=token_ids, top_k=top_k, centering=centering, pad_id=pad_id, mask=mask,
        chunk_size=chunk_size,
    )  # fmt: skip
    first = first_sums.finalize(dtype, release=True)
    second = SecondOrderSums(first)
    for chunk, m in corpus_chunks(arr, chunk_size, mask, "statistics pass 2/2"):
        second.update(chunk, m)
    q, delta = second.finalize(dtype)
    return assemble(first, q, delta, vocab=vocab)


def first_pass(
    tokens: Any,
    vocab_size: int,
    *,
    token_ids: np.ndarray | None = None,
    top_k: int | None = None,
    centering: float | None = None,
    pad_id: int | None = None,
    mask: np.ndarray | None = None,
    chunk_size: int = 1024,
) -> tuple[np.ndarray, FirstOrderSums]:
    """Checked token array and its :class:`FirstOrderSums` (arguments as :func:`corpus_statistics`)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ConfigError(f"chunk size must be an integer ≥ 1, got {chunk_size!r}", "e.g. --chunk-size 1024")
    arr = _check_tokens(tokens, vocab_size)
    if mask is not None and np.asarray(mask).shape != (arr.shape[0], arr.shape[1] - 1):
        raise InputError(
            f"mask shape {np.asarray(mask).shape} does not match (N, T) = {(arr.shape[0], arr.shape[1] - 1)}",
            "pass one flag per (position, target) pair",
        )
    if top_k is not None:
        if token_ids is not None:
            raise ConfigError("pass either top_k or token_ids, not both", "drop one of them")
        token_ids = most_frequent_tokens(arr, vocab_size, top_k, pad_id=pad_id)
    T = arr.shape[1] - 1
    first_sums = FirstOrderSums(vocab_size, T, token_ids=token_ids, centering=centering, pad_id=pad_id)
    for chunk, m in corpus_chunks(arr, chunk_size, mask, "statistics pass 1/2"):
        first_sums.update(chunk, m)
    return arr, first_sums


def assemble(
    first: FirstOrder, query_key: np.ndarray, positional: np.ndarray, vocab: list[str] | None = None
) -> CorpusStatistics:
    """Combine finalised passes into a :class:`CorpusStatistics`."""
    s = first.sums
    kept_vocab = vocab
    if vocab is not None and s.token_ids is not None and len(vocab) == s.vocab_size:
        kept_vocab = [vocab[i] for i in s.token_ids]
    return CorpusStatistics(
        bigram=first.bigram,
        interchangeability=first.interchangeability,
        context=first.context,
        value_target=first.value_target,
        query_key=query_key,
        positional=positional,
        n_pairs=s.n_pairs,
        vocab_size=s.vocab_size,
        seq_len=s.seq_len,
        centering=s.centering,
        unigram=first.unigram,
        token_ids=s.token_ids,
        vocab=kept_vocab,
    )


def most_frequent_tokens(
    tokens: np.ndarray, vocab_size: int, k: int, *, pad_id: int | None = None, chunk_size: int = 65536
) -> np.ndarray:
    """Ids of the ``k`` most frequent tokens of ``tokens`` (ties broken by smaller id), sorted by rank."""
    if k < 1:
        raise ConfigError(f"top-k must be ≥ 1 (got {k})", "pass --top-tokens K with K ≥ 1")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for s in range(0, tokens.shape[0], chunk_size):
        c = np.asarray(tokens[s : s + chunk_size]).ravel()
        if c.size and (c.min() < 0 or c.max() >= vocab_size):
            raise InputError(
                f"token id {c.max()} outside the vocabulary 0..{vocab_size - 1}",
                f"pass --vocab-size {int(c.max()) + 1} or more",
            )
        counts += np.bincount(c, minlength=vocab_size)
    if pad_id is not None and 0 <= pad_id < vocab_size:
        counts[pad_id] = -1
    order = np.lexsort((np.arange(vocab_size), -counts))
    return order[: min(k, vocab_size)]
