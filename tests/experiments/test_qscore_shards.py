"""Q(w) at scale: ``shard=(i, N)`` runs merged by ``merge_qscore_runs`` (``lm qscore --shard`` /
``lm qscore-merge``), and ``lm qscore`` under torchrun, equal the unsharded run: the same features,
contexts and positions exactly, KLs to float64 round-off of different batch compositions (≈ 1e-16
absolute, so ratios of tiny KLs to ≈ 1e-8 relative); the merge refuses incomplete, duplicate or
mismatched shards."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from originlens.errors import ConfigError, InputError
from originlens.experiments.lm_inputs import CorpusSource, ModelSource
from originlens.experiments.qscore_run import QScoreRunConfig, merge_qscore_runs, run_qscore
from originlens.models.gpt import GPT, GPTConfig
from originlens.sae import SAE, SAEConfig, write_sae
from originlens.storage import load_tensors

N_FEATURES = 10


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("qshard")
    torch.manual_seed(3)
    GPT(GPTConfig(vocab_size=13, seq_len=24, n_layer=2, d_model=16, n_head=4, dtype="float64")).save(
        d / "gpt.safetensors"
    )
    np.save(d / "toks.npy", np.random.default_rng(5).integers(1, 13, size=(30, 20)).astype(np.uint16))
    g = torch.Generator().manual_seed(0)
    sae = SAE(SAEConfig(d_in=16, d_sae=N_FEATURES, hook_name="blocks.0.hook_resid_post", dtype="float64"))
    with torch.no_grad():
        sae.W_enc.copy_(torch.randn(16, N_FEATURES, generator=g, dtype=torch.float64))
        sae.W_dec.copy_(torch.randn(N_FEATURES, 16, generator=g, dtype=torch.float64) * 0.5)
        sae.b_enc.copy_(torch.randn(N_FEATURES, generator=g, dtype=torch.float64) * 0.5 + 0.5)
    write_sae(sae, d / "sae")
    return d


def _cfg(d, **kw):
    settings = dict(contexts=3, max_offset=4, min_total_kl=0.0, ablation="both", batch_size=7)  # batches of 7
    return QScoreRunConfig(
        model=ModelSource(str(d / "gpt.safetensors")),
        sae=str(d / "sae"),
        corpus=CorpusSource(str(d / "toks.npy")),
        **{**settings, **kw},
    )


def _load(run):
    res = json.loads((run / "results.json").read_text())
    tabs = {m: load_tensors(run / e["examples_file"], kind="qscore-examples")[0] for m, e in res["ablations"].items()}
    return res, tabs


def _assert_same(a, b):
    (ra, ta), (rb, tb) = a, b
    assert set(ra["ablations"]) == set(rb["ablations"]) == {"error_preserving", "faithful"}
    for m in ra["ablations"]:
        fa, fb = ra["ablations"][m]["features"], rb["ablations"][m]["features"]
        assert [f["feature"] for f in fa] == [f["feature"] for f in fb] == list(range(N_FEATURES))
        for x, y in zip(fa, fb):
            assert (x["n_examples"], x["kept"], x["reason"]) == (y["n_examples"], y["kept"], y["reason"])
            for key in ("q", "q_ratio_of_means", "q_median", "total_kl"):
                # KLs of near-identical distributions cancel: ≈ 1e-16 absolute, amplified in ratios
                assert x[key] == pytest.approx(y[key], rel=1e-8, abs=1e-13, nan_ok=True), (m, x["feature"], key)
        for key in ("feature", "seq_index", "position"):
            np.testing.assert_array_equal(ta[m][key], tb[m][key])
        for key in ("activation", "ablated_activation"):
            np.testing.assert_allclose(ta[m][key], tb[m][key], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(ta[m]["kl"], tb[m]["kl"], rtol=1e-9, atol=1e-14)
        np.testing.assert_allclose(ta[m]["ratio"], tb[m]["ratio"], rtol=1e-8, atol=1e-12)
        sa, sb = ra["ablations"][m]["summary"], rb["ablations"][m]["summary"]
        assert (sa["n_features"], sa["n_kept"], sa["n_examples"]) == (sb["n_features"], sb["n_kept"], sb["n_examples"])
        assert sa["q"]["median"] == pytest.approx(sb["q"]["median"], rel=1e-8)


def test_shards_merge_to_the_unsharded_run(inputs, tmp_path):
    full = run_qscore(_cfg(inputs), tmp_path / "full")
    assert sum(f.kept for f in full.results["faithful"].features) >= 3  # the comparison has content
    shards = []
    for i in range(3):
        r = run_qscore(_cfg(inputs, shard=(i, 3)), tmp_path / f"s{i}")
        info = json.loads((r.path / "results.json").read_text())["info"]
        assert info["shard"]["index"] == i and info["shard"]["n_features_total"] == N_FEATURES
        shards.append(r.path)
    assert [len(json.loads((p / "results.json").read_text())["ablations"]["faithful"]["features"]) for p in shards] == [
        4, 3, 3,
    ]  # fmt: skip
    merged = merge_qscore_runs(shards[::-1], tmp_path / "merged")  # any order of the arguments
    _assert_same(_load(tmp_path / "merged"), _load(tmp_path / "full"))
    res = json.loads((tmp_path / "merged" / "results.json").read_text())
    assert res["info"]["n_features"] == N_FEATURES and "shard" not in res["info"]
    assert len(res["info"]["merged_from"]) == 3
    assert merged.report is not None and merged.report.is_file()
    assert len((tmp_path / "merged" / "metrics.jsonl").read_text().splitlines()) == 2 * N_FEATURES

    with pytest.raises(InputError, match="exactly once"):
        merge_qscore_runs(shards[:2], tmp_path / "m2")
    with pytest.raises(InputError, match="exactly once"):
        merge_qscore_runs([shards[0], shards[0], shards[2]], tmp_path / "m3")
    with pytest.raises(InputError, match="not a shard"):
        merge_qscore_runs([tmp_path / "full", *shards], tmp_path / "m4")
    other = run_qscore(_cfg(inputs, shard=(1, 3), contexts=2), tmp_path / "other")
    with pytest.raises(InputError, match="differ"):
        merge_qscore_runs([shards[0], other.path, shards[2]], tmp_path / "m5")
    with pytest.raises(ConfigError, match="shard"):
        _cfg(inputs, shard=(3, 3))
    with pytest.raises(ConfigError, match="shards for"):
        run_qscore(_cfg(inputs, shard=(0, N_FEATURES + 1)), tmp_path / "m6")


def test_cli_shard_flag_and_merge(inputs, tmp_path, capsys):
    from originlens.cli.main import main

    base = ["-q", "lm", "qscore", "--model", str(inputs / "gpt.safetensors"), "--sae", str(inputs / "sae"),
            "--corpus", str(inputs / "toks.npy"), "--contexts", "3", "--max-offset", "4", "--min-total-kl", "0"]  # fmt: skip
    for i in range(2):
        assert main([*base, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    assert (
        main(["-q", "lm", "qscore-merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")])
        == 0
    )
    assert "features kept" in capsys.readouterr().out
    assert json.loads((tmp_path / "m" / "results.json").read_text())["info"]["n_features"] == N_FEATURES
    with pytest.raises(SystemExit):
        main([*base, "--shard", "2/2", "--out", str(tmp_path / "bad")])
    assert "0 ≤ I < N" in capsys.readouterr().err


@pytest.mark.slow
def test_torchrun_ranks_share_the_features(inputs, tmp_path):
    import os
    import subprocess
    import sys

    full = run_qscore(_cfg(inputs), tmp_path / "full")
    assert full.report is not None
    args = ["lm", "qscore", "--model", str(inputs / "gpt.safetensors"), "--sae", str(inputs / "sae"),
            "--corpus", str(inputs / "toks.npy"), "--contexts", "3", "--max-offset", "4", "--min-total-kl", "0",
            "--ablation", "both", "--batch-size", "7", "--out", str(tmp_path / "tr")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ORIGINLENS_QUIET": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "originlens",
           "-q", *args]  # fmt: skip
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("features kept") == 2  # one line per ablation, printed by rank 0 only
    _assert_same(_load(tmp_path / "tr"), _load(tmp_path / "full"))
    res = json.loads((tmp_path / "tr" / "results.json").read_text())
    assert res["info"]["ranks"] == 2 and res["info"]["n_features"] == N_FEATURES
    bad = subprocess.run([*cmd, "--shard", "0/2"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "torchrun" in bad.stderr


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_model_dtype_flag(inputs, tmp_path, dtype):
    """``--dtype`` casts the model (here a float64 checkpoint); the SAE keeps its own dtype; the run records
    the model's dtype and its KLs are finite."""
    from originlens.cli.main import main

    argv = ["-q", "lm", "qscore", "--model", str(inputs / "gpt.safetensors"), "--sae", str(inputs / "sae"),
            "--corpus", str(inputs / "toks.npy"), "--contexts", "2", "--max-offset", "3", "--min-total-kl", "0",
            "--features", "0-3", "--dtype", dtype, "--out", str(tmp_path / "r")]  # fmt: skip
    assert main(argv) == 0
    res, tabs = _load(tmp_path / "r")
    assert res["info"]["model_dtype"] == dtype
    kl = tabs["error_preserving"]["kl"]
    assert kl.size and np.isfinite(kl).all()
