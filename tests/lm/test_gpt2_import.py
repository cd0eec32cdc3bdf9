"""Import of Hugging Face GPT-2 models (:func:`originlens.gpt_from_hf`): GPT → HF → GPT is bit-identical,
HF → GPT gives the logits and the parameter gradients of a random GPT-2 (float64), untied models take one
GPT-2 per range, and what cannot map exactly is refused in one line before anything is built."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import transformers

import originlens as ol
from originlens.errors import CompatibilityError, ConfigError
from originlens.lm.export import gpt_to_hf, gpt_to_hf_model
from originlens.models.gpt import GPT, GPTConfig

V, T = 17, 10


def _random_gpt2(seed=0, *, tie=True, dtype=torch.float64, **overrides):
    """A GPT-2 with every parameter random (biases and LayerNorms too), so no mapping hides behind init."""
    kw = dict(
        vocab_size=V,
        n_positions=T,
        n_embd=16,
        n_layer=2,
        n_head=4,
        activation_function="gelu_new",
        tie_word_embeddings=tie,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    cfg = transformers.GPT2Config(**{**kw, **overrides})
    torch.manual_seed(seed)
    m = transformers.GPT2LMHeadModel(cfg).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(
                torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3
                + (1.0 if "ln_" in name and name.endswith("weight") else 0.0)
            )
    return m.eval()


def _toks(seed=1, B=3):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tie", [True, False])
def test_hf_to_gpt_gives_the_logits_and_gradients_of_the_hf_model(tie):
    hf = _random_gpt2(tie=tie)
    gpt = ol.gpt_from_hf(hf)
    assert gpt.config.dtype == "float64" and gpt.config.tie_embeddings is tie
    toks = _toks()
    ref = hf(toks).logits
    ours = gpt(toks)
    assert (ours - ref).abs().max().item() <= 1e-10
    # gradients: the same next-token loss through both, every parameter mapped back to GPT-2's layout
    hf.zero_grad()
    (torch.nn.functional.cross_entropy(ref[:, :-1].reshape(-1, V), toks[:, 1:].reshape(-1), reduction="sum")).backward()
    loss = torch.nn.functional.cross_entropy(gpt(toks)[:, :-1].reshape(-1, V), toks[:, 1:].reshape(-1), reduction="sum")
    loss.backward()
    theirs = dict(hf.named_parameters())
    blocks = gpt.blocks
    for i in range(2):
        c, p = blocks[i].copies[0], f"transformer.h.{i}."
        pairs = [
            (c.attn_qkv.weight.grad, theirs[p + "attn.c_attn.weight"].grad.T),
            (c.attn_out.weight.grad, theirs[p + "attn.c_proj.weight"].grad.T),
            (c.mlp_in.weight.grad, theirs[p + "mlp.c_fc.weight"].grad.T),
            (c.mlp_out.weight.grad, theirs[p + "mlp.c_proj.weight"].grad.T),
            (c.mlp_out.bias.grad, theirs[p + "mlp.c_proj.bias"].grad),
            (c.ln_1.weight.grad, theirs[p + "ln_1.weight"].grad),
        ]
        for a, b in pairs:
            assert (a - b).abs().max().item() <= 1e-10 * max(1.0, b.abs().max().item())
    wte = gpt.embed[0].wte.weight.grad
    assert (wte - theirs["transformer.wte.weight"].grad).abs().max().item() <= 1e-9


def test_gpt_to_hf_to_gpt_is_bit_identical():
    g = GPT(GPTConfig(vocab_size=V, seq_len=T, n_layer=2, d_model=16, n_head=4, tie_embeddings=False))
    with torch.no_grad():
        for p in g.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    back = ol.gpt_from_hf(gpt_to_hf_model(g))
    a, b = g.state_dict(), back.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert back.config.to_dict() == g.config.to_dict()


def test_a_saved_directory_imports_like_the_model(tmp_path):
    g = GPT(GPTConfig(vocab_size=V, seq_len=T, n_layer=1, d_model=16, n_head=4))
    back = ol.gpt_from_hf(gpt_to_hf(g, tmp_path / "hf"))
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in g.state_dict().items())


def test_the_untied_model_takes_one_gpt2_per_range():
    a, b = _random_gpt2(0), _random_gpt2(1)
    m = 4
    gpt = ol.gpt_from_hf([a, b], regime="untied", untie_at=[m])
    assert gpt.config.untie_scope == "everything" and len(gpt.embed) == 2
    toks = _toks()
    out = gpt(toks)
    # positions < m attend only to range 0: the first model's logits there
    assert (out[:, :m] - a(toks).logits[:, :m]).abs().max().item() <= 1e-10
    # the second range is the second model's weights
    assert torch.equal(gpt.blocks[0].copies[1].attn_qkv.weight, b.transformer.h[0].attn.c_attn.weight.T)
    assert torch.equal(gpt.embed[1].wte.weight, b.transformer.wte.weight)
    # two copies of one model: the untied model is that model at every position
    same = ol.gpt_from_hf([a, a], regime="untied", untie_at=[m])
    assert (same(toks) - a(toks).logits).abs().max().item() <= 1e-10
    # untie_scope="blocks" shares the embeddings: models with different ones are refused
    ol.gpt_from_hf([a, a], regime="untied", untie_at=[m], untie_scope="blocks")
    with pytest.raises(ConfigError, match="shares transformer.wte.weight"):
        ol.gpt_from_hf([a, b], regime="untied", untie_at=[m], untie_scope="blocks")


def test_refusals_are_one_line_each(tmp_path):
    a = _random_gpt2(0)
    cases = [
        (lambda: ol.gpt_from_hf(_random_gpt2(activation_function="gelu")), ConfigError, "activation_function 'gelu'"),
        (lambda: ol.gpt_from_hf(_random_gpt2(layer_norm_epsilon=1e-6)), ConfigError, "layer_norm_epsilon"),
        (lambda: ol.gpt_from_hf(_random_gpt2(scale_attn_by_inverse_layer_idx=True)), ConfigError, "inverse_layer_idx"),
        (lambda: ol.gpt_from_hf(_random_gpt2(scale_attn_weights=False)), ConfigError, "scale_attn_weights"),
        (lambda: ol.gpt_from_hf(_random_gpt2(add_cross_attention=True)), ConfigError, "add_cross_attention"),
        (lambda: ol.gpt_from_hf(_random_gpt2(n_inner=24)), ConfigError, "whole multiple"),
        (lambda: ol.gpt_from_hf([a, a], regime="untied", untie_at=[3, 6]), ConfigError, "3 position range"),
        (lambda: ol.gpt_from_hf([a, a]), ConfigError, "1 position range"),
        (lambda: ol.gpt_from_hf(torch.nn.Linear(2, 2)), ConfigError, "GPT2LMHeadModel only"),
        (lambda: ol.gpt_from_hf(tmp_path / "none"), ConfigError, "not a local directory"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match) as info:
            fn()
        assert "\n" not in str(info.value.args[0])


def test_a_state_dict_with_missing_keys_is_refused_before_anything_is_built(monkeypatch):
    a = _random_gpt2(0)
    full = a.state_dict()
    monkeypatch.setattr(a, "state_dict", lambda: {k: v for k, v in full.items() if "h.1.mlp" not in k})
    with pytest.raises(CompatibilityError, match="missing"):
        ol.gpt_from_hf(a)
