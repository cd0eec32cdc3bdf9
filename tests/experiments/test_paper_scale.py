"""Tests for originlens.experiments.paper_scale (and scripts/paper_scale.py): the smoke run end to end on
the CPU (calibration, toy grids, Othello, results files, archive, summary), the plan's cuts, the deadline
of a child unit, the FLOP count, and the configuration's refusals."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from originlens.errors import ConfigError
from originlens.experiments.paper_scale import _toy_round_seconds, plan_othello, spread
from originlens.experiments.paper_scale_calibration import gpt_step_flops
from originlens.experiments.paper_scale_config import PaperScaleConfig
from originlens.experiments.paper_scale_units import run_until
from originlens.storage import read_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_smoke_run_goes_end_to_end_on_the_cpu_in_under_a_minute(tmp_path):
    out, results = tmp_path / "runs", tmp_path / "results"
    t = time.time()
    # the documented smoke line (docs/reproduce.md), its budget and directories set for the test
    import re
    import shlex

    doc = (ROOT / "docs" / "reproduce.md").read_text(encoding="utf-8")
    line = next(c for c in re.findall(r"`([^`]+)`", doc) if "scripts/paper_scale.py" in c and "--smoke" in c)
    words = shlex.split(line)[1:]  # without PYTHONPATH=src (the script finds src/ itself)
    # a 2-minute budget (the run takes ≈ 20 s): under a loaded test run the calibration is pessimistic, and
    # a unit predicted not to fit would be skipped
    extra = ["--budget-minutes", "2", "--seed-rounds", "3", "--othello-seeds", "1"]
    proc = subprocess.run(
        [sys.executable, str(ROOT / words[1]), *words[2:], *extra, "--out", str(out), "--results", str(results)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.time() - t < 60 * 1.5  # well inside the budget: under a minute plus the process's start and load
    rec = read_json(results / "paper-scale" / "smoke-cpu.json")
    cal = rec["numbers"]["calibration"]
    for key in ("toy_steps_per_second", "othello_steps_per_second", "recorded_update_seconds", "othello_step_flops"):
        assert cal[key] > 0, key
    extra = rec  # the run record's other fields sit at the top level
    assert extra["errors"] == [] and extra["wall_seconds"] < 60
    for name in ("toy-grid/cond-majority-ci.json", "toy-grid/majority-ci.json", "othello/othello-ci.json"):
        assert (results / name).is_file(), name
    assert set(extra["verdicts"]) == {"gp-cond-majority", "gp-majority", "gp-othello"}
    with tarfile.open(out / "paper-scale-runs.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("config.json") for n in names) and any(n.endswith("metrics.jsonl") for n in names)
    assert not any(n.endswith((".safetensors", ".npy")) for n in names)
    assert "claim" in proc.stdout and "gp-othello" in proc.stdout  # the summary table

    # the calibration reused by a later run on the same device (nothing measured; the toy grid still runs)
    import shutil

    from originlens.experiments.paper_scale import run_paper_scale

    shutil.copy(results / "paper-scale" / "smoke-cpu.json", tmp_path / "calibration.json")
    reuse = run_paper_scale(
        PaperScaleConfig(
            smoke=True,
            budget_minutes=1.0,
            tasks=["majority"],
            seed_rounds=[3],
            othello=False,
            calibration=str(tmp_path / "calibration.json"),
        ),
        tmp_path / "reuse",
        results=tmp_path / "reuse-results",
    )
    assert reuse["calibration"]["reused_from"] == str(tmp_path / "calibration.json")
    assert reuse["calibration"]["seconds"] == 0.0 and reuse["errors"] == []
    assert reuse["calibration"]["toy_step_seconds"] == cal["toy_step_seconds"]
    assert (tmp_path / "reuse-results" / "toy-grid" / "majority-ci.json").is_file()

    # again, in the same results root, with a budget too short for anything: the calibration keeps to its
    # share, nothing runs, and the earlier run's files (still there) are not judged as this run's

    t = time.time()
    again = run_paper_scale(
        PaperScaleConfig(smoke=True, budget_minutes=0.05, seed_rounds=[3], othello_seeds=1),
        tmp_path / "again",
        results=results,
    )
    assert time.time() - t < 3.0 + 6.0  # the budget, plus a stopped child's exit and the archive
    assert again["verdicts"] == {} and "toy" not in again["verdicts"]
    assert again["errors"] and all("calibration" in e for e in again["errors"])
    assert (results / "othello" / "othello-ci.json").is_file()  # still there, not this run's


def test_the_smoke_run_refuses_a_gpu_and_cuda_is_refused_without_one(tmp_path):
    import torch

    from originlens.experiments.paper_scale import run_paper_scale

    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is unavailable"):
            run_paper_scale(PaperScaleConfig(device="cuda"), tmp_path / "o", results=tmp_path / "r")
        assert not (tmp_path / "o").exists()  # nothing written before the device is known


def test_a_calibration_is_reused_only_on_its_device_and_precision(tmp_path):
    from originlens.experiments.paper_scale import reused_calibration, run_paper_scale

    path = ROOT / "results" / "paper-scale" / "cuda-2.25min.json"  # measured on an H200, TF32
    cal = reused_calibration(path, "NVIDIA H200", "tf32")
    assert cal["reused_from"] == str(path) and cal["seconds"] == 0.0 and cal["othello_step_seconds"] > 0
    with pytest.raises(ConfigError, match="calibrated on 'NVIDIA H200', this run is on 'cpu'"):
        reused_calibration(path, "cpu", "tf32")
    with pytest.raises(ConfigError, match="matmul precision 'tf32'"):
        reused_calibration(path, "NVIDIA H200", "highest")
    with pytest.raises(ConfigError, match="not a paper-scale results file"):
        reused_calibration(ROOT / "results" / "toy-grid" / "majority-cpu.json", "cpu", "tf32")
    with pytest.raises(ConfigError, match="this run is on 'cpu'"):
        run_paper_scale(PaperScaleConfig(device="cpu", calibration=str(path)), tmp_path / "o", results=tmp_path / "r")
    assert not (tmp_path / "o").exists()  # refused before anything is written


@pytest.mark.parametrize(
    "kw",
    [
        dict(budget_minutes=0),
        dict(tasks=["othello"]),
        dict(seed_rounds=[5, 3]),
        dict(jobs=-1),
        dict(toy_share=1.5),
        dict(othello_seeds=0),
        dict(toy_steps=0),
        dict(device="tpu"),
        dict(matmul_precision="bf16"),
    ],
)
def test_config_refusals(kw):
    with pytest.raises(ConfigError):
        PaperScaleConfig(**kw)


CAL = dict(
    othello_step_seconds=0.067,
    decomposed_update_seconds=4.2,
    recorded_update_seconds=10.5,
    attribution_fixed_seconds=20.0,
    othello_other_seconds=4.5,
)
PAPER = dict(steps=5000, n_layer=6, positions=list(range(4, 57, 4)), strata=10, burn_in=50, stratum_updates=50)


def test_the_othello_plan_never_cuts_training_and_cuts_seeds_then_positions_then_strata():
    full = plan_othello(1e9, CAL, PAPER, 3)
    assert full is not None
    assert (full["steps"], full["positions"], full["strata"], full["seeds"]) == (5000, PAPER["positions"], 10, 3)
    assert full["sampled_fraction"] == pytest.approx(10 * 50 / 5000)
    plans, seconds = [], full["predicted_seconds"]
    while (p := plan_othello(seconds, CAL, PAPER, 3)) is not None:  # down to the cheapest plan there is
        assert p["predicted_seconds"] <= seconds and p["steps"] == 5000  # training is never cut
        plans.append((-p["seeds"], -len(p["positions"]), -p["strata"]))
        seconds *= 0.97
    assert plans == sorted(plans)  # each cut only after the one before it is exhausted, in the stated order
    assert plans[-1] == (-1, -1, -1)
    one = plan_othello(seconds / 0.97, CAL, PAPER, 3)
    assert one is not None and len(one["positions"]) == 1 and one["check_positions"] == one["positions"]
    # one seed's full training alone does not fit: nothing is planned (no early prefix instead)
    assert plan_othello(5000 * CAL["othello_step_seconds"], CAL, PAPER, 3) is None


def test_positions_are_cut_evenly_over_the_game():
    ps = list(range(4, 57, 4))
    assert spread(ps, 14) == ps and spread(ps, 2) == [4, 56] and spread(ps, 1) == [32]
    assert spread(ps, 4) == [4, 20, 40, 56]


def test_the_toy_round_prediction_uses_the_measured_rate_first():
    cal = {"device": "cuda", "toy_step_seconds": 0.008, "toy_other_seconds": 2.0}
    assert _toy_round_seconds(3.0, 40, cal, 3000, 16) == 120.0
    cpu = dict(cal, device="cpu")
    assert _toy_round_seconds(None, 8, cpu, 100, 2) == pytest.approx(8 * (0.8 + 4.0) / 2 + 2.0)
    with_setup = dict(cpu, toy_setup_seconds=1.5)  # once per worker, not per run
    assert _toy_round_seconds(None, 8, with_setup, 100, 2) == pytest.approx(8 * (0.8 + 4.0) / 2 + 3.5)


def test_gpt_step_flops_counts_the_projections_attention_and_unembedding():
    # one layer, d = 2, ratio 4, T = 3, |V| = 5, batch 1: per token 2·12·4 + 2·3·2 = 108, unembed 2·2·5 = 20
    assert gpt_step_flops(1, 2, 5, 1, 3) == 3.0 * (108 + 20) * 3


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _fail() -> None:
    raise SystemExit(3)


def _refuse() -> None:
    raise ConfigError("no such thing", "ask for another")


def _crash() -> None:
    raise RuntimeError("device lost\n  (details)")


def test_the_stop_grace_stays_inside_the_reserve():
    from originlens.experiments.paper_scale import Clock

    for budget, reserve in ((480.0, 20.0), (135.0, 13.5), (6.0, 0.6)):
        c = Clock(budget, reserve)
        assert c.grace <= reserve / 2 and c.grace <= 15.0
        assert c.left() == pytest.approx(budget - reserve, abs=0.5)


def test_a_unit_past_its_deadline_is_stopped():
    t = time.time()
    assert run_until(_sleep, (60.0,), 2.0, grace=2.0) == "deadline"
    assert time.time() - t < 30
    assert run_until(_sleep, (0.0,), 60.0) == "finished"
    assert run_until(_fail, (), 60.0) == "failed (exit code 3)"


def test_a_unit_that_fails_reports_one_line_not_a_traceback(capfd):
    # the error line comes back for the run's record, and stderr has it once, without a traceback
    assert run_until(_refuse, (), 60.0) == "failed (exit code 2): error: no such thing — fix: ask for another"
    assert run_until(_crash, (), 60.0) == "failed (exit code 1): RuntimeError: device lost (details)"
    err = capfd.readouterr().err
    assert "paper-scale unit: error: no such thing — fix: ask for another" in err and "Traceback" not in err
    t = time.time()
    assert run_until(_sleep, (60.0,), 0.0) == "deadline" and time.time() - t < 1.0  # no time: not started


def test_the_cli_command_parses():
    from originlens.cli.main import build_parser

    args = build_parser().parse_args(["ntp", "experiment", "paper-scale", "--budget-minutes", "3", "--smoke"])
    assert args.budget_minutes == 3.0 and args.smoke and args.seed_rounds == [3, 5, 10]


def test_the_step_alone_is_timed_with_nothing_else_in_its_window():
    """step_seconds: ≥ 20 updates after a warm-up, no host read inside (no loss read, no token check),
    fp32 and bf16 in the same harness; the plan takes the step alone where the calibration has it."""
    import torch

    from originlens.counting import count_dispatch
    from originlens.experiments.paper_scale import othello_step
    from originlens.experiments.paper_scale_calibration import STEP_WINDOW, step_seconds
    from originlens.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, seq_len=9, n_layer=1, d_model=8, n_head=2))
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 11, (4, 9), generator=g) for _ in range(STEP_WINDOW + 3)]
    before = [p.detach().clone() for p in model.parameters()]
    with count_dispatch() as counts:
        fp32 = step_seconds(model, batches)
    assert fp32["updates"] == STEP_WINDOW and fp32["seconds"] > 0 and fp32["precision"] == "fp32"
    # torch's Adam reads its step counters (CPU scalars on every device); nothing else is read
    assert set(counts.host_reads) <= {"item"}, counts.host_reads
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # a copy was trained
    bf16 = step_seconds(model, batches, precision="bf16")
    assert bf16["seconds"] > 0 and bf16["precision"] == "bf16"
    with pytest.raises(ValueError, match="no update"):
        step_seconds(model, batches[:3])
    with pytest.raises(ValueError, match="precision"):
        step_seconds(model, batches, precision="fp8")
    assert othello_step({"othello_step_seconds": 2.0}) == 2.0
    assert othello_step({"othello_step_seconds": 2.0, "othello_step_alone": {"fp32": {"seconds": 0.5}}}) == 0.5
