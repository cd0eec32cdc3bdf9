"""Tests for originlens.train.ntp: defaults, data order, loss and Adam step against hand-written
references, exact resume, checkpoints, run-dir safety, NaN detection, probes, callbacks, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from originlens.cli.main import main as cli_main
from originlens.errors import CompatibilityError, ConfigError, InputError, NumericalError
from originlens.models import GPT
from originlens.probes import ProbeSet
from originlens.storage import load_tensors, save_tensors
from originlens.tasks import get_task
from originlens.train.ntp import (
    CHECKPOINT_KIND,
    NTPConfig,
    Trainer,
    checkpoint_metadata,
    list_checkpoints,
    load_probe_metrics,
    othello_pool,
)


@pytest.fixture(autouse=True)
def one_thread():
    # the CI/dev machines are small and shared: oversubscribed OpenMP threads are ~100x slower
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def tiny(**kw) -> NTPConfig:
    base = dict(
        task="cond-majority",
        d_model=16,
        n_head=2,
        batch_size=16,
        steps=12,
        eval_size=64,
        log_every=1,
        eval_every=0,
        probe_every=0,
        checkpoint_every=5,
    )
    base.update(kw)
    return NTPConfig(**base)


def params(model: GPT) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# ------------------------------------------------------------------------------------------ config


def test_defaults_follow_the_spec_table():
    # arXiv 2603.14087's hyper-parameter table: layers, d, heads, T, batch, lr, steps, eval size, probe interval
    table = {
        "majority": (2, 128, 4, 21, 256, 3000, 10240, 500),
        "cond-majority": (2, 128, 4, 21, 256, 3000, 10240, 500),
        "othello": (6, 256, 4, 61, 1024, 5000, 20480, 1000),
    }
    for task, (L, d, h, T, B, steps, n_eval, every) in table.items():
        c = NTPConfig(task=task)
        assert (c.n_layer, c.d_model, c.n_head, c.batch_size, c.steps, c.eval_size, c.probe_every) == (
            L,
            d,
            h,
            B,
            steps,
            n_eval,
            every,
        )
        assert c.lr == 1e-3 and c.betas == (0.9, 0.999) and c.eps == 1e-8 and c.probe_alpha == 1.0
        assert c.gpt_config(get_task(task).vocab_size, T).n_positions == T + 1
    assert NTPConfig(task="majority", regime="untied").untie_at == [10]
    assert NTPConfig(task="cond-majority", regime="myopic+untied").untie_at == [10]
    assert NTPConfig(task="majority", regime="myopic").untie_at is None
    assert NTPConfig(task="majority", batch_size=8).batch_size == 8


def test_bad_names_are_config_errors_listing_valid_ones():
    with pytest.raises(ConfigError, match="cond-majority"):
        NTPConfig(task="parity")
    with pytest.raises(ConfigError, match="myopic\\+untied"):
        NTPConfig(task="majority", regime="split-brain")
    with pytest.raises(ConfigError, match="untie_at"):  # GPTConfig's own validation
        NTPConfig(task="othello", regime="untied")
    with pytest.raises(ConfigError, match="divisible"):
        NTPConfig(task="majority", d_model=30, n_head=4)
    with pytest.raises(ConfigError, match="corpus"):
        NTPConfig(task="language")
    with pytest.raises(ConfigError, match="float32"):
        NTPConfig(task="majority", dtype="bfloat16")


def test_cli_bad_names_exit_2(tmp_path, capsys):
    assert cli_main(["ntp", "train", "--task", "parity", "--out", str(tmp_path / "r")]) == 2
    assert "unknown task 'parity'" in capsys.readouterr().err
    assert cli_main(["ntp", "train", "--task", "majority", "--regime", "x", "--out", str(tmp_path / "r")]) == 2
    assert "standard, myopic, untied, myopic+untied" in capsys.readouterr().err


# ------------------------------------------------------------------------ data order, loss, Adam


def test_counting_tasks_train_on_a_fixed_set_by_default(tmp_path):
    """The paper's protocol: a fixed set of 102,400 sequences per run, task.sample(N, default_rng([seed, 11])),
    batch b = rows sort(default_rng([seed, 7, b]).integers(0, N, B)); other tasks refuse train_size."""
    assert NTPConfig(task="majority").train_size == 102400
    assert NTPConfig(task="othello").train_size == 0
    with pytest.raises(ConfigError, match="train_size"):
        NTPConfig(task="othello", train_size=10)
    cfg = tiny(steps=1, seed=3, checkpoint_every=0, train_size=500)
    tr = Trainer(cfg, tmp_path / "r")
    data = tr._train_data()
    pool = get_task("cond-majority").sample(500, np.random.default_rng([3, 11])).tokens
    rows = np.sort(np.random.default_rng([3, 7, 4]).integers(0, 500, cfg.batch_size))
    np.testing.assert_array_equal(data.batch(4), pool[rows])
    assert "fixed training set" in data.describe()


def test_first_update_matches_hand_written_loss_and_adam(tmp_path):
    """Batch 0 comes from default_rng([seed, 7, 0]); the logged loss is the mean CE over T−1 positions;
    one Adam step from zero moments moves every weight by lr·g/(|g| + ε) (bias-corrected)."""
    cfg = tiny(steps=1, seed=3, checkpoint_every=0, train_size=0)  # fresh sequences every step
    tr = Trainer(cfg, tmp_path / "r")
    torch.manual_seed(3)
    ref = GPT(tr.gpt_config)
    p0 = params(ref)
    toks = torch.from_numpy(get_task("cond-majority").sample(16, np.random.default_rng([3, 7, 0])).tokens)
    with torch.no_grad():
        logits = ref(toks).double()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    ce = -logp.gather(-1, toks[:, 1:, None]).squeeze(-1)  # (B, T−1)
    loss_ref = ce.mean()
    ref.zero_grad()
    ref(toks).log_softmax(-1)[:, :-1].gather(-1, toks[:, 1:, None]).mean().neg().backward()
    tr.run()
    rec = [r for r in tr.rundir.read_metrics() if r["event"] == "train"]
    assert rec[0]["step"] == 1
    assert math.isclose(rec[0]["loss"], float(loss_ref), rel_tol=1e-5)
    for name, p in tr.model.named_parameters():
        g = dict(ref.named_parameters())[name].grad.double()
        expected = p0[name].double() - 1e-3 * g / (g.abs() + 1e-8)
        torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-7)


# --------------------------------------------------------------------------------- exact resume


def _strip_adam(path):
    arrays, meta = load_tensors(path)
    kept = {k: v for k, v in arrays.items() if not k.startswith("adam.")}
    save_tensors(
        path,
        kept,
        kind=CHECKPOINT_KIND,
        metadata={
            k: json.loads(v) if k in ("step",) else v for k, v in meta.items() if k not in ("kind", "format_version")
        },
    )


@pytest.mark.parametrize("regime", ["standard", "myopic"])
def test_resume_is_bit_exact(tmp_path, regime):
    cfg = tiny(regime=regime)
    full = Trainer(cfg, tmp_path / "full")
    full.run()
    Trainer(cfg.replace(steps=7), tmp_path / "cut").run()  # "killed" after update 7 (checkpoints 5, 7)
    resumed = Trainer(cfg, tmp_path / "cut", resume=True)
    resumed.run()
    assert resumed.last_checkpoint.name == "step-000012.safetensors"
    a, b = params(full.model), params(resumed.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    steps = [r["step"] for r in resumed.rundir.read_metrics() if r["event"] == "train"]
    assert steps == list(range(1, 13))  # no duplicates after the resume
    before = float(checkpoint_metadata(tmp_path / "cut" / "checkpoints" / "step-000007.safetensors")["train_seconds"])
    summary = json.loads((tmp_path / "cut" / "summary.json").read_text())
    assert 0 < before < summary["seconds"]  # wall time accumulates over sessions
    # control: the Adam state is what makes the resume exact, so a checkpoint without it (zeroed moments
    # would give another run) is refused, not resumed
    Trainer(cfg.replace(steps=7), tmp_path / "ctl").run()
    _strip_adam(list_checkpoints(tmp_path / "ctl")[-1][1])
    with pytest.raises(CompatibilityError, match="no optimizer \\(Adam\\) state after 7 updates"):
        Trainer(cfg, tmp_path / "ctl", resume=True).run()


def test_resume_with_another_thread_count_warns_and_is_recorded(tmp_path, capsys):
    cfg = tiny()
    Trainer(cfg.replace(steps=7), tmp_path / "r").run()  # started with 1 thread (the fixture)
    env = json.loads((tmp_path / "r" / "environment.json").read_text())
    assert env["torch_threads_history"] == [1]
    capsys.readouterr()
    torch.set_num_threads(2)
    Trainer(cfg, tmp_path / "r", resume=True).run()
    err = capsys.readouterr().err
    assert "started with 1 torch thread(s) and resumes with 2" in err and "--threads 1" in err
    env = json.loads((tmp_path / "r" / "environment.json").read_text())
    assert env["torch_threads_history"] == [1, 2] and env["torch_threads"] == 2
    torch.set_num_threads(1)  # the same count as the start: silent
    Trainer(cfg.replace(steps=14), tmp_path / "r", resume=True).run()
    assert "resumes with" not in capsys.readouterr().err
    assert json.loads((tmp_path / "r" / "environment.json").read_text())["torch_threads_history"] == [1, 2, 1]


def test_resume_of_a_finished_run_is_a_no_op(tmp_path):
    cfg = tiny(steps=3)
    Trainer(cfg, tmp_path / "r").run()
    res = Trainer(cfg, tmp_path / "r", resume=True).run()
    assert res.skipped and res.step == 3
    longer = Trainer(cfg.replace(steps=5), tmp_path / "r", resume=True)  # extending is allowed
    assert longer.run().step == 5
    with pytest.raises(ConfigError, match="already at step 5"):
        Trainer(cfg.replace(steps=4), tmp_path / "r", resume=True).run()
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["step"] == 5  # left intact


# --------------------------------------------------------------------------------- checkpoints


def test_checkpoint_holds_weights_adam_state_and_rng(tmp_path):
    cfg = tiny(steps=6, checkpoint_every=3)
    tr = Trainer(cfg, tmp_path / "r")
    tr.run()
    assert [s for s, _ in list_checkpoints(tmp_path / "r")] == [3, 6]
    arrays, meta = load_tensors(tmp_path / "r" / "checkpoints" / "step-000006.safetensors", kind=CHECKPOINT_KIND)
    assert json.loads(meta["step"]) == 6
    assert json.loads(meta["ntp_config"])["seed"] == cfg.seed
    for name, p in tr.model.named_parameters():
        np.testing.assert_array_equal(arrays[f"model.{name}"], p.detach().numpy())
        st = tr.optimizer.state[p]
        np.testing.assert_array_equal(arrays[f"adam.{name}.exp_avg"], st["exp_avg"].numpy())
        np.testing.assert_array_equal(arrays[f"adam.{name}.exp_avg_sq"], st["exp_avg_sq"].numpy())
        assert arrays[f"adam.{name}.step"].reshape(-1).tolist() == [6.0]
    assert arrays["rng.torch"].dtype == np.uint8 and arrays["rng.numpy"].dtype == np.uint8
    # final weights load as a GPT and reproduce the trainer's logits
    m = GPT.load(tmp_path / "r" / "model.safetensors")
    x = torch.from_numpy(tr.eval_data.tokens[:4])
    assert torch.equal(m(x), tr.model(x))


# ----------------------------------------------------------------------------- run-dir safety


def test_wrong_run_dir_is_refused(tmp_path):
    run = tmp_path / "r"
    Trainer(tiny(steps=2), run).run()
    with pytest.raises(CompatibilityError, match=r"regime.*'standard'.*'myopic'"):
        Trainer(tiny(steps=2, regime="myopic"), run)
    with pytest.raises(CompatibilityError, match=r"task=cond-majority.*task=majority"):
        Trainer(tiny(steps=2, task="majority"), run)
    with pytest.raises(CompatibilityError, match="--resume"):  # same config, not resuming
        Trainer(tiny(steps=2), run)
    tr = Trainer(tiny(steps=2, regime="myopic"), run, overwrite=True)
    tr.run()
    assert json.loads((run / "config.json").read_text())["regime"] == "myopic"
    (tmp_path / "file").write_text("x")
    with pytest.raises(Exception, match="is a file"):
        Trainer(tiny(), tmp_path / "file")


# ------------------------------------------------------------------------------ NaN detection


def test_injected_nan_names_step_and_last_checkpoint(tmp_path):
    tr = Trainer(tiny(steps=10, checkpoint_every=2), tmp_path / "r")

    def poison(t: Trainer) -> None:
        if t.step == 3:
            with torch.no_grad():
                next(t.model.parameters()).fill_(float("nan"))

    tr.add_callback("on_step_end", poison)
    with pytest.raises(NumericalError, match=r"update 4 .*step-000002\.safetensors"):
        tr.run()


def test_huge_learning_rate_is_detected(tmp_path):
    with pytest.raises(NumericalError, match="training loss is (nan|inf)"):
        Trainer(tiny(steps=30, lr=1e30, checkpoint_every=0), tmp_path / "r").run()


# ------------------------------------------------------------------------- metrics and probes


def test_metrics_probes_and_callbacks(tmp_path):
    cfg = tiny(steps=6, log_every=2, eval_every=3, probe_every=3, eval_size=80, checkpoint_every=3)
    tr = Trainer(cfg, tmp_path / "r")
    seen = {e: [] for e in ("on_step_end", "on_eval", "on_probe", "on_checkpoint")}
    for e in seen:
        tr.add_callback(e, lambda t, e=e: seen[e].append(t.step))
    with pytest.raises(ConfigError):
        tr.add_callback("on_epoch", lambda t: None)
    tr.run()
    assert seen == {"on_step_end": [1, 2, 3, 4, 5, 6], "on_eval": [3, 6], "on_probe": [3, 6], "on_checkpoint": [3, 6]}
    recs = tr.rundir.read_metrics()
    assert [r["step"] for r in recs if r["event"] == "train"] == [2, 4, 6]
    evals = [r for r in recs if r["event"] == "eval"]
    assert [r["step"] for r in evals] == [3, 6]
    assert {"eval_loss", "legal_acc", "legal_output_acc", "first_output_token_acc"} <= set(evals[-1])
    probes = [r for r in recs if r["event"] == "probe"]
    assert "prev_is_<0>/pearson_type1" in probes[-1]

    # brute force: eval loss and one probe refitted by hand from the final model
    batch = tr.eval_data.batch
    x = torch.from_numpy(batch.tokens)
    with torch.no_grad():
        logits, res = tr.model(x, return_residuals=True)
    lp = torch.log_softmax(logits.double()[:, :-1], -1).gather(-1, x[:, 1:, None])
    assert math.isclose(evals[-1]["eval_loss"], float(-lp.mean()), rel_tol=1e-9)
    pm = load_probe_metrics(tmp_path / "r" / "probe_metrics.npz")
    ps = ProbeSet.load(tmp_path / "r" / "probes.safetensors")
    assert pm.layers == [0, 1, 2] and pm.positions == list(range(1, 21)) and ps.positions == pm.positions
    k, i, f = 2, 7, 0  # layer 2, position 7, prev_is_<0>
    X = res[k][:, i].double().numpy()
    y = batch.features[:, i, f].astype(np.float64)
    n_tr = 56  # 70 % of 80
    A = np.hstack([X[:n_tr], np.ones((n_tr, 1))])
    reg = np.hstack([np.eye(16), np.zeros((16, 1))])  # alpha = 1
    sol = np.linalg.lstsq(np.vstack([A, reg]), np.concatenate([y[:n_tr], np.zeros(16)]), rcond=None)[0]
    pred = X[n_tr:] @ sol[:16] + sol[16]
    r = np.corrcoef(pred, y[n_tr:])[0, 1]
    assert math.isclose(pm.pearson[k, pm.positions.index(i), f], r, rel_tol=1e-6)
    np.testing.assert_allclose(ps.direction(k, i, "prev_is_<0>"), sol[:16], rtol=1e-6, atol=1e-9)
    # the logged summary is the mean over tracked layers 1-2 and positions 2..19
    tracked = pm.pearson[1:3][:, [pm.positions.index(p) for p in range(2, 20)], 0]
    assert math.isclose(probes[-1]["tracked/pearson"], float(np.nanmean(tracked)), rel_tol=1e-9)


@pytest.mark.slow
def test_short_cond_majority_run_learns(tmp_path):
    cfg = tiny(d_model=32, batch_size=32, steps=300, log_every=10, eval_size=512, eval_every=0, checkpoint_every=0)
    tr = Trainer(cfg, tmp_path / "r")
    res = tr.run()
    first = [r for r in tr.rundir.read_metrics() if r["event"] == "train"][0]["loss"]
    assert first > 1.3  # ≈ ln 5 at initialisation
    assert res.final_eval["eval_loss"] < 0.85  # inputs ≈ ln 3 / 2, outputs learned
    assert res.final_eval["legal_output_acc"] > 0.9


# ----------------------------------------------------------------------------- other data paths


def test_othello_pool_is_cached_and_indexed_by_the_rule(tmp_path):
    # 40 updates of 4 games draw more than half of the 60 games: the whole pool, kept in the run
    cfg = tiny(task="othello", n_layer=1, batch_size=4, steps=40, eval_size=24, othello_pool=60, checkpoint_every=20)
    tr = Trainer(cfg, tmp_path / "r")
    tr.run()
    pool = np.load(tmp_path / "r" / "data" / "othello-pool.npy", allow_pickle=False)
    np.testing.assert_array_equal(pool, othello_pool(60, cfg.seed))
    idx = np.sort(np.random.default_rng([cfg.seed, 7, 1]).integers(0, 60, 4))
    np.testing.assert_array_equal(tr.data.batch(1), pool[idx].astype(np.int64))
    env = json.loads((tmp_path / "r" / "environment.json").read_text())
    assert "othello_pool_sha256" in env["data_hashes"] and "pool" in env["data_order"]
    assert (tmp_path / "r" / "probe_metrics.npz").is_file()


def test_a_run_drawing_under_half_of_the_pool_plays_only_those_games(tmp_path):
    base = dict(task="othello", n_layer=1, batch_size=4, eval_size=24, othello_pool=60, checkpoint_every=2)
    whole = othello_pool(60, 0)
    tr = Trainer(tiny(steps=2, **base), tmp_path / "r")
    tr.run()
    drawn = [np.sort(np.random.default_rng([0, 7, b]).integers(0, 60, 4)) for b in range(4)]
    assert len(tr.data.pool) == len(np.unique(np.concatenate(drawn[:2])))  # only the games drawn
    assert not (tmp_path / "r" / "data" / "othello-pool.npy").exists()
    env = json.loads((tmp_path / "r" / "environment.json").read_text())
    assert "othello_pool_sha256" not in env["data_hashes"] and "(N = 60)" in env["data_order"]
    drawn_hash = env["data_hashes"]["othello_pool_drawn_sha256"]  # the games drawn, hashed in memory
    with pytest.raises(InputError, match="does not hold"):
        tr.data.batch(2)  # a batch the run never draws
    # more updates on resume (steps is operational): the games drawn grow, the batches are the rule's
    longer = Trainer(tiny(steps=4, **base), tmp_path / "r", resume=True)
    longer.run()
    env = json.loads((tmp_path / "r" / "environment.json").read_text())
    assert env["data_hashes"]["othello_pool_drawn_sha256"] != drawn_hash  # more games drawn: not a refusal
    for b in range(4):
        np.testing.assert_array_equal(longer.data.batch(b), whole[drawn[b]].astype(np.int64))
        np.testing.assert_array_equal(longer.data.device_batch(b, torch.device("cpu"), 70).numpy(), whole[drawn[b]])
    # with the number of updates unchanged the drawn games' hash is compared: other games are refused
    import time

    from originlens.errors import BudgetExceeded

    cut = Trainer(tiny(steps=4, **base), tmp_path / "cut")
    cut.add_callback("on_step_end", lambda t: setattr(t, "deadline", time.time() - 1) if t.step == 2 else None)
    with pytest.raises(BudgetExceeded):
        cut.run()
    env_path = tmp_path / "cut" / "environment.json"
    env = json.loads(env_path.read_text())
    assert env["data_hashes"]["othello_pool_drawn_updates"] == "4"
    env["data_hashes"]["othello_pool_drawn_sha256"] = "0" * 64
    env_path.write_text(json.dumps(env))
    with pytest.raises(CompatibilityError, match="othello_pool_drawn_sha256"):
        Trainer(tiny(steps=4, **base), tmp_path / "cut", resume=True).run()
    # and the weights equal those of a run of 4 updates on the whole pool (an earlier run's pool file)
    full = tmp_path / "full"
    (full / "data").mkdir(parents=True)
    np.save(full / "data" / "othello-pool.npy", whole)
    kept = Trainer(tiny(steps=4, **base), full)
    kept.run()
    assert kept.data.rows is None and len(kept.data.pool) == 60
    assert (full / "model.safetensors").read_bytes() == (tmp_path / "r" / "model.safetensors").read_bytes()


def test_othello_pool_rows_are_the_whole_pools_rows():
    from originlens.train.ntp import data, pool_rows

    whole = othello_pool(40_000, 2)  # three chunks, the last one partial
    rng = np.random.default_rng(0)
    rows = np.unique(np.concatenate([rng.integers(0, 40_000, 50), [0, 16383, 16384, 39_999]]))
    np.testing.assert_array_equal(othello_pool(40_000, 2, rows), whole[rows])
    assert othello_pool(40_000, 2, np.array([], dtype=np.int64)).shape == (0, 61)
    for bad in ([3, 3], [5, 1], [40_000]):
        with pytest.raises(InputError, match="sorted, unique"):
            othello_pool(40_000, 2, np.array(bad))
    want = np.unique(np.concatenate([np.random.default_rng([4, 7, b]).integers(0, 1000, 16) for b in range(5)]))
    np.testing.assert_array_equal(pool_rows(1000, 4, 16, 5), want)
    assert data.pool_rows(10, 0, 8, 20).tolist() == list(range(10))  # every row drawn


def test_othello_pool_games_equal_the_reference_engine(monkeypatch):
    # the pool (hence every batch and the recorded pool sha256) must not depend on the engine: rows are
    # the moves the numpy reference engine plays from default_rng([seed, 11, c]) per chunk c
    import hashlib

    from originlens.tasks import BOS_ID, moves_to_tokens
    from originlens.tasks.othello import _run
    from originlens.train.ntp import data

    # frozen: sha256 of othello_pool(1000, 3)'s bytes as the numpy engine made it
    want = "4a54cf99942c45286b3836fd6b4819b42d9e6c052431f3c1bc411f9ac9749e6e"
    assert hashlib.sha256(othello_pool(1000, 3).tobytes()).hexdigest() == want
    monkeypatch.setattr(data, "POOL_CHUNK", 64)  # several chunks, the last one partial
    n, seed = 150, 5
    ref = np.empty((n, 61), dtype=np.uint8)
    ref[:, 0] = BOS_ID
    for c, a in enumerate(range(0, n, 64)):
        b = min(n, a + 64)
        u = np.random.default_rng([seed, 11, c]).random((b - a, 60))
        ref[a:b, 1:] = moves_to_tokens(_run(np.empty((b - a, 60), np.int64), u, False, 1024, compiled=False).moves)
    np.testing.assert_array_equal(data.othello_pool(n, seed), ref)


def test_othello_pool_reproduces_the_committed_runs_pool_hash():
    # the committed Othello results record the sha256 of their 500,000-game pool file; resuming or
    # attributing those runs regenerates it when absent, so the file must come out byte-identical
    import hashlib
    import io
    from pathlib import Path

    rec = Path(__file__).resolve().parents[2] / "results" / "othello" / "othello-cpu" / "seed-0.json"
    if not rec.is_file():
        pytest.skip("committed Othello results not in this tree")
    r = json.loads(rec.read_text())
    assert r["unit"] == "seed-0"
    buf = io.BytesIO()
    np.save(buf, othello_pool(r["config_key"]["ntp"]["othello_pool"], 0), allow_pickle=False)  # as atomic_save_npy
    assert hashlib.sha256(buf.getvalue()).hexdigest() == r["values"]["data_hashes"]["othello_pool_sha256"]


def test_language_task_from_a_token_array(tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "tok.npy", rng.integers(0, 30, size=(60, 9)).astype(np.uint16))
    cfg = tiny(task="language", corpus=str(tmp_path / "tok.npy"), n_layer=1, eval_size=20, steps=3, eval_every=0)
    res = Trainer(cfg, tmp_path / "r").run()
    assert res.step == 3 and math.isfinite(res.final_eval["eval_loss"]) and res.probe_summary == {}
    with pytest.raises(ConfigError, match="eval_size"):
        Trainer(cfg.replace(eval_size=60), tmp_path / "r2")


def test_resume_refuses_data_changed_in_place(tmp_path):
    """A bare token array rewritten in place (same shape and vocabulary, other windows): resuming is a
    CompatibilityError naming the changed hashes, and environment.json keeps the original ones."""
    rng = np.random.default_rng(0)
    np.save(tmp_path / "tok.npy", rng.integers(0, 30, size=(60, 9)).astype(np.uint16))
    cfg = tiny(
        task="language",
        corpus=str(tmp_path / "tok.npy"),
        n_layer=1,
        eval_size=20,
        steps=4,
        eval_every=0,
        checkpoint_every=2,
    )
    Trainer(cfg.replace(steps=2), tmp_path / "r").run()
    env_before = (tmp_path / "r" / "environment.json").read_text()
    np.save(tmp_path / "tok.npy", rng.integers(0, 30, size=(60, 9)).astype(np.uint16))
    with pytest.raises(CompatibilityError, match="started on other data .*corpus_array_sha256"):
        Trainer(cfg, tmp_path / "r", resume=True).run()
    assert (tmp_path / "r" / "environment.json").read_text() == env_before
    np.save(tmp_path / "tok.npy", np.random.default_rng(0).integers(0, 30, size=(60, 9)).astype(np.uint16))
    assert Trainer(cfg, tmp_path / "r", resume=True).run().step == 4  # the original data resumes


def test_cli_train_and_resume(tmp_path, capsys):
    args = [
        "ntp",
        "train",
        "--task",
        "majority",
        "--regime",
        "untied",
        "--out",
        str(tmp_path / "r"),
        "--steps",
        "3",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--batch-size",
        "8",
        "--eval-size",
        "32",
        "--checkpoint-every",
        "2",
        "--threads",
        "1",
    ]
    assert cli_main(args) == 0
    assert "step 3" in capsys.readouterr().out
    assert json.loads((tmp_path / "r" / "config.json").read_text())["untie_at"] == [10]
    assert cli_main(args) == 2  # exists, neither --resume nor --overwrite
    assert cli_main(args + ["--resume"]) == 0
    assert "already finished" in capsys.readouterr().out


def test_runs_recorded_before_task_options_existed_stay_finished(tmp_path):
    """A field added later is left out of the identity at its default, so earlier runs stay finished."""
    from originlens.train.ntp import is_finished

    cfg = tiny(steps=2, checkpoint_every=0)
    Trainer(cfg, tmp_path / "r").run()
    assert "task_options" not in cfg.identity()
    raw = json.loads((tmp_path / "r" / "config.json").read_text())
    raw.pop("task_options")  # as written before the field existed
    (tmp_path / "r" / "config.json").write_text(json.dumps(raw))
    assert is_finished(tmp_path / "r", cfg)
    Trainer(cfg, tmp_path / "r", resume=True).run()  # no "different configuration" refusal
    other = NTPConfig(**{**cfg.to_dict(), "task_options": {"n_symbols": 3}})
    assert other.identity()["task_options"] == {"n_symbols": 3} and not is_finished(tmp_path / "r", other)


def test_lr_decay_is_a_function_of_the_update_number():
    """lr_at follows its definition: constant to update a, linear cool-down to lr/(b − a) at b, held after."""
    cfg = NTPConfig(task="majority", lr=0.4, lr_decay=[2, 6])
    want = {1: 0.4, 2: 0.4, 3: 0.4, 4: 0.3, 5: 0.2, 6: 0.1, 7: 0.1, 100: 0.1}
    for s, lr in want.items():
        assert cfg.lr_at(s) == pytest.approx(lr, rel=1e-15)
    assert NTPConfig(task="majority", lr=0.4).lr_at(10**6) == 0.4
    for bad in ([3, 3], [5, 2], [-1, 2], [1], [1.5, 3], "1,3"):
        with pytest.raises(ConfigError, match="lr_decay"):
            NTPConfig(task="majority", lr_decay=bad)
    # a run recorded before the field existed keeps its identity (the default is left out)
    assert "lr_decay" not in NTPConfig(task="majority").identity()


def test_model_options_are_nested_and_reach_the_model(tmp_path, capsys):
    """NTPConfig.model (ModelOptions) sets the GPTConfig choices beyond the shape, from Python, a mapping
    and the CLI; at the defaults it stays out of the identity, so earlier runs stay finished."""
    from dataclasses import asdict

    from originlens.train.ntp import ModelOptions, is_finished

    default = tiny(steps=2, checkpoint_every=0)
    assert "model" not in default.identity() and default.model == ModelOptions()
    gpt = default.gpt_config(7, 5)
    assert {k: getattr(gpt, k) for k in asdict(ModelOptions())} == asdict(ModelOptions())
    Trainer(default, tmp_path / "r").run()
    raw = json.loads((tmp_path / "r" / "config.json").read_text())
    raw.pop("model")  # as written before the field existed
    (tmp_path / "r" / "config.json").write_text(json.dumps(raw))
    assert is_finished(tmp_path / "r", default)

    cfg = tiny(
        regime="untied", task="majority", model={"mlp_ratio": 2, "tie_embeddings": False, "untie_init": "shared"}
    )
    assert cfg.model == ModelOptions(mlp_ratio=2, tie_embeddings=False, untie_init="shared")
    assert cfg.identity()["model"]["mlp_ratio"] == 2 and not is_finished(tmp_path / "r", cfg)
    assert NTPConfig.from_dict(cfg.to_dict()) == cfg  # round trip through JSON-able mappings
    trainer = Trainer(cfg, tmp_path / "m")
    trainer.run()
    model = trainer.model
    d = model.config.d_model
    mlp_in = [p for n, p in model.named_parameters() if n.endswith("mlp_in.weight")]
    assert model.config.mlp_ratio == 2 and model.config.tie_embeddings is False and model.config.untie_init == "shared"
    assert mlp_in and all(p.shape == (2 * d, d) for p in mlp_in)
    with pytest.raises(ConfigError, match="unknown model option"):
        tiny(model={"n_layer": 3})
    with pytest.raises(ConfigError, match="untie_init"):
        tiny(model={"untie_init": "nope"})

    args = ["ntp", "train", "--task", "majority", "--out", str(tmp_path / "c"), "--steps", "1", "--d-model", "16"]
    args += ["--heads", "2", "--batch-size", "4", "--eval-size", "8", "--threads", "1", "--mlp-ratio", "1"]
    args += ["--tie-embeddings", "false", "--dropout", "0.1"]
    assert cli_main(args) == 0
    saved = json.loads((tmp_path / "c" / "config.json").read_text())["model"]
    assert saved == {"mlp_ratio": 1, "tie_embeddings": False, "untie_init": "independent", "dropout": 0.1}
    capsys.readouterr()
