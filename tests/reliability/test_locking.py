"""One writer per run directory: a second process that would write the same run is refused with the
owner's pid; locks die with their process; ``--overwrite`` starts append-only records afresh."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from originlens.errors import ConfigError
from originlens.runs import exclusive, hold_lock, release_lock


@pytest.fixture()
def holder(tmp_path):
    """A separate process holding the lock of ``tmp_path/run`` until it is killed."""
    run = tmp_path / "run"
    code = (
        "import sys, time; from originlens.runs import hold_lock; hold_lock(sys.argv[1]); "
        "print('held', flush=True); time.sleep(120)"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    yield run, p
    p.kill()
    p.wait()


def test_second_ntp_writer_is_refused_with_the_owner(holder):
    from originlens.train.ntp import NTPConfig, Trainer

    run, p = holder
    with pytest.raises(ConfigError, match=f"another process \\(pid {p.pid} on "):
        Trainer(
            NTPConfig(
                task="majority", steps=1, batch_size=4, eval_size=8, d_model=8, n_head=2, n_layer=1, train_size=0
            ),
            run,
        )
    assert not (run / "config.json").exists() and not (run / "metrics.jsonl").exists()


def test_lm_runs_and_experiments_are_refused(holder, tmp_path):
    from originlens.experiments.lm_inputs import open_lm_run as open_run

    run, p = holder
    with pytest.raises(ConfigError, match="being written by another process"):
        open_run(str(run), overwrite=True)
    with pytest.raises(ConfigError, match="being written by another process"), exclusive(run):
        pass


def test_lock_dies_with_its_process(holder):
    run, p = holder
    p.kill()
    p.wait()
    hold_lock(run)  # the stale .lock file is reused, not an obstacle
    assert f"pid {os.getpid()}" in (run / ".lock").read_text()
    hold_lock(run)  # re-entrant within a process
    release_lock(run)


def test_overwrite_starts_metrics_afresh(tmp_path):
    from originlens.experiments.lm_inputs import open_lm_run as open_run

    out = tmp_path / "q"
    r = open_run(str(out), overwrite=False)
    r.log_metrics({"event": "x", "step": 1})
    r.log_metrics({"event": "x", "step": 2})
    (out / "results.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds results"):
        open_run(str(out), overwrite=False)
    r = open_run(str(out), overwrite=True)
    r.log_metrics({"event": "y", "step": 1})
    assert r.read_metrics() == [{"event": "y", "step": 1}]
    release_lock(out)
