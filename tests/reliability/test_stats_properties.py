"""Property-based invariants of the corpus statistics (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from originlens.stats import FirstOrderSums, SecondOrderSums, assemble, corpus_statistics


@st.composite
def corpora(draw):
    V = draw(st.integers(2, 9))
    T = draw(st.integers(1, 7))
    N = draw(st.integers(1, 6))
    flat = draw(st.lists(st.integers(0, V - 1), min_size=N * (T + 1), max_size=N * (T + 1)))
    return np.array(flat, dtype=np.int64).reshape(N, T + 1), V


@settings(max_examples=40, deadline=None)
@given(corpora())
def test_invariants(c):
    toks, V = c
    s = corpus_statistics(toks, V)
    tol = 1e-13
    assert np.abs(s.bigram.sum(1)).max() < tol  # bigram rows sum to zero
    assert np.abs(s.context.sum(0)).max() < tol  # context columns sum to zero
    S = s.interchangeability
    assert np.abs(S - S.T).max() < 1e-16  # symmetric
    assert np.linalg.eigvalsh(S).min() > -1e-14  # positive semi-definite
    scale = max(np.abs(s.query_key).max(), 1e-300)
    assert np.abs(s.query_key.sum(1)).max() <= 1e-12 * scale * V + 1e-15
    assert abs(s.positional.sum()) <= 1e-12 * np.abs(s.positional).max() * len(s.positional) + 1e-15


@settings(max_examples=25, deadline=None)
@given(corpora(), st.data())
def test_merge_is_associative_and_matches_whole(c, data):
    toks, V = c
    N, T = toks.shape[0], toks.shape[1] - 1
    cut1 = data.draw(st.integers(0, N))
    cut2 = data.draw(st.integers(cut1, N))
    parts = [toks[:cut1], toks[cut1:cut2], toks[cut2:]]
    parts = [p for p in parts if len(p)]
    sums = [FirstOrderSums(V, T).update(p) for p in parts]
    left = FirstOrderSums(V, T)
    for s in sums:
        left.merge(s)
    right = FirstOrderSums(V, T)
    for s in reversed(sums):
        right.merge(s)
    whole = FirstOrderSums(V, T).update(toks)
    assert left.n_pairs == right.n_pairs == whole.n_pairs
    assert np.array_equal(left.unigram, whole.unigram)
    assert (left.joint != whole.joint).nnz == 0
    np.testing.assert_allclose(left.context_raw, right.context_raw, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(left.context_raw, whole.context_raw, rtol=1e-14, atol=1e-14)
    f = left.finalize()
    q = SecondOrderSums(f)
    for p in parts:
        q.merge(SecondOrderSums(f).update(p))
    merged = assemble(f, *q.finalize())
    ref = corpus_statistics(toks, V)
    for k in ("bigram", "context", "query_key", "positional"):
        np.testing.assert_allclose(getattr(merged, k), getattr(ref, k), rtol=1e-12, atol=1e-15)
