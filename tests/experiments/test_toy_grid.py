"""The toy regime grid as an experiment, and the regression test of its science: on Conditioned Majority
standard training must learn prev_is_<0> clearly better than myopic training (pre-caching is its only
source, arXiv 2603.14087 §8).  A change that breaks the direction breaks the build."""

from __future__ import annotations

import subprocess
import sys

import pytest

from originlens.errors import ConfigError, InputError
from originlens.experiments.results import read_results
from originlens.experiments.toy_grid import GAIN_MARGIN, ToyGridConfig, gain, reanalyse_toy_grid, run_toy_grid


@pytest.fixture(scope="module")
def ci_grid(tmp_path_factory):
    out = tmp_path_factory.mktemp("grid")
    cfg = ToyGridConfig(task="cond-majority", scale="ci", seeds=[0, 1], regimes=["standard", "myopic"])
    summary = run_toy_grid(cfg, out / "exp", results=out / "res.json", command="originlens test")
    return cfg, out, summary


@pytest.mark.slow
def test_standard_beats_myopic_on_conditioned_majority(ci_grid):
    _, _, s = ci_grid
    by = {(r["regime"], r["seed"]): r for r in s["runs"]}
    for seed in (0, 1):
        std, myo = by[("standard", seed)], by[("myopic", seed)]
        # both models learn the task's output rule (a model that learned nothing measures nothing)
        assert std["legal_output_acc"] > 0.9 and myo["legal_output_acc"] > 0.9
        assert std["useless_r"] - myo["useless_r"] > 0.08, (seed, std["useless_r"], myo["useless_r"])
        assert std["useless_r"] - std["initial_useless_r"] > 0.2  # well above the untrained null
    t = s["orderings"]["standard > myopic"]
    assert t["n"] == 2 and t["diff"] > 0


@pytest.mark.slow
def test_results_file_records_what_ran(ci_grid):
    cfg, out, _ = ci_grid
    rec = read_results(out / "res.json")
    assert rec["command"] == "originlens test" and rec["seeds"] == [0, 1]
    assert rec["experiment"] == "toy-grid" and rec["name"] == "cond-majority-ci"
    assert any(d == "d_model 32 (paper 128)" for d in rec["scale"]["deviations"])
    assert "2 seeds (paper 10)" in rec["scale"]["deviations"]
    assert rec["config"]["ntp"]["untie_scope"] == "everything" and rec["config"]["ntp"]["train_size"] == 16384
    hashes = rec["data_hashes"]["standard/seed-0"]
    assert len(hashes["train_set_sha256"]) == 64 and len(hashes["eval_tokens_sha256"]) == 64
    assert hashes == rec["data_hashes"]["myopic/seed-0"]  # paired: same data per seed
    assert hashes != rec["data_hashes"]["standard/seed-1"]
    for regime in ("standard", "myopic"):
        assert rec["quality"][regime]["eval_loss"]["n"] == 2
        assert -1 <= rec["numbers"][regime]["useless_r"]["low"] <= rec["numbers"][regime]["useless_r"]["high"] <= 1
    assert (out / "exp" / "report.html").is_file() and (out / "exp" / "experiment.json").is_file()


@pytest.mark.slow
def test_rerun_resumes_nothing_and_concurrent_writers_are_refused(ci_grid):
    cfg, out, first = ci_grid
    again = run_toy_grid(cfg, out / "exp", results=out / "res2.json", command="originlens test")
    assert again["trained_this_call"] == 0
    assert again["orderings"] == first["orderings"]
    code = (
        "import sys, time; from originlens.runs import hold_lock; hold_lock(sys.argv[1]); "
        "print('held', flush=True); time.sleep(60)"
    )
    other = subprocess.Popen([sys.executable, "-c", code, str(out / "exp")], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"  # another process writes the experiment
        with pytest.raises(ConfigError, match="another process"):
            run_toy_grid(cfg, out / "exp", results=out / "res3.json")
    finally:
        other.kill()
        other.wait()
    assert not (out / "res3.json").exists()


@pytest.mark.slow
def test_gains_and_a_reanalysis_from_the_results_file(ci_grid, tmp_path):
    """Every run's gain is (r − r₀)/(1 − r₀); the orderings are tested on the gains; a reanalysis from the
    results file alone reproduces every number and names its source; another grid's file is refused."""
    cfg, out, s = ci_grid
    for r in s["runs"]:
        assert r["gain"] == (r["useless_r"] - r["initial_useless_r"]) / (1 - r["initial_useless_r"])
    by = {(r["regime"], r["seed"]): r["gain"] for r in s["runs"]}
    t = s["orderings"]["standard > myopic"]
    assert t["scale"] == "raw" and t["mean_diff"] == pytest.approx(
        sum(by[("standard", k)] - by[("myopic", k)] for k in (0, 1)) / 2, rel=1e-12
    )
    rec = read_results(out / "res.json")
    assert rec["tests"]["readings"]["margin"] == GAIN_MARGIN and set(rec["tests"]["readings"]["A"]) == {"myopic"}
    again = reanalyse_toy_grid(cfg, rec, tmp_path / "exp", results=tmp_path / "res.json", command="re")
    new = read_results(tmp_path / "res.json")
    assert [r["gain"] for r in again["runs"]] == [r["gain"] for r in s["runs"]]
    assert new["numbers"] == rec["numbers"] and new["tests"] == rec["tests"]
    assert new["data_hashes"] == rec["data_hashes"] and new["reanalysed_from"]["command"] == "originlens test"
    other = ToyGridConfig(task="cond-majority", scale="ci", seeds=[0, 1, 2], regimes=["standard", "myopic"])
    with pytest.raises(InputError, match="not a toy-grid record of this grid"):
        reanalyse_toy_grid(other, rec, tmp_path / "exp2", results=tmp_path / "res2.json")
    assert gain(0.5, 1.0) is None and gain(None, 0.2) is None and gain(0.2, 0.2) == 0.0


def test_bad_configurations_are_one_line_errors():
    with pytest.raises(ConfigError, match="counting tasks"):
        ToyGridConfig(task="othello")
    with pytest.raises(ConfigError, match="unknown scale"):
        ToyGridConfig(scale="huge")
    with pytest.raises(ConfigError, match="unknown regime"):
        ToyGridConfig(regimes=["standard", "lazy"])
    with pytest.raises(ConfigError):
        ToyGridConfig(overrides={"d_model": -3})
