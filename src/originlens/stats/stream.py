"""The six statistics computed block by block and handed to a sink as they are produced.

Used by :func:`originlens.stats.io.stream_statistics` to write ``statistics.safetensors`` without ever
holding the outputs in memory: at K kept tokens and output item size s (8 for float64, 4 for float32)
the resident K×K arrays are, in turn,

* pass 1: the float64 context accumulator (8K² bytes), then Φ̄ row blocks written out and the
  accumulator freed;
* B̄ and Σ row blocks, from the sparse bigram counts (nothing K×K);
* G = ΣΦ̄ (sK², kept for pass 2) and column blocks of Φ̄ (read back from the sink), B̄Φ̄ and G: the
  value target Φ̄ᵀB̄ᵀ leaves as row blocks, G fills its columns;
* pass 2: G plus a float64 block of Q̄ rows (``block_bytes``, default max(sK², 512 MB)), one pass over
  the corpus per block; each finished block is written out.

So the peak is about max(8K², sK² + ``block_bytes``) plus the corpus chunk and the interpreter: at
K = 20,000 in float32 (two passes for Q̄) 3.2 GB of arrays, 3.4 GiB resident in all, where holding the
five outputs alone would take 8 GB.  Caveat: in float64 the accumulator and G are 3.2 GB each (G is
read at random by pass 2, so it cannot be blocked), and about 4 GiB is reachable only with
``block_bytes`` ≈ 0.4 GB, i.e. eight passes over the corpus for Q̄ (not measured).

Every value is computed by the same operations, element by element and in the same order, as
:meth:`FirstOrderSums.finalize` (``release=True``) and :class:`SecondOrderSums`, so the results are
bit-identical to :func:`~originlens.stats.corpus_statistics`.

A sink has ``write(name, array, row)`` (rows ``row..`` of a statistic) and ``columns(name, start,
stop)`` (a column slab of a statistic already written: Φ̄ is read back once).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from .corpus import FirstOrder, FirstOrderSums, SecondOrderSums, alpha_dot, corpus_chunks, spans

SLAB_BYTES = 1 << 27  # working blocks of the row- and column-wise phases (≈ 128 MB)


class Sink(Protocol):
    def write(self, name: str, array: Any, row: int = 0) -> None: ...

    def columns(self, name: str, start: int, stop: int) -> np.ndarray: ...


def finalize_first(sums: FirstOrderSums, dtype: Any, sink: Sink, *, slab_bytes: int | None = None) -> FirstOrder:
    """Write ``context``, ``bigram``, ``interchangeability`` and ``value_target``; return G = ΣΦ̄ for pass 2.

    Frees the context accumulator of ``sums`` (no merges afterwards).  The returned :class:`FirstOrder`
    holds G (``composed``) and the unigram; its other matrices are empty.
    """
    from ..errors import InputError

    if sums.n_pairs == 0:
        raise InputError("no counted (position, target) pairs", "use a non-empty corpus / mask")
    out = np.dtype(dtype)
    slab_bytes = slab_bytes or SLAB_BYTES
    K, P, c = sums.K, float(sums.n_pairs), sums.centering
    alpha = sums.unigram.astype(np.float64) / P
    JP = (sums.joint.astype(np.float64) / P).tocsr()
    JPo = JP.astype(out)
    prefix = sums.prefix_parts.sum(axis=0) / P
    rows = slab_bytes // (8 * K)
    # Φ̄ = F/P − c 1 μᵀ, divided and centred in float64 (in place), then rounded to ``out``
    raw = sums.context_raw
    sums.context_raw = None  # type: ignore[assignment]
    for a, b in spans(K, rows):
        blk = raw[a:b]
        blk /= P
        blk -= c * prefix[None, :]
        sink.write("context", blk.astype(out, copy=False), a)
    del raw, blk
    # B̄ = J/P − c α 1ᵀ
    shift = (c * alpha[:, None]).astype(out)
    for a, b in spans(K, rows):
        blk = JPo[a:b].toarray()
        blk -= shift[a:b]
        sink.write("bigram", blk, a)
    # Σ = (J/P)ᵀ(J/P) − c (J/P)ᵀα 1ᵀ − c 1 αᵀ(J/P) + c²(αᵀα) 1 1ᵀ
    ja = (JP.T @ alpha).astype(out)
    cc = out.type(c * c * float(alpha @ alpha))
    At = JPo.T.tocsr()
    for a, b in spans(K, rows):
        blk = (At[a:b] @ JPo).toarray()
        blk -= c * ja[a:b, None]
        blk -= c * ja[None, :]
        blk += cc
        sink.write("interchangeability", blk, a)
    del blk
    # column blocks C: (B̄Φ̄)[:, C] = (J/P)Φ̄[:, C] − c α (1ᵀΦ̄[:, C]); value target rows C = its transpose;
    # G[:, C] = B̄ᵀ(B̄Φ̄)[:, C]
    G = np.empty((K, K), dtype=out)
    ca = (c * alpha).astype(out)
    JPoT = JPo.T
    for a, b in spans(K, slab_bytes // (28 * K)):
        phi = sink.columns("context", a, b)
        colsum = phi.sum(axis=0, dtype=np.float64)
        bphi = np.asarray(JPo @ phi)
        del phi
        bphi -= np.outer(ca, colsum.astype(out))
        g = np.asarray(JPoT @ bphi)
        g -= (c * alpha_dot(alpha, bphi)).astype(out)[None, :]
        G[:, a:b] = g
        del g
        sink.write("value_target", bphi.T, a)
        del bphi
    empty = np.empty((0, 0), dtype=out)
    return FirstOrder(
        bigram=empty, context=empty, interchangeability=empty, value_target=empty, composed=G, unigram=alpha, sums=sums
    )


def second_pass(
    first: FirstOrder,
    tokens: np.ndarray,
    mask: np.ndarray | None,
    dtype: Any,
    sink: Sink,
    *,
    chunk_size: int = 1024,
    block_bytes: int | None = None,
    slab_bytes: int | None = None,
) -> int:
    """Write ``query_key`` (row blocks of ``block_bytes`` float64, one corpus pass each) and ``positional``.

    Returns the number of passes over the corpus.
    """
    out = np.dtype(dtype)
    slab_bytes = slab_bytes or SLAB_BYTES
    K, P = first.sums.K, first.sums.n_pairs
    if block_bytes is None:
        block_bytes = max(K * K * out.itemsize, 1 << 29)
    blocks = list(spans(K, block_bytes // (8 * K)))
    delta = None
    for i, (r0, r1) in enumerate(blocks):
        second = SecondOrderSums(first, rows=(r0, r1))
        desc = "statistics pass 2/2" + (f" (rows {r0}–{r1 - 1})" if len(blocks) > 1 else "")
        for chunk, m in corpus_chunks(tokens, chunk_size, mask, desc):
            second.update(chunk, m)
        if second.n_pairs != P:
            second.finalize(out)  # raises the mismatch
        for a, b in spans(r1 - r0, slab_bytes // (8 * K)):
            sink.write("query_key", (second.qk_raw[a:b] / float(P)).astype(out, copy=False), r0 + a)
        if i == 0:
            delta = (second.delta_parts.sum(axis=0) / float(P)).astype(out, copy=False)
        del second  # free this block before the next one is allocated
    sink.write("positional", delta, 0)
    return len(blocks)
