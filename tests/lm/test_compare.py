"""The Pythia comparison of arXiv 2601.19208 (Fig. 6–7): cov_cosine against a direct float64 transcription of its definition, the fast trace identities,
mappings of tiny models against a brute-force construction, statistics in the model's tokenizer, and a
small end-to-end CLI run."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from originlens.errors import CompatibilityError, ConfigError
from originlens.lm.compare import (
    VARIANTS,
    CompareConfig,
    checkpoint_cosines,
    compare_checkpoints,
    cov_cosine,
    prepare_targets,
)
from originlens.lm.compare_statistics import (
    VocabIdentity,
    check_vocab,
    comparison_statistics,
    prepend_bos,
    top_tokens,
    windows_from_texts,
)
from originlens.lm.llama2c import Llama2cConfig, Llama2cModel
from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.models.gpt import GPT, GPTConfig

# ---------------------------------------------------------------------------------------------- brute force


def spec_cov_cosine(A, B):
    """Direct float64 transcription of the comparison statistic's definition (docs/concepts.md)."""
    A = np.asarray(A, dtype=np.float64)
    B = np.asarray(B, dtype=np.float64)
    norms = np.linalg.norm(A, axis=1, keepdims=True)
    A = np.where(norms > 0, A / np.where(norms > 0, norms, 1.0), 0.0)

    def cov(M):
        Z = M - M.mean(axis=1, keepdims=True)
        C = Z @ Z.T / (M.shape[1] - 1)
        return C / np.linalg.norm(C)

    return float(np.trace(cov(A).T @ cov(B)))


def token_centred_cov_cosine(A, B):
    """Brute force of the token-centred variant: J C_A J and J C_B J, J = I − 11ᵀ/K."""
    A = np.asarray(A, dtype=np.float64)
    A = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-300)
    K = A.shape[0]
    J = np.eye(K) - 1.0 / K

    def cov(M):
        Z = M - M.mean(axis=1, keepdims=True)
        return J @ (Z @ Z.T) @ J

    CA, CB = cov(A), cov(np.asarray(B, dtype=np.float64))
    return float(np.sum(CA * CB) / (np.linalg.norm(CA) * np.linalg.norm(CB)))


def brute_gpt_scores(model, E, layer):
    """Per-head token × token scores through the model's own q/k projection (bias removed): (H, K, K)."""
    c = model.blocks[layer].copies[0]
    d, H = model.config.d_model, model.config.n_head
    with torch.no_grad():
        qkv = c.attn_qkv(E) - c.attn_qkv.bias
    q, k = qkv[:, :d], qkv[:, d : 2 * d]
    dh = d // H
    return torch.stack([q[:, h * dh : (h + 1) * dh] @ k[:, h * dh : (h + 1) * dh].T for h in range(H)]).numpy()


def brute_llama_scores(model, E, layer):
    """Per-head scores of a llama2.c layer through its wq/wk Linear layers, GQA by key-head sharing."""
    a, cfg = model.layers[layer].attention, model.cfg
    with torch.no_grad():
        q = a.wq(E).view(-1, cfg.n_heads, cfg.head_dim)
        k = a.wk(E).view(-1, cfg.n_kv_heads, cfg.head_dim)
    return torch.stack([q[:, h] @ k[:, h // cfg.kv_group].T for h in range(cfg.n_heads)]).numpy()


def _gpt(vocab=40, layers=3, d=16, heads=4, seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=vocab, seq_len=8, n_layer=layers, d_model=d, n_head=heads, dtype="float64"))


def _llama(vocab=30, seed=0):
    torch.manual_seed(seed)
    cfg = Llama2cConfig(dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=vocab, max_seq_len=8)
    return Llama2cModel(cfg).double()


# ---------------------------------------------------------------------------------------------- the statistic


def test_cov_cosine_equals_spec_transcription():
    rng = np.random.default_rng(0)
    for K, m, n in [(30, 30, 8), (25, 40, 25), (12, 5, 60)]:
        A = rng.normal(size=(K, m)) + rng.normal(size=(1, m))  # shared row component
        A[2] = 0.0  # a zero theory row stays zero
        B = rng.normal(size=(K, n)) * rng.uniform(0.1, 3, size=(K, 1))
        assert cov_cosine(A, B) == pytest.approx(spec_cov_cosine(A, B), rel=1e-12, abs=1e-14)
        assert cov_cosine(A, B, centre_tokens=True) == pytest.approx(token_centred_cov_cosine(A, B), rel=1e-10)


def test_cov_cosine_properties():
    rng = np.random.default_rng(1)
    A = rng.normal(size=(20, 20))
    B = rng.normal(size=(20, 7))
    unit = A / np.linalg.norm(A, axis=1, keepdims=True)
    assert cov_cosine(A, unit) == pytest.approx(1.0, abs=1e-12)  # identical up to row normalisation
    assert cov_cosine(A * rng.uniform(0.1, 5, size=(20, 1)), B) == pytest.approx(cov_cosine(A, B), rel=1e-12)
    assert cov_cosine(A, 7.5 * B) == pytest.approx(cov_cosine(A, B), rel=1e-12)
    assert cov_cosine(A, B + 3.0) == pytest.approx(cov_cosine(A, B), rel=1e-12)  # row centring
    v = cov_cosine(A, B)
    assert 0.0 <= v <= 1.0
    # the model is not row-normalised: rescaling B's rows changes the value
    assert cov_cosine(A, B * rng.uniform(0.1, 5, size=(20, 1))) != pytest.approx(v, rel=1e-6)
    assert np.isnan(cov_cosine(A, np.ones((20, 3))))  # zero covariance
    with pytest.raises(ConfigError):
        cov_cosine(A, B[:5])


def test_fast_trace_identities():
    """tr(C_A C_B) = ‖Z_Aᵀ Z_B‖², ‖C‖ = ‖ZᵀZ‖, and the low-rank forms used for the attention mapping."""
    rng = np.random.default_rng(2)
    K, r = 50, 6
    ZA = rng.normal(size=(K, K))
    ZB = rng.normal(size=(K, 9))
    CA, CB = ZA @ ZA.T, ZB @ ZB.T
    assert np.trace(CA @ CB) == pytest.approx(np.sum((ZA.T @ ZB) ** 2), rel=1e-12)
    assert np.linalg.norm(CB) == pytest.approx(np.linalg.norm(ZB.T @ ZB), rel=1e-12)
    U, V = rng.normal(size=(K, r)), rng.normal(size=(K, r))
    Vc = V - V.mean(axis=0)
    A_tok = U @ V.T
    Z = A_tok - A_tok.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(Z, U @ Vc.T, atol=1e-12)
    W, R, P = U.T @ ZA, Vc.T @ Vc, U.T @ U
    assert np.trace(CA @ (Z @ Z.T)) == pytest.approx(np.sum((W @ W.T) * R), rel=1e-10)
    assert np.linalg.norm(Z @ Z.T) ** 2 == pytest.approx(np.trace(P @ R @ P @ R), rel=1e-10)


# ---------------------------------------------------------------------------------------------- mappings


@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_mappings_match_brute_force(family):
    model = _gpt() if family == "gpt" else _llama()
    ad = GPTAdapter(model) if family == "gpt" else Llama2cAdapter(model)
    rng = np.random.default_rng(0)
    K = 21
    ids = rng.permutation(ad.vocab_size)[:K]
    Q = rng.normal(size=(K, K))
    Q[4] = 0.0
    Vt = rng.normal(size=(K, K)) + 0.5
    stats = SimpleNamespace(query_key=Q, value_target=Vt, size=K)
    targets = prepare_targets(stats, variants=VARIANTS, seed=5)
    L = ad.n_layers
    res = checkpoint_cosines(ad, ids, targets, layers=list(range(L)), head_layers=[L - 1], token_chunk=8)
    perm = np.random.default_rng(5).permutation(K)
    scores = brute_gpt_scores if family == "gpt" else brute_llama_scores
    with torch.no_grad():
        st = ad.single_token_states(torch.as_tensor(ids))
    for v in VARIANTS:
        p = perm if v.endswith("null") else np.arange(K)
        f = token_centred_cov_cosine if v.startswith("token_centred") else spec_cov_cosine
        for l in range(L):
            per_head = scores(model, st.pre[l], l)
            A_tok = per_head.mean(axis=0)
            assert res.values[v]["attention"][l] == pytest.approx(f(Q[p], A_tok), rel=1e-9)
            assert res.values[v]["embedding"][l] == pytest.approx(f(Vt[p], st.post[l].numpy()), rel=1e-9)
            assert res.values[v]["embedding_no_mlp"][l] == pytest.approx(f(Vt[p], st.attn[l].numpy()), rel=1e-9)
        np.testing.assert_allclose(
            res.heads[v][L - 1], [f(Q[p], s) for s in scores(model, st.pre[L - 1], L - 1)], rtol=1e-9
        )
    # orientation guard: the query × key orientation, not its transpose
    A_tok = scores(model, st.pre[0], 0).mean(axis=0)
    assert abs(spec_cov_cosine(Q, A_tok.T) - res.values["spec"]["attention"][0]) > 1e-4


def test_token_chunking_does_not_change_results():
    ad = GPTAdapter(_gpt())
    rng = np.random.default_rng(3)
    K = 30
    stats = SimpleNamespace(query_key=rng.normal(size=(K, K)), value_target=rng.normal(size=(K, K)), size=K)
    targets = prepare_targets(stats, variants=("spec", "token_centred"))
    ids = rng.permutation(40)[:K]
    a = checkpoint_cosines(ad, ids, targets, layers=[0, 2], token_chunk=K)
    b = checkpoint_cosines(ad, ids, targets, layers=[0, 2], token_chunk=7)
    for v in a.values:
        for k in a.values[v]:
            np.testing.assert_allclose(a.values[v][k], b.values[v][k], rtol=1e-11)


# ---------------------------------------------------------------------------------------------- statistics


def test_windows_bos_padding_and_top_tokens():
    texts = ["a b c", "d", "", "b b b b b b b b"]
    vocab = {"a": 3, "b": 4, "c": 5, "d": 6}
    w, valid = windows_from_texts(texts, lambda t: [vocab[x] for x in t.split()], bos_id=1, window_tokens=5)
    np.testing.assert_array_equal(w, [[1, 3, 4, 5, 0], [1, 6, 0, 0, 0], [1, 4, 4, 4, 4]])
    np.testing.assert_array_equal(valid, [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    # BOS is not added twice; text starting with BOS keeps it
    w2, _ = windows_from_texts(["x"], lambda t: [1, 9], bos_id=1, window_tokens=3)
    np.testing.assert_array_equal(w2, [[1, 9, 0]])
    np.testing.assert_array_equal(prepend_bos(np.array([[1, 5, 6], [7, 8, 9]]), 1), [[1, 5, 6], [1, 7, 8]])
    np.testing.assert_array_equal(prepend_bos(np.array([[7, 8, 9]]), None), [[7, 8, 9]])
    # padding (id 0) is not counted; ties by smaller id; absent tokens are never kept
    ids = top_tokens(w, valid, vocab_size=10, k=10)
    np.testing.assert_array_equal(ids, [4, 1, 3, 5, 6])


def test_comparison_statistics_equal_direct_statistics_and_mask_padding():
    from originlens.stats import corpus_statistics

    rng = np.random.default_rng(4)
    texts = [" ".join(str(x) for x in rng.integers(2, 12, size=rng.integers(3, 12))) for _ in range(40)]
    w, valid = windows_from_texts(texts, lambda t: [int(x) for x in t.split()], bos_id=1, window_tokens=8)
    st = comparison_statistics(w, 12, valid=valid, top_k=6)
    ref = corpus_statistics(w, 12, token_ids=top_tokens(w, valid, 12, 6), mask=valid)
    np.testing.assert_allclose(st.query_key, ref.query_key, atol=1e-15)
    np.testing.assert_allclose(st.value_target, ref.value_target, atol=1e-15)
    assert st.n_pairs == int(valid.sum()) and st.centering == pytest.approx(1 / 12)
    with pytest.raises(CompatibilityError):
        comparison_statistics(w, 8, valid=valid, top_k=6)  # ids beyond the model's vocabulary


def test_vocabulary_checks():
    assert check_vocab(VocabIdentity(50, "h"), VocabIdentity(50, "h"), "corpus") == []
    assert check_vocab(VocabIdentity(50, None), VocabIdentity(50, "h"), "corpus")  # a warning, no error
    with pytest.raises(CompatibilityError, match="another tokenizer"):
        check_vocab(VocabIdentity(50, None), VocabIdentity(60, None), "corpus X")
    with pytest.raises(CompatibilityError, match="another vocabulary"):
        check_vocab(VocabIdentity(50, "h1"), VocabIdentity(50, "h2"), "corpus X")
    # padded model vocabulary (Pythia-style), tokenizer proven by the hash
    assert check_vocab(VocabIdentity(64, "h"), VocabIdentity(50, "h"), "c", tokenizer_size=50) == []


# ---------------------------------------------------------------------------------------------- end to end


class _Grid:
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __iter__(self):
        return iter(self.items)


def test_compare_checkpoints_sweep_shapes_and_values():
    rng = np.random.default_rng(6)
    w = rng.integers(0, 40, size=(30, 9))
    stats = comparison_statistics(w, 40, top_k=25)
    ads = [("a", GPTAdapter(_gpt(seed=0))), ("b", GPTAdapter(_gpt(seed=1)))]
    res = compare_checkpoints(_Grid(ads), stats, CompareConfig(layers=[1, 3], head_layers=[3], null_baseline=True))
    assert res.labels == ["a", "b"] and res.layers == [1, 3]
    assert set(res.cosines) == {"spec", "null"} and res.cosines["spec"]["attention"].shape == (2, 2)
    assert res.heads["spec"][3].shape == (4, 2)
    with torch.no_grad():
        st = ads[1][1].single_token_states(torch.as_tensor(stats.token_ids))
    assert res.cosines["spec"]["embedding"][1, 1] == pytest.approx(
        spec_cov_cosine(stats.value_target, st.post[2]), rel=1e-9
    )
    json.dumps(res.to_json())
    with pytest.raises(ConfigError, match="out of range"):
        compare_checkpoints(_Grid(ads), stats, CompareConfig(layers=[4]))


def _save_checkpoints(tmp, vocab_size, vocab_hash, bos, steps=(0, 1, 2), name="ckpts"):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab_size, seq_len=17, n_layer=2, d_model=16, n_head=2))
    d = tmp / name
    d.mkdir()
    toks = torch.randint(0, vocab_size, (4, 17))
    for s in range(max(steps) + 1):
        if s in steps:
            model.save(d / f"step-{s:06d}.safetensors", {"bos_id": bos, "vocab_hash": vocab_hash})
        model.zero_grad()
        model.loss(toks).backward()
        with torch.no_grad():  # plain SGD (torch.optim would import torch._dynamo: slow)
            for p in model.parameters():
                p -= 0.5 * p.grad
    return d


@pytest.mark.slow
def test_cli_end_to_end_on_storyworld(tmp_path, capsys):
    from originlens.cli.main import main
    from originlens.data import storyworld_store

    store = storyworld_store(tmp_path / "corpus", n=40, vocab_size=120, seq_len=16, windows="pack", oov="unk")
    eot = store.vocab.index("<eot>")
    ckpts = _save_checkpoints(tmp_path, store.vocab_size, store.vocab_hash, eot)
    (ckpts / "step-000004.safetensors").write_bytes((ckpts / "step-000002.safetensors").read_bytes())
    out = tmp_path / "run"
    rc = main(
        [
            "-q",
            "lm",
            "compare",
            "--checkpoint-dir",
            str(ckpts),
            "--corpus",
            str(tmp_path / "corpus"),
            "--top-tokens",
            "60",
            "--heads-layers",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["labels"] == ["step0", "step1", "step2", "step4"] and res["layers"] == [1, 2]
    assert res["statistics"]["K"] == 60 and res["statistics"]["meta"]["bos_id"] == eot
    assert res["grid"]["duplicates"][0]["label"] == "step4"
    assert any("same weights" in w for w in res["warnings"])
    vals = np.array(res["cosines"]["spec"]["embedding"], dtype=float)
    assert vals.shape == (2, 4) and np.all((vals >= 0) & (vals <= 1))
    assert (out / "report.html").is_file() and (out / "figures" / "mappings-spec.png").is_file()
    assert (out / "figures" / "heads-spec.png").is_file()
    # the same numbers through the library, with the statistics recomputed independently
    from originlens.lm.checkpoints import load_gpt_adapter
    from originlens.stats import corpus_statistics

    windows = prepend_bos(np.asarray(store.tokens), eot)
    ad = load_gpt_adapter(ckpts / "step-000001.safetensors")
    stats = corpus_statistics(windows, store.vocab_size, token_ids=top_tokens(windows, None, store.vocab_size, 60))
    with torch.no_grad():
        st = ad.single_token_states(torch.as_tensor(stats.token_ids))
    assert vals[0, 1] == pytest.approx(spec_cov_cosine(stats.value_target, st.post[0].double()), abs=2e-6)
    # an existing run is not overwritten silently (refused before any work)
    assert (
        main(
            [
                "-q",
                "lm",
                "compare",
                "--checkpoint-dir",
                str(ckpts),
                "--corpus",
                str(tmp_path / "corpus"),
                "--out",
                str(out),
            ]
        )
        == 2
    )


def test_cli_bad_inputs(tmp_path, capsys):
    from originlens.cli.main import main
    from originlens.data import storyworld_store

    store = storyworld_store(tmp_path / "corpus", n=30, vocab_size=120, seq_len=16, windows="pack", oov="unk")
    ckpts = _save_checkpoints(tmp_path, store.vocab_size, store.vocab_hash, 0, steps=(0,))
    other = storyworld_store(tmp_path / "other", n=30, vocab_size=90, seq_len=16, windows="pack", oov="unk")
    assert other.vocab_size != store.vocab_size
    capsys.readouterr()
    # a corpus in another tokenizer: different size (hash unknown) or different hash
    rc = main(
        [
            "-q",
            "lm",
            "compare",
            "--checkpoint-dir",
            str(ckpts),
            "--corpus",
            str(tmp_path / "other"),
            "--out",
            str(tmp_path / "run2"),
        ]
    )
    assert rc == 2 and "was tokenized with another" in capsys.readouterr().err
    unhashed = _save_checkpoints(tmp_path, other.vocab_size, None, None, steps=(0,), name="unhashed")
    rc = main(
        [
            "-q",
            "lm",
            "compare",
            "--checkpoint-dir",
            str(unhashed),
            "--corpus",
            str(tmp_path / "corpus"),
            "--out",
            str(tmp_path / "run2"),
        ]
    )
    assert rc == 2 and "another tokenizer" in capsys.readouterr().err
    # a missing checkpoint is named and stops the run before anything is loaded
    rc = main(
        [
            "-q",
            "lm",
            "compare",
            "--checkpoints",
            f"{ckpts}/step-000000.safetensors,{ckpts}/nope.safetensors",
            "--corpus",
            str(tmp_path / "corpus"),
            "--out",
            str(tmp_path / "run3"),
        ]
    )
    assert rc == 2 and "nope.safetensors" in capsys.readouterr().err
    # --corpus and --stats are exclusive; a non-comparison --out is never replaced
    assert main(["-q", "lm", "compare", "--checkpoint-dir", str(ckpts), "--out", str(tmp_path / "r")]) == 2
    assert (
        main(
            [
                "-q",
                "lm",
                "compare",
                "--checkpoint-dir",
                str(ckpts),
                "--corpus",
                str(tmp_path / "corpus"),
                "--out",
                str(tmp_path / "corpus"),
                "--overwrite",
            ]
        )
        == 2
    )
    assert "not a comparison run" in capsys.readouterr().err


def _write_llama2c(path, cfg, seed=0):
    from originlens.lm.llama2c import _weight_shapes

    n = sum(int(np.prod(s)) for _, s in _weight_shapes(cfg))
    head = np.array(
        [cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.vocab_size, cfg.max_seq_len],
        dtype="<i4",
    )
    w = (np.random.default_rng(seed).normal(size=n) * 0.1).astype("<f4")
    path.write_bytes(head.tobytes() + w.tobytes())


def test_cli_text_corpus_with_llama2c_tokenizer(tmp_path, capsys):
    from originlens.cli.main import main
    from originlens.paths import data_root

    tok = data_root() / "models" / "stories260K" / "tok512.bin"
    if not tok.exists():
        pytest.skip("stories260K tokenizer not available")
    cfg = Llama2cConfig(dim=16, hidden_dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, max_seq_len=32)
    _write_llama2c(tmp_path / "tiny.bin", cfg)
    text = tmp_path / "stories.txt"
    text.write_text(
        "\n".join(
            [
                "Once upon a time there was a little girl named Lily.",
                "Tom had a red ball. He liked to play with it in the park.",
                "The cat sat on the mat and looked at the big dog.",
            ]
            * 5
        )
    )
    out = tmp_path / "run"
    rc = main(
        [
            "-q",
            "lm",
            "compare",
            "--model",
            str(tmp_path / "tiny.bin"),
            "--tokenizer",
            str(tok),
            "--corpus",
            str(text),
            "--top-tokens",
            "30",
            "--window",
            "16",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["statistics"]["meta"]["bos_id"] == 1 and res["statistics"]["K"] == 30
    assert res["statistics"]["tokens_head"][0] and res["labels"] == ["tiny"]
    # the model without its tokenizer cannot read raw text
    rc = main(
        [
            "-q",
            "lm",
            "compare",
            "--model",
            str(tmp_path / "tiny.bin"),
            "--corpus",
            str(text),
            "--out",
            str(tmp_path / "run2"),
        ]
    )
    assert rc == 2 and "tokenizer" in capsys.readouterr().err


def test_cli_checkpoint_spec_expansion(tmp_path):
    from originlens.experiments.compare_run import checkpoint_specs

    assert checkpoint_specs("hf:org/m", "step1,step2", None, None) == ["hf:org/m@step1", "hf:org/m@step2"]
    assert checkpoint_specs("hf:org/m", None, None, 4) == ["hf:org/m@step1", "hf:org/m@step2", "hf:org/m@step4"]
    assert checkpoint_specs(str(tmp_path), "a.safetensors", None, None) == [str(tmp_path / "a.safetensors")]
    assert checkpoint_specs("m.bin", None, None, None) == ["m.bin"]
    with pytest.raises(ConfigError):
        checkpoint_specs("m.bin", None, None, 8)  # --log-steps needs a hub model
    with pytest.raises(ConfigError):
        checkpoint_specs(None, "a", str(tmp_path), None)


def test_the_null_baseline_is_on_by_default_and_null_level_agreement_is_flagged():
    from originlens.lm.compare import MAPPINGS, ComparisonResult, null_level_warnings

    assert CompareConfig().variants == ["spec", "null"]
    assert CompareConfig(null_baseline=False).variants == ["spec"]
    real = {k: np.array([[0.99, 0.60]]) for k in MAPPINGS}
    null = {k: np.array([[0.985, 0.20]]) for k in MAPPINGS}
    res = ComparisonResult(labels=["a", "b"], layers=[1], cosines={"spec": real, "null": null}, heads={})
    warns = null_level_warnings(res)
    assert len(warns) == len(MAPPINGS)
    assert all("within 0.02 of its token-permuted null at 1 of 2" in w and "null-level agreement" in w for w in warns)
    far = ComparisonResult(
        labels=["a"],
        layers=[1],
        cosines={"spec": {k: np.array([[0.9]]) for k in MAPPINGS}, "null": {k: np.array([[0.3]]) for k in MAPPINGS}},
        heads={},
    )
    assert null_level_warnings(far) == []
    assert null_level_warnings(ComparisonResult(labels=["a"], layers=[1], cosines={"spec": real}, heads={})) == []


def test_sharded_checkpoint_grid_merges_to_the_unsharded_run(tmp_path, capsys):
    """`lm compare --shard I/N` on blocks of the checkpoint list, merged by `lm compare-merge`, gives the
    results of one unsharded run: same labels, cosines, per-head cosines, statistics, duplicates across
    blocks and warnings; bad shard sets are refused."""
    from originlens.cli.main import main
    from originlens.data import storyworld_store

    store = storyworld_store(tmp_path / "corpus", n=30, vocab_size=100, seq_len=16, windows="pack", oov="unk")
    eot = store.vocab.index("<eot>")
    ckpts = _save_checkpoints(tmp_path, store.vocab_size, store.vocab_hash, eot, steps=(0, 1, 2, 3))
    # a duplicate whose original lies in another block
    (ckpts / "step-000005.safetensors").write_bytes((ckpts / "step-000000.safetensors").read_bytes())
    base = ["-q", "lm", "compare", "--checkpoint-dir", str(ckpts), "--corpus", str(tmp_path / "corpus")]
    base += ["--top-tokens", "40", "--heads-layers", "1,2"]
    assert main([*base, "--out", str(tmp_path / "all")]) == 0
    for i in range(3):
        assert main([*base, "--shard", f"{i}/3", "--out", str(tmp_path / f"s{i}")]) == 0
    blocks = [json.loads((tmp_path / f"s{i}" / "results.json").read_text())["labels"] for i in range(3)]
    assert blocks == [["step0", "step1"], ["step2", "step3"], ["step5"]]
    shards = [str(tmp_path / f"s{i}") for i in (2, 0, 1)]  # any order
    assert main(["-q", "lm", "compare-merge", *shards, "--out", str(tmp_path / "merged")]) == 0
    want = json.loads((tmp_path / "all" / "results.json").read_text())
    got = json.loads((tmp_path / "merged" / "results.json").read_text())
    for key in ("kind", "labels", "layers", "cosines", "heads", "statistics", "model", "warnings"):
        assert got[key] == want[key], key
    assert (
        got["grid"]["duplicates"]
        == want["grid"]["duplicates"]
        == [{"label": "step5", "same_as": "step0", "sha256": want["grid"]["hashes"]["step0"]}]
    )
    assert got["config"]["merged_from_shards"] == 3 and got["config"]["checkpoints_total"] == 5
    assert (tmp_path / "merged" / "report.html").is_file()
    # refused: a missing block, a run without --shard, more blocks than checkpoints
    capsys.readouterr()
    assert main(["-q", "lm", "compare-merge", *shards[:2], "--out", str(tmp_path / "m2")]) == 2
    assert "exactly once" in capsys.readouterr().err
    assert main(["-q", "lm", "compare-merge", shards[0], str(tmp_path / "all"), "--out", str(tmp_path / "m3")]) == 2
    assert main([*base, "--shard", "0/9", "--out", str(tmp_path / "s9")]) == 2
    assert "cannot fill 9 blocks" in capsys.readouterr().err


def test_models_are_placed_where_the_comparison_runs(tmp_path, monkeypatch, capsys):
    """`lm compare --device-map` reaches the Hugging Face loader, is refused for our own checkpoints and
    beside another --device; without it each model is moved to --device (the CPU here)."""
    from originlens.cli.main import main
    from originlens.data import storyworld_store
    from originlens.errors import ConfigError
    from originlens.experiments import compare_run
    from originlens.lm import loading

    store = storyworld_store(tmp_path / "corpus", n=20, vocab_size=60, seq_len=16, windows="pack", oov="unk")
    ckpts = _save_checkpoints(tmp_path, store.vocab_size, store.vocab_hash, store.vocab.index("<eot>"), steps=(0,))
    spec = str(next(ckpts.glob("*.safetensors")))
    adapter = compare_run.placing_loader("cpu")(spec)
    assert {p.device.type for p in adapter.module.parameters()} == {"cpu"}
    with pytest.raises(ConfigError, match="given together"):
        compare_run.placing_loader("cuda", "auto")
    seen = {}

    def fake_load_adapter(s, **kw):
        seen.update(kw, spec=s)
        return adapter

    monkeypatch.setattr(loading, "load_adapter", fake_load_adapter)
    assert compare_run.placing_loader("cpu", "auto")("hf:org/model@main") is adapter
    assert seen["spec"] == "hf:org/model@main" and seen["device_map"] == "auto"
    monkeypatch.undo()
    base = ["-q", "lm", "compare", "--checkpoint-dir", str(ckpts), "--corpus", str(tmp_path / "corpus")]
    assert main([*base, "--top-tokens", "20", "--device-map", "auto", "--out", str(tmp_path / "dm")]) == 2
    assert "device_map" in capsys.readouterr().err.replace("--device-map", "device_map")
