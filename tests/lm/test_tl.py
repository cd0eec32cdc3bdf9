"""TLAdapter against a fake HookedTransformer written here over one of our GPTs.

The fake re-implements the forward pass from the GPT's weights with TransformerLens' hook points and
weight layout (``W_Q`` ``(L, H, d, dh)``, ``W_U`` ``(d, V)``), so a wrong site mapping, transpose or
cache key in the adapter makes it disagree with :class:`GPTAdapter` on the same weights.
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from originlens.errors import CompatibilityError, ConfigError
from originlens.lm.native import GPTAdapter
from originlens.lm.tl import TLAdapter
from originlens.models.gpt import GPT, GPTConfig

V, D, H, L, T = 11, 16, 4, 3, 7


class FakeHookedTransformer(nn.Module):
    """The subset of TransformerLens' HookedTransformer API that TLAdapter uses."""

    def __init__(self, gpt: GPT, kv_heads: int | None = None) -> None:
        super().__init__()
        self.gpt = gpt
        self.cfg = SimpleNamespace(
            n_layers=L, d_model=D, n_heads=H, d_vocab=V, n_ctx=gpt.config.n_positions, d_head=D // H
        )
        self.kv_heads = kv_heads
        self.ln_final = gpt.head[0].ln_f
        self.calls: list[str] = []

    # weights in TransformerLens layout
    def _qkv(self, l: int, i: int) -> torch.Tensor:
        w = self.gpt.blocks[l].copies[0].attn_qkv.weight[i * D : (i + 1) * D]  # (H*dh, d)
        return w.view(H, D // H, D).transpose(1, 2)  # (H, d, dh)

    @property
    def W_Q(self) -> torch.Tensor:
        return torch.stack([self._qkv(l, 0) for l in range(L)])

    @property
    def W_K(self) -> torch.Tensor:
        wk = torch.stack([self._qkv(l, 1) for l in range(L)])
        return wk if self.kv_heads is None else wk[:, :: H // self.kv_heads]  # grouped-query fake

    @property
    def W_U(self) -> torch.Tensor:
        return self.gpt.embed[0].wte.weight.T

    @property
    def b_U(self) -> torch.Tensor:
        return torch.zeros(V, dtype=self.W_U.dtype)

    def _forward(self, tokens, hooks, cache, names_filter):
        def point(name, x):
            self.calls.append(name)
            for hname, fn in hooks:
                if hname == name:
                    r = fn(x, hook=SimpleNamespace(name=name))
                    x = x if r is None else r
            if cache is not None and names_filter(name):
                cache[name] = x.detach()
            return x

        Tn = tokens.shape[1]
        emb = self.gpt.embed[0]
        x = emb.wte.weight[tokens] + emb.wpe.weight[:Tn]
        mask = torch.ones(Tn, Tn, dtype=torch.bool).tril()
        for l in range(L):
            c = self.gpt.blocks[l].copies[0]
            x = point(f"blocks.{l}.hook_resid_pre", x)
            h = F.layer_norm(x, (D,), c.ln_1.weight, c.ln_1.bias, 1e-5)
            qkv = h @ c.attn_qkv.weight.T + c.attn_qkv.bias
            q, k, v = (t.reshape(*t.shape[:2], H, D // H).transpose(1, 2) for t in qkv.split(D, -1))
            s = (q @ k.transpose(-1, -2) / math.sqrt(D // H)).masked_fill(~mask, float("-inf"))
            z = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(*x.shape)
            x = x + point(f"blocks.{l}.hook_attn_out", z @ c.attn_out.weight.T + c.attn_out.bias)
            h2 = F.layer_norm(x, (D,), c.ln_2.weight, c.ln_2.bias, 1e-5)
            mlp = F.gelu(h2 @ c.mlp_in.weight.T + c.mlp_in.bias, approximate="tanh") @ c.mlp_out.weight.T
            x = point(f"blocks.{l}.hook_resid_post", x + mlp + c.mlp_out.bias)
        return self.ln_final(x) @ self.W_U + self.b_U

    def run_with_hooks(self, tokens, fwd_hooks=(), return_type="logits"):
        return self._forward(tokens, list(fwd_hooks), None, None)

    def run_with_cache(self, tokens, names_filter=None):
        cache: dict[str, torch.Tensor] = {}
        logits = self._forward(tokens, [], cache, names_filter or (lambda n: True))
        return logits, cache


def _pair(kv_heads=None):
    torch.manual_seed(0)
    g = GPT(GPTConfig(vocab_size=V, seq_len=8, n_layer=L, d_model=D, n_head=H, dtype="float64"))
    with torch.no_grad():
        for p in g.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return GPTAdapter(g), TLAdapter(FakeHookedTransformer(g, kv_heads))


def test_transformer_lens_not_imported():
    # in a fresh interpreter: other tests of the same worker (SAELens) may import transformer_lens
    import subprocess

    code = (
        "import sys, originlens, originlens.lm.tl, originlens.lm.native; "
        "assert 'transformer_lens' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with pytest.raises(CompatibilityError, match="HookedTransformer"):
        TLAdapter(object())


def test_real_hooked_transformer():
    """TLAdapter on a real (random, float64) TransformerLens HookedTransformer when the extra is installed:
    logits, residual sites, hooks, single-token states and Q/K weights against TransformerLens' own
    forward, cache and weights, computed independently here."""
    tl = pytest.importorskip("transformer_lens", reason="TransformerLens not installed (extra [interop])")
    # TransformerLens 4 raises ImportError (not AttributeError) for its removed names: hasattr would raise
    if "HookedTransformer" not in dir(tl):
        pytest.skip("this TransformerLens has no HookedTransformer (4.x: see the TransformerBridge test)")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cfg = tl.HookedTransformerConfig(
            n_layers=2,
            d_model=16,
            n_ctx=8,
            d_head=4,
            n_heads=4,
            d_vocab=11,
            act_fn="gelu",
            normalization_type="LN",
            seed=0,
            dtype=torch.float64,
        )
        m = tl.HookedTransformer(cfg).eval()
    ad = TLAdapter(m)
    x = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref_logits, cache = m.run_with_cache(x)
        logits, res = ad.run(x, return_residuals=True)
        torch.testing.assert_close(logits, ref_logits, rtol=1e-12, atol=1e-12)
        assert len(res) == 3
        for k in range(2):
            torch.testing.assert_close(res[k], cache[f"blocks.{k}.hook_resid_pre"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(res[2], cache["blocks.1.hook_resid_post"], rtol=1e-12, atol=1e-12)

        # an intervention at site 1: zero position 3 of the stream entering block 1
        def zero3(t, _k):
            t = t.clone()
            t[:, 3] = 0
            return t

        hooked = ad.run(x, hooks={1: zero3})

        def tl_hook(t, hook):
            t = t.clone()
            t[:, 3] = 0
            return t

        ref_hooked = m.run_with_hooks(x, fwd_hooks=[("blocks.1.hook_resid_pre", tl_hook)])
        torch.testing.assert_close(hooked, ref_hooked, rtol=1e-12, atol=1e-12)
        assert (hooked[:, :3] - logits[:, :3]).abs().max() < 1e-12  # causal: earlier positions unchanged
        assert (hooked[:, 3:] - logits[:, 3:]).abs().max() > 1e-6
        # each token alone
        ids = torch.tensor([0, 5, 10])
        st = ad.single_token_states(ids)
        _, c1 = m.run_with_cache(ids[:, None])
        for l in range(2):
            torch.testing.assert_close(st.pre[l], c1[f"blocks.{l}.hook_resid_pre"][:, 0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(
                st.attn[l],
                c1[f"blocks.{l}.hook_resid_pre"][:, 0] + c1[f"blocks.{l}.hook_attn_out"][:, 0],
                rtol=1e-12,
                atol=1e-12,
            )
            torch.testing.assert_close(st.post[l], c1[f"blocks.{l}.hook_resid_post"][:, 0], rtol=1e-12, atol=1e-12)
            wq, wk = ad.qk_weights(l)  # (H, dh, d): q_h = W_Q[h] x
            torch.testing.assert_close(wq, m.W_Q[l].transpose(1, 2))
            torch.testing.assert_close(wk, m.W_K[l].transpose(1, 2))


def test_run_residuals_and_hooks_match_gpt_adapter():
    ref, tl = _pair()
    assert (tl.n_layers, tl.d_model, tl.n_heads, tl.vocab_size, tl.max_seq_len) == (L, D, H, V, 8)
    toks = torch.randint(0, V, (2, T), generator=torch.Generator().manual_seed(1))
    a, ra = ref.run(toks, return_residuals=True)
    b, rb = tl.run(toks, return_residuals=True)
    torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
    assert len(rb) == L + 1
    for x, y in zip(ra, rb):
        torch.testing.assert_close(y, x, rtol=0, atol=1e-10)
    torch.testing.assert_close(tl.unembed(rb[-1]), a, rtol=0, atol=1e-10)
    for k in range(L + 1):
        hook = {k: lambda h, site: h * 0.3 - 0.2}
        torch.testing.assert_close(tl.run(toks, hooks=hook), ref.run(toks, hooks=hook), rtol=0, atol=1e-10)
    # each site is hooked once, at the point the next stage consumes
    seen = []
    tl.run(toks, hooks={L: lambda h, s: seen.append(s), "blocks.0.hook_resid_post": lambda h, s: seen.append(s)})
    assert seen == [1, L]
    with pytest.raises(ConfigError):
        tl.run(toks, hooks={1: lambda h, s: h[:, :2]})
    with pytest.raises(ConfigError):
        tl.run(torch.zeros(1, 9, dtype=torch.long))


def test_single_token_states_and_qk_match_gpt_adapter():
    ref, tl = _pair()
    ids = torch.arange(V)
    sa, sb = ref.single_token_states(ids), tl.single_token_states(ids)
    for f in ("pre", "attn", "post"):
        torch.testing.assert_close(getattr(sb, f), getattr(sa, f), rtol=0, atol=1e-10)
    for l in range(L):
        for x, y in zip(ref.qk_weights(l), tl.qk_weights(l)):
            torch.testing.assert_close(y, x, rtol=0, atol=0)
    with pytest.raises(ConfigError):
        tl.qk_weights(L)


def test_grouped_query_keys_are_repeated():
    ref, tl = _pair(kv_heads=2)
    wq, wk = tl.qk_weights(0)
    assert wk.shape == wq.shape == (H, D // H, D)
    full = ref.qk_weights(0)[1]
    for h in range(H):  # query head h reads key head h // 2 = full head 2 * (h // 2)
        torch.testing.assert_close(wk[h], full[2 * (h // 2)], rtol=0, atol=0)


def _tiny_hf_gpt2_and_tokenizer(tmp_path):
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(V)}, unk_token="t0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="t0", eos_token="t0", unk_token="t0")
    fast.save_pretrained(tmp_path / "tok")  # the bridge re-reads its tokenizer from name_or_path
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    cfg = transformers.GPT2Config(
        vocab_size=V, n_embd=D, n_layer=2, n_head=H, n_positions=8, bos_token_id=0, eos_token_id=0
    )
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model, tok


def test_real_transformer_bridge(tmp_path):
    """TLAdapter on a TransformerLens TransformerBridge (TransformerLens 4; ``model_bridge`` in 3) over a
    random float64 GPT-2: the bridge runs the Hugging Face weights unprocessed, so logits, residuals,
    hooks, single-token states and Q/K weights equal HFAdapter's on the same model."""
    pytest.importorskip("transformer_lens", reason="TransformerLens not installed (extra [interop])")
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        pytest.skip("this TransformerLens has no TransformerBridge")
    import warnings

    from originlens.lm.hf import HFAdapter

    model, tok = _tiny_hf_gpt2_and_tokenizer(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bridge = TransformerBridge.boot_transformers("gpt2", hf_model=model, tokenizer=tok)
    ad, ref = TLAdapter(bridge), HFAdapter(model)
    assert (ad.n_layers, ad.d_model, ad.n_heads, ad.vocab_size, ad.max_seq_len, ad.bos_id) == (2, D, H, V, 8, 0)
    x = torch.randint(0, V, (3, 8), generator=torch.Generator().manual_seed(1))
    v = torch.randn(D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        logits, res = ad.run(x, return_residuals=True)
        want, want_res = ref.run(x, return_residuals=True)
        torch.testing.assert_close(logits, want, rtol=0, atol=1e-10)
        for a, b in zip(res, want_res, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
        torch.testing.assert_close(ad.unembed(res[-1]), want, rtol=0, atol=1e-10)
        for k in range(3):
            hook = {k: lambda h, _k: h * 0.5 + v}
            torch.testing.assert_close(ad.run(x, hooks=hook), ref.run(x, hooks=hook), rtol=0, atol=1e-10)
        ids = torch.tensor([0, 5, 10])
        st, st_ref = ad.single_token_states(ids), ref.single_token_states(ids)
        for f in ("pre", "attn", "post"):
            torch.testing.assert_close(getattr(st, f), getattr(st_ref, f), rtol=0, atol=1e-10)
    for layer in range(2):
        for a, b in zip(ad.qk_weights(layer), ref.qk_weights(layer), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_required_attributes_are_found_without_evaluating_them():
    """The API check reads no property: a model whose weight properties raise (as a TransformerBridge
    property can, or TransformerLens 4's removed names do) is still accepted, and one lacking them is
    refused with the names."""

    class Raising(FakeHookedTransformer):
        @property
        def W_Q(self):
            raise ImportError("computed on access")

    ref, _ = _pair()
    ad = TLAdapter(Raising(ref.module))
    assert ad.n_layers == L

    class Partial(nn.Module):
        cfg = SimpleNamespace(n_layers=1)

        def __init__(self):
            super().__init__()
            self.ln_final = nn.LayerNorm(4)

    with pytest.raises(CompatibilityError, match="run_with_hooks.*W_Q"):
        TLAdapter(Partial())
