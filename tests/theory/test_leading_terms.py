"""Closed-form leading terms (arXiv 2601.19208 Thm 4.1, zero init Thm D.9) against full-batch GD of the Def. 3.1 model, float64.

The statistics used for the training comparisons come from ``originlens.stats.corpus_statistics``;
``reference_statistics`` below is an independent brute-force float64 implementation of the statistics' definitions (arXiv 2601.19208 §3; docs/concepts.md) (dense
one-hots, explicit softmax Jacobians J_t) used to check that module and the formulas here.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from originlens.errors import ConfigError, InputError
from originlens.models.assoc import AssocConfig, AssocModel
from originlens.theory import (
    LeadingTermModel,
    attention_coef,
    attention_count,
    compare_to_theory,
    conditional_bigram_loss,
    cosine,
    error_bounds,
    min_cosines,
    norm_ratio,
    output_coef,
    position_coef,
    predicted_weights,
    validity_window,
    value_coef,
)
from originlens.train import AssocTrainConfig, train_assoc

# ------------------------------------------------------------------------------------------------
# test helpers: corpus and brute-force reference statistics


def markov_topic_corpus(V: int = 48, T: int = 20, N: int = 160, n_topics: int = 4, seed: int = 0) -> np.ndarray:
    """(N, T+1) tokens from a sparse Markov chain mixed with a per-sequence topic distribution."""
    rng = np.random.default_rng(seed)
    trans = rng.dirichlet(np.full(V, 0.1), size=V)
    topics = np.full((n_topics, V), 0.05)
    for k in range(n_topics):
        topics[k, k * V // n_topics : (k + 1) * V // n_topics] = 1.0
    topics /= topics.sum(1, keepdims=True)
    out = np.empty((N, T + 1), dtype=np.int64)
    for n in range(N):
        z = rng.integers(n_topics)
        x = rng.choice(V, p=topics[z])
        out[n, 0] = x
        for t in range(1, T + 1):
            x = rng.choice(V, p=0.5 * trans[x] + 0.5 * topics[z])
            out[n, t] = x
    return out


def reference_statistics(tokens: np.ndarray, V: int) -> SimpleNamespace:
    """TEST HELPER: brute-force statistics' definitions in float64 with dense one-hots and explicit J_t."""
    N, T = tokens.shape[0], tokens.shape[1] - 1
    eye = np.eye(V)
    X, Y = eye[tokens[:, :-1]], eye[tokens[:, 1:]]
    R0 = Y - 1.0 / V
    A0 = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    B = np.einsum("ntv,ntw->vw", X, R0) / (N * T)
    Phi = np.einsum("ntv,ntw->vw", R0, np.einsum("tj,njv->ntv", A0, X)) / (N * T)
    Sig = B.T @ B
    M = np.einsum("ntv,vw,nkw->ntk", R0, Sig @ Phi, X)
    J = np.zeros((T, T, T))
    for t in range(T):
        a = A0[t]
        J[t] = np.diag(a) - np.outer(a, a)
    Qn = np.einsum("tjk,ntk->ntj", J, M)
    Q = np.einsum("ntv,ntj,njw->vw", X, Qn, X) / (N * T)
    Qmean = Qn.sum(0) / (N * T)
    Delta = np.array([np.trace(Qmean, offset=-d) for d in range(T)])
    return SimpleNamespace(
        bigram=B,
        interchangeability=Sig,
        context=Phi,
        value_target=Phi.T @ B.T,
        query_key=Q,
        positional=Delta,
        n_pairs=N * T,
        Qn=Qn,
    )


def _statistics(tokens: np.ndarray, V: int):
    from originlens.stats import corpus_statistics

    return corpus_statistics(tokens, V, dtype=np.float64)


def train_gd(tokens: np.ndarray, V: int, L: int, eta: float, steps: int, record) -> dict[int, dict]:
    """Full-batch GD from zero init; returns weights (float64 numpy) at the steps in ``record``."""
    snaps: dict[int, dict] = {}

    class Snap:
        def on_step_end(self, tr):
            if tr.step in record:
                snaps[tr.step] = {k: v.numpy().copy() for k, v in tr.model.weights().items()}

    cfg = AssocTrainConfig(n_layers=L, lr=eta, steps=steps, dtype="float64", stats_source="none")
    train_assoc(tokens, V, cfg, callbacks=[Snap()])
    return snaps


def rel(a, b) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def cos_ref(a, b) -> float:
    a, b = np.ravel(a), np.ravel(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


V0, T0, N0, L0, ETA = 48, 20, 160, 2, 0.02


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    # tiny matmuls: intra-op threads only add contention on the shared 2-core machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def corpus():
    return markov_topic_corpus(V0, T0, N0)


@pytest.fixture(scope="module")
def ref(corpus):
    return reference_statistics(corpus, V0)


@pytest.fixture(scope="module")
def stats(corpus):
    return _statistics(corpus, V0)


@pytest.fixture(scope="module")
def snaps(corpus):
    return train_gd(corpus, V0, L0, ETA, 20, {1, 2, 3, 5, 10, 20})


# ------------------------------------------------------------------------------------------------
# the reference helper itself, and the statistics module against it


def test_reference_helper_matches_entry_formulas(corpus, ref):
    V, (N, T1) = V0, corpus.shape
    T = T1 - 1
    joint = np.zeros((V, V))
    np.add.at(joint, (corpus[:, :-1].ravel(), corpus[:, 1:].ravel()), 1.0 / (N * T))
    pa = joint.sum(1)
    np.testing.assert_allclose(ref.bigram, joint - pa[:, None] / V, atol=1e-15)
    # Φ̄[a, b] entry formula (docs/concepts.md) by loops
    phi = np.zeros((V, V))
    mu = np.zeros(V)
    for n in range(N):
        for t in range(T):
            for m in range(t + 1):
                phi[corpus[n, t + 1], corpus[n, m]] += 1.0 / ((t + 1) * N * T)
                mu[corpus[n, m]] += 1.0 / ((t + 1) * N * T * V)
    np.testing.assert_allclose(ref.context, phi - mu[None, :], atol=1e-15)
    # closed form of Q_n (the query-key leading term, docs/concepts.md) vs the J_t form used in the helper
    R0 = np.eye(V)[corpus[:, 1:]] - 1.0 / V
    M = np.einsum("ntv,vw,nkw->ntk", R0, ref.interchangeability @ ref.context, np.eye(V)[corpus[:, :-1]])
    t = np.arange(T)[:, None]
    closed = np.where(np.arange(T)[None, :] <= t, M / (t + 1) - np.tril(M).sum(-1, keepdims=True) / (t + 1) ** 2, 0.0)
    np.testing.assert_allclose(ref.Qn, closed, atol=1e-15)
    np.testing.assert_allclose(ref.bigram.sum(1), 0, atol=1e-15)
    np.testing.assert_allclose(ref.context.sum(0), 0, atol=1e-15)
    np.testing.assert_allclose(ref.query_key.sum(1), 0, atol=1e-15)
    assert abs(ref.positional.sum()) < 1e-15


def test_statistics_module_matches_reference(stats, ref):
    for name in ("bigram", "interchangeability", "context", "value_target", "query_key", "positional"):
        a, b = np.asarray(getattr(stats, name)), getattr(ref, name)
        assert np.abs(a - b).max() <= 1e-12 * max(np.abs(b).max(), 1e-300), name


# ------------------------------------------------------------------------------------------------
# coefficients, window, bounds


def test_coefficients_are_binomials():
    for s in range(0, 25):
        assert output_coef(s, 0.1) == pytest.approx(s * 0.1, rel=1e-15)
        assert value_coef(s, 0.1) == pytest.approx(s * (s - 1) / 2 * 0.01, rel=1e-15, abs=0)
        brute = 3 * (s * (s - 1) * (s - 2) * (s - 3) // 24) + 2 * (s * (s - 1) * (s - 2) // 6)
        assert attention_count(s) == brute
        assert attention_coef(s, 0.1) == pytest.approx(brute * 1e-4, rel=1e-12)
        assert position_coef(s, 0.1) == attention_coef(s, 0.1)
    assert [attention_count(s) for s in (1, 2, 3, 4)] == [0, 0, 2, 11]
    with pytest.raises(ConfigError):
        value_coef(2.5, 0.1)


def test_attention_count_identity():
    for s in range(1, 21):
        assert attention_count(s) == sum(k * math.comb(k, 2) for k in range(s))


def test_validity_window_paper_setting():
    w = validity_window(200, 3, 0.005, 3000)
    assert w.holds and w.variant == "multi"
    assert w.s_max * 0.005 == pytest.approx(min(5 / (8 * math.sqrt(200)), 1 / 36), rel=1e-12)
    assert w.s_max * 0.005 == pytest.approx(0.0278, abs=5e-5)  # the validity window of the paper's experiments
    assert w.steps == 5 and w.covers(5) and not w.covers(6)
    assert validity_window(200, 3, 0.05, 3000).steps == 0  # less than one step
    bad = validity_window(64, 3, 0.005, 500)  # L > √T/4
    assert not bad.holds and not bad.conditions["L <= sqrt(T)/4"]
    assert not validity_window(64, 2, 0.005, 400).conditions["|V| >= 500"]
    one = validity_window(64, 1, 0.01, 500)
    assert one.variant == "one_layer" and one.s_max == pytest.approx(3 / (8 * 64**0.375) / 0.01)
    g = validity_window(64, 2, 0.02, 500, init_std=1e-12)
    assert g.holds and "gaussian" in g.theorem
    assert not validity_window(64, 2, 0.02, 500, init_std=1.0).holds


def test_error_bounds_formulas():
    s, e, T = 4, 0.01, 64
    b = error_bounds(s, e, T)
    assert b == pytest.approx(
        {"W_O": 3 * s**2 * e**2, "V": 12 * s**3 * e**3, "W": 13 * s**5 * e**5 * T, "P": 13 * s**5 * e**5 * T}
    )
    b1 = error_bounds(s, e, T, "one_layer")
    assert b1["V"] == pytest.approx(4 * s**3 * e**3) and b1["W"] == pytest.approx(6 * s**5 * e**5 * T)


# ------------------------------------------------------------------------------------------------
# exact small-step facts of zero-init full-batch GD


def test_initial_loss_is_log_vocab(corpus):
    m = AssocModel(AssocConfig(vocab_size=V0, seq_len=T0, n_layers=L0, dtype="float64"))
    assert abs(m.loss(torch.from_numpy(corpus)).item() - math.log(V0)) <= 1e-12


def test_after_one_step(snaps, ref):
    w = snaps[1]
    assert rel(w["W_O"], ETA * ref.bigram) <= 1e-12
    for l in range(1, L0 + 1):
        for k in ("W", "V", "P"):
            assert not np.any(w[f"{k}.{l}"]), f"{k}.{l} not exactly zero"


def test_after_two_steps(snaps, ref):
    w = snaps[2]
    assert np.linalg.norm(w["W_O"] - 2 * ETA * ref.bigram) <= ETA**2 / V0
    for l in range(1, L0 + 1):
        assert not np.any(w[f"W.{l}"]) and not np.any(w[f"P.{l}"])
        assert np.linalg.norm(w[f"V.{l}"] - ETA**2 * ref.value_target) <= 2 * ETA**3 / V0
        assert np.any(w[f"V.{l}"])


def test_after_three_steps(snaps, ref):
    w = snaps[3]
    for l in range(1, L0 + 1):
        assert rel(w[f"W.{l}"] / (2 * ETA**4), ref.query_key) < 1e-3
        assert rel(w[f"P.{l}"] / (2 * ETA**4), ref.positional) < 1e-3


@pytest.mark.parametrize("s", [3, 5, 10, 20])
def test_cosines_and_norm_ratios(snaps, stats, ref, s):
    w = snaps[s]
    targets = {"W_O": (ref.bigram, output_coef(s, ETA))}
    for l in range(1, L0 + 1):
        targets[f"V.{l}"] = (ref.value_target, value_coef(s, ETA))
        targets[f"W.{l}"] = (ref.query_key, attention_coef(s, ETA))
        targets[f"P.{l}"] = (ref.positional, attention_coef(s, ETA))
    cmp = compare_to_theory(w, stats, s, ETA)
    for name, (target, c) in targets.items():
        cs = cos_ref(w[name], target)
        ratio = np.linalg.norm(w[name]) / (c * np.linalg.norm(target))
        assert cs > 0.99999, (name, s, cs)
        assert abs(ratio - 1) < 1e-3, (name, s, ratio)
        assert cmp[name]["cos"] == pytest.approx(cs, abs=1e-12)
        assert cmp[name]["norm_ratio"] == pytest.approx(ratio, rel=1e-10)
        err = np.linalg.norm(w[name] - c * target)
        assert cmp[name]["frob_err"] == pytest.approx(err, rel=1e-8, abs=1e-18)
    mc = min_cosines(cmp)
    assert set(mc) == {"W_O", "V", "W", "P"} and min(mc.values()) > 0.99999


def test_orientation_guards(snaps, ref):
    w = snaps[10]
    for l in range(1, L0 + 1):
        right_w = cos_ref(w[f"W.{l}"], ref.query_key)
        assert cos_ref(w[f"W.{l}"], ref.query_key.T) < right_w - 0.05
        right_p = cos_ref(w[f"P.{l}"], ref.positional)
        assert cos_ref(w[f"P.{l}"], ref.positional[::-1]) < right_p - 0.05
        right_v = cos_ref(w[f"V.{l}"], ref.value_target)
        assert cos_ref(w[f"V.{l}"], ref.bigram @ ref.context) < right_v - 0.05
    assert cos_ref(w["W_O"], ref.bigram.T) < cos_ref(w["W_O"], ref.bigram) - 0.05


@pytest.mark.slow
def test_theorem_bounds_within_window():
    V, T, L, eta = 500, 64, 2, 0.005
    win = validity_window(T, L, eta, V)
    assert win.holds and win.steps >= 8
    toks = markov_topic_corpus(V, T, 16, n_topics=5, seed=3)
    st = _statistics(toks, V)
    steps = list(range(1, win.steps + 1))
    snaps = train_gd(toks, V, L, eta, win.steps, set(steps))
    for s in steps:
        b = win.bounds(s)
        pred = predicted_weights(st, s, eta, L)
        w = snaps[s]
        for name, p in pred.items():
            err = np.linalg.norm(w[name] - p)
            assert err <= b[name.split(".")[0]], (s, name, err, b)
        cmp = compare_to_theory(w, st, s, eta)
        assert all(cmp[n]["frob_err"] <= cmp[n]["bound"] for n in cmp)


# ------------------------------------------------------------------------------------------------
# predicted weights, comparison helpers


def test_predicted_weights(ref):
    p = predicted_weights(ref, 4, 0.1, 3)
    assert set(p) == {"W_O"} | {f"{k}.{l}" for k in "WVP" for l in (1, 2, 3)}
    np.testing.assert_allclose(p["W_O"], 0.4 * ref.bigram, rtol=1e-15)
    np.testing.assert_allclose(p["V.2"], 6 * 0.01 * ref.value_target, rtol=1e-13)
    np.testing.assert_allclose(p["W.3"], 11 * 1e-4 * ref.query_key, rtol=1e-13)
    np.testing.assert_allclose(p["P.1"], 11 * 1e-4 * ref.positional, rtol=1e-13)
    with pytest.raises(InputError):
        predicted_weights({"bigram": ref.bigram}, 1, 0.1, 1)


def test_cosine_and_norm_ratio():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 4))
    assert cosine(a, 3 * a) == pytest.approx(1.0, abs=1e-15)
    assert cosine(a, -a) == pytest.approx(-1.0, abs=1e-15)
    b = rng.normal(size=(5, 4))
    assert cosine(a, b) == pytest.approx(np.sum(a * b) / np.linalg.norm(a) / np.linalg.norm(b), abs=1e-15)
    assert cosine(torch.from_numpy(a), b) == pytest.approx(cosine(a, b), abs=1e-15)
    assert math.isnan(cosine(a, np.zeros_like(a)))
    assert norm_ratio(2 * a, a) == pytest.approx(2.0, rel=1e-15)
    assert math.isnan(norm_ratio(a, np.zeros_like(a)))
    with pytest.raises(InputError):
        cosine(a, b[:4])


def test_compare_at_small_s_gives_nan_not_error(snaps, stats):
    cmp = compare_to_theory(snaps[1], stats, 1, ETA)
    assert cmp["W_O"]["cos"] > 0.999999999
    assert math.isnan(cmp["V.1"]["cos"]) and math.isnan(cmp["W.2"]["norm_ratio"])


# ------------------------------------------------------------------------------------------------
# leading-term model (Eq. 12)


def _eq12_bruteforce(inputs, st, s, eta, n_layers):
    """TEST HELPER: Eq. 12 with dense one-hots and explicit masking."""
    V = st.bigram.shape[0]
    cO, cV, cW = s * eta, math.comb(s, 2) * eta**2, (3 * math.comb(s, 4) + 2 * math.comb(s, 3)) * eta**4
    out = []
    for x in inputs:
        T = len(x)
        X = np.eye(V)[x]
        DM = np.zeros((T, T))
        for t in range(T):
            for d in range(t + 1):
                DM[t, t - d] = st.positional[d]
        S = cW * (X @ st.query_key @ X.T + DM)
        S[np.triu_indices(T, 1)] = -np.inf
        A = np.exp(S - S.max(1, keepdims=True))
        A /= A.sum(1, keepdims=True)
        out.append((X + n_layers * cV * A @ X @ st.value_target) @ (cO * st.bigram))
    return np.stack(out)


def test_leading_term_model_logits(corpus, ref, stats):
    x = corpus[:7, :15]
    for s, L in ((5, 1), (20, 2)):
        lt = LeadingTermModel(stats, s, ETA, n_layers=L)
        np.testing.assert_allclose(lt.logits(x).numpy(), _eq12_bruteforce(x, ref, s, ETA, L), rtol=1e-10, atol=1e-14)
    lt = LeadingTermModel(stats, 20, ETA)
    m = lt.as_model(1)
    np.testing.assert_allclose(m(torch.from_numpy(x)).detach().numpy(), lt.logits(x).numpy(), rtol=1e-10, atol=1e-14)
    with pytest.raises(InputError):
        lt.logits(np.zeros((2, T0 + 1), dtype=np.int64))


def test_leading_term_model_tracks_training_loss(corpus, stats, snaps):
    s, eta = 20, ETA
    trained = snaps[s]
    m = AssocModel(AssocConfig(vocab_size=V0, seq_len=T0, n_layers=L0, dtype="float64"))
    m.load_weights(trained)
    loss_trained = m.loss(torch.from_numpy(corpus)).item()
    lt = LeadingTermModel(stats, s, eta, n_layers=L0)
    loss_lt = lt.loss(corpus)
    loss_stacked = lt.as_model(L0).loss(torch.from_numpy(corpus)).item()
    gain = math.log(V0) - loss_trained  # loss decrease from ln|V|
    print(
        f"loss: trained {loss_trained:.8f}, Eq.12 {loss_lt:.8f}, stacked {loss_stacked:.8f}, ln|V| {math.log(V0):.8f}"
    )
    assert gain > 0
    assert abs(loss_lt - loss_trained) < 0.01 * gain
    assert abs(loss_stacked - loss_trained) < 0.01 * gain
    # attention adds to the residual-only bigram path
    assert lt.loss(corpus) < lt.bigram_loss(corpus)
    b = lt.bigram_loss(corpus)
    logits = s * eta * ref_logits_bigram(corpus, stats)
    assert b == pytest.approx(_ce(logits, corpus[:, 1:]), rel=1e-12)


def ref_logits_bigram(tokens, st):
    return np.asarray(st.bigram)[tokens[:, :-1]]


def _ce(logits, targets):
    m = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - m).sum(-1)) + m[..., 0]
    picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return float((lse - picked).mean())


def test_conditional_bigram_loss(corpus):
    tr, ev = corpus[:100], corpus[100:]
    V, k = V0, 0.5
    counts = np.zeros((V, V))
    for row in tr:
        for a, b in zip(row[:-1], row[1:]):
            counts[a, b] += 1
    nll = [-math.log((counts[a, b] + k) / (counts[a].sum() + k * V)) for row in ev for a, b in zip(row[:-1], row[1:])]
    assert conditional_bigram_loss(tr, ev, V, k=k) == pytest.approx(float(np.mean(nll)), rel=1e-12)
    with pytest.raises(ConfigError):
        conditional_bigram_loss(tr, ev, V, k=0)
