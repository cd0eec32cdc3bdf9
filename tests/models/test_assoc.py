"""The Def. 3.1 model: fast implementations vs a brute-force numpy forward, Lemma D.7 gradients,
finite differences, weight naming and I/O."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from originlens.errors import CompatibilityError, ConfigError, InputError
from originlens.models.assoc import (
    CHECKPOINT_KIND,
    MODEL_KIND,
    AssocConfig,
    AssocModel,
    dense_logits,
    diag_matrix,
    load_assoc,
    path_cost,
    weight_names,
)
from originlens.storage import save_tensors


def make(V=9, T=6, L=2, std=0.7, seed=0, dtype="float64", impl="auto") -> AssocModel:
    return AssocModel(
        AssocConfig(
            vocab_size=V, seq_len=T, n_layers=L, init="gaussian", init_std=std, seed=seed, dtype=dtype, impl=impl
        )
    )


def np_weights(m: AssocModel) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in m.weights().items()}


# ------------------------------------------------------------------------------------------------
# TEST HELPER: brute-force forward and the exact gradients of Lemma D.7 of arXiv 2601.19208, numpy float64


def np_forward(w, x, L):
    V = w["W_O"].shape[0]
    T = len(x)
    X = np.eye(V)[x]
    hs, As = [X], []
    h = X
    for l in range(1, L + 1):
        DM = np.zeros((T, T))
        for t in range(T):
            for d in range(t + 1):
                DM[t, t - d] = w[f"P.{l}"][d]
        S = h @ w[f"W.{l}"] @ h.T + DM
        S[np.triu_indices(T, 1)] = -np.inf
        A = np.exp(S - S.max(1, keepdims=True))
        A /= A.sum(1, keepdims=True)
        h = h + A @ h @ w[f"V.{l}"]
        hs.append(h)
        As.append(A)
    return h @ w["W_O"], hs, As


def np_neg_grads(w, tokens, L):
    """−∂L/∂θ by Lemma D.7: G^(L) = R W_Oᵀ, G^(l−1) = G + AᵀGVᵀ + S h Wᵀ + Sᵀ h W."""
    V = w["W_O"].shape[0]
    N, T = tokens.shape[0], tokens.shape[1] - 1
    g = {k: np.zeros_like(v) for k, v in w.items()}
    for seq in tokens:
        x, y = seq[:-1], seq[1:]
        logits, hs, As = np_forward(w, x, L)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        R = np.eye(V)[y] - p
        g["W_O"] += hs[L].T @ R
        G = R @ w["W_O"].T
        for l in range(L, 0, -1):
            h, A, Wl, Vl = hs[l - 1], As[l - 1], w[f"W.{l}"], w[f"V.{l}"]
            g[f"V.{l}"] += h.T @ A.T @ G
            dA = G @ Vl.T @ h.T
            S = np.zeros((T, T))
            for t in range(T):
                a = A[t]
                J = np.diag(a) - np.outer(a, a)
                S[t] = J @ dA[t]
            g[f"W.{l}"] += h.T @ S @ h
            for d in range(T):
                g[f"P.{l}"][d] += np.trace(S, offset=-d)
            G = G + A.T @ G @ Vl.T + S @ h @ Wl.T + S.T @ h @ Wl
    return {k: v / (N * T) for k, v in g.items()}


# ------------------------------------------------------------------------------------------------


def test_zero_init_loss_is_log_vocab():
    for dtype, tol in (("float64", 1e-12), ("float32", 1e-5)):
        m = AssocModel(AssocConfig(vocab_size=37, seq_len=8, n_layers=3, dtype=dtype))
        toks = torch.randint(0, 37, (5, 9), generator=torch.Generator().manual_seed(0))
        for impl in ("paths", "gather", "dense"):
            assert abs(m.loss(toks, impl=impl).item() - math.log(37)) <= tol
            assert not m(toks[:, :-1], impl=impl).any()


@pytest.mark.parametrize("L", [1, 2, 3])
def test_logits_match_numpy_forward(L):
    m = make(V=11, T=7, L=L, seed=L)
    w = np_weights(m)
    rng = np.random.default_rng(L)
    x = rng.integers(0, 11, (4, 5))  # T' = 5 < T = 7 also exercised
    ref = np.stack([np_forward(w, row, L)[0] for row in x])
    for impl in ("paths", "gather", "dense"):
        out = m(torch.from_numpy(x), impl=impl).detach().numpy()
        np.testing.assert_allclose(out, ref, rtol=1e-11, atol=1e-12, err_msg=impl)


@pytest.mark.parametrize("L", [1, 2, 3])
def test_gradients_match_lemma_D7(L):
    m = make(V=8, T=6, L=L, std=0.5, seed=10 + L)
    w = np_weights(m)
    toks = np.random.default_rng(L).integers(0, 8, (5, 7))
    ref = np_neg_grads(w, toks, L)
    for impl in ("paths", "gather", "dense"):
        m.zero_grad()
        m.loss(torch.from_numpy(toks), impl=impl).backward()
        for name, p in m.named_weights():
            np.testing.assert_allclose(-p.grad.numpy(), ref[name], rtol=1e-9, atol=1e-13, err_msg=f"{impl} {name}")


def test_gradcheck_finite_differences():
    m = make(V=5, T=4, L=2, std=0.6, seed=3)
    toks = torch.randint(0, 5, (3, 5), generator=torch.Generator().manual_seed(1))
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in m.named_parameters())
    for impl in ("paths", "gather"):

        def f(*ps):
            return torch.func.functional_call(m, dict(zip(names, ps)), (toks[:, :-1],), {"impl": impl})

        assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-6, rtol=1e-5)


# scratch sizes of the path implementation: one sequence per chunk, one per row block, key-position
# blocks of 2 (uneven at T' = 7, 9) — or everything in one piece
SMALL = {"CHUNK_BYTES": 1, "ROWS_BYTES": 1, "ROW_POSITIONS": 2}
LARGE = {"CHUNK_BYTES": 10**12, "ROWS_BYTES": 10**12, "ROW_POSITIONS": 0}


def set_sizes(monkeypatch, sizes, kind="cpu"):
    from originlens.models import assoc

    for name, value in sizes.items():
        monkeypatch.setitem(getattr(assoc, name), kind, value)


@pytest.mark.parametrize("sizes", [SMALL, LARGE], ids=["small", "large"])
def test_hand_written_path_backward_matches_lemma_D7(monkeypatch, sizes):
    """The paths implementation differentiates by hand (_Chunk, Products.backward); L = 3 exercises every
    subset product; inputs of the full length T and shorter (P beyond T' gets zero gradient)."""
    set_sizes(monkeypatch, sizes)
    m = make(V=7, T=9, L=3, std=0.5, seed=21)
    w = np_weights(m)
    toks = np.random.default_rng(5).integers(0, 7, (5, 10))
    ref = np_neg_grads(w, toks, 3)
    short = np_neg_grads(w, toks[:, :8], 3)
    for how in ("accumulate", "accumulate-short", "autograd", "autograd-short"):
        m.zero_grad()
        t = torch.from_numpy(toks if "short" not in how else toks[:, :8])
        if how.startswith("accumulate"):
            loss = m.accumulate_gradients(t, chunk=2, impl="paths")
            assert loss == pytest.approx(m.loss(t, impl="dense").item(), rel=1e-13)
        else:
            m.loss(t, impl="paths").backward()
        want = short if "short" in how else ref
        for name, p in m.named_weights():
            got = -p.grad.numpy()
            exp = want[name] if not name.startswith("P") else np.pad(want[name], (0, 9 - len(want[name])))
            np.testing.assert_allclose(got, exp, rtol=1e-9, atol=1e-13, err_msg=f"{how} {name}")


@pytest.mark.parametrize("L", [1, 2, 3])
def test_hand_written_products_backward_matches_autograd(L):
    """Products (the layouts the pass reads, and its hand-written backward) against autograd through
    path_products, for arbitrary incoming gradients (float64)."""
    from originlens.models.assoc.paths import _pair_columns
    from originlens.models.assoc.workers import Team, fresh_pass

    V = 6
    m = make(V=V, T=4, L=L, std=0.7, seed=30 + L)
    prods = m.path_products()
    with torch.no_grad(), Team(1) as team:
        P = m._products(fresh_pass, team)
        offs, width = _pair_columns(L)
        assert P.Kr.shape == (V * V, width) and P.ZL.shape == (V, 1 << L, V)
        torch.testing.assert_close(P.ZL[:, 0], m.W_O.detach(), rtol=0, atol=0)
        torch.testing.assert_close(
            P.ZL[:, 1:].transpose(0, 1).reshape(-1, V), prods[-1].detach(), rtol=1e-13, atol=1e-14
        )
        for l in range(L):
            n2 = 4**l
            torch.testing.assert_close(P.Kr[:, offs[l] : offs[l] + n2].t(), prods[l].detach(), rtol=1e-13, atol=1e-14)
        assert not P.Kr[:, (4**L - 1) // 3 :].any()  # padding
    g = torch.Generator().manual_seed(L)
    dW = torch.randn(V, V, generator=g, dtype=torch.float64)
    dZ = torch.randn(V, (1 << L) - 1, V, generator=g, dtype=torch.float64)
    dKr = torch.randn(V * V, width, generator=g, dtype=torch.float64)
    # autograd reference: ⟨dW, W_O⟩ (the W_O[x] term) + ⟨dZ, Z⟩ + Σ_l ⟨dK_l, K_l⟩
    ref_loss = (dW * m.W_O).sum() + (dZ.transpose(0, 1).reshape(-1, V) * prods[-1]).sum()
    for l in range(L):
        ref_loss = ref_loss + (dKr[:, offs[l] : offs[l] + 4**l].t() * prods[l]).sum()
    names = [n for n, _ in m.named_weights() if not n.startswith("P")]
    ref = dict(zip(names, torch.autograd.grad(ref_loss, [m.param(n) for n in names])))
    with torch.no_grad(), Team(1) as team:
        got = P.backward(dW.clone(), dZ.clone(), dKr.clone(), team)
    assert set(got) == set(names)
    for n in names:
        torch.testing.assert_close(got[n], ref[n], rtol=1e-12, atol=1e-13, msg=n)


def test_threaded_chunk_loop_matches_single_thread(monkeypatch):
    """With several torch threads the chunks run on worker threads (one sequence per chunk here, in 3
    lanes); losses, gradients and logits equal the single-threaded path to round-off, repeated runs are
    bit-identical, and torch's thread count is restored."""
    set_sizes(monkeypatch, SMALL)
    m = make(V=9, T=7, L=3, std=0.5, seed=13)
    toks = torch.randint(0, 9, (6, 8), generator=torch.Generator().manual_seed(3))
    prev = torch.get_num_threads()
    out = {}
    try:
        for thr in (1, 3, 3):
            torch.set_num_threads(thr)
            m.zero_grad()
            loss = m.accumulate_gradients(toks, impl="paths")
            with torch.no_grad():
                logits = m(toks[:, :-1], impl="paths")
            m2 = make(V=9, T=7, L=3, std=0.5, seed=13)
            m2.loss(toks, impl="paths").backward()  # autograd path (grad_backward)
            res = (
                loss,
                logits,
                {n: p.grad.clone() for n, p in m.named_weights()},
                {n: p.grad.clone() for n, p in m2.named_weights()},
            )
            if thr in out:  # same thread count: bit-identical
                assert res[0] == out[thr][0] and torch.equal(res[1], out[thr][1])
                assert all(torch.equal(res[k][n], out[thr][k][n]) for k in (2, 3) for n in res[2])
            out[thr] = res
            assert torch.get_num_threads() == thr  # restored after the worker loop
    finally:
        torch.set_num_threads(prev)
    assert out[3][0] == pytest.approx(out[1][0], rel=1e-14)
    torch.testing.assert_close(out[3][1], out[1][1], rtol=1e-13, atol=1e-14)
    for k in (2, 3):
        for n in out[1][k]:
            torch.testing.assert_close(out[3][k][n], out[1][k][n], rtol=1e-12, atol=1e-15, msg=n)


def test_team_lanes_order_errors_and_threads():
    """Team runs every task once, a lane's tasks in order and never two of a lane at once; an error in
    a worker is re-raised in the caller after the running tasks finish; thread count restored."""
    import threading
    import time

    from originlens.models.assoc.workers import PAIR_BLOCK, Team, block_ranges

    prev = torch.get_num_threads()
    lanes = [list(range(w, 23, 3)) for w in range(3)]
    seen: dict[int, list[int]] = {0: [], 1: [], 2: []}
    running = [0, 0, 0]
    lock = threading.Lock()

    def fn(lane, k):
        with lock:
            running[lane] += 1
            assert running[lane] == 1
            seen[lane].append(k)
        time.sleep(0.001 * (k % 3))
        with lock:
            running[lane] -= 1

    with Team(3) as team:
        team.run(fn, lanes)
        assert seen == {w: lanes[w] for w in range(3)}
        assert torch.get_num_threads() == prev

        def bad(lane, k):
            if k == 7:
                raise ValueError("task 7")

        with pytest.raises(ValueError, match="task 7"):
            team.run(bad, lanes)
        team.run(fn, [[0], [1]])  # still usable
        calls = []
        block_ranges(team, 10, lambda r0, r1: calls.append((r0, r1)), torch.device("cuda"))
        assert calls == [(0, 10)]  # other devices: one block
        block_ranges(team, 2 * PAIR_BLOCK + 3, lambda r0, r1: calls.append((r0, r1)), torch.device("cpu"))
        B = PAIR_BLOCK
        assert sorted(calls[1:]) == [(0, B), (B, 2 * B), (2 * B, 2 * B + 3)]
    assert torch.get_num_threads() == prev


def test_subnormals_flushed_in_caller_and_team_threads_and_restored():
    """Inside a team (and subnormals_flushed) the calling thread and every worker flush subnormals to zero;
    nested blocks keep it on; on exit the previous mode returns (off by default, on if it was on)."""
    import threading

    from originlens.models.assoc.workers import Team, _ftz_active, subnormals_flushed

    assert not _ftz_active()
    seen: dict[str, bool] = {}
    lock = threading.Lock()

    def probe(lane, k):
        with lock:
            seen[f"{threading.get_ident()}-{k}"] = _ftz_active()

    with Team(3) as team:
        assert _ftz_active()
        with subnormals_flushed():
            assert _ftz_active()
        assert _ftz_active()  # the inner block does not switch it off
        team.run(probe, [[0], [1], [2]])
    assert len(seen) == 3 and all(seen.values())
    assert not _ftz_active()
    torch.set_flush_denormal(True)
    try:
        with subnormals_flushed():
            pass
        assert _ftz_active()  # a mode that was on stays on
    finally:
        torch.set_flush_denormal(False)
    assert not _ftz_active()


@pytest.mark.parametrize("scale", [1.0, 1e-12])
@pytest.mark.parametrize("n", [1, 2, 3])
def test_row_split_matmul_equals_torch(n, scale):
    """batched_mm (intra-op threads, or split by rows over a team's workers for tiny values) equals torch.mm /
    addmm_ (out a strided view, transposed operands)."""
    from originlens.models.assoc.workers import Team, batched_mm

    g = torch.Generator().manual_seed(n)
    a = scale * torch.randn(11, 7, generator=g, dtype=torch.float64)
    b = scale * torch.randn(11, 7, generator=g, dtype=torch.float64)
    buf = scale**2 * torch.randn(11, 3, 11, generator=g, dtype=torch.float64)
    start = buf[:, 1].clone()
    with Team(n) as team:
        batched_mm(team, buf[:, 1], a, b.t())
        torch.testing.assert_close(buf[:, 1], a @ b.t(), rtol=1e-14, atol=0.0)
        buf[:, 1] = start
        batched_mm(team, buf[:, 1], b, a.t(), add=True)
        torch.testing.assert_close(buf[:, 1], start + b @ a.t(), rtol=1e-14, atol=0.0)
        batched_mm(team, buf[:, 1], b, torch.zeros_like(a).t(), add=True)  # a zero factor: skipped, exactly
        torch.testing.assert_close(buf[:, 1], start + b @ a.t(), rtol=1e-14, atol=0.0)
        batched_mm(team, buf[:, 1], torch.zeros_like(b), a.t())
        assert not buf[:, 1].any()


def test_early_training_scales_match_dense_after_flushing():
    """Weights at the scales of the first steps from zero init (W_O ≈ 1e-3, V ≈ 1e-5, W ≈ 1e-8: the
    products V_S W V_S'ᵀ reach 1e-38, below float32's normal range, and are flushed to zero): every
    float32 path gradient still equals the float64 dense one to float32 round-off of its own norm."""
    V, T, L = 12, 6, 3
    g = torch.Generator().manual_seed(5)
    scale = {"W_O": 1e-3, "W": 1e-8, "V": 1e-5, "P": 1e-3}
    w64 = {
        k: scale[k.split(".")[0]] * torch.randn(v.shape, generator=g, dtype=torch.float64)
        for k, v in make(V=V, T=T, L=L).weights().items()
    }
    toks = torch.randint(0, V, (4, T + 1), generator=torch.Generator().manual_seed(1))
    m64, m32 = make(V=V, T=T, L=L), make(V=V, T=T, L=L, dtype="float32")
    m64.load_weights(w64)
    m32.load_weights({k: v.float() for k, v in w64.items()})
    m32.accumulate_gradients(toks, impl="paths")
    m64.loss(toks, impl="dense").backward()
    for (name, p32), (_, p64) in zip(m32.named_weights(), m64.named_weights()):
        rel = float((p32.grad.double() - p64.grad).norm() / p64.grad.norm())
        assert p64.grad.norm() > 0 and rel < 1e-5, (name, rel)


def test_swap_copy_is_a_bit_exact_transpose():
    """The wide-element copy (int64 / complex128 views) moves bits unchanged, NaN payloads included;
    the element-wise fallback (float64, 4 values) gives the same layout."""
    from originlens.models.assoc.paths import _swap_copy

    g = torch.Generator().manual_seed(0)
    for dtype, n in ((torch.float32, 2), (torch.float32, 4), (torch.float64, 2), (torch.float64, 4)):
        bits = torch.randint(-(2**31), 2**31 - 1, (2, 3, 5, 24 * (dtype.itemsize // 4)), generator=g, dtype=torch.int32)
        R = bits.view(dtype)  # arbitrary bit patterns (NaNs included)
        src = R[..., : n * n].view(2, 3, 5, n, n)
        out = torch.empty(2, 3, n, 5, n, dtype=dtype)
        _swap_copy(out, src)
        want = src.transpose(2, 3)
        assert torch.equal(out.view(torch.int32), want.contiguous().view(torch.int32)), (dtype, n)
        back = torch.full_like(R, 0.0)
        _swap_copy(back[..., : n * n].view(2, 3, 5, n, n), out)  # strided destination
        assert torch.equal(
            back[..., : n * n].contiguous().view(torch.int32), R[..., : n * n].contiguous().view(torch.int32)
        ), (dtype, n)


def test_gradcheck_three_layers_paths():
    """Finite differences (float64) for every parameter of a 3-layer model through the hand-written
    backward, with a shorter input than T."""
    m = make(V=4, T=5, L=3, std=0.6, seed=8)
    toks = torch.randint(0, 4, (2, 5), generator=torch.Generator().manual_seed(4))
    names = [n for n, _ in m.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_() for _, p in m.named_parameters())

    def f(*ps):
        return torch.func.functional_call(m, dict(zip(names, ps)), (toks[:, :-1],), {"impl": "paths"})

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-7, rtol=1e-6)


def test_fast_equals_dense_reference_logits_and_grads():
    m = make(V=40, T=16, L=3, std=0.3, seed=5)
    toks = torch.randint(0, 40, (6, 17), generator=torch.Generator().manual_seed(2))
    res = {}
    for impl in ("dense", "gather", "paths"):
        m.zero_grad()
        loss = m.loss(toks, impl=impl)
        loss.backward()
        res[impl] = (
            m(toks[:, :-1], impl=impl).detach(),
            loss.item(),
            {n: p.grad.clone() for n, p in m.named_weights()},
        )
    assert torch.equal(res["dense"][0], dense_logits(m, toks[:, :-1]).detach())
    for impl in ("gather", "paths"):
        torch.testing.assert_close(res[impl][0], res["dense"][0], rtol=1e-12, atol=1e-12)
        assert res[impl][1] == pytest.approx(res["dense"][1], rel=1e-13)
        for n, g in res[impl][2].items():
            torch.testing.assert_close(g, res["dense"][2][n], rtol=1e-10, atol=1e-14, msg=f"{impl} {n}")


def test_float32_agrees_with_float64():
    m64 = make(V=30, T=10, L=3, std=0.2, seed=7)
    m32 = make(V=30, T=10, L=3, std=0.2, seed=7, dtype="float32")
    x = torch.randint(0, 30, (4, 10), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(m32(x).double(), m64(x).detach(), rtol=1e-4, atol=1e-5)


def test_accumulate_gradients_chunked():
    m = make(V=20, T=8, L=2, std=0.4, seed=9)
    toks = torch.randint(0, 20, (11, 9), generator=torch.Generator().manual_seed(3))
    m.zero_grad()
    ref_loss = m.loss(toks, impl="dense")
    ref_loss.backward()
    ref = {n: p.grad.clone() for n, p in m.named_weights()}
    for impl in ("paths", "gather"):
        for chunk in (None, 4, 1):
            m.zero_grad()
            loss = m.accumulate_gradients(toks, chunk=chunk, impl=impl)
            assert loss == pytest.approx(ref_loss.item(), rel=1e-13)
            for n, p in m.named_weights():
                torch.testing.assert_close(p.grad, ref[n], rtol=1e-11, atol=1e-15, msg=f"{impl} {chunk} {n}")


def test_workspace_reuse_does_not_alias_results():
    """Buffers are reused across calls (also when the batch grows or shrinks); returned logits and
    gradients must not change when the model is called again."""
    m = make(V=12, T=8, L=3, std=0.4, seed=2)
    g = torch.Generator().manual_seed(6)
    a, b = torch.randint(0, 12, (7, 9), generator=g), torch.randint(0, 12, (3, 9), generator=g)
    with torch.no_grad():
        la = m(a[:, :-1], impl="paths")
        ref_a = m(a[:, :-1], impl="dense").clone()
        lb = m(b[:, :-1], impl="paths")
    torch.testing.assert_close(la, ref_a, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(lb, m(b[:, :-1], impl="dense"), rtol=1e-12, atol=1e-13)
    kept = []
    for toks in (a, b, a):
        m.zero_grad()
        m.loss(toks, impl="dense").backward()
        ref = {n: p.grad.clone() for n, p in m.named_weights()}
        m.zero_grad()
        m.accumulate_gradients(toks, chunk=2, impl="paths")
        for n, p in m.named_weights():
            torch.testing.assert_close(p.grad, ref[n], rtol=1e-10, atol=1e-14, msg=n)
        kept.append(({n: p.grad for n, p in m.named_weights()}, ref))  # .grad objects, not copies
    for grads, ref in kept:  # later calls did not write into earlier gradients
        for n, g in grads.items():
            torch.testing.assert_close(g, ref[n], rtol=1e-10, atol=1e-14, msg=n)
    m.release_workspace()
    m.zero_grad()
    m.accumulate_gradients(b, impl="paths")


def test_inference_product_cache_follows_parameter_updates():
    m = make(V=10, T=6, L=3, std=0.4, seed=3)
    x = torch.randint(0, 10, (4, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a = m(x, impl="paths")
        assert torch.equal(m(x, impl="paths"), a)  # cached products reused
        for p in (m.V[1], m.W_O, m.W[2]):  # in-place updates invalidate the cache
            p.add_(0.3)
            torch.testing.assert_close(m(x, impl="paths"), m(x, impl="dense"), rtol=1e-12, atol=1e-12)
        m.load_weights({k: v * 0.5 for k, v in m.weights().items()})
        torch.testing.assert_close(m(x, impl="paths"), m(x, impl="dense"), rtol=1e-12, atol=1e-12)


def test_diag_matrix_convention():
    p = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    D = diag_matrix(p, 4)
    for t in range(4):
        for j in range(4):
            assert D[t, j] == (p[t - j] if j <= t else 0.0)
    assert torch.equal(diag_matrix(p[:3], 3), D[:3, :3])


def test_position_bias_favours_offset():
    # only P[1][d] non-zero: attention of layer 1 leans towards the token d positions back
    m = AssocModel(AssocConfig(vocab_size=4, seq_len=6, n_layers=1, dtype="float64"))
    with torch.no_grad():
        m.P[0][2] = 5.0
        m.V[0].copy_(torch.eye(4, dtype=torch.float64))
        m.W_O.copy_(torch.eye(4, dtype=torch.float64))
    x = torch.tensor([[0, 1, 2, 3, 0, 1]])
    logits = m(x)[0]
    for t in range(2, 6):
        assert int(torch.argmax(logits[t] - torch.nn.functional.one_hot(x[0, t], 4))) == int(x[0, t - 2])


def test_weight_names_and_roundtrip(tmp_path):
    m = make(V=6, T=5, L=3, seed=1)
    w = m.weights()
    assert list(w) == weight_names(3) == ["W_O", "W.1", "V.1", "P.1", "W.2", "V.2", "P.2", "W.3", "V.3", "P.3"]
    assert torch.equal(w["W.2"], m.W[1]) and w["P.3"].shape == (5,)
    m2 = AssocModel(AssocConfig(vocab_size=6, seq_len=5, n_layers=3, dtype="float64"))
    m2.load_weights({k: v.numpy() for k, v in w.items()} | {"trainer.extra": np.zeros(3)})
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))
    with pytest.raises(CompatibilityError):
        m2.load_weights({k: v for k, v in w.items() if k != "V.3"})
    with pytest.raises(CompatibilityError):
        m2.load_weights(w | {"W_O": torch.zeros(5, 5)})
    f = save_tensors(tmp_path / "m.safetensors", w, kind=MODEL_KIND)
    m3, meta = load_assoc(f)
    assert meta["kind"] == MODEL_KIND and m3.n_layers == 3 and m3.seq_len == 5 and m3.cfg.dtype == "float64"
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m3.parameters()))
    save_tensors(tmp_path / "c.safetensors", w, kind=CHECKPOINT_KIND)
    assert load_assoc(tmp_path / "c.safetensors")[0].vocab_size == 6
    save_tensors(tmp_path / "other.safetensors", w, kind="gpt")
    with pytest.raises(CompatibilityError):
        load_assoc(tmp_path / "other.safetensors")


def test_input_and_config_validation():
    m = make(V=6, T=5, L=1)
    with pytest.raises(InputError):
        m(torch.tensor([[0, 6]]))
    with pytest.raises(InputError):
        m(torch.zeros(2, 6, dtype=torch.long))  # longer than T
    with pytest.raises(InputError):
        m(torch.zeros(2, 3))  # floats
    with pytest.raises(InputError):
        m.loss(torch.zeros(2, 1, dtype=torch.long))
    for bad in (
        dict(init="ones"),
        dict(init="gaussian", init_std=0.0),
        dict(dtype="float16"),
        dict(n_layers=0),
        dict(impl="magic"),
    ):
        with pytest.raises(ConfigError):
            AssocModel(AssocConfig(vocab_size=4, seq_len=3, **bad))


def test_gaussian_init_is_seeded():
    a, b, c = make(seed=4, std=0.1), make(seed=4, std=0.1), make(seed=5, std=0.1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.W_O, c.W_O)
    big = make(V=200, T=5, L=1, std=0.1)
    assert big.W_O.std().item() == pytest.approx(0.1, rel=0.02)


def test_auto_impl_choice():
    m = AssocModel(AssocConfig(vocab_size=1000, seq_len=64, n_layers=3))
    assert m.choose_impl(512, 64) == "paths"  # benchmark setting: batch-independent products amortised
    assert m.choose_impl(1, 64) == "gather"  # one sequence: |V|³ products do not pay off
    c = path_cost(512, 64, 1000, 3)
    assert c["paths"] < c["gather"] < c["dense"]
    assert AssocModel(AssocConfig(vocab_size=10, seq_len=4, impl="dense")).choose_impl(512, 4) == "dense"


def test_path_products_shapes():
    """Stacked products: layout and values against the definitions."""
    m = make(V=5, T=4, L=3)
    prods = m.path_products()
    assert [tuple(p.shape) for p in prods] == [(1, 25), (4, 25), (16, 25), (35, 5)]
    torch.testing.assert_close(prods[0][0].reshape(5, 5), m.W[0])
    # K_{S={1}, S'={2}} at layer 3 is V1 W3 V2ᵀ (bitmask order 0, 1, 2, 3 → row 1*4 + 2)
    torch.testing.assert_close(prods[2][1 * 4 + 2].reshape(5, 5), m.V[0] @ m.W[2] @ m.V[1].T)
    # Z for S = {1, 2} (bitmask 3, third non-empty subset) is V1 V2 W_O
    torch.testing.assert_close(prods[3][10:15], m.V[0] @ m.V[1] @ m.W_O)

    def VS(S):  # V_S = V_{s1} V_{s2} … in increasing layer order
        out = torch.eye(5, dtype=torch.float64)
        for i in range(3):
            if S >> i & 1:
                out = out @ m.V[i]
        return out.detach()

    for l in range(3):
        n = 1 << l
        for S in range(n):
            for S2 in range(n):
                want = VS(S) @ m.W[l].detach() @ VS(S2).T
                torch.testing.assert_close(prods[l][S * n + S2].reshape(5, 5), want, rtol=1e-12, atol=1e-14)
    for S in range(1, 8):
        torch.testing.assert_close(prods[3][(S - 1) * 5 : S * 5], VS(S) @ m.W_O.detach(), rtol=1e-12, atol=1e-14)


def _subnormals(t: torch.Tensor) -> int:
    """Entries of a float tensor that are subnormal (nonzero, below the dtype's smallest normal)."""
    tiny = torch.finfo(t.dtype).tiny
    return int(((t != 0) & (t.abs() < tiny)).sum())


@pytest.mark.parametrize("threads", [1, 2])
def test_the_flushed_model_never_sees_a_subnormal_product(monkeypatch, threads):
    """The mechanism behind ``benchmarks/subnormals.py`` (whose speed-up is a property of the CPU: a core
    without a microcode penalty on subnormal operands shows none): the first steps from zero init at a
    small η make |V|³ path products with subnormal entries (the control: with the flush switched off they
    appear), and with the flush on no path product has a subnormal operand or result, in the calling
    thread and in the team's workers alike."""
    import originlens.models.assoc.paths as paths
    from originlens.models.assoc import AssocConfig, AssocModel, workers

    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode torch can set (torch.set_flush_denormal returned False)")
    torch.set_flush_denormal(False)
    original = workers.batched_mm
    counts = {"operands": 0, "results": 0, "products": 0}

    def counted(team, out, a, b, *, add=False):
        counts["operands"] += _subnormals(a) + _subnormals(b)
        original(team, out, a, b, add=add)
        counts["results"] += _subnormals(out)
        counts["products"] += 1

    monkeypatch.setattr(paths, "batched_mm", counted)
    rng = np.random.default_rng(0)
    V, T, B = 120, 16, 64
    p = 1.0 / np.arange(1, V + 1)
    tokens = torch.from_numpy(rng.choice(V, size=(4 * B, T + 1), p=p / p.sum()))
    prev = torch.get_num_threads()

    def train(flush: bool) -> dict[str, int]:
        for k in counts:
            counts[k] = 0
        monkeypatch.setattr(workers, "FLUSH_SUBNORMALS", flush)
        torch.set_num_threads(threads)
        try:
            m = AssocModel(AssocConfig(vocab_size=V, seq_len=T, n_layers=3, impl="paths"))
            opt = torch.optim.SGD(m.parameters(), lr=0.005)
            for s in range(5):
                opt.zero_grad()
                m.accumulate_gradients(tokens[s * B % len(tokens) :][:B])
                opt.step()
        finally:
            torch.set_num_threads(prev)
        return dict(counts)

    kept = train(flush=False)
    assert kept["products"] > 0 and kept["operands"] + kept["results"] > 0, kept  # the control
    flushed = train(flush=True)
    assert flushed["products"] == kept["products"]
    assert flushed["operands"] == 0 and flushed["results"] == 0, flushed
