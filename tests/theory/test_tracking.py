"""Leading-term tracking over checkpoints (originlens.theory.tracking, .nulls, .intervention): cosines
against brute-force leading terms, projection removal, intervention losses, PMI, token alignment, null
baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from originlens.errors import CompatibilityError
from originlens.models.assoc import AssocConfig, AssocModel
from originlens.stats import corpus_statistics
from originlens.theory import attention_coef, cosine, output_coef, value_coef
from originlens.theory.intervention import heldout_losses, intervention_losses, mean_loss, project_out
from originlens.theory.nulls import (
    baseline_cosines,
    cooccurrence_counts,
    pmi_from_counts,
    random_cosine,
    shared_token_index,
)
from originlens.theory.tracking import checkpoint_files, min_over_training, track_checkpoints
from originlens.train import AssocTrainConfig, train_assoc

V, T, N, L = 24, 8, 40, 2


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def markov_tokens(n: int, seed: int = 0, vocab: int = V, T_: int = T) -> np.ndarray:
    """A first-order chain with a few favoured successors per token (structure to learn)."""
    rng = np.random.default_rng(seed)
    succ = rng.integers(0, vocab, (vocab, 3))
    out = np.empty((n, T_ + 1), dtype=np.int64)
    out[:, 0] = rng.integers(0, vocab, n)
    for t in range(1, T_ + 1):
        fav = rng.random(n) < 0.7
        out[:, t] = np.where(fav, succ[out[:, t - 1], rng.integers(0, 3, n)], rng.integers(0, vocab, n))
    return out


def reference_terms(tokens: np.ndarray, vocab: int) -> dict[str, np.ndarray]:
    """TEST HELPER: the leading terms by the dense einsum definitions of arXiv 2601.19208 §3 (float64)."""
    Nn, T1 = tokens.shape
    Tt = T1 - 1
    X = np.eye(vocab)[tokens[:, :-1]]
    Y = np.eye(vocab)[tokens[:, 1:]]
    R0 = Y - 1.0 / vocab
    A0 = np.tril(np.ones((Tt, Tt))) / np.arange(1, Tt + 1)[:, None]
    B = np.einsum("ntv,ntw->vw", X, R0) / (Nn * Tt)
    Phi = np.einsum("ntv,ntw->vw", R0, np.einsum("tj,njv->ntv", A0, X)) / (Nn * Tt)
    Sig = B.T @ B
    M = np.einsum("ntv,vw,nkw->ntk", R0, Sig @ Phi, X)
    Qn = np.zeros_like(M)
    for t in range(Tt):
        a = np.zeros(Tt)
        a[: t + 1] = 1.0 / (t + 1)
        J = np.diag(a) - np.outer(a, a)
        Qn[:, t, :] = M[:, t, :] @ J.T
    Q = np.einsum("ntv,ntj,njw->vw", X, Qn, X) / (Nn * Tt)
    Qmean = Qn.sum(0) / (Nn * Tt)
    Delta = np.array([np.trace(Qmean, offset=-d) for d in range(Tt)])
    return {"W_O": B, "V": Phi.T @ B.T, "W": Q, "P": Delta}


@pytest.fixture(scope="module")
def gd_run(tmp_path_factory):
    tokens = markov_tokens(N)
    out = tmp_path_factory.mktemp("run") / "r"
    cfg = AssocTrainConfig(
        n_layers=L,
        lr=0.3,
        steps=6,
        batch_size=None,
        dtype="float64",
        checkpoint_every=1,
        stats_source="full",
        out=str(out),
    )
    run = train_assoc(tokens, V, cfg)
    return tokens, out, run


def test_tracked_cosines_equal_bruteforce_from_checkpoint_tensors(gd_run):
    tokens, out, run = gd_run
    ref = reference_terms(tokens, V)
    files = checkpoint_files(out)
    assert [s for s, _ in files] == [1, 2, 3, 4, 5, 6]
    records = track_checkpoints(((s, load_file(str(f))) for s, f in files), run.stats, 0.3)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    for (s, f), rec in zip(files, records):
        w = load_file(str(f))  # independent read of the tensors
        for name, got in rec["theory"].items():
            kind = name.split(".")[0]
            M = w[name].astype(np.float64)
            T_ = ref[kind]
            if not np.any(M):
                assert math.isnan(got["cos"])
                continue
            want = float(np.sum(M * T_) / (np.linalg.norm(M) * np.linalg.norm(T_)))
            assert got["cos"] == pytest.approx(want, abs=1e-9)
            assert got["cos"] == pytest.approx(cosine(M, T_), abs=1e-9)
            coef = {
                "W_O": output_coef(s, 0.3),
                "V": value_coef(s, 0.3),
                "W": attention_coef(s, 0.3),
                "P": attention_coef(s, 0.3),
            }[kind]
            assert got["norm_ratio"] == pytest.approx(np.linalg.norm(M) / (coef * np.linalg.norm(T_)), rel=1e-9)
            assert got["frob_err"] == pytest.approx(np.linalg.norm(M - coef * T_), rel=1e-7, abs=1e-15)
    # GD from zero init: W_O = ηB̄ after one step; cosines near 1 early on (full-batch theory)
    assert records[0]["theory"]["W_O"]["cos"] == pytest.approx(1.0, abs=1e-12)
    assert records[2]["min_cos"]["W"] > 0.999 and records[2]["min_cos"]["V"] > 0.999
    table = min_over_training(records)
    assert table["W"] == pytest.approx(min(r["min_cos"]["W"] for r in records[2:]))  # NaN steps skipped
    assert len({r["hash"] for r in records}) == len(records)


def test_project_out_removes_component():
    rng = np.random.default_rng(1)
    M, Tm = rng.standard_normal((7, 5)), rng.standard_normal((7, 5))
    P = project_out(M, Tm)
    assert abs(np.sum(P * Tm)) <= 1e-12 * np.linalg.norm(M) * np.linalg.norm(Tm)
    d = M - P  # removed part is a multiple of T
    c = np.sum(M * Tm) / np.sum(Tm * Tm)
    np.testing.assert_allclose(d, c * Tm, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(project_out(M, np.zeros_like(M)), M)
    np.testing.assert_allclose(project_out(Tm * 3.0, Tm), 0.0, atol=1e-12)


def _bruteforce_loss(model: AssocModel, tokens: np.ndarray) -> float:
    """TEST HELPER: dense forward, explicit log-softmax gather, mean over all positions."""
    with torch.no_grad():
        x = torch.from_numpy(tokens[:, :-1])
        logits = model(x, impl="dense").double()
        logp = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
        y = torch.from_numpy(tokens[:, 1:])
        return float(-logp.gather(-1, y[..., None]).mean())


def test_intervention_matches_bruteforce_and_changes_loss(gd_run):
    tokens, out, run = gd_run
    model = run.model
    before = {n: p.detach().clone() for n, p in model.named_weights()}
    res = intervention_losses(model, run.stats, tokens, batch_size=16)
    for n, p in model.named_weights():  # model restored
        assert torch.equal(p, before[n])
    assert res["original"] == pytest.approx(_bruteforce_loss(model, tokens), abs=1e-12)
    ref = reference_terms(tokens, V)
    for name in ("W_O", "V.1", "W.2", "P.1"):
        m2 = AssocModel(AssocConfig(vocab_size=V, seq_len=T, n_layers=L, dtype="float64"))
        w = {k: v.numpy() for k, v in before.items()}
        Mm, Tm = w[name], ref[name.split(".")[0]]
        w[name] = Mm - (np.sum(Mm * Tm) / np.sum(Tm * Tm)) * Tm
        assert abs(np.sum(w[name] * Tm)) <= 1e-10 * np.linalg.norm(Mm) * np.linalg.norm(Tm)  # ⟨M', T⟩ = 0
        m2.load_weights(w)
        got = res["losses"][name]
        assert got["loss"] == pytest.approx(_bruteforce_loss(m2, tokens), abs=1e-10)
        assert abs(got["residual_cos"]) < 1e-10
    d = {n: v["delta"] for n, v in res["losses"].items()}
    assert d["W_O"] > 0.005 and all(abs(d["W_O"]) > abs(v) for n, v in d.items() if n != "W_O")
    assert min(d["V.1"], d["V.2"]) > max(abs(d["W.1"]), abs(d["W.2"]))  # output ≫ value ≫ attention
    assert res["losses"]["W.1"]["loss"] != res["original"]


def test_heldout_losses_trained_and_bounds(gd_run):
    tokens, out, run = gd_run
    ev = markov_tokens(12, seed=5)
    h = heldout_losses(run.model, run.stats, 6, 0.3, ev, tokens, batch_size=5)
    assert h["trained"] == pytest.approx(_bruteforce_loss(run.model, ev), abs=1e-12)
    assert h["uniform"] == pytest.approx(math.log(V))
    assert all(math.isfinite(v) for v in h.values())
    assert mean_loss(run.model, ev, batch_size=3) == pytest.approx(h["trained"], abs=1e-12)


def test_cooccurrence_and_pmi_bruteforce():
    toks = markov_tokens(6, seed=2, vocab=7, T_=5)
    Vv, Tt = 7, 5
    want = {k: np.zeros((Vv, Vv)) for k in ("bigram", "context", "query_key")}
    for row in toks:
        for t in range(Tt):
            want["bigram"][row[t], row[t + 1]] += 1
            for m in range(t + 1):
                want["context"][row[m], row[t + 1]] += 1
                want["query_key"][row[t], row[m]] += 1
    for k, W in want.items():
        C = cooccurrence_counts(toks, Vv, k, chunk=4)
        np.testing.assert_array_equal(C, W)
        P = pmi_from_counts(C)
        n = W.sum()
        for a in range(Vv):
            for b in range(Vv):
                if W[a, b] == 0:
                    assert P[a, b] == 0.0
                else:
                    pa, pb = W[a].sum() / n, W[:, b].sum() / n
                    assert P[a, b] == pytest.approx(math.log(W[a, b] / n / (pa * pb)), abs=1e-12)


def test_shared_token_index_bruteforce():
    a = ["<unk>", "the", "fish", "red", "zebra", "a"]
    b = ["a", "red", "cat", "the", "<unk>", "fish"]
    ia, ib, toks = shared_token_index(a, b)
    want = [(i, b.index(t), t) for i, t in enumerate(a) if t in b and t != "<unk>"]
    assert list(zip(ia.tolist(), ib.tolist(), toks)) == want
    ia, ib, _ = shared_token_index(None, None, size_a=4, size_b=4)
    assert ia.tolist() == ib.tolist() == [0, 1, 2, 3]
    with pytest.raises(CompatibilityError):
        shared_token_index(None, None, size_a=4, size_b=5)
    with pytest.raises(CompatibilityError):
        shared_token_index(a, None)


def test_null_baselines_random_statistics_far_below_true(gd_run):
    tokens, out, run = gd_run
    w = {n: p.detach().numpy() for n, p in run.model.named_weights()}
    rnd = np.random.default_rng(3).integers(0, V, (N, T + 1))
    null = corpus_statistics(rnd, V)
    pmi = {k: pmi_from_counts(cooccurrence_counts(tokens, V, k)) for k in ("bigram", "context", "query_key")}
    b = baseline_cosines(w, run.stats, null_stats=null, pmi=pmi, same_corpus_stats=run.stats)
    for name in ("W_O", "V.1", "V.2", "W.1", "W.2"):
        r = b[name]
        assert r["leading_term"] > 0.99
        assert r["null_corpus"] < r["leading_term"] - 0.3, (name, r)
        assert r["leading_term_shared"] == pytest.approx(r["leading_term"])  # id alignment: all tokens
        assert r["same_corpus"] == pytest.approx(r["leading_term"])
        assert abs(r["random"]) < 6 / math.sqrt(w[name].size)
        assert -1 <= r["pmi"] <= 1
    # alignment restricts both sides to the shared tokens
    vocab = [f"t{i}" for i in range(V)]
    null_vocab = [f"t{i}" for i in range(0, V, 2)] + ["other"]
    null_small = corpus_statistics(rnd % len(null_vocab), len(null_vocab))
    b2 = baseline_cosines(w, run.stats, vocab=vocab, null_stats=null_small, null_vocab=null_vocab)
    idx = np.arange(0, V, 2)
    sub = w["W_O"][np.ix_(idx, idx)]
    assert b2["W_O"]["n_shared"] == len(idx)
    assert b2["W_O"]["null_corpus"] == pytest.approx(cosine(sub, null_small.bigram[: len(idx), : len(idx)]))
    assert b2["W_O"]["leading_term_shared"] == pytest.approx(cosine(sub, run.stats.bigram[np.ix_(idx, idx)]))


def test_random_cosine_is_small():
    x = np.random.default_rng(0).standard_normal((60, 60))
    vals = [random_cosine(x.shape, x, seed=s) for s in range(100, 120)]
    assert abs(np.mean(vals)) < 3 / 60 and max(abs(v) for v in vals) < 5 / 60


def test_shape_mismatch_is_compatibility_error(gd_run):
    tokens, out, run = gd_run
    other = corpus_statistics(markov_tokens(10, vocab=V + 1), V + 1)
    with pytest.raises(CompatibilityError, match="statistics are"):
        track_checkpoints([(1, {n: p.detach() for n, p in run.model.named_weights()})], other, 0.3)
