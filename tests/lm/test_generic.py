"""GenericHFAdapter (nnsight) on tiny random Hugging Face models, float64.

Architectures outside the hand-written table (Qwen2, Mistral, OPT, Phi, GPT-J) are checked against
transformers itself: ``output_hidden_states`` (entries 0..L−1 are the inputs of blocks 1..L; entry L is
recorded **after** the final norm, so it is compared with ``final_norm(resid.L)``), the model's logits,
and interventions done with plain torch forward pre-hooks on modules named here per architecture.  GPT-2,
Llama and Gemma-2 must equal the hand-written :class:`HFAdapter` exactly.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("nnsight")

from originlens.errors import CompatibilityError, ConfigError, InputError  # noqa: E402
from originlens.lm.generic import GenericHFAdapter  # noqa: E402
from originlens.lm.hf import HFAdapter  # noqa: E402
from originlens.lm.loading import load_adapter  # noqa: E402

V, D, H, L, T = 23, 16, 4, 3, 7
# per architecture: (decoder layers, final norm) as the model names them
PATHS = {
    "qwen2": ("model.layers", "model.norm"),
    "mistral": ("model.layers", "model.norm"),
    "opt": ("model.decoder.layers", "model.decoder.final_layer_norm"),
    "phi": ("model.layers", "model.final_layernorm"),
    "gptj": ("transformer.h", "transformer.ln_f"),
}
OTHERS = list(PATHS)


def _randomise(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
            if "norm" in name or "ln_" in name:
                p.add_(1.0 if name.endswith("weight") else 0.0)
    return model.eval()


def config(kind: str):
    ids = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    attn = dict(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, max_position_embeddings=32)
    c = {
        "qwen2": lambda: transformers.Qwen2Config(
            vocab_size=V, intermediate_size=24, num_key_value_heads=2, **attn, **ids
        ),
        "mistral": lambda: transformers.MistralConfig(
            vocab_size=V, intermediate_size=24, num_key_value_heads=2, sliding_window=4, **attn, **ids
        ),
        "opt": lambda: transformers.OPTConfig(vocab_size=V, ffn_dim=24, word_embed_proj_dim=D, **attn, **ids),
        "phi": lambda: transformers.PhiConfig(
            vocab_size=V, intermediate_size=24, partial_rotary_factor=0.5, **attn, **ids
        ),
        "gptj": lambda: transformers.GPTJConfig(
            vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=32, rotary_dim=2, **ids
        ),
        "gpt2": lambda: transformers.GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=32, **ids),
        "llama": lambda: transformers.LlamaConfig(
            vocab_size=V, intermediate_size=24, num_key_value_heads=2, **attn, **ids
        ),
        "gemma2": lambda: transformers.Gemma2Config(
            vocab_size=V,
            intermediate_size=24,
            num_key_value_heads=2,
            head_dim=6,
            final_logit_softcapping=5.0,
            attn_logit_softcapping=20.0,
            query_pre_attn_scalar=6,
            sliding_window=4,
            **attn,
            **ids,
        ),
    }[kind]()
    c._attn_implementation = "eager"
    return c


def make(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    return _randomise(transformers.AutoModelForCausalLM.from_config(config(kind)), seed).double()


def tokens(seed=1, B=3):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------------
# exactness
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gemma2"])
def test_equals_the_hand_written_adapter(kind):
    model = make(kind)
    gen, ref = GenericHFAdapter(model), HFAdapter(model)
    assert (gen.n_layers, gen.d_model, gen.n_heads, gen.vocab_size, gen.bos_id, gen.stop_ids) == (
        ref.n_layers, ref.d_model, ref.n_heads, ref.vocab_size, ref.bos_id, ref.stop_ids,
    )  # fmt: skip
    assert gen.max_seq_len == ref.max_seq_len and gen.device == ref.device
    toks = tokens()
    v = torch.randn(D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    hooks = {1: lambda x, k: x * 0.5, "resid.3": [lambda x, k: x + v, lambda x, k: None]}
    with torch.no_grad():
        lg, rg = gen.run(toks, return_residuals=True)
        lh, rh = ref.run(toks, return_residuals=True)
        torch.testing.assert_close(lg, lh, rtol=0, atol=1e-12)
        for a, b in zip(rg, rh, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
        torch.testing.assert_close(gen.unembed(rg[-1]), ref.unembed(rh[-1]), rtol=0, atol=1e-12)
        hg, hr = gen.run(toks, hooks=hooks, return_residuals=True), ref.run(toks, hooks=hooks, return_residuals=True)
        torch.testing.assert_close(hg[0], hr[0], rtol=0, atol=1e-12)
        for a, b in zip(hg[1], hr[1], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # gradients flow through the trace like through plain hooks
    grads = []
    for ad in (gen, ref):
        w = v.clone().requires_grad_(True)
        ad.run(toks, hooks={2: lambda x, k, w=w: x + w})[..., 0].sum().backward()
        grads.append(w.grad)
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", OTHERS)
def test_residuals_and_logits_are_the_models_own(kind):
    model = make(kind)
    ad = GenericHFAdapter(model)
    assert (ad.layers_path, ad.norm_path) == PATHS[kind]
    assert (ad.n_layers, ad.d_model, ad.n_heads, ad.vocab_size, ad.max_seq_len, ad.bos_id) == (L, D, H, V, 32, 1)
    toks = tokens()
    with torch.no_grad():
        logits, res = ad.run(toks, return_residuals=True)
        out = model(input_ids=toks, output_hidden_states=True, use_cache=False)
        assert len(res) == L + 1 == len(out.hidden_states) and res[0].shape == (3, T, D)
        torch.testing.assert_close(logits, out.logits, rtol=0, atol=0)
        for k in range(L):
            torch.testing.assert_close(res[k], out.hidden_states[k], rtol=0, atol=0)
        torch.testing.assert_close(ad.final_norm(res[L]), out.hidden_states[L], rtol=0, atol=0)
        torch.testing.assert_close(ad.unembed(res[L]), logits, rtol=0, atol=1e-12)
        assert not logits.requires_grad


def _forward_with_pre_hook(model, kind, k, fn, toks):
    """transformers' own forward with a torch forward pre-hook replacing the input of block k+1 (k < L) or
    of the final norm (k = L) by ``fn(x)``."""
    layers, norm = PATHS[kind]
    mod = model.get_submodule(layers)[k] if k < L else model.get_submodule(norm)

    def pre(module, args, kwargs):
        if args:
            return (fn(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": fn(kwargs["hidden_states"])}

    h = mod.register_forward_pre_hook(pre, with_kwargs=True)
    try:
        return model(input_ids=toks, use_cache=False).logits
    finally:
        h.remove()


@pytest.mark.parametrize("kind", OTHERS)
def test_replacing_hooks_equal_the_same_intervention_in_transformers(kind):
    model = make(kind)
    ad = GenericHFAdapter(model)
    toks = tokens(seed=2)
    v = torch.randn(D, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * 2
    with torch.no_grad():
        clean = ad.run(toks)
        for k in range(L + 1):
            torch.testing.assert_close(ad.run(toks, hooks={k: lambda x, _k: x}), clean, rtol=0, atol=0)
            got, res = ad.run(toks, hooks={f"resid.{k}": lambda x, _k: x + v}, return_residuals=True)
            want = _forward_with_pre_hook(model, kind, k, lambda x: x + v, toks)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            assert (got - clean).abs().max() > 1e-3  # the intervention changes the logits
            torch.testing.assert_close(ad.unembed(res[L]), got, rtol=0, atol=1e-12)
        # zeroing the last site: logits are the unembedding of zeros, whatever the tokens
        zero = ad.run(toks, hooks={L: lambda x, _k: torch.zeros_like(x)})
        lm_head = model.get_output_embeddings()
        norm = model.get_submodule(PATHS[kind][1])
        want = lm_head(norm(torch.zeros(3, T, D, dtype=torch.float64)))
        # the model's own logits dtype (GPT-J in transformers 4.x casts them to float32)
        torch.testing.assert_close(zero, want.to(zero.dtype), rtol=0, atol=1e-12)


def test_logits_cast_by_the_model_are_cast_by_unembed_too():
    """A model that returns float32 logits from float64 weights (GPT-J in transformers 4.x): unembed
    follows the dtype of the model's own logits."""
    model = make("qwen2")

    def cast(module, args, kwargs, out):
        out.logits = out.logits.float()
        return out

    model.register_forward_hook(cast, with_kwargs=True)
    ad = GenericHFAdapter(model)
    assert ad.logits_dtype == torch.float32
    with torch.no_grad():
        logits, res = ad.run(tokens(), return_residuals=True)
        assert logits.dtype == ad.unembed(res[L]).dtype == torch.float32
        torch.testing.assert_close(ad.unembed(res[L]), logits, rtol=0, atol=1e-6)
    assert GenericHFAdapter(make("qwen2")).logits_dtype is None


def test_errors_and_unsupported_methods():
    ad = GenericHFAdapter(make("qwen2"))
    toks = tokens()
    with pytest.raises(ConfigError, match="expected shape"):
        ad.run(toks, hooks={1: lambda x, k: x[:, :2]})
    with pytest.raises(ConfigError, match="out of range"):
        ad.run(toks, hooks={L + 1: lambda x, k: x})
    with pytest.raises(InputError, match="outside the vocabulary"):
        ad.run(toks + V)
    with pytest.raises(ConfigError, match="exceeds"):
        ad.run(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ConfigError, match="hand-written family"):
        ad.single_token_states(torch.arange(3))
    with pytest.raises(ConfigError, match="hand-written family"):
        ad.qk_weights(0)
    assert not ad.supports_cached_ablation and not ad.supports_run_from and not ad.supports_decode
    ad.run(toks)  # the adapter still works after the failed traces


def test_a_model_whose_logits_are_not_the_unembedding_is_refused():
    model = make("qwen2")
    model.config.final_logit_softcapping = 0.5  # unembed would cap, Qwen2's forward does not
    with pytest.raises(CompatibilityError, match="hand-written adapter"):
        GenericHFAdapter(model)


# --------------------------------------------------------------------------------------------------
# loading and backends
# --------------------------------------------------------------------------------------------------


def test_load_adapter_backends(tmp_path, monkeypatch):
    make("qwen2").float().save_pretrained(tmp_path / "qwen2")
    make("llama").float().save_pretrained(tmp_path / "llama")
    assert type(load_adapter(tmp_path / "qwen2")) is GenericHFAdapter
    assert type(load_adapter(tmp_path / "llama")) is HFAdapter
    gen = load_adapter(tmp_path / "llama", backend="generic", dtype="float64")
    ref = load_adapter(tmp_path / "llama", backend="hf", dtype="float64")
    assert type(gen) is GenericHFAdapter and type(ref) is HFAdapter
    torch.testing.assert_close(gen.logits(tokens()), ref.logits(tokens()), rtol=0, atol=1e-12)
    with pytest.raises(CompatibilityError, match="'qwen2' is not supported"):
        load_adapter(tmp_path / "qwen2", backend="hf")
    with pytest.raises(ConfigError, match="unknown backend"):
        load_adapter(tmp_path / "qwen2", backend="nnsight")
    monkeypatch.setitem(sys.modules, "nnsight", None)  # nnsight not installed
    with pytest.raises(ConfigError, match="pip install nnsight"):
        load_adapter(tmp_path / "llama", backend="generic")
    with pytest.raises(CompatibilityError, match="pip install nnsight"):
        load_adapter(tmp_path / "qwen2")
    assert type(load_adapter(tmp_path / "llama")) is HFAdapter  # the table needs no nnsight


# --------------------------------------------------------------------------------------------------
# Q(w) through the generic backend
# --------------------------------------------------------------------------------------------------


def _random_sae(seed, dtype="float64"):
    from originlens.sae import SAE, SAEConfig

    g = torch.Generator().manual_seed(seed)
    sae = SAE(SAEConfig(d_in=D, d_sae=12, hook_name="blocks.0.hook_resid_post", dtype=dtype))
    with torch.no_grad():
        for p in (sae.W_enc, sae.W_dec, sae.b_enc, sae.b_dec):
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return sae.requires_grad_(False)


def test_qscore_generic_hooks_method_equals_the_hand_written_cached_one():
    from originlens.lm.qscore_ablation import ablation_kl
    from originlens.lm.qscore_config import QScoreConfig
    from originlens.lm.qscore_contexts import find_top_contexts
    from originlens.sae.activations import as_sequences

    model = make("llama")
    gen, ref = GenericHFAdapter(model), HFAdapter(model)
    sae = _random_sae(3)
    toks = torch.randint(0, V, (10, 7), generator=torch.Generator().manual_seed(4)).numpy()
    cfg = QScoreConfig(n_contexts=3, max_offset=3, dedup_distance=-1, min_total_kl=0.0, prepend_bos=True)
    seqs = as_sequences(toks, gen, prepend_bos=True)
    ex = find_top_contexts(gen, sae, 1, seqs, list(range(12)), cfg)
    assert len(ex) > 0
    kl_g, a_g = ablation_kl(gen, sae, 1, seqs, ex, cfg)  # no cached path: the hooks method
    kl_c, a_c = ablation_kl(ref, sae, 1, seqs, ex, cfg, method="cached")
    np.testing.assert_allclose(kl_g, kl_c, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(a_g, a_c, rtol=0, atol=1e-12)
    assert kl_g.max() > 0


def test_lm_qscore_command_on_a_qwen2_directory(tmp_path):
    from originlens.cli.main import main
    from originlens.sae.format import write_sae

    sae = _random_sae(7, dtype="float32")
    sae.cfg.hook_name = "blocks.1.hook_resid_post"
    write_sae(sae, tmp_path / "sae")
    make("qwen2").float().save_pretrained(tmp_path / "qwen2")
    np.save(tmp_path / "tokens.npy", torch.randint(3, V, (24, 12), generator=torch.Generator().manual_seed(2)).numpy())
    out = tmp_path / "q"
    assert main(["lm", "qscore", "--model", str(tmp_path / "qwen2"), "--sae", str(tmp_path / "sae"), "-q",
                 "--backend", "generic", "--corpus", str(tmp_path / "tokens.npy"), "--max-features", "4",
                 "--max-offset", "3", "--min-total-kl", "0", "--out", str(out)]) == 0  # fmt: skip
    q = json.loads((out / "results.json").read_text())
    feats = [f for a in q["ablations"].values() for f in a["features"]]
    assert feats and all(np.isfinite(f["q"]) for f in feats if f["kept"])
    assert any(f["kept"] for f in feats)
    assert all(a["site"] == "resid.2" for a in q["ablations"].values())
