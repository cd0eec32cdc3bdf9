"""Steering (coefficient applied once, seeded sampling) and look-ahead maps (SVD alignment, correlation)."""

import math

import numpy as np
import pytest
import torch

from originlens.errors import CompatibilityError, InputError
from originlens.lm.llama2c import generate_tokens
from originlens.lm.native import GPTAdapter, Llama2cAdapter
from originlens.lm.steering import (
    LookaheadConfig,
    completion_stats,
    generate_steered,
    lookahead,
    steer,
    steering_hook,
    subspace_alignment,
    train_lookahead_map,
)
from originlens.models.gpt import GPT, GPTConfig
from originlens.sae import SAE, SAEConfig


def _gpt(dtype="float64"):
    torch.manual_seed(0)
    return GPTAdapter(GPT(GPTConfig(vocab_size=11, seq_len=16, n_layer=2, d_model=16, n_head=4, dtype=dtype)), bos_id=0)


def _sae(d=16, m=6, hook="blocks.0.hook_resid_post", dtype="float64", seed=0):
    g = torch.Generator().manual_seed(seed)
    sae = SAE(SAEConfig(d_in=d, d_sae=m, hook_name=hook, dtype=dtype)).requires_grad_(False)
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(d, m, generator=g, dtype=torch.float64))
        sae.W_dec.copy_(torch.randn(m, d, generator=g, dtype=torch.float64))
    return sae


def test_steering_adds_the_direction_exactly_once():
    ad, sae = _gpt(), _sae()
    toks = torch.tensor([[0, 3, 5, 7, 2]])
    seen = []
    hook = steering_hook(sae.W_dec[2], 7.0)
    ad.run(toks, hooks={1: [hook, lambda x, k: seen.append(x.clone())]})
    clean = ad.residuals(toks)[1]
    torch.testing.assert_close(seen[0] - clean, (7.0 * sae.W_dec[2]).expand_as(clean), rtol=0, atol=1e-12)


def _manual_sampling(ad, k, direction, c, prompt, n, steps, temperature, seed):
    """Reference: re-run the prefix each step, add c·direction once at resid.k, sample with a seeded generator."""
    g = torch.Generator().manual_seed(seed)
    toks = torch.tensor([prompt] * n)
    out = []
    for _ in range(steps):

        def add(x, _k):
            return x + c * direction

        logits = ad.run(toks, hooks={k: add})[:, -1].double()
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)[:, 0]
        out.append(nxt)
        toks = torch.cat([toks, nxt[:, None]], 1)
    return torch.stack(out, 1)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generation_matches_manual_loop(temperature):
    ad, sae = _gpt(), _sae()
    with torch.no_grad():
        got = generate_steered(
            ad, 1, sae.W_dec[4], 3.0, [0, 5], n_samples=5, max_new_tokens=6, temperature=temperature, seed=42
        )
        want = _manual_sampling(ad, 1, sae.W_dec[4], 3.0, [0, 5], 5, 6, temperature, 42)
    assert torch.equal(got, want)
    # same seed, same samples; c = 0 is the unsteered model
    again = generate_steered(
        ad, 1, sae.W_dec[4], 3.0, [0, 5], n_samples=5, max_new_tokens=6, temperature=temperature, seed=42
    )
    assert torch.equal(got, again)
    plain = generate_steered(
        ad, 1, sae.W_dec[4], 0.0, [0, 5], n_samples=5, max_new_tokens=6, temperature=temperature, seed=42
    )
    assert torch.equal(plain, _manual_sampling(ad, 1, sae.W_dec[4], 0.0, [0, 5], 5, 6, temperature, 42))


def test_steer_runs_baseline_and_all_conditions():
    ad, sae = _gpt(), _sae()

    class Tok:
        def decode(self, ids):
            return "".join("abc.,!0123x"[i] for i in ids)

    res = steer(ad, sae, [1, 3], [1.0, 100.0], tokenizer=Tok(), n_samples=4, max_new_tokens=5, seed=1)
    assert [(s.feature, s.coefficient) for s in res] == [(-1, 0.0), (1, 1.0), (1, 100.0), (3, 1.0), (3, 100.0)]
    assert all(len(s.ids) == 4 and len(s.ids[0]) == 5 and len(s.texts) == 4 for s in res)
    assert "promoted" in res[1].stats and "promoted" not in res[0].stats
    with pytest.raises(CompatibilityError):
        steer(ad, _sae(hook="blocks.0.hook_attn_out"), [0])
    ad.bos_id = None
    with pytest.raises(InputError, match="BOS"):
        steer(ad, sae, [0])


def test_completion_stats_against_counts():
    class Tok:
        table = {0: "the", 1: ".", 2: " ", 3: "x2", 4: "{"}  # noqa: RUF012 (read-only)

        def decode(self, ids):
            return "".join(self.table[i] for i in ids)

    ids = [[0, 1, 1, 3], [4, 2, 0, 0]]
    base = [[0, 0, 0, 0], [0, 0, 0, 3]]
    s = completion_stats(ids, Tok(), base, top=2)
    assert s["n_tokens"] == 8 and s["distinct_frac"] == 5 / 8
    assert s["punct_frac"] == 4 / 8  # ".", ".", "{", " "
    assert s["digit_frac"] == 1 / 8
    # lift = ((c+1)/(n+1)) / ((b+1)/(nb+1)): "." (2 vs 0) = 3, "{" and " " (1 vs 0) = 2, "x2" (1 vs 1) = 1
    assert [p["id"] for p in s["promoted"]] == [1, 2] and math.isclose(s["promoted"][0]["lift"], 3.0)


def test_subspace_alignment_matches_projection():
    rng = np.random.default_rng(0)
    d, F = 7, 5
    A = rng.normal(size=(d, d))
    E = rng.normal(size=(d, F))
    _, _, Vh = np.linalg.svd(A)
    got = subspace_alignment(torch.from_numpy(E), torch.from_numpy(Vh)).numpy()
    for r in range(1, d + 1):
        P = Vh[:r].T @ Vh[:r]
        for f in range(F):
            e = E[:, f]
            pe = P @ e
            cos = e @ pe / (np.linalg.norm(e) * np.linalg.norm(pe))
            assert math.isclose(got[f, r - 1], cos, rel_tol=1e-10)
    np.testing.assert_allclose(got[:, -1], 1.0)


@pytest.mark.slow
def test_lookahead_map_training_and_correlation():
    ad = _gpt(dtype="float32")
    sae = _sae(dtype="float32", m=8)
    toks = np.random.default_rng(0).integers(1, 11, size=(40, 15))
    toks[:, 1::2] = (toks[:, 0::2][:, :7] + 3) % 10 + 1  # token t+1 is a function of token t
    # lr = 0: the map stays the identity
    from originlens.lm.steering import lookahead_data
    from originlens.sae.activations import as_sequences

    X, Y = lookahead_data(ad, as_sequences(toks, ad), 1, 2)
    assert X.shape[0] == Y.shape[0] == 40 * (16 - 2 - 1)
    m0 = train_lookahead_map(ad, X, Y[:, 0], 1, LookaheadConfig(lr=1e-12, epochs=1, batch_size=64))
    torch.testing.assert_close(m0.weight, torch.eye(16, dtype=torch.float64), rtol=0, atol=1e-6)
    assert math.isclose(m0.val_loss, m0.val_loss_identity, rel_tol=1e-4)
    assert all(p.grad is None for p in ad.parameters())  # the model itself is not trained
    q = {f: float(v) for f, v in enumerate([0.1, 5.0, 0.3, 2.0, 0.01, 1.0, 9.0, 0.5])}
    res = lookahead(ad, sae, toks, LookaheadConfig(max_offset=2, lr=3e-2, epochs=3, batch_size=32), q=q)
    assert [m.offset for m in res.maps] == [1, 2]
    assert res.maps[0].val_loss < res.maps[0].val_loss_identity  # the map learns something
    assert res.alignment[1].shape == (8, 16)
    from scipy.stats import spearmanr

    qa = np.array([q[f] for f in range(8)])
    r = 4
    want = spearmanr(res.alignment[2][:, r - 1], qa)
    got = res.correlation[2][r - 1]
    assert got["rank"] == r and math.isclose(got["rho"], want[0], rel_tol=1e-12)
    js = res.to_json()
    assert set(js["correlation_with_q"]) == {"1", "2"}


@pytest.mark.slow
def test_stories260k_unsteered_greedy_matches_reference_generation():
    from originlens.lm.llama2c import load_llama2c
    from originlens.lm.llama2c_tokenizer import Llama2cTokenizer
    from originlens.paths import data_path

    d = data_path("models", "stories260K", required=False)
    if not (d / "stories260K.bin").exists():
        pytest.skip("shared data not available")
    m = load_llama2c(d / "stories260K.bin")
    tok = Llama2cTokenizer.from_file(d / "tok512.bin", m.cfg.vocab_size)
    ad = Llama2cAdapter(m)
    ref = generate_tokens(m, [1], 24, greedy=True)[1:]
    sae = _sae(d=64, m=4, hook="blocks.2.hook_resid_post", dtype="float32", seed=3)
    res = steer(ad, sae, [0], [0.0, 30.0], tokenizer=tok, n_samples=2, max_new_tokens=len(ref), temperature=0.0)
    base, zero, strong = res
    assert base.ids[0] == ref and zero.ids[0] == ref
    assert strong.ids[0] != ref and base.texts[0] == tok.decode([1] + ref)


def test_cli_lookahead_and_steer_errors(tmp_path, capsys):
    import json

    from originlens.cli.main import main
    from originlens.sae import write_sae

    torch.manual_seed(0)
    GPT(GPTConfig(vocab_size=13, seq_len=24, n_layer=2, d_model=16, n_head=4)).save(tmp_path / "gpt.safetensors")
    np.save(tmp_path / "toks.npy", np.random.default_rng(0).integers(1, 13, size=(20, 16)).astype(np.uint16))
    write_sae(_sae(dtype="float32", hook="blocks.1.hook_resid_post"), tmp_path / "sae")
    model = ["--model", str(tmp_path / "gpt.safetensors"), "--sae", str(tmp_path / "sae")]
    assert (
        main(
            [
                "-q",
                "lm",
                "lookahead",
                *model,
                "--corpus",
                str(tmp_path / "toks.npy"),
                "--max-offset",
                "2",
                "--epochs",
                "1",
                "--lr",
                "1e-2",
                "--out",
                str(tmp_path / "la"),
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "la" / "results.json").read_text())
    assert [m["offset"] for m in res["maps"]] == [1, 2] and res["site"] == "resid.2"
    assert (tmp_path / "la" / "figures" / "alignment.png").is_file()
    assert main(["-q", "lm", "steer", *model, "--features", "1", "--out", str(tmp_path / "st")]) == 2
    assert "BOS" in capsys.readouterr().err  # our GPT has no BOS and no prompt was given


@pytest.mark.slow
def test_cli_steer_stories260k(tmp_path):
    import json

    from originlens.cli.main import main
    from originlens.paths import data_path
    from originlens.sae import write_sae

    d = data_path("models", "stories260K", required=False)
    if not (d / "stories260K.bin").exists():
        pytest.skip("shared data not available")
    write_sae(_sae(d=64, m=4, hook="blocks.3.hook_resid_post", dtype="float32"), tmp_path / "sae")
    assert (
        main(
            [
                "-q",
                "lm",
                "steer",
                "--model",
                str(d / "stories260K.bin"),
                "--tokenizer",
                str(d / "tok512.bin"),
                "--sae",
                str(tmp_path / "sae"),
                "--features",
                "0,2",
                "--coefficients",
                "1,100",
                "--samples",
                "3",
                "--max-new-tokens",
                "6",
                "--prompt",
                "Once upon",
                "--out",
                str(tmp_path / "st"),
            ]
        )
        == 0
    )
    res = json.loads((tmp_path / "st" / "results.json").read_text())
    assert len(res["samples"]) == 5 and all(t.startswith("Once upon") for t in res["samples"][0]["texts"])
    assert (tmp_path / "st" / "figures" / "steering-stats.png").is_file()
