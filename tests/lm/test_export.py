"""Export to Hugging Face format: the same weights through the native adapter and through HFAdapter on the
exported directory give the same logits, residuals, single-token states and attention bilinear forms."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from originlens.errors import ConfigError, OriginlensError
from originlens.lm.export import gpt_to_hf, llama2c_to_hf, llama2c_to_rotate_half, rotate_half_to_llama2c
from originlens.lm.hf import HFAdapter, load_hf
from originlens.lm.llama2c import Llama2cConfig, Llama2cModel, load_llama2c
from originlens.lm.llama2c_tokenizer import Llama2cTokenizer
from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.models.gpt import GPT, GPTConfig
from originlens.paths import data_path

MODEL_DIR = data_path("models", "stories260K", required=False)
STORIES = data_path("tinystories", "stories-004.txt", required=False)
needs_model = pytest.mark.skipif(
    not (MODEL_DIR / "stories260K.bin").is_file() or not STORIES.is_file(),
    reason="stories260K / TinyStories not found (set ORIGINLENS_DATA)",
)


def _perturb(module, seed):
    """Random weights everywhere (LayerNorm/RMSNorm gains around 1) so that no mapping hides behind init."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
            if "ln_" in name or "norm" in name:
                p.add_(1.0 if name.endswith("weight") else 0.0)
    return module.eval()


def _gpt(tie=True, dtype="float32"):
    return _perturb(
        GPT(GPTConfig(vocab_size=13, seq_len=8, n_layer=2, d_model=16, n_head=4, tie_embeddings=tie, dtype=dtype)), 0
    )


def _llama(shared=True):
    cfg = Llama2cConfig(
        dim=16,
        hidden_dim=24,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        vocab_size=11,
        max_seq_len=8,
        shared_classifier=shared,
    )
    return _perturb(Llama2cModel(cfg), 1)


def _compare(native, hf, toks, atol):
    a, ra = native.run(toks, return_residuals=True)
    b, rb = hf.run(toks, return_residuals=True)
    torch.testing.assert_close(b, a, rtol=0, atol=atol)
    for x, y in zip(ra, rb):
        torch.testing.assert_close(y, x, rtol=0, atol=atol)
    torch.testing.assert_close(hf.unembed(ra[-1]), a, rtol=0, atol=atol)
    ids = torch.arange(native.vocab_size)
    sa, sb = native.single_token_states(ids), hf.single_token_states(ids)
    for f in ("pre", "attn", "post"):
        torch.testing.assert_close(getattr(sb, f), getattr(sa, f), rtol=0, atol=atol)
    # the same hook on both paths
    hook = {1: lambda h, k: h * 0.5 + 0.1}
    torch.testing.assert_close(hf.run(toks, hooks=hook), native.run(toks, hooks=hook), rtol=0, atol=atol)
    # attention bilinear forms W_Q[h]ᵀ W_K[h] agree head by head (row permutations cancel)
    for l in range(native.n_layers):
        (qa, ka), (qb, kb) = native.qk_weights(l), hf.qk_weights(l)
        assert qa.shape == qb.shape and ka.shape == kb.shape
        for h in range(native.n_heads):
            torch.testing.assert_close(qb[h].T @ kb[h], qa[h].T @ ka[h], rtol=0, atol=atol)


@pytest.mark.parametrize("tie", [True, False])
def test_gpt_export_float32(tmp_path, tie):
    g = _gpt(tie)
    out = gpt_to_hf(g, tmp_path / "hf")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["tie_word_embeddings"] is tie
    toks = torch.randint(0, 13, (3, 8), generator=torch.Generator().manual_seed(2))
    hf = load_hf(out)
    _compare(GPTAdapter(g), hf, toks, atol=1e-5)
    # GPT-2's qkv layout is ours: the per-head matrices are identical, not only their products
    for l in range(2):
        for a, b in zip(GPTAdapter(g).qk_weights(l), hf.qk_weights(l)):
            torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_gpt_export_float64_is_exact(tmp_path):
    g = _gpt(False, "float64")
    hf = load_hf(gpt_to_hf(g, tmp_path / "hf"), dtype=None)
    assert next(hf.parameters()).dtype == torch.float64
    toks = torch.randint(0, 13, (2, 8), generator=torch.Generator().manual_seed(3))
    _compare(GPTAdapter(g), hf, toks, atol=1e-12)


def test_gpt_export_refusals(tmp_path):
    g = GPT(GPTConfig(vocab_size=13, seq_len=8, n_layer=1, d_model=16, n_head=4, regime="untied", untie_at=[4]))
    with pytest.raises(ConfigError, match="untied"):
        gpt_to_hf(g, tmp_path / "x")
    gpt_to_hf(_gpt(), tmp_path / "y")
    with pytest.raises(OriginlensError, match="already exists"):
        gpt_to_hf(_gpt(), tmp_path / "y")
    gpt_to_hf(_gpt(), tmp_path / "y", overwrite=True)


def test_rotary_permutation():
    w = torch.arange(2 * 8 * 3, dtype=torch.float32).view(16, 3)  # 2 heads of dim 8, d = 3
    p = llama2c_to_rotate_half(w, 2)
    for h in range(2):
        for j in range(4):  # HF row j <- llama2.c row 2j, row j + 4 <- row 2j + 1
            assert torch.equal(p[h * 8 + j], w[h * 8 + 2 * j])
            assert torch.equal(p[h * 8 + 4 + j], w[h * 8 + 2 * j + 1])
    assert torch.equal(rotate_half_to_llama2c(p, 2), w)


@pytest.mark.parametrize("shared", [True, False])
def test_llama2c_export(tmp_path, shared):
    m = _llama(shared)
    out = llama2c_to_hf(m, tmp_path / "hf")
    gen = json.loads((out / "generation_config.json").read_text())
    assert sorted(gen["eos_token_id"]) == [1, 2]
    hf = load_hf(out)
    assert hf.n_kv_heads == 2 and hf.bos_id == 1 and hf.stop_ids == (1, 2)
    toks = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(4))
    _compare(Llama2cAdapter(m), hf, toks, atol=1e-5)
    # the exported per-head rows are the native ones permuted (even rows, then odd rows)
    qa, ka = Llama2cAdapter(m).qk_weights(1)
    qb, kb = hf.qk_weights(1)
    perm = torch.cat([torch.arange(0, 4, 2), torch.arange(1, 4, 2)])
    torch.testing.assert_close(qb, qa[:, perm], rtol=0, atol=0)
    torch.testing.assert_close(kb, ka[:, perm], rtol=0, atol=0)
    # without the permutation the rotary positions would be wrong: logits differ (the test can fail)
    bad = HFAdapter(load_hf(out).module)
    with torch.no_grad():
        for layer, ref in zip(bad.layers, m.layers):
            layer.self_attn.q_proj.weight.copy_(ref.attention.wq.weight)
            layer.self_attn.k_proj.weight.copy_(ref.attention.wk.weight)
    assert (bad.run(toks) - Llama2cAdapter(m).run(toks)).abs().max() > 1e-3


@needs_model
@pytest.mark.slow
def test_stories260k_export_logits_and_greedy_text(tmp_path, capsys):
    m = load_llama2c(MODEL_DIR / "stories260K.bin")
    tok = Llama2cTokenizer.from_file(MODEL_DIR / "tok512.bin", 512)
    out = llama2c_to_hf(m, tmp_path / "hf")
    hf, native = load_hf(out), Llama2cAdapter(m)
    story = STORIES.read_text(encoding="utf-8").splitlines()[0]
    ids = torch.tensor([tok.encode(story)[:256]])
    with torch.no_grad():
        a, b = native.run(ids), hf.run(ids)
    # float32: agreement to 1e-5 of the logit scale (|logits| reaches ~20; HF computes its rotary table
    # in float32 while llama2c.py computes the angles in float64, which dominates the difference)
    scale = float(a.abs().max())
    assert float((a - b).abs().max()) <= 1e-5 * scale
    assert torch.equal(a.argmax(-1), b.argmax(-1))
    sa, sb = native.single_token_states(torch.arange(512)), hf.single_token_states(torch.arange(512))
    torch.testing.assert_close(sb.post, sa.post, rtol=1e-5, atol=1e-5)
    # greedy text through the CLI: llama2.c path == exported Hugging Face path
    from originlens.cli.main import main

    texts = []
    for model in (MODEL_DIR / "stories260K.bin", out):
        assert (
            main(
                [
                    "lm",
                    "generate",
                    "--model",
                    str(model),
                    "--tokenizer",
                    str(MODEL_DIR / "tok512.bin"),
                    "--max-new-tokens",
                    "40",
                    "--greedy",
                ]
            )
            == 0
        )
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1] and texts[0].startswith("Once upon a time")
