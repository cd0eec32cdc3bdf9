"""Adapters for our GPT and llama2.c models agree with the models' own forward passes."""

import pytest
import torch

from originlens.errors import ConfigError
from originlens.lm.adapter import TokenStates
from originlens.lm.llama2c import Llama2cConfig, Llama2cModel
from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.models.gpt import GPT, GPTConfig
from originlens.sites import hook_name_from_site, parse_site, site_from_hook_name


def _gpt():
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=13, seq_len=6, n_layer=2, d_model=16, n_head=4, dtype="float64"))


def _llama():
    torch.manual_seed(0)
    cfg = Llama2cConfig(dim=16, hidden_dim=24, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=11, max_seq_len=8)
    m = Llama2cModel(cfg).double()
    return m


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_run_matches_model_and_hooks_replace(make):
    model = _gpt() if make == "gpt" else _llama()
    ad = GPTAdapter(model) if make == "gpt" else Llama2cAdapter(model)
    toks = torch.randint(0, ad.vocab_size, (3, 5))
    ref, ref_res = model(toks, return_residuals=True)
    out, res = ad.run(toks, return_residuals=True)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    for a, b in zip(res, ref_res):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # unembed of the last residual = logits
    torch.testing.assert_close(ad.unembed(res[-1]), ref, rtol=0, atol=1e-12)
    # a hook that zeroes resid.1 changes the logits exactly as running the rest on zeros would
    seen = {}

    def hook(x, k):
        seen[k] = x.clone()
        return torch.zeros_like(x)

    out2 = ad.run(toks, hooks={1: hook})
    torch.testing.assert_close(seen[1], ref_res[1])
    assert not torch.allclose(out2, ref)
    out3 = ad.run(toks, hooks={"resid.1": lambda x, k: None})
    torch.testing.assert_close(out3, ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_single_token_states_match_length_one_runs(make):
    model = _gpt() if make == "gpt" else _llama()
    ad = GPTAdapter(model) if make == "gpt" else Llama2cAdapter(model)
    ids = torch.arange(ad.vocab_size)
    st = ad.single_token_states(ids)
    assert isinstance(st, TokenStates) and st.pre.shape == (ad.n_layers, ad.vocab_size, ad.d_model)
    _, res = model(ids[:, None], return_residuals=True)
    for l in range(ad.n_layers):
        torch.testing.assert_close(st.pre[l], res[l][:, 0], rtol=0, atol=1e-12)
        torch.testing.assert_close(st.post[l], res[l + 1][:, 0], rtol=0, atol=1e-12)
    # E_attn = E_post - mlp(E_attn): check the MLP part through a brute-force recomputation on layer 0
    if make == "gpt":
        c = model.blocks[0].copies[0]
        h = st.attn[0]
        mlp = c.mlp_out(torch.nn.functional.gelu(c.mlp_in(c.ln_2(h)), approximate="tanh"))
    else:
        lay = model.layers[0]
        h = st.attn[0]
        mlp = lay.feed_forward(lay.ffn_norm(h))
    torch.testing.assert_close(h + mlp, st.post[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_qk_weights_reproduce_attention_scores(make):
    model = _gpt() if make == "gpt" else _llama()
    ad = GPTAdapter(model) if make == "gpt" else Llama2cAdapter(model)
    x = torch.randn(5, ad.d_model, dtype=torch.float64)
    wq, wk = ad.qk_weights(1)
    H = ad.n_heads
    assert wq.shape == wk.shape == (H, ad.d_model // H, ad.d_model)
    if make == "gpt":
        qkv = model.blocks[1].copies[0].attn_qkv
        d = ad.d_model
        q = (x @ qkv.weight[:d].T).view(5, H, -1)
        k = (x @ qkv.weight[d : 2 * d].T).view(5, H, -1)
    else:
        att = model.layers[1].attention
        q = att.wq(x).view(5, H, -1)
        k = att.wk(x).view(5, model.cfg.n_kv_heads, -1).repeat_interleave(model.cfg.kv_group, dim=1)
    for h in range(H):
        torch.testing.assert_close(x @ wq[h].T, q[:, h], rtol=0, atol=1e-12)
        torch.testing.assert_close(x @ wk[h].T, k[:, h], rtol=0, atol=1e-12)
    with pytest.raises(ConfigError):
        ad.qk_weights(2)


def test_site_names():
    assert site_from_hook_name("blocks.3.hook_resid_post") == 4
    assert site_from_hook_name("blocks.3.hook_resid_pre") == 3
    for k in range(5):
        assert site_from_hook_name(hook_name_from_site(k)) == k
    assert parse_site("resid.2", 4) == 2
    with pytest.raises(ConfigError):
        parse_site("resid.9", 4)
    with pytest.raises(ConfigError):
        parse_site("blocks.x", 4)


@pytest.mark.parametrize("make", ["gpt", "llama"])
def test_run_from_site_equals_full_run(make):
    model = _gpt() if make == "gpt" else _llama()
    ad = GPTAdapter(model) if make == "gpt" else Llama2cAdapter(model)
    assert ad.supports_run_from
    toks = torch.randint(0, ad.vocab_size, (2, 5))
    logits, res = ad.run(toks, return_residuals=True)
    for k in range(ad.n_layers + 1):
        torch.testing.assert_close(ad.run_from(k, res[k]), logits, rtol=0, atol=1e-12)
    # an edited stream continues exactly like a replacing hook
    edit = res[1].clone()
    edit[:, 2] += 1.0
    torch.testing.assert_close(ad.run_from(1, edit), ad.run(toks, hooks={1: lambda x, k: edit}), rtol=0, atol=1e-12)
    with pytest.raises(ConfigError):
        ad.run_from(ad.n_layers + 1, res[0])
