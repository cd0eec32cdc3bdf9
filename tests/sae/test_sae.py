"""SAEs: definitions against brute force, SAELens' on-disk conventions, training on planted data."""

import json

import numpy as np
import pytest
import torch

from originlens.errors import CompatibilityError, ConfigError, InputError
from originlens.lm.native import GPTAdapter
from originlens.models.gpt import GPT, GPTConfig
from originlens.sae import (
    SAE,
    SAEConfig,
    SAETrainConfig,
    config_from_dict,
    read_sae,
    sae_site,
    train_sae_on_activations,
    train_sae_run,
    write_sae,
)


def _random_sae(arch, d=6, m=10, dtype="float32", seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    cfg = SAEConfig(
        d_in=d,
        d_sae=m,
        architecture=arch,
        k=3 if arch == "topk" else None,
        hook_name="blocks.1.hook_resid_post",
        model_name="toy",
        dtype=dtype,
        **kw,
    )
    sae = SAE(cfg)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))
        if sae.threshold is not None:
            sae.threshold.abs_().mul_(0.3)
    return sae.requires_grad_(False)


def _np(t):
    return t.detach().double().numpy()


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk"])
def test_encode_decode_match_definitions(arch):
    sae = _random_sae(arch, dtype="float64")
    x = torch.randn(7, 6, dtype=torch.float64)
    W_enc, b_enc, W_dec, b_dec = (_np(getattr(sae, n)) for n in ("W_enc", "b_enc", "W_dec", "b_dec"))
    xn = x.numpy()
    pre = (xn - b_dec) @ W_enc + b_enc  # apply_b_dec_to_input = True (SAELens default)
    if arch == "standard":
        a = np.maximum(pre, 0)
    elif arch == "jumprelu":
        a = np.where(pre > _np(sae.threshold), np.maximum(pre, 0), 0.0)
    else:
        a = np.zeros_like(pre)
        for i in range(pre.shape[0]):
            top = np.argsort(-pre[i])[:3]
            a[i, top] = np.maximum(pre[i, top], 0)
    np.testing.assert_allclose(sae.encode(x).numpy(), a, atol=1e-12)
    np.testing.assert_allclose(sae(x).numpy(), a @ W_dec + b_dec, atol=1e-12)
    feats = torch.tensor([0, 3, 9])
    np.testing.assert_allclose(sae.encode_subset(x, feats).numpy(), a[:, [0, 3, 9]], atol=1e-12)


@pytest.mark.parametrize("mode", ["constant_norm_rescale", "layer_norm"])
def test_normalisation_and_feature_contribution(mode):
    sae = _random_sae("standard", dtype="float64", normalize_activations=mode)
    x = torch.randn(5, 6, dtype=torch.float64) * 3 + 1
    xn = x.numpy()
    if mode == "constant_norm_rescale":
        c = np.sqrt(6) / np.linalg.norm(xn, axis=1, keepdims=True)
        z, back = xn * c, (lambda y: y / c)
    else:
        mu, sd = xn.mean(1, keepdims=True), xn.std(1, ddof=1, keepdims=True)
        z, back = (xn - mu) / (sd + 1e-5), (lambda y: y * sd + mu)
    a = np.maximum((z - _np(sae.b_dec)) @ _np(sae.W_enc) + _np(sae.b_enc), 0)
    np.testing.assert_allclose(sae(x).numpy(), back(a @ _np(sae.W_dec) + _np(sae.b_dec)), atol=1e-10)
    # the decoder contribution in model space equals the change of the reconstruction when a_f is zeroed
    acts, st = sae.encode_with_state(x)
    f = torch.tensor([1, 2, 3, 4, 5])
    a_f = acts[torch.arange(5), f]
    zeroed = acts.clone()
    zeroed[torch.arange(5), f] = 0
    diff = sae.decode(acts, st) - sae.decode(zeroed, st)
    torch.testing.assert_close(sae.feature_contribution(a_f, f, st), diff, rtol=0, atol=1e-10)


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk"])
def test_folds_leave_the_reconstruction_unchanged(arch):
    sae = _random_sae(arch, dtype="float64")
    if arch == "topk":  # topk folds are exact for a common norm only
        with torch.no_grad():
            sae.W_dec.mul_(2.5 / sae.W_dec.norm(dim=-1, keepdim=True))
    x = torch.randn(9, 6, dtype=torch.float64)
    ref = sae(2.0 * x) / 2.0
    sae.fold_input_scale(2.0)
    torch.testing.assert_close(sae(x), ref, rtol=0, atol=1e-10)
    sae.fold_decoder_norm()
    torch.testing.assert_close(sae(x), ref, rtol=0, atol=1e-10)
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(10, dtype=torch.float64))


@pytest.mark.parametrize("arch", ["standard", "jumprelu", "topk"])
def test_round_trip_and_raw_files_follow_saelens(arch, tmp_path):
    from safetensors import safe_open

    sae = _random_sae(arch)
    path = write_sae(sae, tmp_path / "sae")
    # raw files, read without our reader
    cfg = json.loads((path / "cfg.json").read_text())
    for key in (
        "architecture",
        "d_in",
        "d_sae",
        "dtype",
        "device",
        "model_name",
        "hook_name",
        "hook_layer",
        "apply_b_dec_to_input",
        "normalize_activations",
        "activation_fn_str",
        "activation_fn_kwargs",
        "prepend_bos",
        "context_size",
        "dataset_path",
        "finetuning_scaling_factor",
        "hook_head_index",
    ):
        assert key in cfg, key
    assert cfg["architecture"] == arch and cfg["d_in"] == 6 and cfg["d_sae"] == 10
    assert cfg["dtype"] == "float32" and cfg["hook_name"] == "blocks.1.hook_resid_post" and cfg["hook_layer"] == 1
    assert cfg["normalize_activations"] == "none" and cfg["finetuning_scaling_factor"] is False
    assert "sae_lens_version" not in cfg  # SAELens 6 then converts it as a pre-6 config
    if arch == "topk":
        assert cfg["k"] == 3 and cfg["activation_fn_kwargs"] == {"k": 3} and cfg["activation_fn_str"] == "topk"
    else:
        assert "k" not in cfg and cfg["activation_fn_str"] == "relu"
    with safe_open(str(path / "sae_weights.safetensors"), framework="numpy") as f:
        keys = set(f.keys())
        arrays = {k: f.get_tensor(k) for k in keys}
    want = {"W_enc": (6, 10), "b_enc": (10,), "W_dec": (10, 6), "b_dec": (6,)}
    if arch == "jumprelu":
        want["threshold"] = (10,)
    assert keys == set(want)
    for k, shape in want.items():
        assert arrays[k].shape == shape and arrays[k].dtype == np.float32
        np.testing.assert_array_equal(arrays[k], getattr(sae, k).detach().numpy())
    # round trip through our reader
    back = read_sae(path)
    assert back.cfg.architecture == arch and back.cfg.k == sae.cfg.k and back.cfg.hook_name == sae.cfg.hook_name
    assert back.cfg.model_name == "toy"
    for k in want:
        torch.testing.assert_close(getattr(back, k), getattr(sae, k), rtol=0, atol=0)
    x = torch.randn(4, 6)
    torch.testing.assert_close(back(x), sae(x), rtol=0, atol=0)


def test_reads_both_saelens_config_generations():
    legacy = {
        "architecture": "standard",
        "d_in": 4,
        "d_sae": 8,
        "dtype": "torch.float32",
        "hook_point": "blocks.2.hook_resid_pre",
        "activation_fn_str": "topk",
        "activation_fn_kwargs": {"k": 2},
        "normalize_activations": False,
        "model_name": "m",
        "l1_coefficient": 5,
    }
    c = config_from_dict(legacy)
    assert c.architecture == "topk" and c.k == 2 and c.hook_name == "blocks.2.hook_resid_pre"
    assert c.normalize_activations == "none" and c.dtype == "float32" and c.extra["l1_coefficient"] == 5
    for meta_key in ("metadata", "meta"):
        v6 = {
            "architecture": "jumprelu",
            "d_in": 4,
            "d_sae": 8,
            "dtype": "float32",
            "device": "cpu",
            "apply_b_dec_to_input": False,
            "normalize_activations": "none",
            "reshape_activations": "none",
            meta_key: {
                "model_name": "gemma-2-2b",
                "hook_name": "blocks.15.hook_resid_post",
                "prepend_bos": True,
                "sae_lens_version": "6.5.0",
            },
        }
        c = config_from_dict(v6)
        assert c.architecture == "jumprelu" and c.hook_name == "blocks.15.hook_resid_post"
        assert c.model_name == "gemma-2-2b" and c.apply_b_dec_to_input is False and c.hook_layer == 15
    c = config_from_dict(
        {"architecture": "topk", "d_in": 4, "d_sae": 8, "k": 3, "meta": {"hook_name": "blocks.0.hook_resid_post"}}
    )
    assert c.k == 3


def test_bad_configs_and_files_are_clear_errors(tmp_path):
    base = {"architecture": "topk", "d_in": 4, "d_sae": 8, "k": 2, "hook_name": "blocks.0.hook_resid_post"}
    for key, value in (
        ("hook_head_index", 3),
        ("reshape_activations", "hook_z"),
        ("rescale_acts_by_decoder_norm", True),
    ):
        with pytest.raises(ConfigError, match=key):
            config_from_dict({**base, key: value})
        with pytest.raises(ConfigError, match=key):  # SAELens 6 nests model-side settings under "metadata"
            config_from_dict({**base, "metadata": {key: value}})
    ok = config_from_dict({**base, "hook_head_index": None, "reshape_activations": "none"})
    assert ok.k == 2
    with pytest.raises(ConfigError, match="gated"):
        config_from_dict({"architecture": "gated", "d_in": 4, "d_sae": 8, "hook_name": "blocks.0.hook_resid_post"})
    with pytest.raises(ConfigError, match="k"):
        config_from_dict({"architecture": "topk", "d_in": 4, "d_sae": 8, "hook_name": "blocks.0.hook_resid_post"})
    with pytest.raises(InputError, match="hook_name"):
        config_from_dict({"architecture": "standard", "d_in": 4, "d_sae": 8})
    with pytest.raises(InputError, match="does not exist"):
        read_sae(tmp_path / "missing")
    path = write_sae(_random_sae("jumprelu"), tmp_path / "j")
    cfg = json.loads((path / "cfg.json").read_text())
    cfg["d_sae"] = 11
    (path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(CompatibilityError, match="shape"):
        read_sae(path)
    from safetensors.torch import save_file

    save_file(
        {"W_enc": torch.zeros(6, 10), "b_enc": torch.zeros(10), "W_dec": torch.zeros(10, 6), "b_dec": torch.zeros(6)},
        str(path / "sae_weights.safetensors"),
    )
    cfg["d_sae"] = 10
    (path / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(InputError, match="threshold"):
        read_sae(path)


def _gpt(d=16, layers=2, vocab=13, seq=12):
    torch.manual_seed(0)
    return GPTAdapter(GPT(GPTConfig(vocab_size=vocab, seq_len=seq, n_layer=layers, d_model=d, n_head=4)), bos_id=0)


def test_sae_site_checks_width_and_hook():
    ad = _gpt()
    sae = SAE(SAEConfig(d_in=16, d_sae=8, hook_name="blocks.1.hook_resid_post"))
    assert sae_site(sae, ad) == 2 and sae_site(sae, ad, "resid.2") == 2
    with pytest.raises(CompatibilityError, match="resid.1"):
        sae_site(sae, ad, "resid.1")
    with pytest.raises(CompatibilityError, match="d_in=12"):
        sae_site(SAE(SAEConfig(d_in=12, d_sae=8, hook_name="blocks.1.hook_resid_post")), ad)
    with pytest.raises(CompatibilityError, match="layers"):
        sae_site(SAE(SAEConfig(d_in=16, d_sae=8, hook_name="blocks.5.hook_resid_post")), ad)
    with pytest.raises(CompatibilityError, match="residual"):
        sae_site(SAE(SAEConfig(d_in=16, d_sae=8, hook_name="blocks.1.hook_mlp_out")), ad)


def _planted(n=6000, d=8, m=10, p=0.08, seed=0):
    g = torch.Generator().manual_seed(seed)
    D = torch.randn(m, d, generator=g)
    D /= D.norm(dim=1, keepdim=True)
    s = (torch.rand(n, m, generator=g) < p) * (0.5 + torch.rand(n, m, generator=g))
    return s @ D + 0.2 * torch.randn(d, generator=g), D


@pytest.mark.slow
@pytest.mark.parametrize("arch,kw", [("standard", {"l1_coefficient": 1.0}), ("topk", {"k": 2})])
def test_training_reduces_error_and_recovers_planted_directions(arch, kw):
    x, D = _planted()
    cfg = SAETrainConfig(architecture=arch, d_sae=16, steps=700, batch_size=128, lr=1e-2, log_every=50, **kw)
    res = train_sae_on_activations(x, cfg)
    assert res.history[-1]["fvu"] < 0.5 * res.history[0]["fvu"]
    assert res.metrics["fvu"] < 0.25
    cos = (D @ res.sae.W_dec.T).max(dim=1).values  # decoder rows are unit norm
    assert int((cos > 0.9).sum()) >= 9, cos
    torch.testing.assert_close(res.sae.W_dec.norm(dim=-1), torch.ones(16))


def test_train_on_a_model_writes_a_run_dir(tmp_path):
    ad = _gpt()
    toks = np.random.default_rng(0).integers(1, 13, size=(24, 11))
    cfg = SAETrainConfig(architecture="topk", k=2, d_sae=32, steps=30, batch_size=64, log_every=10)
    res, sae_dir = train_sae_run(ad, toks, "blocks.0.hook_resid_post", cfg, tmp_path / "run", model_name="toy-gpt")
    assert (tmp_path / "run" / "report.html").is_file() and (tmp_path / "run" / "results.json").is_file()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3
    back = read_sae(sae_dir)
    assert back.cfg.hook_name == "blocks.0.hook_resid_post" and sae_site(back, ad) == 1
    assert back.cfg.context_size == 12 and back.cfg.prepend_bos is True
    x = ad.residuals(torch.tensor([[0, 3, 4, 5]]))[1][0, 1:]
    torch.testing.assert_close(back(x), res.sae(x))


def test_loads_in_saelens_when_installed(tmp_path):
    sae_lens = pytest.importorskip("sae_lens")
    for arch in ("standard", "jumprelu", "topk"):
        ours = _random_sae(arch)
        path = write_sae(ours, tmp_path / arch)
        theirs = sae_lens.SAE.load_from_disk(str(path), device="cpu")
        x = torch.randn(3, 6)
        torch.testing.assert_close(theirs.encode(x), ours.encode(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(theirs.decode(theirs.encode(x)), ours(x), rtol=1e-5, atol=1e-5)


def test_cli_sae_train_and_info(tmp_path, capsys):
    from originlens.cli.main import main

    torch.manual_seed(0)
    GPT(GPTConfig(vocab_size=13, seq_len=24, n_layer=2, d_model=16, n_head=4)).save(tmp_path / "gpt.safetensors")
    np.save(tmp_path / "toks.npy", np.random.default_rng(0).integers(1, 13, size=(30, 20)).astype(np.uint16))
    args = [
        "-q",
        "sae",
        "train",
        "--model",
        str(tmp_path / "gpt.safetensors"),
        "--corpus",
        str(tmp_path / "toks.npy"),
        "--steps",
        "10",
        "--batch-size",
        "64",
        "--d-sae",
        "24",
        "--architecture",
        "topk",
        "--k",
        "3",
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(args + ["--site", "blocks.1.hook_resid_pre"]) == 0
    sae = read_sae(tmp_path / "run" / "sae")
    # the hook name as given, though it is the site of blocks.0.hook_resid_post (resid.1)
    assert sae.cfg.hook_name == "blocks.1.hook_resid_pre" and sae.cfg.k == 3 and sae.d_sae == 24
    assert json.loads((tmp_path / "run" / "results.json").read_text())["site"] == "resid.1"
    assert main(["-q", "sae", "info", str(tmp_path / "run" / "sae")]) == 0
    assert json.loads(capsys.readouterr().out.split("report:")[-1].split("\n", 1)[1])["d_sae"] == 24
    assert main(args + ["--site", "resid.1"]) == 2  # results exist: needs --overwrite
    assert "already holds results" in capsys.readouterr().err
    assert main(args + ["--site", "resid.7", "--overwrite"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_an_sae_train_run_directory_resolves_to_its_sae(tmp_path):
    sae = _random_sae("topk")
    write_sae(sae, tmp_path / "run" / "sae")  # where `sae train --out RUN` puts it
    for where in (tmp_path / "run", tmp_path / "run" / "sae"):
        back = read_sae(where)
        assert torch.equal(back.W_dec, sae.W_dec) and back.cfg.hook_name == sae.cfg.hook_name
    with pytest.raises(InputError, match="has no cfg.json"):
        read_sae(tmp_path)  # two levels up: not an SAE


def test_reads_saes_that_saelens_saved(tmp_path):
    """The other direction: SAELens' own ``save_model`` output (the form Gemma Scope takes once converted,
    JumpReLU) read by :func:`read_sae` encodes and reconstructs as SAELens does."""
    sae_lens = pytest.importorskip("sae_lens")
    kinds = {
        "standard": (sae_lens.StandardSAE, sae_lens.StandardSAEConfig, {}),
        "jumprelu": (sae_lens.JumpReLUSAE, sae_lens.JumpReLUSAEConfig, {}),
        "topk": (sae_lens.TopKSAE, sae_lens.TopKSAEConfig, {"k": 3}),
    }
    for name, (cls, cfg_cls, extra) in kinds.items():
        cfg = cfg_cls(d_in=6, d_sae=10, **extra)
        cfg.metadata.hook_name = "blocks.0.hook_resid_post"
        theirs = cls(cfg)
        gen = torch.Generator().manual_seed(len(name))
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            if name == "jumprelu":
                theirs.threshold.copy_(torch.rand(10, generator=gen) * 0.3)
        theirs.save_model(str(tmp_path / name))
        ours = read_sae(tmp_path / name)
        x = torch.randn(7, 6, generator=gen)
        torch.testing.assert_close(ours.encode(x), theirs.encode(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours(x), theirs.decode(theirs.encode(x)), rtol=1e-5, atol=1e-5)
        assert (ours.encode(x) > 0).any() and (ours.encode(x) == 0).any()  # the activation actually gates


def test_hook_names_are_kept_and_remote_code_is_not_claimed(tmp_path):
    """An SAE trained on blocks.1.hook_resid_pre keeps that name (same site as blocks.0.hook_resid_post);
    cfg.json says dataset_trust_remote_code only as a read cfg.json said it (default false)."""
    from originlens.sae.format import config_to_dict

    ad = _gpt()
    toks = np.random.default_rng(0).integers(1, 13, size=(8, 6))
    cfg = SAETrainConfig(d_sae=8, steps=2, batch_size=16, seed=0)
    for site, name in (("blocks.1.hook_resid_pre", "blocks.1.hook_resid_pre"), ("resid.1", "blocks.0.hook_resid_post")):
        res, sae_dir = train_sae_run(ad, toks, site, cfg, tmp_path / site)
        raw = json.loads((sae_dir / "cfg.json").read_text())
        assert raw["hook_name"] == name and raw["dataset_trust_remote_code"] is False
        assert sae_site(read_sae(sae_dir), ad) == 1
    sae = SAE(SAEConfig(d_in=16, d_sae=8, extra={"dataset_trust_remote_code": True}))
    assert config_to_dict(sae.cfg)["dataset_trust_remote_code"] is True
    write_sae(sae, tmp_path / "kept")
    assert read_sae(tmp_path / "kept").cfg.extra["dataset_trust_remote_code"] is True
