"""Q(w): planted toy ranking, batched numbers against a brute-force per-example loop, context selection."""

import math
import random

import numpy as np
import pytest
import torch

from originlens.errors import CompatibilityError, ConfigError, InputError
from originlens.lm.llama2c import Llama2cConfig, Llama2cModel
from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.lm.qscore import aggregate, qscore
from originlens.lm.qscore_ablation import ablation_kl
from originlens.lm.qscore_config import QScoreConfig
from originlens.lm.qscore_contexts import find_top_contexts, within_edit_distance
from originlens.models.gpt import GPT, GPTConfig
from originlens.sae import SAE, SAEConfig

T, V = 16, 8
D = T + V + 2  # one-hot positions, one-hot tokens, attention output O, spare
O = T + V


def planted_model(beta=40.0, alpha=2.0):
    """A hand-built 1-layer GPT: the current token 1 raises the logit of token 3 at the same position
    (immediate effect only); a previous-token attention head copies "token 2" into coordinate O, which
    raises the logit of token 4 at the *next* position (later effect only).  MLP weights are zero."""
    m = GPT(
        GPTConfig(
            vocab_size=V,
            seq_len=T,
            n_layer=1,
            d_model=D,
            n_head=1,
            tie_embeddings=False,
            dtype="float64",
            attn_impl="eager",
        )
    )
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        for mod in m.modules():
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.fill_(1.0)
        m.embed[0].wte.weight[:, T : T + V] = torch.eye(V, dtype=torch.float64)
        m.embed[0].wpe.weight[:, :T] = torch.eye(T, dtype=torch.float64)
        c = m.blocks[0].copies[0]
        W = c.attn_qkv.weight  # rows [W_Q; W_K; W_V]
        for t in range(1, T):
            W[t - 1, t] = beta  # query at t looks for position t-1
        for s in range(T):
            W[D + s, s] = 1.0  # key = position
        W[2 * D + O, T + 2] = 1.0  # value = "is token 2"
        c.attn_out.weight[O, O] = 1.0
        head = m.head[0].lm_head.weight
        head[3, T + 1] = alpha  # token 1 now -> token 3 next
        head[4, O] = alpha  # token 2 one step back -> token 4 next
    return GPTAdapter(m, bos_id=0)


def planted_sae():
    """Latents 0, 1, 2 read and write the one-hot directions of tokens 1, 2 and 5 at resid.0."""
    sae = SAE(
        SAEConfig(d_in=D, d_sae=3, hook_name="blocks.0.hook_resid_pre", apply_b_dec_to_input=False, dtype="float64")
    ).requires_grad_(False)
    with torch.no_grad():
        for f, tok in enumerate([1, 2, 5]):
            sae.W_enc[T + tok, f] = 1.0
            sae.W_dec[f, T + tok] = 1.0
    return sae


def _tokens(n, length, vocab, seed=0, low=0):
    return np.random.default_rng(seed).integers(low, vocab, size=(n, length))


def test_planted_toy_ranks_immediate_below_later():
    ad, sae = planted_model(), planted_sae()
    toks = _tokens(40, T - 1, V)
    cfg = QScoreConfig(n_contexts=6, max_offset=5, dedup_distance=-1)
    r = qscore(ad, sae, toks, config=cfg)
    f0, f1, f2 = r.features
    # latent 1 acts on later tokens only, latent 0 on the next token only
    for key in ("q", "q_ratio_of_means", "q_median"):
        assert getattr(f1, key) > 100 * getattr(f0, key), key
    assert f1.q_median > 10 and f0.q_median < 0.1
    assert f0.kl_by_offset[0] > 1 and f1.kl_by_offset[1] > 1 and max(f1.kl_by_offset[2:]) < 1e-9
    # latent 2 changes nothing but the LayerNorm scale: dropped by the total-KL rule
    assert f0.kept and f1.kept and not f2.kept and "total KL" in f2.reason
    assert r.summary()["n_kept"] == 2
    # the faithful (reference) ablation also removes the reconstruction error: here the position code,
    # so every latent shows a large feature-independent KL
    rf = qscore(
        ad,
        sae,
        toks,
        config=QScoreConfig(n_contexts=6, max_offset=5, dedup_distance=-1, ablation="faithful"),
        examples=r.examples,
    )
    assert rf.features[2].total_kl > 100 * f2.total_kl and rf.features[2].kept
    assert rf.features[1].q_median > rf.features[0].q_median
    np.testing.assert_array_equal(rf.examples.position, r.examples.position)


def brute_force_kl(ad, sae, k, seqs, feature, seq_index, position, K, ablation):
    """One example: clean and ablated runs of the whole window, KL_d from its definition in float64."""
    tok = seqs[seq_index : seq_index + 1]
    p, f = int(position), int(feature)

    def hook(x, _k):
        x = x.clone()
        v = x[0, p].to(sae.dtype)
        W_enc, b_enc, W_dec, b_dec = sae.W_enc, sae.b_enc, sae.W_dec, sae.b_dec
        pre = (v - b_dec * sae.cfg.apply_b_dec_to_input) @ W_enc + b_enc
        a = sae.activation(pre)
        if ablation == "faithful":
            a2 = a.clone()
            a2[f] = 0
            new = a2 @ W_dec + b_dec
        else:
            new = v - a[f] * W_dec[f]
        x[0, p] = new.to(x.dtype)
        return x

    with torch.no_grad():
        clean = ad.run(tok)[0].double()
        abl = ad.run(tok, hooks={k: hook})[0].double()
    out = []
    for d in range(1, K + 1):
        t = p + d - 1
        P = torch.softmax(clean[t], -1)
        Q = torch.softmax(abl[t], -1)
        out.append(float((P * (P.log() - Q.log())).sum()))
    return np.array(out)


def _check_against_brute_force(ad, sae, toks, cfg, tol, rtol=1e-6, method="auto"):
    """``rtol``: aggregates (ratios) vs the brute force; float32 models differ by ~3e-5 relative from
    float64 for *every* path (different kernels round differently), so their tests pass ~1e-4."""
    from originlens.sae.activations import as_sequences

    r = qscore(ad, sae, toks, config=cfg)
    seqs = as_sequences(toks, ad, prepend_bos=cfg.prepend_bos)
    ex = r.examples
    if method != "auto":
        r.kl, r.ablated_activation = ablation_kl(ad, sae, r.site, seqs, ex, cfg, method=method)
        r.features, r.ratio = aggregate(ex, r.kl, [f.feature for f in r.features], cfg)
    assert len(ex) > 0
    brute = np.stack(
        [
            brute_force_kl(
                ad, sae, r.site, seqs, ex.feature[e], ex.seq_index[e], ex.position[e], cfg.max_offset, cfg.ablation
            )
            for e in range(len(ex))
        ]
    )
    # float32 (rtol > 1e-6): logits of magnitude ~20 carry ~1e-6 rounding each, so large KLs (~10) differ
    # by ~1e-5 between kernels; float64 tests compare with rtol=0
    np.testing.assert_allclose(r.kl, brute, rtol=0 if rtol <= 1e-6 else 1e-5, atol=tol)
    # aggregates from their definitions
    for fq in r.features:
        sel = ex.feature == fq.feature
        if not sel.any():
            continue
        b = brute[sel]
        ratios = b[:, 1:].sum(1) / (b[:, 0] + 1e-8)
        assert math.isclose(fq.q, ratios.mean(), rel_tol=rtol, abs_tol=1e-6)
        assert math.isclose(fq.q_median, float(np.median(ratios)), rel_tol=rtol, abs_tol=1e-6)
        assert math.isclose(fq.q_ratio_of_means, b[:, 1:].sum() / (b[:, 0].sum() + 1e-8), rel_tol=rtol, abs_tol=1e-6)
        assert math.isclose(fq.total_kl, b.sum(1).mean(), rel_tol=rtol, abs_tol=1e-9)
        assert fq.kept == (b.sum(1).mean() > cfg.min_total_kl)
    np.testing.assert_allclose(r.ablated_activation, ex.activation, rtol=rtol, atol=1e-9)
    return r


@pytest.mark.parametrize("ablation", ["error_preserving", "faithful"])
def test_batched_matches_brute_force_on_planted_toy(ablation):
    ad, sae = planted_model(), planted_sae()
    cfg = QScoreConfig(n_contexts=5, max_offset=4, ablation=ablation, dedup_distance=-1, batch_size=7)
    _check_against_brute_force(ad, sae, _tokens(30, T - 1, V, seed=1), cfg, 1e-10)


def _random_gpt(d=16, vocab=23, seq=20):
    torch.manual_seed(1)
    return GPTAdapter(
        GPT(
            GPTConfig(
                vocab_size=vocab, seq_len=seq, n_layer=2, d_model=d, n_head=4, dtype="float64", tie_embeddings=False
            )
        ),
        bos_id=0,
    )


def _random_sae(arch, d, m, hook, seed=0, dtype="float64"):
    g = torch.Generator().manual_seed(seed)
    sae = SAE(
        SAEConfig(d_in=d, d_sae=m, architecture=arch, k=4 if arch == "topk" else None, hook_name=hook, dtype=dtype)
    ).requires_grad_(False)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(d, m, generator=g, dtype=torch.float64))
        sae.W_dec.copy_(torch.randn(m, d, generator=g, dtype=torch.float64) * 0.5)
        sae.b_enc.copy_(torch.randn(m, generator=g, dtype=torch.float64) * 0.5 - 0.5)
        sae.b_dec.copy_(torch.randn(d, generator=g, dtype=torch.float64) * 0.1)
        if sae.threshold is not None:
            sae.threshold.fill_(0.2)
    return sae


@pytest.mark.parametrize(
    "arch,ablation,method",
    [
        ("standard", "error_preserving", "auto"),
        ("jumprelu", "faithful", "auto"),
        ("topk", "error_preserving", "auto"),
        ("standard", "faithful", "run_from"),
        ("topk", "error_preserving", "hooks"),
    ],
)
def test_batched_matches_brute_force_on_random_gpt(arch, ablation, method):
    ad = _random_gpt()
    sae = _random_sae(arch, 16, 12, "blocks.0.hook_resid_post")
    # tiny blocks and batches: several clean blocks / window groups, ablated chunks and shared windows
    cfg = QScoreConfig(
        n_contexts=4,
        max_offset=3,
        ablation=ablation,
        batch_size=5,
        max_clean_bytes=1,
        scan_batch_size=7,
        position_rule="drop" if arch == "jumprelu" else "restrict",
    )
    _check_against_brute_force(ad, sae, _tokens(25, 15, 23, seed=2, low=1), cfg, 1e-10, method=method)


def _random_llama(n_layers=2, dim=16, vocab=17, seq=24):
    torch.manual_seed(0)
    return Llama2cAdapter(
        Llama2cModel(
            Llama2cConfig(
                dim=dim, hidden_dim=24, n_layers=n_layers, n_heads=4, n_kv_heads=2, vocab_size=vocab, max_seq_len=seq
            )
        ).double()
    )


@pytest.mark.parametrize("method", ["auto", "run_from"])
def test_batched_matches_brute_force_on_llama(method):
    ad = _random_llama()
    sae = _random_sae("standard", 16, 10, "blocks.1.hook_resid_pre", seed=3)
    cfg = QScoreConfig(n_contexts=3, max_offset=4, batch_size=6, clean_tokens=40)
    _check_against_brute_force(ad, sae, _tokens(20, 14, 17, seed=3, low=3), cfg, 1e-10, method=method)


def _perturbed_prefix_logits(ad, k, res_k, b, s, x_b):
    """Brute force: the whole prefix of row b from site k with positions s.. replaced by x_b."""
    full = res_k[b : b + 1, : s + x_b.shape[0]].clone()
    full[0, s:] = x_b
    return ad.run_from(k, full)[0, s:]


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_cached_partial_forward_matches_full_runs(make):
    """run_cached = run (logits via unembed, site stream, one key/value pair per block above the site);
    run_positions_from = run_from on the whole prefix with the last positions replaced, for per-row
    starts (0 included) and finite garbage in the past beyond each row's start (float64)."""
    if make == "gpt":
        torch.manual_seed(2)
        ad = GPTAdapter(GPT(GPTConfig(vocab_size=23, seq_len=20, n_layer=3, d_model=16, n_head=4, dtype="float64")))
    else:
        ad = _random_llama(n_layers=3)
    assert ad.supports_cached_ablation
    toks = torch.randint(0, 17, (4, 15), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, res = ad.run(toks, return_residuals=True)
        for k in range(ad.n_layers + 1):
            resid_L, resid_k, past = ad.run_cached(toks, k)
            torch.testing.assert_close(ad.unembed(resid_L), logits, rtol=0, atol=1e-12)
            torch.testing.assert_close(resid_k, res[k], rtol=0, atol=1e-12)
            assert len(past) == ad.n_layers - k
            assert all(t.shape[0] == 4 and t.shape[2] == 15 for kv in past for t in kv)
            start, n = torch.tensor([3, 0, 7, 10]), 5
            g = torch.Generator().manual_seed(k)
            x = torch.stack([res[k][b, s : s + n] for b, s in enumerate(start.tolist())])
            x = x + torch.randn(x.shape, generator=g, dtype=x.dtype)
            garbage = [tuple(t.clone() for t in kv) for kv in past]
            for kk, vv in garbage:
                for b, s in enumerate(start.tolist()):
                    kk[b, :, s:] = 50 * torch.randn(kk[b, :, s:].shape, generator=g, dtype=kk.dtype)
                    vv[b, :, s:] = 50 * torch.randn(vv[b, :, s:].shape, generator=g, dtype=vv.dtype)
            for pst in (past, garbage):
                out = ad.run_positions_from(k, x, start, pst)
                for b, s in enumerate(start.tolist()):
                    ref = _perturbed_prefix_logits(ad, k, res[k], b, s, x[b])
                    torch.testing.assert_close(out[b], ref, rtol=0, atol=1e-11)


def _handmade_examples(n_seqs, length, K, seed):
    """Examples on repeated windows, positions 0 (no BOS) through the last eligible one."""
    from originlens.lm.qscore_config import Examples

    rng = np.random.default_rng(seed)
    E = 23
    pos = rng.integers(0, length - K + 1, size=E)
    pos[:3] = [0, 0, length - K]
    return Examples(
        feature=rng.integers(0, 10, size=E),
        seq_index=rng.integers(0, n_seqs, size=E),
        position=pos.astype(np.int64),
        activation=np.zeros(E),
    )


@pytest.mark.parametrize("make,site", [("gpt", 0), ("gpt", 2), ("llama", 1), ("llama", 3)])
def test_methods_agree_with_each_other_and_brute_force(make, site):
    """cached, run_from and hooks agree in float64 to 1e-10 and match the brute force, at the embedding
    site, mid-model and after the last block, with past lengths 0 and odd batch / group / chunk sizes."""
    ad = _random_gpt() if make == "gpt" else _random_llama(n_layers=3)
    hook = "blocks.0.hook_resid_pre" if site == 0 else f"blocks.{site - 1}.hook_resid_post"
    sae = _random_sae("standard", 16, 10, hook, seed=site)
    seqs = torch.from_numpy(_tokens(6, 14, 17, seed=site, low=0))
    K = 4
    ex = _handmade_examples(6, 14, K, seed=site)
    base = dict(max_offset=K, ablation="faithful" if site % 2 else "error_preserving")
    out = {}
    for method, extra in [
        ("cached", dict(batch_size=4, clean_tokens=30, max_clean_bytes=2000)),
        ("cached", dict(batch_size=64)),
        ("run_from", dict(batch_size=5)),
        ("hooks", dict(batch_size=64)),
    ]:
        kl, act = ablation_kl(ad, sae, site, seqs, ex, QScoreConfig(**base, **extra), method=method)
        if method in out:
            np.testing.assert_allclose(kl, out[method][0], rtol=0, atol=1e-12)
        out[method] = (kl, act)
    for m in ("run_from", "hooks"):
        np.testing.assert_allclose(out["cached"][0], out[m][0], rtol=0, atol=1e-10)
        np.testing.assert_allclose(out["cached"][1], out[m][1], rtol=0, atol=1e-10)
    for e in range(0, len(ex), 5):
        brute = brute_force_kl(ad, sae, site, seqs, ex.feature[e], ex.seq_index[e], ex.position[e], K, base["ablation"])
        np.testing.assert_allclose(out["cached"][0][e], brute, rtol=0, atol=1e-10)
    assert (out["cached"][0] > 0).any()


def test_method_selection_and_fallback():
    """Adapters without the cached capability (untied GPT) fall back to run_from; asking for an
    unsupported or unknown method is a ConfigError."""
    torch.manual_seed(3)
    untied = GPTAdapter(
        GPT(
            GPTConfig(
                vocab_size=23,
                seq_len=15,
                n_layer=2,
                d_model=16,
                n_head=4,
                dtype="float64",
                regime="untied",
                untie_at=[6],
            )
        ),
        bos_id=0,
    )
    assert not untied.supports_cached_ablation and untied.supports_run_from
    assert _random_gpt().supports_cached_ablation and _random_llama().supports_cached_ablation
    sae = _random_sae("standard", 16, 10, "blocks.0.hook_resid_post", seed=4)
    seqs = torch.from_numpy(_tokens(6, 14, 23, seed=4, low=1))
    ex = _handmade_examples(6, 14, 3, seed=4)
    cfg = QScoreConfig(max_offset=3, batch_size=7)
    kl_auto, _ = ablation_kl(untied, sae, 1, seqs, ex, cfg)
    kl_hooks, _ = ablation_kl(untied, sae, 1, seqs, ex, cfg, method="hooks")
    np.testing.assert_allclose(kl_auto, kl_hooks, rtol=0, atol=1e-10)
    with pytest.raises(ConfigError, match="does not support"):
        ablation_kl(untied, sae, 1, seqs, ex, cfg, method="cached")
    with pytest.raises(ConfigError, match="one parameter copy"):
        untied.run_cached(seqs[:2], 1)
    with pytest.raises(ConfigError, match="unknown ablation method"):
        ablation_kl(untied, sae, 1, seqs, ex, cfg, method="fast")
    with pytest.raises(ConfigError, match="clean_tokens"):
        QScoreConfig(clean_tokens=0).validate()
    with pytest.raises(ConfigError, match="max_stream_bytes"):
        QScoreConfig(max_stream_bytes=-1).validate()


@pytest.mark.parametrize("rule", ["restrict", "drop"])
def test_context_selection_matches_definition(rule):
    from originlens.sae.activations import as_sequences

    ad = _random_gpt()
    sae = _random_sae("standard", 16, 12, "blocks.1.hook_resid_post", seed=5)
    toks = _tokens(30, 15, 23, seed=4, low=1)
    K, n = 3, 4
    cfg = QScoreConfig(n_contexts=n, max_offset=K, dedup_distance=-1, position_rule=rule, scan_batch_size=8)
    seqs = as_sequences(toks, ad)
    ex = find_top_contexts(ad, sae, 2, seqs, list(range(12)), cfg, first=1)
    with torch.no_grad():
        acts = sae.encode(ad.residuals(seqs)[2]).numpy()  # (N, L, F)
    L = seqs.shape[1]
    for f in range(12):
        cands = []
        for i in range(len(seqs)):
            lo, hi = 1, (L - 1 - K) if rule == "restrict" else L - 1
            p = lo + int(np.argmax(acts[i, lo : hi + 1, f]))
            v = acts[i, p, f]
            if p + K <= L - 1 and v > 0:
                cands.append((-v, i, p))
        want = sorted(cands)[:n]
        got = [(i, p) for ff, i, p in zip(ex.feature, ex.seq_index, ex.position) if ff == f]
        assert got == [(i, p) for _, i, p in want], f
        np.testing.assert_allclose(ex.activation[ex.feature == f], [-v for v, _, _ in want], rtol=1e-9)


def _levenshtein(a, b):
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def test_edit_distance_threshold_matches_levenshtein():
    rng = random.Random(0)
    for _ in range(400):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 14))]
        b = list(a)
        for _ in range(rng.randrange(0, 6)):
            op = rng.randrange(3)
            if op == 0 and b:
                b.pop(rng.randrange(len(b)))
            elif op == 1:
                b.insert(rng.randrange(len(b) + 1), rng.randrange(4))
            elif b:
                b[rng.randrange(len(b))] = rng.randrange(4)
        if rng.random() < 0.3:
            b = [rng.randrange(4) for _ in range(rng.randrange(0, 14))]
        thr = rng.randrange(0, 5)
        assert within_edit_distance(a, b, thr) == (_levenshtein(a, b) <= thr), (a, b, thr)


def test_dedup_dead_features_and_bad_inputs():
    ad, sae = planted_model(), planted_sae()
    row = np.array([[3, 1, 4, 6, 7, 3, 6, 7, 4, 6, 3, 7, 6, 4, 3]])
    toks = np.concatenate([row, row, row, _tokens(4, T - 1, V, seed=9, low=6)])  # 3 identical windows
    r = qscore(ad, sae, toks, features=[0, 2], config=QScoreConfig(n_contexts=3, max_offset=4))
    assert (r.examples.feature == 0).sum() == 1  # duplicates removed
    r2 = qscore(ad, sae, toks, features=[0], config=QScoreConfig(n_contexts=3, max_offset=4, dedup_distance=-1))
    assert (r2.examples.feature == 0).sum() == 3
    assert r.examples.skipped.get(2) == "dead" and r.features[1].reason == "dead"  # token 5 never occurs
    late = np.full((3, 15), 6)
    late[:, -2] = 1  # token 1 only where fewer than K tokens follow
    r3 = qscore(ad, sae, late, features=[0, 2], config=QScoreConfig(n_contexts=3, max_offset=4))
    assert r3.examples.skipped == {0: "no eligible context", 2: "dead"} and len(r3.examples) == 0
    with pytest.raises(InputError, match="windows"):
        qscore(ad, sae, toks[:, :4], config=QScoreConfig(max_offset=4))
    with pytest.raises(CompatibilityError, match="vocabulary"):
        qscore(ad, sae, toks + 10)
    wrong = SAE(SAEConfig(d_in=D + 1, d_sae=3, hook_name="blocks.0.hook_resid_pre"))
    with pytest.raises(CompatibilityError, match="d_in"):
        qscore(ad, wrong, toks)


@pytest.mark.slow
def test_stories260k_batched_matches_loop():
    from originlens.lm.llama2c import load_llama2c
    from originlens.lm.llama2c_tokenizer import Llama2cTokenizer
    from originlens.paths import data_path, tinystories_files

    model_dir = data_path("models", "stories260K", required=False)
    files = tinystories_files()
    if model_dir is None or not (model_dir / "stories260K.bin").exists() or not files:
        pytest.skip("shared data not available")
    m = load_llama2c(model_dir / "stories260K.bin")
    tok = Llama2cTokenizer.from_file(model_dir / "tok512.bin", m.cfg.vocab_size)
    ad = Llama2cAdapter(m)
    lines = files[0].read_text(encoding="utf-8").splitlines()[:12]
    ids = [tok.encode(s, bos=False) for s in lines]
    toks = np.array([i[:40] for i in ids if len(i) >= 40][:8])
    sae = _random_sae("topk", 64, 16, "blocks.2.hook_resid_post", seed=7, dtype="float32")
    cfg = QScoreConfig(n_contexts=3, max_offset=5, batch_size=16)
    r = _check_against_brute_force(ad, sae, toks, cfg, 2e-5, rtol=2e-4)
    assert np.isfinite(r.kl).all() and (r.kl >= -1e-6).all()


@pytest.mark.slow
def test_cli_qscore_writes_a_run_directory(tmp_path, capsys):
    import json

    from originlens.cli.main import main
    from originlens.sae import write_sae

    torch.manual_seed(0)
    GPT(GPTConfig(vocab_size=13, seq_len=24, n_layer=2, d_model=16, n_head=4)).save(tmp_path / "gpt.safetensors")
    np.save(tmp_path / "toks.npy", _tokens(30, 20, 13, seed=5, low=1).astype(np.uint16))
    write_sae(_random_sae("standard", 16, 10, "blocks.0.hook_resid_post", dtype="float32"), tmp_path / "sae")
    base = [
        "-q",
        "lm",
        "qscore",
        "--model",
        str(tmp_path / "gpt.safetensors"),
        "--corpus",
        str(tmp_path / "toks.npy"),
        "--features",
        "0-5",
        "--contexts",
        "3",
        "--max-offset",
        "4",
        "--min-total-kl",
        "0",
    ]
    assert main(base + ["--sae", str(tmp_path / "sae"), "--ablation", "both", "--out", str(tmp_path / "run")]) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(res["ablations"]) == {"error_preserving", "faithful"}
    ep = res["ablations"]["error_preserving"]
    assert len(ep["features"]) == 6 and ep["summary"]["n_features"] == 6
    from originlens.storage import load_tensors

    a, _ = load_tensors(tmp_path / "run" / ep["examples_file"], kind="qscore-examples")
    b, _ = load_tensors(tmp_path / "run" / "examples-faithful.safetensors", kind="qscore-examples")
    assert a["kl"].shape[1] == 4 and a["kl"].shape[0] == a["feature"].shape[0] > 0
    np.testing.assert_array_equal(a["position"], b["position"])
    for fig in ("q-hist-error_preserving.png", "kl-by-offset-faithful.png", "q-ablations.png"):
        assert (tmp_path / "run" / "figures" / fig).is_file()
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "config.json").is_file()
    write_sae(_random_sae("standard", 12, 10, "blocks.0.hook_resid_post", dtype="float32"), tmp_path / "narrow")
    assert main(base + ["--sae", str(tmp_path / "narrow"), "--out", str(tmp_path / "r2")]) == 2
    assert "d_in=12" in capsys.readouterr().err
    np.save(tmp_path / "big.npy", _tokens(5, 20, 40, seed=5).astype(np.uint16))
    assert (
        main(base[:6] + [str(tmp_path / "big.npy"), "--sae", str(tmp_path / "sae"), "--out", str(tmp_path / "r3")]) == 2
    )
    assert "vocabulary" in capsys.readouterr().err
    # nothing can be scored (every feature below the KL floor): one error, no page of nan
    no_kl = [a if a != "0" or base[i - 1] != "--min-total-kl" else "1e9" for i, a in enumerate(base)]
    assert main(no_kl + ["--sae", str(tmp_path / "sae"), "--out", str(tmp_path / "r4")]) == 2
    err = capsys.readouterr().err
    assert "none of the 6 features could be scored" in err and "--min-total-kl" in err, err
    assert not (tmp_path / "r4" / "results.json").exists() and not (tmp_path / "r4" / "report.html").exists()


def _reference_selection(acts, seqs, f, K, n, pool, dedup, first=1):
    """Selection rules from their definition (restrict rule): per window the maximum over eligible
    positions, sorted by descending activation, the top ``pool`` candidates, then greedy
    de-duplication by Levenshtein distance (text from ``first`` through p + K)."""
    L = seqs.shape[1]
    cands = []
    for i in range(len(seqs)):
        p = first + int(np.argmax(acts[i, first : L - K, f]))
        if acts[i, p, f] > 0:
            # activations equal to round-off (1e-9) count as ties, broken by window index: the batched
            # scan and this per-window recomputation may order two such windows either way by one ulp
            cands.append((-round(float(acts[i, p, f]), 9), i, p))
    kept = []
    for _, i, p in sorted(cands)[:pool]:
        if len(kept) >= n:
            break
        text = seqs[i, first : p + K + 1].tolist()
        if dedup >= 0 and any(_levenshtein(text, t) <= dedup for _, _, t in kept):
            continue
        kept.append((i, p, text))
    return [(i, p) for i, p, _ in kept]


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_dedup_selection_and_kept_streams_match_definition(make):
    """With de-duplication on: the selected contexts equal the rules applied by brute force; the kept
    site streams are the clean stream at the site (float64, 1e-10) of exactly the selected windows,
    covering the prefix their examples need."""
    from originlens.sae.activations import as_sequences

    ad = _random_gpt(vocab=7) if make == "gpt" else _random_llama(n_layers=3, vocab=7)
    site = 2
    sae = _random_sae("standard", 16, 12, f"blocks.{site - 1}.hook_resid_post", seed=6)
    toks = _tokens(40, 15, 5, seed=6, low=1)  # small vocabulary: many near-duplicate windows
    K, n, pf, dd = 3, 5, 3, 6
    cfg = QScoreConfig(n_contexts=n, max_offset=K, dedup_distance=dd, pool_factor=pf, scan_batch_size=6)
    seqs = as_sequences(toks, ad)
    ex, st = find_top_contexts(ad, sae, site, seqs, list(range(12)), cfg, first=1, return_streams=True)
    with torch.no_grad():
        res = ad.residuals(seqs)[site]
        acts = sae.encode(res).numpy()
    n_dropped = 0
    for f in range(12):
        want = _reference_selection(acts, seqs.numpy(), f, K, n, n * pf, dd)
        got = [(i, p) for ff, i, p in zip(ex.feature, ex.seq_index, ex.position) if ff == f]
        assert got == want, f
        n_dropped += len(want) < n
    assert n_dropped > 0  # de-duplication did remove candidates
    assert st.site == site and sorted(st.streams) == sorted(set(ex.seq_index.tolist()))
    for w, t in st.streams.items():
        need = int(ex.position[ex.seq_index == w].max()) + K
        assert t.shape[0] >= need
        torch.testing.assert_close(t, res[w, : t.shape[0]], rtol=0, atol=1e-10)
    # a budget smaller than one window keeps none; the streams then change nothing
    _, none = find_top_contexts(
        ad,
        sae,
        site,
        seqs,
        list(range(12)),
        QScoreConfig(n_contexts=n, max_offset=K, dedup_distance=dd, pool_factor=pf, max_stream_bytes=100),
        return_streams=True,
    )
    assert none.streams == {} and none.nbytes == 0


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_cached_ablation_with_kept_streams_matches_brute_force(make):
    """ablation_kl("cached") from all, some or none of the kept site streams equals the full clean
    runs and the brute force (float64, 1e-10); streams of another site are refused."""
    from originlens.lm.qscore_config import SiteStreams
    from originlens.sae.activations import as_sequences

    ad = _random_gpt() if make == "gpt" else _random_llama(n_layers=3)
    site = 1
    sae = _random_sae("standard", 16, 10, "blocks.0.hook_resid_post", seed=8)
    toks = _tokens(18, 14, 17, seed=8, low=1)
    cfg = QScoreConfig(n_contexts=3, max_offset=4, batch_size=5, clean_tokens=40, max_clean_bytes=3000)
    seqs = as_sequences(toks, ad)
    ex, st = find_top_contexts(ad, sae, site, seqs, list(range(10)), cfg, first=1, return_streams=True)
    assert len(st.streams) == len(set(ex.seq_index.tolist())) > 3
    half = SiteStreams(site, {w: t for j, (w, t) in enumerate(st.streams.items()) if j % 2})
    full, act = ablation_kl(ad, sae, site, seqs, ex, cfg, method="cached")
    # tiny groups / chunks (one window each), and one forward holding windows with and without streams
    for c in (cfg, QScoreConfig(n_contexts=3, max_offset=4, batch_size=64)):
        for s in (st, half):
            kl, a = ablation_kl(ad, sae, site, seqs, ex, c, method="cached", streams=s)
            np.testing.assert_allclose(kl, full, rtol=0, atol=1e-10)
            np.testing.assert_allclose(a, act, rtol=0, atol=1e-10)
    for e in range(0, len(ex), 3):
        brute = brute_force_kl(ad, sae, site, seqs, ex.feature[e], ex.seq_index[e], ex.position[e], 4, cfg.ablation)
        np.testing.assert_allclose(full[e], brute, rtol=0, atol=1e-10)
    with pytest.raises(ConfigError, match="streams kept at resid.2"):
        ablation_kl(ad, sae, site, seqs, ex, cfg, method="cached", streams=SiteStreams(2, st.streams))


def test_run_to_and_run_cached_from_match_run():
    """The llama2.c fast paths used with kept streams: run_to = run's residual at k, and run_cached_from
    on it = run_cached (float64); for our GPT run_cached_from = run_cached."""
    toks = torch.randint(0, 17, (3, 13), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)
    gpt = GPTAdapter(GPT(GPTConfig(vocab_size=23, seq_len=20, n_layer=3, d_model=16, n_head=4, dtype="float64")))
    with torch.no_grad():
        for ad in (_random_llama(n_layers=3), gpt):
            res = ad.residuals(toks)
            for k in range(ad.n_layers + 1):
                if hasattr(ad, "run_to"):
                    torch.testing.assert_close(ad.run_to(toks, k), res[k], rtol=0, atol=1e-12)
                rL, rk, past = ad.run_cached(toks, k)
                rL2, past2 = ad.run_cached_from(k, res[k])
                torch.testing.assert_close(rL2, rL, rtol=0, atol=1e-12)
                assert len(past2) == len(past)
                for a, b in zip(past, past2):
                    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-12)
                    torch.testing.assert_close(a[1], b[1], rtol=0, atol=1e-12)
