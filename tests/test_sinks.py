"""Optional TensorBoard / W&B mirrors of the metrics log (fake tracker modules stand in for the real ones)."""

import sys
import types

import pytest

from originlens import sinks
from originlens.cli.main import main
from originlens.errors import CompatibilityError, ConfigError
from originlens.runs import RunDir


@pytest.fixture(autouse=True)
def _clean():
    yield
    sinks.close_all()
    sinks.reset_sinks()


def _fake_tensorboard(monkeypatch, calls):
    mod = types.ModuleType("torch.utils.tensorboard")

    class SummaryWriter:
        def __init__(self, log_dir):
            calls.append(("init", log_dir))

        def add_scalar(self, k, v, step):
            calls.append((k, v, step))

        def flush(self):
            pass

        def close(self):
            calls.append(("close",))

    mod.SummaryWriter = SummaryWriter
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", mod)


def test_parse_and_unknown_sink():
    assert sinks.parse_sinks(" tensorboard , wandb ") == ["tensorboard", "wandb"]
    assert sinks.parse_sinks(None) == []
    with pytest.raises(ConfigError, match="mlflow"):
        sinks.parse_sinks("mlflow")


def test_metrics_are_mirrored_to_tensorboard(tmp_path, monkeypatch):
    calls = []
    _fake_tensorboard(monkeypatch, calls)
    sinks.set_sinks("tensorboard")
    run = RunDir(tmp_path / "r")
    run.log_metrics({"step": 3, "loss": 1.5, "name": "x", "ok": True})
    run.log_metrics({"acc": 0.25})
    assert calls[0] == ("init", str(tmp_path / "r" / "tensorboard"))
    assert ("loss", 1.5, 3) in calls and ("acc", 0.25, 0) in calls
    assert not any(c[0] in ("name", "ok") for c in calls)
    assert len(run.read_metrics()) == 2  # the JSONL log is unchanged


def test_wandb_offline_and_missing_packages(tmp_path, monkeypatch):
    logged = []
    wandb = types.ModuleType("wandb")

    class Run:
        def log(self, values, step):
            logged.append((values, step))

        def finish(self):
            logged.append("finish")

    wandb.init = lambda **kw: (logged.append(kw), Run())[1]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    sinks.set_sinks(["wandb"])
    RunDir(tmp_path / "w").log_metrics({"step": 1, "loss": 2.0})
    assert logged[0]["mode"] == "offline" and logged[1] == ({"loss": 2.0}, 1)
    sinks.close_all()
    assert logged[-1] == "finish"
    monkeypatch.setitem(sys.modules, "wandb", None)  # import fails
    with pytest.raises(CompatibilityError, match="pip install wandb"):
        RunDir(tmp_path / "w2").log_metrics({"loss": 1.0})


def test_cli_flag_and_env(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setenv("ORIGINLENS_LOG_TO", "tensorboard")
    assert sinks.requested_sinks() == ["tensorboard"]
    (tmp_path / "a").mkdir()
    rc = main(["--log-to", "wandb,nope", "report", str(tmp_path / "a")])
    assert rc == 2 and "nope" in capsys.readouterr().err
    assert sinks.requested_sinks() == ["tensorboard"]  # the flag does not leak past the command


def test_wandb_run_gets_the_run_config(tmp_path, monkeypatch):
    inits = []
    wandb = types.ModuleType("wandb")

    class Run:
        def log(self, values, step):
            pass

        def finish(self):
            pass

    wandb.init = lambda **kw: (inits.append(kw), Run())[1]
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    sinks.set_sinks("wandb")
    run = RunDir(tmp_path / "w")
    run.write_config({"lr": 0.01, "model": {"layers": 2}})
    run.log_metrics({"step": 0, "loss": 1.0})
    RunDir(tmp_path / "bare").log_metrics({"loss": 1.0})  # no config.json: an empty config
    assert inits[0]["config"] == {"lr": 0.01, "model": {"layers": 2}} and inits[1]["config"] == {}


def test_missing_tracker_fails_before_the_run_directory_exists(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    monkeypatch.delenv("ORIGINLENS_LOG_TO", raising=False)
    out = tmp_path / "run"
    argv = ["--log-to", "tensorboard", "sae", "train", "--model", str(tmp_path / "m.bin"), "--corpus", "c"]
    assert main([*argv, "--site", "resid.0", "--out", str(out)]) == 2
    assert "pip install tensorboard" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(CompatibilityError, match="tensorboard"):
        sinks.set_sinks("tensorboard")
    assert sinks.requested_sinks() == []
