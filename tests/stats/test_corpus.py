"""Corpus statistics against a brute-force float64 one-hot implementation of the definitions of arXiv 2601.19208 §3."""

from __future__ import annotations

import numpy as np
import pytest

from originlens.errors import CompatibilityError, ConfigError, InputError
from originlens.stats import (
    FirstOrderSums,
    SecondOrderSums,
    assemble,
    corpus_statistics,
    most_frequent_tokens,
    top_associations,
)


# ------------------------------------------------------------------ brute force (the definitions, dense)
def brute_force(tokens, V, *, token_ids=None, c=None, valid=None):
    tokens = np.asarray(tokens)
    N, T1 = tokens.shape
    T = T1 - 1
    ids = np.arange(V) if token_ids is None else np.asarray(token_ids)
    K = len(ids)
    c = 1.0 / V if c is None else c
    sel = np.zeros((V, K))
    sel[ids, np.arange(K)] = 1.0  # one-hot in V, projected on the kept set
    eye = np.eye(V)
    X = eye[tokens[:, :-1]] @ sel  # (N,T,K), out-of-set rows zero
    Y = eye[tokens[:, 1:]] @ sel
    valid = np.ones((N, T), bool) if valid is None else valid
    R0 = (Y - c) * valid[..., None]  # uncounted pairs contribute nothing
    P = valid.sum()
    A0 = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    B = np.einsum("ntv,ntw->vw", X, R0) / P
    Phi = np.einsum("ntv,ntw->vw", R0, np.einsum("ts,nsw->ntw", A0, X)) / P
    Sig = B.T @ B
    Vlt = Phi.T @ B.T
    M = np.einsum("ntv,vw,nkw->ntk", R0, Sig @ Phi, X)
    # dense softmax Jacobian at uniform causal attention: J_t = diag(a_t) - a_t a_t^T
    Jt = np.zeros((T, T, T))
    for t in range(T):
        a = A0[t]
        Jt[t] = np.diag(a) - np.outer(a, a)
    Qn = np.einsum("tij,ntj->nti", Jt, M)
    Q = np.einsum("ntv,ntj,njw->vw", X, Qn, X) / P
    Qmean = Qn.sum(0) / P
    Delta = np.array([np.trace(Qmean, offset=-d) for d in range(T)])
    return dict(
        bigram=B, context=Phi, interchangeability=Sig, value_target=Vlt, query_key=Q, positional=Delta, Qn=Qn, P=P
    )


def random_corpus(seed, N=12, T=7, V=9):
    rng = np.random.default_rng(seed)
    # skewed unigram so that some tokens are rare and the top-k restriction matters
    p = rng.dirichlet(np.full(V, 0.6))
    return rng.choice(V, size=(N, T + 1), p=p)


KEYS = ["bigram", "context", "interchangeability", "value_target", "query_key", "positional"]


def assert_stats_close(st, ref, rtol=1e-11):
    for k in KEYS:
        got, exp = getattr(st, k), ref[k]
        scale = max(np.abs(exp).max(), 1e-300)
        np.testing.assert_allclose(got, exp, rtol=0, atol=rtol * scale, err_msg=k)


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(100 + seed)
    V, T, N = int(rng.integers(4, 12)), int(rng.integers(2, 9)), int(rng.integers(1, 15))
    toks = random_corpus(seed, N=N, T=T, V=V)
    st = corpus_statistics(toks, V, chunk_size=int(rng.integers(1, 6)))
    ref = brute_force(toks, V)
    assert st.n_pairs == N * T
    assert_stats_close(st, ref)


def test_restricted_token_set_and_centering():
    V = 11
    toks = random_corpus(3, N=15, T=6, V=V)
    ids = most_frequent_tokens(toks, V, 5)
    st = corpus_statistics(toks, V, token_ids=ids, centering=1 / 50)
    ref = brute_force(toks, V, token_ids=ids, c=1 / 50)
    assert st.bigram.shape == (5, 5)
    assert_stats_close(st, ref)
    st2 = corpus_statistics(toks, V, top_k=5, centering=1 / 50)
    assert_stats_close(st2, ref)


def test_mask_and_pad():
    V = 8
    toks = random_corpus(5, N=10, T=6, V=V)
    rng = np.random.default_rng(0)
    valid = rng.random((10, 6)) < 0.7
    st = corpus_statistics(toks, V, mask=valid)
    ref = brute_force(toks, V, valid=valid)
    assert st.n_pairs == valid.sum()
    assert_stats_close(st, ref)
    # right padding with id 0: pairs touching a pad are not counted; pads are zero rows of X
    padded = toks.copy()
    padded[:, 5:] = 0
    pad_valid = (padded[:, :-1] != 0) & (padded[:, 1:] != 0)
    ids = np.arange(1, V)
    st = corpus_statistics(padded, V, pad_id=0, token_ids=ids)
    ref = brute_force(padded, V, valid=pad_valid, token_ids=ids)
    assert_stats_close(st, ref)


def test_entry_formulas_and_invariants():
    V, T, N = 10, 8, 30
    toks = random_corpus(11, N=N, T=T, V=V)
    st = corpus_statistics(toks, V)
    x, y = toks[:, :-1], toks[:, 1:]
    P = N * T
    # B̄[a,b] = Pr(x_t=a, x_{t+1}=b) − Pr(x_t=a)/|V|
    joint = np.zeros((V, V))
    np.add.at(joint, (x.ravel(), y.ravel()), 1)
    pa = np.bincount(x.ravel(), minlength=V) / P
    np.testing.assert_allclose(st.bigram, joint / P - pa[:, None] / V, atol=1e-15)
    # Φ̄[a,b] = (1/T) Σ_t 1/(t+1) Σ_{m≤t} Pr(x_{t+1}=a, x_m=b) − μ_b   (loops over the definition)
    phi = np.zeros((V, V))
    mu = np.zeros(V)
    for t in range(T):
        for m in range(t + 1):
            for n in range(N):
                phi[y[n, t], x[n, m]] += 1 / (N * T * (t + 1))
                mu[x[n, m]] += 1 / (V * N * T * (t + 1))
    np.testing.assert_allclose(st.context, phi - mu[None, :], atol=1e-15)
    # invariants
    np.testing.assert_allclose(st.bigram.sum(1), 0, atol=1e-15)
    np.testing.assert_allclose(st.context.sum(0), 0, atol=1e-15)
    np.testing.assert_allclose(st.interchangeability, st.interchangeability.T, atol=1e-17)
    assert np.linalg.eigvalsh(st.interchangeability).min() > -1e-15
    np.testing.assert_allclose(st.query_key.sum(1), 0, atol=1e-15 * np.abs(st.query_key).max() * V)
    assert abs(st.positional.sum()) < 1e-14 * np.abs(st.positional).max() * T
    ref = brute_force(toks, V)
    Qn = ref["Qn"]
    assert np.all(Qn[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] == 0)
    np.testing.assert_allclose(Qn.sum(-1), 0, atol=1e-15)


def test_closed_form_qn_equals_jacobian_form():
    # the kernel's closed form (docs/concepts.md) against the J_t einsum on a random M
    rng = np.random.default_rng(1)
    T = 6
    M = rng.normal(size=(3, T, T))
    closed = np.zeros_like(M)
    for t in range(T):
        r = M[:, t, : t + 1].sum(-1)
        closed[:, t, : t + 1] = M[:, t, : t + 1] / (t + 1) - r[:, None] / (t + 1) ** 2
    A0 = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    dense = np.stack([(np.diag(A0[t]) - np.outer(A0[t], A0[t])) @ M[:, t, :].T for t in range(T)], 1)
    np.testing.assert_allclose(closed, np.transpose(dense, (2, 1, 0)), atol=1e-15)


def test_merge_of_shards_equals_whole():
    V, T = 9, 6
    toks = random_corpus(21, N=40, T=T, V=V)
    whole = corpus_statistics(toks, V)
    shards = [toks[:13], toks[13:14], toks[14:]]
    f = [FirstOrderSums(V, T).update(s) for s in shards]
    merged = f[0].merge(f[1]).merge(f[2])
    first = merged.finalize()
    q = [SecondOrderSums(first).update(s) for s in shards]
    qm = q[0].merge(q[1]).merge(q[2])
    st = assemble(first, *qm.finalize())
    assert st.n_pairs == whole.n_pairs
    assert np.array_equal(merged.unigram, FirstOrderSums(V, T).update(toks).unigram)
    for k in KEYS:
        np.testing.assert_allclose(getattr(st, k), getattr(whole, k), rtol=1e-12, atol=1e-17, err_msg=k)
    with pytest.raises(CompatibilityError):
        FirstOrderSums(V, T).merge(FirstOrderSums(V + 1, T))


def test_chunking_and_memmap_are_invariant(tmp_path):
    V = 12
    toks = random_corpus(7, N=25, T=9, V=V).astype(np.uint16)
    np.save(tmp_path / "t.npy", toks)
    mm = np.load(tmp_path / "t.npy", mmap_mode="r")
    a = corpus_statistics(mm, V, chunk_size=4)
    b = corpus_statistics(toks, V, chunk_size=1000)
    for k in KEYS:
        np.testing.assert_allclose(getattr(a, k), getattr(b, k), rtol=1e-12, atol=1e-17)


def test_bad_input_errors():
    toks = random_corpus(0, N=4, T=3, V=5)
    with pytest.raises(InputError, match="outside the vocabulary"):
        corpus_statistics(toks, 4 if toks.max() >= 4 else toks.max())
    with pytest.raises(ConfigError, match="vocab size"):
        corpus_statistics(toks, 0)
    with pytest.raises(InputError, match="empty"):
        corpus_statistics(np.zeros((0, 5), dtype=int), 5)
    with pytest.raises(InputError, match="2-D"):
        corpus_statistics(np.zeros(5, dtype=int), 5)
    with pytest.raises(InputError, match="at least 2"):
        corpus_statistics(np.zeros((3, 1), dtype=int), 5)
    with pytest.raises(InputError, match="integers"):
        corpus_statistics(np.zeros((3, 4)), 5)


def test_top_associations_orders_and_excludes_self():
    V = 6
    # a deterministic corpus: 0 is always followed by 1, 2 by 3
    toks = np.array([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5]] * 3)
    vocab = ["a", "b", "c", "d", "e", "f"]
    st = corpus_statistics(toks, V, vocab=vocab)
    top = top_associations(st, "bigram", "a", k=2)
    assert top[0][0] == "b" and top[0][1] > top[1][1]
    col = top_associations(st, "bigram", "d", k=1, direction="column")
    assert col[0][0] == "c"
    assert all(name != "a" for name, _ in top_associations(st, "context", "a", k=5))
    with pytest.raises(ConfigError):
        top_associations(st, "nonsense", "a")
    with pytest.raises(InputError, match="not in the vocabulary"):
        top_associations(st, "bigram", "zzz")


def test_statistics_keep_torch_thread_setting():
    """numba's OpenMP layer resets the OpenMP thread count when it starts; the statistics kernels must put
    torch's setting back (it silently undid --threads 1 in the first training of a process)."""
    import subprocess
    import sys

    code = (
        "import numpy as np, torch; torch.set_num_threads(1); assert torch.get_num_threads() == 1; "
        "from originlens.stats import corpus_statistics; "
        "corpus_statistics(np.random.default_rng(0).integers(0, 20, size=(50, 9)), 20); "
        "assert torch.get_num_threads() == 1, torch.get_num_threads()"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_NUM_THREADS"}
    subprocess.run([sys.executable, "-c", code], check=True, env={**env, "NUMBA_NUM_THREADS": "2"})
