"""HFAdapter on tiny random GPT-2 / GPT-NeoX (parallel and sequential residual) / Llama (GQA) models.

References are computed independently of the adapter: the model's own forward (logits,
``output_hidden_states``, eager ``output_attentions``) and brute-force recomputations from the modules'
weights written here (value path of a length-1 sequence, attention scores per head).
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from originlens.errors import CompatibilityError, ConfigError, InputError  # noqa: E402
from originlens.lm.hf import HFAdapter, load_hf  # noqa: E402
from originlens.lm.hf_hub import require_transformers  # noqa: E402

V, D, H, L, T = 13, 16, 4, 2, 6
KINDS = ["gpt2", "neox-parallel", "neox-sequential", "llama"]


def _randomise(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            if "norm" in name or ".ln_" in name or "ln_f" in name:
                p.add_(1.0 if name.endswith("weight") else 0.0)
    return model.eval()


def make(kind: str, *, zero_qk_bias: bool = False):
    torch.manual_seed(0)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=V, n_positions=8, n_embd=D, n_layer=L, n_head=H, bos_token_id=0, eos_token_id=0
        )
        cls = transformers.GPT2LMHeadModel
    elif kind.startswith("neox"):
        cfg = transformers.GPTNeoXConfig(
            vocab_size=V,
            hidden_size=D,
            num_hidden_layers=L,
            num_attention_heads=H,
            intermediate_size=32,
            max_position_embeddings=8,
            rotary_pct=0.5,
            use_parallel_residual=kind == "neox-parallel",
            bos_token_id=0,
            eos_token_id=0,
        )
        cls = transformers.GPTNeoXForCausalLM
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=V,
            hidden_size=D,
            intermediate_size=24,
            num_hidden_layers=L,
            num_attention_heads=H,
            num_key_value_heads=2,
            max_position_embeddings=8,
            bos_token_id=1,
            eos_token_id=2,
        )
        cls = transformers.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    model = _randomise(cls(cfg))
    if zero_qk_bias:
        with torch.no_grad():
            for layer in HFAdapter(model).layers:
                if kind == "gpt2":
                    layer.attn.c_attn.bias[: 2 * D].zero_()
                elif kind.startswith("neox"):
                    layer.attention.query_key_value.bias.view(H, 3, D // H)[:, :2].zero_()
    return model


def tokens(seed=1, B=3):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", KINDS)
def test_run_logits_residuals_and_unembed(kind):
    m = make(kind)
    ad = HFAdapter(m)
    assert (ad.n_layers, ad.d_model, ad.n_heads, ad.vocab_size) == (L, D, H, V)
    x = tokens()
    ref = m(x, output_hidden_states=True)
    logits, res = ad.run(x, return_residuals=True)
    assert len(res) == L + 1 and res[0].shape == (3, T, D)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=0)
    for k in range(L):
        torch.testing.assert_close(res[k], ref.hidden_states[k], rtol=0, atol=0)
    # transformers 5 reports the last hidden state after the final norm
    torch.testing.assert_close(ad.final_norm(res[L]), ref.hidden_states[L], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ad.unembed(res[L]), ref.logits, rtol=1e-6, atol=1e-6)
    # unembed = lm_head(final norm) computed by hand
    h = torch.randn(5, D)
    norm = ad.final_norm
    if isinstance(norm, torch.nn.LayerNorm):
        mu, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        hn = (h - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias
    else:
        hn = h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
    torch.testing.assert_close(ad.unembed(h), hn @ m.get_output_embeddings().weight.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_hooks_replace_the_stream(kind):
    ad = HFAdapter(make(kind))
    x, x2 = tokens(1), tokens(2)
    ref2, res2 = ad.run(x2, return_residuals=True)
    for k in range(L + 1):
        # replacing resid.k of x by resid.k of x2 at every position reproduces x2's logits exactly
        out, res = ad.run(x, hooks={k: lambda h, site, k=k: res2[k]}, return_residuals=True)
        torch.testing.assert_close(out, ref2, rtol=0, atol=1e-6)
        torch.testing.assert_close(res[k], res2[k], rtol=0, atol=0)
    seen = []
    out = ad.run(x, hooks={"resid.1": [lambda h, s: seen.append(s), lambda h, s: None]})
    torch.testing.assert_close(out, ad.run(x), rtol=0, atol=0)
    assert seen == [1]
    with pytest.raises(ConfigError):
        ad.run(x, hooks={1: lambda h, s: h[:, :1]})
    with pytest.raises(ConfigError):
        ad.run(x, hooks={L + 1: lambda h, s: None})
    # the hooks were removed: a clean run is unaffected
    torch.testing.assert_close(ad.run(x), ad.run(x), rtol=0, atol=0)
    with pytest.raises(ConfigError):
        ad.run(torch.zeros(1, 9, dtype=torch.long))  # longer than the context of 8
    with pytest.raises(InputError):
        ad.run(torch.full((1, 2), V))


def _value_path(kind, layer, xn):
    """Attention output of a length-1 sequence (one key, weight 1) from the normalised input."""
    if kind == "gpt2":
        qkv = xn @ layer.attn.c_attn.weight + layer.attn.c_attn.bias
        return qkv[:, 2 * D :] @ layer.attn.c_proj.weight + layer.attn.c_proj.bias
    if kind.startswith("neox"):
        a = layer.attention
        qkv = (xn @ a.query_key_value.weight.T + a.query_key_value.bias).view(-1, H, 3, D // H)
        return qkv[:, :, 2].reshape(-1, D) @ a.dense.weight.T + a.dense.bias
    a = layer.self_attn
    v = (xn @ a.v_proj.weight.T).view(-1, 2, D // H).repeat_interleave(H // 2, dim=1).reshape(-1, D)
    return v @ a.o_proj.weight.T


@pytest.mark.parametrize("kind", KINDS)
def test_single_token_states_match_length_one_forward(kind):
    m = make(kind)
    ad = HFAdapter(m)
    ids = torch.arange(V)
    st = ad.single_token_states(ids)
    assert st.pre.shape == st.attn.shape == st.post.shape == (L, V, D)
    ref = m(ids[:, None], output_hidden_states=True).hidden_states
    for l in range(L):
        torch.testing.assert_close(st.pre[l], ref[l][:, 0], rtol=0, atol=0)
    for l in range(L - 1):
        torch.testing.assert_close(st.post[l], ref[l + 1][:, 0], rtol=0, atol=0)
    torch.testing.assert_close(ad.final_norm(st.post[L - 1]), ref[L][:, 0], rtol=1e-6, atol=1e-6)
    for l, layer in enumerate(ad.layers):
        ln1 = layer.ln_1 if kind == "gpt2" else layer.input_layernorm
        ln2 = layer.ln_2 if kind == "gpt2" else layer.post_attention_layernorm
        attn_out = _value_path(kind, layer, ln1(st.pre[l]))
        torch.testing.assert_close(st.attn[l], st.pre[l] + attn_out, rtol=1e-5, atol=1e-5)
        if kind == "neox-parallel":  # out = x + attn(ln1 x) + mlp(ln2 x)
            expect = st.attn[l] + layer.mlp(ln2(st.pre[l]))
        else:  # out = h + mlp(ln2 h), h = x + attn
            expect = st.attn[l] + layer.mlp(ln2(st.attn[l]))
        torch.testing.assert_close(st.post[l], expect, rtol=1e-5, atol=1e-5)
    # chunked and unchunked agree
    st2 = ad.single_token_states(ids[3:7])
    torch.testing.assert_close(st2.post, st.post[:, 3:7], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
def test_qk_weights_reproduce_attention_probabilities(kind):
    """With position ids all 0 (no rotation, same wpe) and zero q/k biases, the model's own attention
    probabilities are softmax_j(x_t W_Q[h]ᵀ W_K[h] x_j / sqrt(dh)) over j <= t."""
    m = make(kind, zero_qk_bias=True)
    ad = HFAdapter(m)
    x = tokens(3, B=2)
    normed = {}
    for l, layer in enumerate(ad.layers):
        ln = layer.ln_1 if kind == "gpt2" else layer.input_layernorm
        ln.register_forward_hook(lambda mod, a, out, l=l: normed.__setitem__(l, out.detach()))
    out = m(x, output_attentions=True, position_ids=torch.zeros(1, T, dtype=torch.long))
    dh = D // H
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for l in range(L):
        wq, wk = ad.qk_weights(l)
        assert wq.shape == wk.shape == (H, dh, D)
        xn = normed[l].double()
        for h in range(H):
            s = (xn @ wq[h].double().T) @ (xn @ wk[h].double().T).transpose(-1, -2) / math.sqrt(dh)
            p = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
            torch.testing.assert_close(p, out.attentions[l][:, h].double(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError):
        ad.qk_weights(L)


def test_load_local_directory_offline(tmp_path, monkeypatch):
    m = make("llama")
    m.save_pretrained(tmp_path / "m")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ad = load_hf(tmp_path / "m")
    assert isinstance(ad, HFAdapter) and ad.bos_id == 1 and ad.stop_ids == (2,)
    x = tokens()
    # same float32 weights, possibly another attention kernel: round-off up to ~2e-6 has been seen
    torch.testing.assert_close(ad.run(x), m(x).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match="revision"):
        load_hf(tmp_path / "m", revision="step1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json"):
        load_hf(tmp_path / "empty")
    with pytest.raises(InputError, match="neither an existing directory nor"):
        load_hf(str(tmp_path / "missing" / "dir"))


def test_hub_offline_gives_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(InputError) as err:
        load_hf("originlens-test/does-not-exist", revision="step1")
    msg = str(err.value)
    assert "hub could not be reached" in msg and "local" in msg and "--revision step1" in msg


def test_trust_remote_code_only_when_asked(tmp_path, monkeypatch):
    make("gpt2").save_pretrained(tmp_path / "m")
    calls = []
    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM):
        orig = cls.from_pretrained

        def spy(*a, _orig=orig, **kw):
            calls.append(kw)
            return _orig(*a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    load_hf(tmp_path / "m")
    assert calls and all(kw["trust_remote_code"] is False for kw in calls)  # explicit: never a prompt
    assert all(kw["local_files_only"] for kw in calls)
    calls.clear()
    load_hf(tmp_path / "m", trust_remote_code=True)
    assert all(kw["trust_remote_code"] is True for kw in calls)


def test_remote_code_never_runs_even_when_stdin_says_yes(tmp_path, monkeypatch):
    """A directory whose config.json maps AutoConfig to its own module: with "y" waiting on stdin, loading
    it is one clear error and the module (which would create a marker file) is never imported."""
    import io
    import json
    import sys

    d = tmp_path / "remote"
    make("gpt2").save_pretrained(d)
    marker = tmp_path / "pwned"
    (d / "evil_config.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
        "from transformers import PretrainedConfig\n"
        "class EvilConfig(PretrainedConfig):\n    model_type = 'evil-remote'\n"
    )
    cfg = json.loads((d / "config.json").read_text())
    cfg.update(model_type="evil-remote", auto_map={"AutoConfig": "evil_config.EvilConfig"})
    (d / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\ny\n"))
    with pytest.raises(InputError, match="own model code"):
        load_hf(d)
    assert not marker.exists()


def test_missing_transformers_and_unsupported_family(monkeypatch, tmp_path):
    from types import SimpleNamespace

    with pytest.raises(CompatibilityError, match="model type 'opt'"):
        HFAdapter(SimpleNamespace(config=SimpleNamespace(model_type="opt")))
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(CompatibilityError, match=r"originlens\[hf\]"):
        require_transformers()
    with pytest.raises(CompatibilityError, match=r"pip install 'originlens\[hf\]'"):
        load_hf(tmp_path)


def _gemma2(cap=5.0):
    cfg = transformers.Gemma2Config(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=24,
        num_hidden_layers=L,
        num_attention_heads=H,
        num_key_value_heads=2,
        head_dim=6,
        max_position_embeddings=8,
        final_logit_softcapping=cap,
        attn_logit_softcapping=20.0,
        query_pre_attn_scalar=6,
        sliding_window=4,
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return _randomise(transformers.Gemma2ForCausalLM(cfg))


def test_gemma2_logits_residuals_soft_capped_unembedding_and_token_states():
    m = _gemma2()
    ad = HFAdapter(m)
    assert (ad.n_layers, ad.d_model, ad.n_heads, ad.n_kv_heads, ad.vocab_size) == (L, D, H, 2, V)
    x = tokens()
    ref = m(x, output_hidden_states=True)
    logits, res = ad.run(x, return_residuals=True)
    torch.testing.assert_close(logits, ref.logits, rtol=0, atol=0)
    for k in range(L):
        torch.testing.assert_close(res[k], ref.hidden_states[k], rtol=0, atol=0)
    # the soft cap is in the unembedding: |logit| < cap, and without it the logits would differ
    torch.testing.assert_close(ad.unembed(res[L]), ref.logits, rtol=1e-5, atol=1e-5)
    assert ref.logits.abs().max() < 5.0
    raw = m.get_output_embeddings()(ad.final_norm(res[L]))
    torch.testing.assert_close(torch.tanh(raw / 5.0) * 5.0, ad.unembed(res[L]), rtol=1e-6, atol=1e-6)
    # single-token states: mid = pre + post_attention_layernorm(attn), post = the layer's output
    ids = torch.arange(V)
    st = ad.single_token_states(ids)
    one = m(ids[:, None], output_hidden_states=True)
    for l, layer in enumerate(ad.layers):
        torch.testing.assert_close(st.pre[l], one.hidden_states[l][:, 0], rtol=0, atol=0)
        mid = st.attn[l][:, None]
        post = mid + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(mid)))
        torch.testing.assert_close(post[:, 0], st.post[l], rtol=1e-5, atol=1e-5)
    wq, wk = ad.qk_weights(0)
    assert wq.shape == (H, 6, D) and wk.shape == (H, 6, D)


def test_gemma2_runs_through_qscore_steer_and_lookahead_with_an_sae_saved_by_saelens(tmp_path):
    """The paper's §9 setting end to end at toy size: a tiny random Gemma-2 saved as an HF directory, a TopK
    SAE written by SAELens itself (``SAE.save_model``), and the three commands on it; the adapter's logits are
    transformers' own (soft-capped) and the SAE is read with SAELens' weights."""
    import json

    import numpy as np

    sae_lens = pytest.importorskip("sae_lens")
    from originlens.cli.main import main
    from originlens.lm.loading import load_adapter
    from originlens.sae import read_sae

    cfg = transformers.Gemma2Config(
        vocab_size=40, hidden_size=D, intermediate_size=24, num_hidden_layers=3, num_attention_heads=H,
        num_key_value_heads=2, head_dim=6, max_position_embeddings=32, final_logit_softcapping=5.0,
        attn_logit_softcapping=20.0, query_pre_attn_scalar=6, sliding_window=8, bos_token_id=2, eos_token_id=1,
        pad_token_id=0,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = _randomise(transformers.Gemma2ForCausalLM(cfg))
    model.save_pretrained(tmp_path / "gemma2")
    sc = sae_lens.TopKSAEConfig(d_in=D, d_sae=24, k=4)
    sc.metadata.hook_name = "blocks.1.hook_resid_post"
    theirs = sae_lens.TopKSAE(sc)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.5)
    theirs.save_model(str(tmp_path / "sae"))
    ours = read_sae(tmp_path / "sae")
    x = torch.randn(5, D)
    torch.testing.assert_close(ours.encode(x), theirs.encode(x), rtol=1e-5, atol=1e-5)

    ad = load_adapter(tmp_path / "gemma2")
    ids = torch.randint(3, 40, (2, 20), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(ad.run(ids), model(ids).logits, rtol=0, atol=0)
    np.save(tmp_path / "tokens.npy", torch.randint(3, 40, (48, 20), generator=torch.Generator().manual_seed(2)).numpy())

    common = ["--model", str(tmp_path / "gemma2"), "--sae", str(tmp_path / "sae"), "-q"]
    corpus = ["--corpus", str(tmp_path / "tokens.npy")]
    q_out, s_out, l_out = tmp_path / "q", tmp_path / "steer", tmp_path / "la"
    assert main(["lm", "qscore", *common, *corpus, "--max-features", "6", "--max-offset", "3",
                 "--min-total-kl", "0", "--out", str(q_out)]) == 0  # fmt: skip
    q = json.loads((q_out / "results.json").read_text())
    feats = [f for a in q["ablations"].values() for f in a["features"]]
    assert feats and all(np.isfinite(f["q"]) for f in feats if f["kept"])
    assert q["ablations"] and all(a["site"] == "resid.2" for a in q["ablations"].values())
    assert main(["lm", "steer", *common, "--features", "0,1", "--coefficients", "0,4", "--samples", "2",
                 "--max-new-tokens", "5", "--out", str(s_out)]) == 0  # fmt: skip
    assert any(s_out.iterdir())
    assert main(["lm", "lookahead", *common, *corpus, "--max-offset", "2", "--epochs", "1",
                 "--qscore", str(q_out), "--out", str(l_out)]) == 0  # fmt: skip
    assert any(l_out.iterdir())


def _garbage_beyond(past, start, seed):
    """The cached pasts with large random values at every row's positions ≥ its start (to be ignored)."""
    g = torch.Generator().manual_seed(seed)
    out = [tuple(t.clone() for t in kv) for kv in past]
    for kk, vv in out:
        for b, s in enumerate(start.tolist()):
            kk[b, :, s:] = 50 * torch.randn(kk[b, :, s:].shape, generator=g, dtype=kk.dtype)
            vv[b, :, s:] = 50 * torch.randn(vv[b, :, s:].shape, generator=g, dtype=vv.dtype)
    return out


@pytest.mark.parametrize("kind", [*KINDS, "gemma2"])
def test_cached_ablation_through_the_models_own_cache_equals_rerunning_the_prefix(kind):
    """run_cached = run (logits, site stream, one key/value pair per block above the site);
    run_positions_from over the cached past (per-row starts, 0 included, garbage beyond each start) =
    the whole prefix re-run with the last positions replaced at the site (float64)."""
    model = _gemma2() if kind == "gemma2" else make(kind)
    if kind == "gemma2":
        model.config.sliding_window = 16  # wider than the windows: the cached path applies
    ad = HFAdapter(model.double())
    assert ad.supports_cached_ablation
    toks = torch.randint(0, V, (4, 8), generator=torch.Generator().manual_seed(0))
    start, n = torch.tensor([3, 0, 2, 5]), 3
    with torch.no_grad():
        logits, res = ad.run(toks, return_residuals=True)
        for k in range(ad.n_layers + 1):
            resid_L, resid_k, past = ad.run_cached(toks, k)
            torch.testing.assert_close(ad.unembed(resid_L), logits, rtol=0, atol=1e-12)
            torch.testing.assert_close(resid_k, res[k], rtol=0, atol=1e-12)
            assert len(past) == ad.n_layers - k and all(t.shape[:3:2] == (4, 8) for kv in past for t in kv)
            x = torch.stack([res[k][b, s : s + n] for b, s in enumerate(start.tolist())])
            x = x + torch.randn(x.shape, generator=torch.Generator().manual_seed(k), dtype=x.dtype)
            for pst in (past, _garbage_beyond(past, start, k)) if past else (past,):
                out = ad.run_positions_from(k, x, start, pst)
                for b, s in enumerate(start.tolist()):

                    def put(h, _k, b=b, s=s):
                        h = h.clone()
                        h[:, s : s + n] = x[b]
                        return h

                    ref = ad.run(toks[b : b + 1, : s + n], hooks={k: put})[0, s:]
                    torch.testing.assert_close(out[b], ref, rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_cached_ablation_keys_never_outnumber_the_positions(kind, monkeypatch):
    """Past columns at or beyond every row's start are dropped before the forward: a full-context past
    (8 = n_positions) plus 3 new positions reaches the model as at most max(start) + 3 keys, and starts
    all 0 run without a past (GPT-2's eager attention in transformers 4.x cannot take more keys than
    positions)."""
    ad = HFAdapter(make(kind).double())
    toks = torch.randint(0, V, (2, 8), generator=torch.Generator().manual_seed(4))
    n, k = 3, 1
    seen: list[int] = []
    real = ad._forward_cached

    def spy(cache, **kw):
        seen.append(int(cache.get_seq_length()) + kw["input_ids"].shape[1])
        return real(cache, **kw)

    monkeypatch.setattr(ad, "_forward_cached", spy)
    with torch.no_grad():
        res = ad.run(toks, return_residuals=True)[1]
        past = ad.run_cached(toks, k)[2]
        for start in (torch.tensor([2, 5]), torch.tensor([0, 0])):
            x = torch.stack([res[k][b, s : s + n] for b, s in enumerate(start.tolist())]) * 0.5
            out = ad.run_positions_from(k, x, start, past)
            assert seen[-1] == int(start.max()) + n
            for b, s in enumerate(start.tolist()):

                def put(h, _k, b=b, s=s):
                    h = h.clone()
                    h[:, s : s + n] = x[b]
                    return h

                ref = ad.run(toks[b : b + 1, : s + n], hooks={k: put})[0, s:]
                torch.testing.assert_close(out[b], ref, rtol=0, atol=1e-10)


def test_qscore_on_a_hf_model_cached_equals_hooks_and_sliding_windows_fall_back():
    from originlens.lm.qscore_ablation import ablation_kl
    from originlens.lm.qscore_config import QScoreConfig
    from originlens.lm.qscore_contexts import find_top_contexts
    from originlens.sae import SAE, SAEConfig
    from originlens.sae.activations import as_sequences

    ad = HFAdapter(make("llama").double())

    def random_sae(seed):
        g = torch.Generator().manual_seed(seed)
        sae = SAE(SAEConfig(d_in=D, d_sae=12, hook_name="blocks.0.hook_resid_post", dtype="float64"))
        with torch.no_grad():
            for p in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        return sae.requires_grad_(False)

    sae = random_sae(3)
    toks = torch.randint(0, V, (10, 7), generator=torch.Generator().manual_seed(4)).numpy()
    cfg = QScoreConfig(n_contexts=3, max_offset=3, dedup_distance=-1, min_total_kl=0.0, prepend_bos=True)
    seqs = as_sequences(toks, ad, prepend_bos=True)
    ex = find_top_contexts(ad, sae, 1, seqs, list(range(12)), cfg)
    assert len(ex) > 0
    kl_c, a_c = ablation_kl(ad, sae, 1, seqs, ex, cfg, method="cached")
    kl_h, a_h = ablation_kl(ad, sae, 1, seqs, ex, cfg, method="hooks")
    np.testing.assert_allclose(kl_c, kl_h, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a_c, a_h, rtol=0, atol=1e-12)
    assert kl_c.max() > 0  # the ablations change something

    g = _gemma2()  # sliding window 4 < 8 tokens + K: auto must not take the cached path, cached must refuse
    gad = HFAdapter(g.double())
    gsae = random_sae(5)
    gseqs = as_sequences(toks, gad, prepend_bos=True)
    gex = find_top_contexts(gad, gsae, 1, gseqs, list(range(12)), cfg)
    kl_auto, _ = ablation_kl(gad, gsae, 1, gseqs, gex, cfg)
    kl_hooks, _ = ablation_kl(gad, gsae, 1, gseqs, gex, cfg, method="hooks")
    np.testing.assert_allclose(kl_auto, kl_hooks, rtol=0, atol=0)
    with pytest.raises(ConfigError, match="sliding|limit"):
        ablation_kl(gad, gsae, 1, gseqs, gex, cfg, method="cached")


def test_load_adapter_dtype(tmp_path):
    """``dtype``: HF directories are loaded in it (default float32, "auto" the stored dtype), native
    checkpoints cast after loading; the logits follow (float64 equal to transformers' float64 model)."""
    from originlens.lm.loading import load_adapter
    from originlens.models.gpt import GPT, GPTConfig

    m = make("llama")
    m.to(torch.bfloat16).save_pretrained(tmp_path / "m")  # stored in bfloat16

    def dtype_of(ad):
        return next(ad.module.parameters()).dtype

    assert dtype_of(load_adapter(tmp_path / "m")) == torch.float32
    assert dtype_of(load_adapter(tmp_path / "m", dtype="auto")) == torch.bfloat16
    ad64 = load_adapter(tmp_path / "m", dtype="float64")
    assert dtype_of(ad64) == torch.float64
    x = tokens()
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "m", dtype=torch.float64).eval()
    torch.testing.assert_close(ad64.run(x), ref(x).logits, rtol=1e-12, atol=1e-12)
    GPT(GPTConfig(vocab_size=13, seq_len=8, n_layer=1, d_model=8, n_head=2)).save(tmp_path / "g.safetensors")
    assert dtype_of(load_adapter(tmp_path / "g.safetensors")) == torch.float32
    assert dtype_of(load_adapter(tmp_path / "g.safetensors", dtype="bf16")) == torch.bfloat16
    with pytest.raises(ConfigError, match="dtype"):
        load_adapter(tmp_path / "g.safetensors", dtype="int8")


def test_device_map_reaches_from_pretrained_and_inputs_follow_the_embedding(tmp_path, monkeypatch):
    """``device_map`` (load_adapter, ModelSource, --device-map) is passed to from_pretrained; the adapter
    feeds its inputs to the input embedding's device; it is refused with --device, for native checkpoints
    and for adapters given as objects."""
    import argparse

    from originlens.cli.lm_features_cmd import add_model_arguments, model_source
    from originlens.experiments.lm_inputs import ModelSource, load_model_and_codec
    from originlens.lm.loading import load_adapter
    from originlens.models.gpt import GPT, GPTConfig

    pytest.importorskip("accelerate", reason="device_map needs accelerate")
    m = make("llama")
    m.save_pretrained(tmp_path / "m")
    seen = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kw):
        seen.append(kw.get("device_map", "absent"))
        return real(*args, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    x = tokens()
    for dm in ("cpu", {"": "cpu"}):
        ad = load_adapter(tmp_path / "m", device_map=dm)
        assert seen[-1] == dm and ad.device == torch.device("cpu")
        torch.testing.assert_close(ad.run(x), m(x).logits, rtol=1e-5, atol=1e-5)
    load_adapter(tmp_path / "m")
    assert seen[-1] == "absent"
    p = argparse.ArgumentParser()
    add_model_arguments(p, corpus=False)
    src = model_source(p.parse_args(["--model", str(tmp_path / "m"), "--device-map", "cpu"]))
    assert src.device_map == "cpu" and model_source(p.parse_args(["--model", "x"])).device_map is None
    ad, _ = load_model_and_codec(src)
    assert seen[-1] == "cpu" and isinstance(ad, HFAdapter)
    with pytest.raises(ConfigError, match="--device-map cpu and --device cuda"):
        load_model_and_codec(ModelSource(str(tmp_path / "m"), device="cuda", device_map="cpu"))
    GPT(GPTConfig(vocab_size=13, seq_len=8, n_layer=1, d_model=8, n_head=2)).save(tmp_path / "g.safetensors")
    with pytest.raises(ConfigError, match="Hugging Face models only"):
        load_adapter(tmp_path / "g.safetensors", device_map="auto")
    with pytest.raises(ConfigError, match="Hugging Face models only"):
        load_adapter(ad, device_map="auto")
    with pytest.raises(ConfigError, match="together"):
        load_hf(tmp_path / "m", device="cpu", device_map="cpu")


def test_device_map_without_accelerate_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    from originlens.errors import CompatibilityError
    from originlens.lm.loading import load_adapter

    make("llama").save_pretrained(tmp_path / "m")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(CompatibilityError, match="accelerate") as exc:
        load_adapter(str(tmp_path / "m"), device_map="auto")
    assert "pip install accelerate" in exc.value.fix
