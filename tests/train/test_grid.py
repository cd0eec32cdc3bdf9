"""Tests for originlens.train.grid: t-intervals and the NTP-useless selection against hand-written
references, the expected-ordering checks, and a tiny end-to-end grid that skips finished runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from originlens.cli.main import main as cli_main
from originlens.errors import ConfigError, InputError
from originlens.probes import ProbeMetrics
from originlens.tasks import get_task
from originlens.train.grid import GridConfig, expectation_checks, run_dir_for, run_grid, t_interval
from originlens.train.ntp import tracked_quality


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_t_interval_matches_the_textbook_formula():
    x = [0.61, 0.74, 0.58, 0.70, 0.66]
    n = len(x)
    mean = sum(x) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in x) / (n - 1))
    lo, hi = stats.t.interval(0.95, n - 1, loc=mean, scale=sd / math.sqrt(n))
    got = t_interval(x, 0.95)
    assert got["n"] == 5 and math.isclose(got["mean"], mean) and math.isclose(got["sd"], sd)
    assert math.isclose(got["low"], lo) and math.isclose(got["high"], hi)
    assert t_interval([0.5, float("nan")])["n"] == 1 and t_interval([0.5])["low"] is None
    assert t_interval([])["mean"] is None
    # 2 seeds: t_{0.975, 1} = 12.706
    two = t_interval([0.0, 1.0])
    assert math.isclose(two["high"] - two["mean"], 12.7062047 * math.sqrt(0.5) / math.sqrt(2), rel_tol=1e-6)


def _fake_metrics(task_name: str, seed: int = 0) -> tuple[ProbeMetrics, np.ndarray]:
    task = get_task(task_name)
    batch = task.sample(50, np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    K, P, F = 3, 20, len(task.feature_names)
    pearson = rng.uniform(-1, 1, size=(K, P, F))
    types = batch.feature_types[0, 1:]  # (P, F): constant over sequences
    by_type = {t: np.where(types[None] == t, pearson, np.nan) for t in (0, 1, 2)}
    pm = ProbeMetrics(
        pearson=pearson,
        r2=pearson,
        mse=pearson,
        accuracy=pearson,
        by_type=by_type,
        layers=[0, 1, 2],
        positions=list(range(1, 21)),
        feature_names=task.feature_names,
    )
    return pm, pearson


def test_majority_useless_selection_is_positions_2_to_9_layers_1_2():
    pm, pearson = _fake_metrics("majority")
    tr = get_task("majority").tracked
    q = tracked_quality(pm, tr.layers, tr.positions, tr.features)
    # hand selection: layers 1..2, positions 2..9 (index = position − 1), all three features
    expected = np.mean([pearson[k, i - 1, f] for k in (1, 2) for i in range(2, 10) for f in range(3)])
    assert math.isclose(q["pearson_type1"], expected, rel_tol=1e-12)
    useful = np.mean([pearson[k, i - 1, f] for k in (1, 2) for i in range(10, 20) for f in range(3)])
    assert math.isclose(q["pearson_type2"], useful, rel_tol=1e-12)


def test_cond_majority_useless_selection_is_prev_is_0_at_positions_2_to_19():
    pm, pearson = _fake_metrics("cond-majority")
    tr = get_task("cond-majority").tracked
    q = tracked_quality(pm, tr.layers, tr.positions, tr.features)
    expected = np.mean([pearson[k, i - 1, 0] for k in (1, 2) for i in range(2, 20)])
    assert math.isclose(q["pearson_type1"], expected, rel_tol=1e-12)
    assert math.isnan(q["pearson_type2"])


def test_expectation_checks():
    s = lambda m, lo, hi: {"mean": m, "low": lo, "high": hi}
    stats_ = {
        "standard": s(0.9, 0.85, 0.95),
        "untied": s(0.8, 0.7, 0.9),
        "myopic": s(0.4, 0.3, 0.5),
        "myopic+untied": s(0.82, 0.5, 1.1),
    }
    c = expectation_checks("cond-majority", stats_)
    assert c["standard > myopic"] == {"holds": True, "ci_separated": True}
    assert c["untied > myopic+untied"] == {"holds": False, "ci_separated": False}
    assert set(expectation_checks("cond-majority", {"standard": stats_["standard"]})) == set()


def test_grid_config_validation(tmp_path):
    with pytest.raises(ConfigError, match="myopic\\+untied"):
        GridConfig(regimes=["standard", "splitbrain"])
    with pytest.raises(ConfigError, match="repeat"):
        GridConfig(seeds=[0, 0])
    with pytest.raises(ConfigError, match="batch_sze"):
        GridConfig(overrides={"batch_sze": 3})
    with pytest.raises(InputError, match="no finished runs"):
        run_grid(GridConfig(regimes=["standard"], seeds=[0]), tmp_path / "g", report_only=True)


@pytest.mark.slow
def test_tiny_grid_writes_cis_and_skips_finished_runs(tmp_path, capsys):
    out = tmp_path / "g"
    args = [
        "ntp",
        "grid",
        "--task",
        "cond-majority",
        "--regimes",
        "standard,myopic+untied",
        "--seeds",
        "0,1",
        "--steps",
        "4",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--batch-size",
        "8",
        "--eval-size",
        "40",
        "--checkpoint-every",
        "0",
        "--out",
        str(out),
        "--threads",
        "1",
    ]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert "trained 4, skipped 0" in printed and "myopic+untied" in printed
    g = json.loads((out / "grid.json").read_text())
    assert g["regimes"] == ["standard", "myopic+untied"] and not g["missing"]
    for regime in g["regimes"]:
        u = g["per_regime"][regime]["useless"]
        vals = [r["useless"] for r in g["runs"] if r["regime"] == regime]
        assert u["n"] == 2 and math.isclose(u["mean"], float(np.mean(vals)))
        assert u["low"] < u["mean"] < u["high"]
        assert set(g["per_regime"][regime]["useless_by_layer"]) == {"1", "2"}
    assert "standard > myopic+untied" in g["checks"]
    assert (out / "report.html").is_file() and (out / "figures" / "grid.png").is_file()
    assert run_dir_for(out, "myopic+untied", 1).name == "seed-1"
    model = run_dir_for(out, "standard", 0) / "model.safetensors"
    mtime = model.stat().st_mtime_ns
    assert cli_main(args) == 0  # re-run: everything skipped
    assert "trained 0, skipped 4" in capsys.readouterr().out
    assert model.stat().st_mtime_ns == mtime


def test_runs_trained_side_by_side_equal_runs_trained_in_turn_at_one_thread(tmp_path):
    """jobs = 2 trains in worker processes at one thread each: the same bytes as training the runs one
    after another at one thread in this process."""
    import torch

    from originlens.train.grid import GridConfig, run_dir_for, train_runs

    cfg = GridConfig(
        task="cond-majority",
        regimes=["standard", "myopic"],
        seeds=[0],
        overrides={"steps": 4, "d_model": 16, "n_layer": 1, "batch_size": 8, "eval_size": 64, "probe_size": 64},
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        done, skipped = train_runs(cfg, tmp_path / "turn", jobs=1)
    finally:
        torch.set_num_threads(threads)
    assert done == ["standard/seed-0", "myopic/seed-0"] and skipped == []
    assert train_runs(cfg, tmp_path / "side", jobs=2)[0] == done
    for regime in cfg.regimes:
        a = (run_dir_for(tmp_path / "turn", regime, 0) / "model.safetensors").read_bytes()
        b = (run_dir_for(tmp_path / "side", regime, 0) / "model.safetensors").read_bytes()
        assert a == b, regime
    assert train_runs(cfg, tmp_path / "side", jobs=2) == ([], done)  # finished runs are skipped


def test_worker_environment_is_single_threaded_and_restored(monkeypatch):
    import os

    from originlens.train.grid import WORKER_ENV, worker_environment

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with worker_environment():
        assert all(os.environ[k] == v for k, v in WORKER_ENV.items())
        assert os.environ["OMP_WAIT_POLICY"]
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OPENBLAS_NUM_THREADS" not in os.environ


def test_train_runs_past_the_deadline_stops_every_run(tmp_path):
    import time

    from originlens.errors import BudgetExceeded
    from originlens.train.grid import train_runs

    grid = GridConfig(
        task="majority",
        regimes=["standard"],
        seeds=[0, 1],
        overrides=dict(d_model=16, n_head=2, batch_size=8, steps=5, eval_size=32, checkpoint_every=0),
    )
    for jobs in (2, 1):  # runs the deadline refused are not reported as checkpointed
        with pytest.raises(
            BudgetExceeded, match=r"deadline reached: 2 not started \(standard/seed-0, standard/seed-1\)"
        ):
            train_runs(grid, tmp_path, jobs=jobs, deadline=time.time() - 1)
    assert not list(tmp_path.rglob("*.safetensors")) and not (tmp_path / "standard").exists()


def test_a_failed_run_in_a_shared_pool_leaves_no_sibling_running(tmp_path):
    from originlens.errors import InputError
    from originlens.train.grid import train_runs, worker_pool

    over = dict(d_model=16, n_head=2, batch_size=8, steps=30, eval_size=32, checkpoint_every=0)
    grid = GridConfig(task="majority", regimes=["standard"], seeds=[0, 1, 2, 3], overrides=over)
    bad = run_dir_for(tmp_path, "standard", 0)
    bad.parent.mkdir(parents=True)
    bad.write_text("not a run directory")  # this run fails at its start
    with worker_pool(2) as pool:
        with pytest.raises(InputError, match="is a file"):
            train_runs(grid, tmp_path, executor=pool)
        after_error = sorted(str(p) for p in tmp_path.rglob("*"))
    # leaving the pool waits for anything still running: nothing was, so nothing changed
    assert sorted(str(p) for p in tmp_path.rglob("*")) == after_error


def test_runs_trained_in_a_shared_worker_pool_equal_runs_trained_alone(tmp_path):
    from originlens.train.grid import train_runs, worker_pool

    over = dict(d_model=16, n_head=2, batch_size=8, steps=4, eval_size=32, checkpoint_every=0)
    a = GridConfig(task="majority", regimes=["standard"], seeds=[0, 1], overrides=over)
    b = GridConfig(task="majority", regimes=["myopic"], seeds=[0], overrides=over)
    with worker_pool(2) as pool:  # two calls, one pool (as the paper-scale run's rounds do)
        train_runs(a, tmp_path / "pool", executor=pool)
        assert train_runs(b, tmp_path / "pool", executor=pool)[0] == ["myopic/seed-0"]
    train_runs(b, tmp_path / "alone", jobs=1)
    assert (tmp_path / "pool" / "myopic" / "seed-0" / "model.safetensors").read_bytes() == (
        tmp_path / "alone" / "myopic" / "seed-0" / "model.safetensors"
    ).read_bytes()
