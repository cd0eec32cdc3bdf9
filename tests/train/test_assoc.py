"""Trainer of the Def. 3.1 model: GD/SGD updates against hand-written loops, data order, checkpoints,
exact resume, run-directory safety, NaN detection, callbacks."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from originlens.errors import CompatibilityError, ConfigError, InputError, NumericalError
from originlens.models.assoc import CHECKPOINT_KIND, AssocConfig, AssocModel, load_assoc
from originlens.storage import load_tensors
from originlens.train import AssocTrainConfig, steps_per_epoch, train_assoc

V, T = 13, 6


@pytest.fixture(scope="module")
def tokens():
    rng = np.random.default_rng(0)
    # a noisy cycle so that training has something to learn
    start = rng.integers(0, V, 12)
    toks = (start[:, None] + np.arange(T + 1)[None, :]) % V
    noise = rng.random(toks.shape) < 0.3
    toks[noise] = rng.integers(0, V, noise.sum())
    return toks


def cfg(**kw) -> AssocTrainConfig:
    base = dict(n_layers=2, lr=0.5, steps=7, batch_size=5, dtype="float64", stats_source="none")
    base.update(kw)
    return AssocTrainConfig(**base)


def params_equal(a: AssocModel, b: AssocModel) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def manual_sgd(tokens, c: AssocTrainConfig) -> AssocModel:
    """TEST HELPER: plain SGD loop written from the definition (torch.Generator(data_seed) permutation
    per epoch, batches in order, last partial batch kept, θ ← θ − η∇L)."""
    m = AssocModel(AssocConfig(vocab_size=V, seq_len=T, n_layers=c.n_layers, dtype=c.dtype))
    t = torch.from_numpy(tokens)
    N = t.shape[0]
    g = torch.Generator().manual_seed(c.data_seed)
    step = 0
    while step < c.steps:
        perm = torch.randperm(N, generator=g) if c.batch_size else torch.arange(N)
        bs = c.batch_size or N
        for i in range(0, N, bs):
            if step == c.steps:
                break
            batch = t if c.batch_size is None else t[perm[i : i + bs]]
            m.zero_grad()
            m.loss(batch).backward()
            with torch.no_grad():
                for p in m.parameters():
                    p -= c.lr * p.grad
            step += 1
    return m


# ------------------------------------------------------------------------------------------------


def test_steps_per_epoch():
    assert steps_per_epoch(65536, 2048) == 32
    assert steps_per_epoch(12, 5) == 3
    assert steps_per_epoch(12, None) == 1


def test_gd_and_sgd_match_hand_written_loops(tokens):
    for c in (cfg(batch_size=None, steps=4), cfg(steps=7), cfg(steps=5, batch_size=12)):
        run = train_assoc(tokens, V, c)
        ref = manual_sgd(tokens, c)
        for a, b in zip(run.model.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
        assert run.optimizer == ("gd" if c.batch_size is None else "sgd")
        assert run.finished and run.step == c.steps


def test_loss_decreases_and_first_loss_is_log_vocab(tokens):
    run = train_assoc(tokens, V, cfg(batch_size=None, steps=30, lr=2.0))
    assert run.losses[1] == pytest.approx(math.log(V), abs=1e-12)
    assert run.losses[30] < run.losses[1] - 0.1


def test_epochs_reshuffle(tokens):
    seen = []

    class Rec:
        def on_step_end(self, tr):
            seen.append(tr._perm.clone())

    train_assoc(tokens, V, cfg(epochs=2, steps=None), callbacks=[Rec()])
    assert len(seen) == 6  # 2 epochs × ⌈12/5⌉ steps
    assert torch.equal(seen[0], seen[2]) and not torch.equal(seen[0], seen[3])
    g = torch.Generator().manual_seed(42)
    assert torch.equal(seen[0], torch.randperm(12, generator=g))
    assert torch.equal(seen[3], torch.randperm(12, generator=g))


def test_grad_chunk_matches(tokens):
    a = train_assoc(tokens, V, cfg(steps=4, grad_chunk=2))
    b = train_assoc(tokens, V, cfg(steps=4, grad_chunk=None))
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-15)


def test_run_directory_contents(tokens, tmp_path):
    out = tmp_path / "run"
    c = cfg(out=str(out), checkpoint_every=3, checkpoint_at=(1,), log_every=2)
    called = {"step": 0, "ckpt": []}

    class CB:
        def on_step_end(self, tr):
            called["step"] += 1
            assert tr.loss is not None and tr.cfg is c

        def on_checkpoint(self, tr, path):
            called["ckpt"].append(path.name)

    run = train_assoc(tokens, V, c, callbacks=[CB()])
    assert called["step"] == 7
    assert called["ckpt"] == [
        "step-000001.safetensors",
        "step-000003.safetensors",
        "step-000006.safetensors",
        "step-000007.safetensors",
    ]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == called["ckpt"]
    arrays, meta = load_tensors(out / "checkpoints" / "step-000003.safetensors", kind=CHECKPOINT_KIND)
    assert {"W_O", "W.1", "V.2", "P.2", "trainer.data_rng_state"} <= set(arrays)
    assert json.loads(meta["step"]) == 3 and meta["optimizer"] == "sgd" and "none" in meta["optimizer_state"]
    final, fmeta = load_assoc(out / "model.safetensors")
    assert params_equal(final, run.model) and json.loads(fmeta["step"]) == 7
    config = json.loads((out / "config.json").read_text())
    assert config["optimizer"] == "sgd" and config["identity"]["train"]["lr"] == 0.5
    env = json.loads((out / "environment.json").read_text())
    assert env["seeds"] == {"init": 0, "data_order": 42} and env["data_hashes"]["tokens"]
    recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in recs if r["event"] == "step"]
    assert steps == [2, 4, 6, 7]
    assert all(r["loss"] == pytest.approx(run.losses[r["step"]]) for r in recs if r["event"] == "step")
    assert [r["step"] for r in recs if r["event"] == "checkpoint"] == [1, 3, 6, 7]


def test_checkpoint_metrics_hold_theory_comparison(tokens, tmp_path):
    pytest.importorskip("originlens.stats")
    c = cfg(out=str(tmp_path / "r"), batch_size=None, steps=4, lr=0.05, checkpoint_every=1, stats_source="full")
    run = train_assoc(tokens, V, c)
    recs = [json.loads(l) for l in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    ck = [r for r in recs if r["event"] == "checkpoint"]
    assert [r["step"] for r in ck] == [1, 2, 3, 4]
    assert ck[0]["theory"]["W_O"]["cos"] == pytest.approx(1.0, abs=1e-12)
    assert ck[0]["theory"]["V.1"]["cos"] is None  # NaN at s = 1 is stored as null
    assert ck[-1]["min_cos"]["W"] > 0.9 and ck[-1]["stats_source"] == "full"
    assert set(run.comparisons) == {1, 2, 3, 4}


@pytest.mark.parametrize("kill_at", [5, 7])  # resume mid-epoch (from 4) and at an epoch boundary (from 6)
def test_resume_is_bit_identical(tokens, tmp_path, kill_at):
    c_full = cfg(steps=9, out=str(tmp_path / "full"), checkpoint_every=2)
    full = train_assoc(tokens, V, c_full)

    class Kill(Exception):
        pass

    class Killer:
        def on_step_end(self, tr):
            if tr.step == kill_at:
                raise Kill

    c = dataclasses.replace(c_full, out=str(tmp_path / "killed"))
    with pytest.raises(Kill):
        train_assoc(tokens, V, c, callbacks=[Killer()])
    assert not (tmp_path / "killed" / "model.safetensors").exists()
    resumed = train_assoc(tokens, V, c, resume=True)
    assert resumed.resumed_from == kill_at - 1
    assert params_equal(resumed.model, full.model)
    a = (tmp_path / "full" / "model.safetensors").read_bytes()
    b = (tmp_path / "killed" / "model.safetensors").read_bytes()
    assert load_tensors(tmp_path / "full" / "model.safetensors")[0]["W_O"].tobytes() == load_tensors(
        tmp_path / "killed" / "model.safetensors"
    )[0]["W_O"].tobytes() and len(a) == len(b)
    losses = lambda p: [
        (r["step"], r["loss"])
        for r in map(json.loads, (p / "metrics.jsonl").read_text().splitlines())
        if r["event"] == "step"
    ]
    assert losses(tmp_path / "killed") == losses(tmp_path / "full")


def test_request_stop_then_resume_and_extend(tokens, tmp_path):
    full = train_assoc(tokens, V, cfg(steps=8))

    class Stop:
        def on_step_end(self, tr):
            if tr.step == 3:
                tr.request_stop()

    c = cfg(steps=5, out=str(tmp_path / "r"))
    r1 = train_assoc(tokens, V, c, callbacks=[Stop()])
    assert r1.stopped_early and r1.step == 3 and (tmp_path / "r" / "checkpoints" / "step-000003.safetensors").exists()
    r2 = train_assoc(tokens, V, c, resume=True)
    assert r2.finished and r2.step == 5
    r3 = train_assoc(tokens, V, dataclasses.replace(c, steps=8), resume=True)  # extend a finished run
    assert r3.resumed_from == 5 and params_equal(r3.model, full.model)
    r4 = train_assoc(tokens, V, dataclasses.replace(c, steps=8), resume=True)  # nothing left to do
    assert r4.losses == {} and params_equal(r4.model, full.model)


def test_resume_with_another_thread_count_warns(tokens, tmp_path, capsys):
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        c = cfg(steps=4, out=str(tmp_path / "r"), checkpoint_every=2)
        train_assoc(tokens, V, dataclasses.replace(c, steps=2))
        capsys.readouterr()
        torch.set_num_threads(2)
        train_assoc(tokens, V, c, resume=True)
        err = capsys.readouterr().err
        assert "started with 1 torch thread(s) and resumes with 2" in err and "--threads 1" in err
        torch.set_num_threads(1)
        train_assoc(tokens, V, dataclasses.replace(c, steps=6), resume=True)  # the start's count: silent
        assert "resumes with" not in capsys.readouterr().err
    finally:
        torch.set_num_threads(old)


def test_resume_refuses_another_statistics_source(tokens, tmp_path):
    c = cfg(steps=2, out=str(tmp_path / "r"), batch_size=8, stats_source="first_batch")
    train_assoc(tokens, V, c)
    with pytest.raises(ConfigError, match="another run.*stats_source"):
        train_assoc(tokens, V, dataclasses.replace(c, steps=4, stats_source="full"), resume=True)
    assert train_assoc(tokens, V, dataclasses.replace(c, steps=4), resume=True).step == 4


def test_run_directory_safety(tokens, tmp_path):
    out = tmp_path / "r"
    train_assoc(tokens, V, cfg(steps=2, out=str(out)))
    with pytest.raises(ConfigError, match="already holds this run"):
        train_assoc(tokens, V, cfg(steps=2, out=str(out)))
    with pytest.raises(ConfigError, match="another run.*lr"):
        train_assoc(tokens, V, cfg(steps=2, lr=0.1, out=str(out)), resume=True)
    with pytest.raises(ConfigError, match="data"):
        train_assoc(tokens[::-1].copy(), V, cfg(steps=2, out=str(out)), resume=True)
    run = train_assoc(tokens, V, cfg(steps=2, lr=0.1, out=str(out)), overwrite=True)
    assert json.loads((out / "config.json").read_text())["identity"]["train"]["lr"] == 0.1 and run.step == 2
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no originlens run"):
        train_assoc(tokens, V, cfg(steps=1, out=str(foreign)), overwrite=True)
    assert (foreign / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="beyond"):
        train_assoc(tokens, V, cfg(steps=1, lr=0.1, out=str(out)), resume=True)


def test_keep_checkpoints(tokens, tmp_path):
    train_assoc(tokens, V, cfg(steps=6, out=str(tmp_path / "r"), checkpoint_every=1, keep_checkpoints=2))
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir()) == [
        "step-000005.safetensors",
        "step-000006.safetensors",
    ]


def test_nan_detection_names_step_tensor_and_checkpoint(tokens, tmp_path):
    c = cfg(batch_size=None, steps=60, lr=1e12, out=str(tmp_path / "r"), checkpoint_at=(1,))
    with pytest.raises(NumericalError) as ei:
        train_assoc(tokens, V, c)
    msg = str(ei.value)
    assert "non-finite" in msg and "at step" in msg and "step-000001.safetensors" in msg
    step = int(msg.split("at step ")[1].split()[0])
    assert step > 1
    assert any(k in msg for k in ("loss", "gradient of", "weight "))


def test_validation(tokens):
    with pytest.raises(ConfigError):
        train_assoc(tokens, V, cfg(epochs=2))  # steps and epochs
    with pytest.raises(ConfigError):
        train_assoc(tokens, V, cfg(lr=-1.0))
    with pytest.raises(ConfigError):
        train_assoc(tokens, V, cfg(stats_source="elsewhere"))
    with pytest.raises(InputError):
        train_assoc(tokens, V - 1, cfg())  # ids ≥ vocab size
    with pytest.raises(InputError):
        train_assoc(tokens[:, :1], V, cfg())
    with pytest.raises(InputError):
        train_assoc(tokens.astype(float), V, cfg())
    wrong = {
        "bigram": np.zeros((V - 1, V - 1)),
        "value_target": np.zeros((V - 1, V - 1)),
        "query_key": np.zeros((V - 1, V - 1)),
        "positional": np.zeros(T),
    }
    with pytest.raises(CompatibilityError):
        train_assoc(tokens, V, cfg(), stats=wrong)


# ------------------------------------------------------------------------------------------------ device


def test_device_option(tokens, tmp_path):
    from originlens.train.assoc import resolve_device

    with pytest.raises(ConfigError, match="unknown device"):
        train_assoc(tokens, V, cfg(device="tpu"))
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("CPU") == torch.device("cpu")
    if not torch.cuda.is_available():
        for spec in ("cuda", "cuda:0", "cuda:3"):
            with pytest.raises(ConfigError, match="CUDA is unavailable"):
                train_assoc(tokens, V, cfg(device=spec))
        # auto falls back to the CPU: the same trajectory as device="cpu"
        a = train_assoc(tokens, V, cfg(steps=3, device="auto"))
        b = train_assoc(tokens, V, cfg(steps=3))
        assert params_equal(a.model, b.model) and a.model.W_O.device.type == "cpu"
    # the device is not part of the run's identity: a run can be continued with another device setting
    out = str(tmp_path / "r")
    train_assoc(tokens, V, cfg(steps=2, out=out, device="cpu"))
    r = train_assoc(tokens, V, cfg(steps=3, out=out, device="auto"), resume=True)
    assert r.resumed_from == 2 and r.step == 3
    env = json.loads((tmp_path / "r" / "environment.json").read_text())
    assert env["device"] == "cpu" and env["device_name"] == "cpu"


# ------------------------------------------------------------------------------------------------ statistics


def test_first_batch_statistics_are_the_first_batch_with_the_vocabulary(tokens, tmp_path):
    from originlens.stats import corpus_statistics, load_statistics

    vocab = [f"w{i}" for i in range(V)]
    first = []

    class Rec:
        def on_step_end(self, tr):
            if tr.step == 1:
                first.append(tr._perm[: tr.batch].numpy().copy())  # the batch SGD actually used

    out = tmp_path / "r"
    run = train_assoc(tokens, V, cfg(steps=2, stats_source="first_batch", out=str(out)), [Rec()], vocab=vocab)
    assert sorted(run.stats_windows.tolist()) == sorted(first[0].tolist())
    ref = corpus_statistics(tokens[first[0]], V)
    for k in ("bigram", "context", "value_target", "query_key", "positional"):
        np.testing.assert_allclose(getattr(run.stats, k), getattr(ref, k), rtol=1e-13, atol=1e-16)
    # centred with the model's vocabulary size, token strings attached, written by the trainer
    assert run.stats.vocab == vocab and run.stats.centering == pytest.approx(1.0 / V, rel=1e-15)
    saved = load_statistics(out / "statistics")
    assert saved.vocab == vocab and np.array_equal(saved.query_key, run.stats.query_key)
    man = json.loads((out / "statistics" / "manifest.json").read_text())
    assert man["source"] == "first_batch" and sorted(man["windows"]) == sorted(first[0].tolist())
    assert man["vocab_size"] == V and man["n_windows"] == 5
    # full-batch GD: all windows
    gd = train_assoc(tokens, V, cfg(batch_size=None, steps=1, stats_source="first_batch"))
    assert gd.stats_windows is None and gd.stats.n_pairs == tokens.shape[0] * T


def test_statistics_of_another_vocabulary_are_rejected(tokens):
    from originlens.stats import corpus_statistics

    vocab = [f"w{i}" for i in range(V)]
    with pytest.raises(CompatibilityError, match="vocabulary has"):
        train_assoc(tokens, V, cfg(), vocab=vocab[:-1])
    other = corpus_statistics(tokens, V, vocab=list(reversed(vocab)))
    with pytest.raises(CompatibilityError, match="another vocabulary"):
        train_assoc(tokens, V, cfg(), stats=other, vocab=vocab)
    with pytest.raises(CompatibilityError, match="T = "):
        train_assoc(tokens, V, cfg(), stats=corpus_statistics(tokens[:, :4], V))
    with pytest.raises(CompatibilityError):
        train_assoc(tokens, V, cfg(), stats=corpus_statistics(tokens, V, top_k=V - 2))


# ------------------------------------------------------------------------------------------------ bad input


def test_directory_of_another_kind_is_never_overwritten(tokens, tmp_path):
    other = tmp_path / "gpt-run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"model": {"n_layer": 2}, "lr": 0.1}))
    (other / "checkpoints" / "step-000001.safetensors").write_bytes(b"precious")
    bad = tmp_path / "bad-config"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    for d, needle in ((other, "another kind of run"), (bad, "unreadable config.json")):
        before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
        for kw in (dict(overwrite=True), dict(resume=True), {}):
            with pytest.raises(ConfigError, match=needle):
                train_assoc(tokens, V, cfg(steps=1, out=str(d)), **kw)
        assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before


def _rewrite_checkpoint(path, change):
    from originlens.storage import save_tensors

    arrays, meta = load_tensors(path)
    arrays = change(dict(arrays))
    save_tensors(
        path,
        arrays,
        kind=CHECKPOINT_KIND,
        metadata={k: v for k, v in meta.items() if k not in ("kind", "format_version")},
    )


@pytest.mark.parametrize(
    "damage,error,needle",
    [
        (
            lambda a: {k: v for k, v in a.items() if k != "trainer.data_rng_state"},
            CompatibilityError,
            "data-order state",
        ),
        (lambda a: a | {"W.1": np.full_like(a["W.1"], np.nan)}, InputError, "non-finite values in W.1"),
        (lambda a: a | {"V.2": np.zeros((V + 1, V + 1))}, CompatibilityError, "'V.2' has shape"),
        (lambda a: {k: v for k, v in a.items() if k != "P.1"}, CompatibilityError, "lack 'P.1'"),
    ],
)
def test_damaged_checkpoint_names_the_file_and_overwrites_nothing(tokens, tmp_path, damage, error, needle):
    out = tmp_path / "r"
    train_assoc(tokens, V, cfg(steps=2, out=str(out), checkpoint_every=1))
    ck = out / "checkpoints" / "step-000002.safetensors"
    _rewrite_checkpoint(ck, damage)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "metrics.jsonl"}
    with pytest.raises(error, match=needle) as ei:
        train_assoc(tokens, V, cfg(steps=4, out=str(out), checkpoint_every=1), resume=True)
    assert "step-000002.safetensors" in str(ei.value)
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "metrics.jsonl"} == before


def test_divergence_keeps_last_good_checkpoint_and_logs_the_error(tokens, tmp_path):
    out = tmp_path / "r"
    c = cfg(batch_size=None, steps=60, lr=1e12, out=str(out), checkpoint_every=1)
    with pytest.raises(NumericalError) as ei:
        train_assoc(tokens, V, c)
    step = int(str(ei.value).split("at step ")[1].split()[0])
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == [f"step-{s:06d}.safetensors" for s in range(1, step)]  # nothing for the failed step
    assert f"step-{step - 1:06d}.safetensors" in str(ei.value)
    assert not (out / "model.safetensors").exists()
    arrays, _ = load_tensors(out / "checkpoints" / ckpts[-1])
    assert all(np.isfinite(v).all() for k, v in arrays.items() if k != "trainer.data_rng_state")
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "error" and last["step"] == step and "non-finite" in last["error"]


def test_run_killed_before_its_config_was_written_resumes(tokens, tmp_path):
    """RunDir() creates empty checkpoints/ and figures/ before config.json: that skeleton is resumable;
    a stray file next to it makes the directory foreign again."""
    out = tmp_path / "r"
    (out / "checkpoints").mkdir(parents=True)
    (out / "figures").mkdir()
    run = train_assoc(tokens, V, cfg(steps=2, out=str(out)), resume=True)
    assert run.finished and (out / "config.json").exists()
    ref = train_assoc(tokens, V, cfg(steps=2))
    assert params_equal(run.model, ref.model)
    other = tmp_path / "o"
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds no originlens run"):
        train_assoc(tokens, V, cfg(steps=1, out=str(other)), resume=True)
