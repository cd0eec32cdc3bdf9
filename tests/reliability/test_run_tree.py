"""A run directory is tidied when a process takes its lock: symbolic links inside it are refused (they
would make the run write outside its directory) and temporary files of interrupted writes are removed."""

from __future__ import annotations

import json

import pytest

from originlens import locks
from originlens.errors import ConfigError
from originlens.runs import hold_lock, release_lock


def tiny_ntp(steps: int = 6):
    from originlens.train.ntp import NTPConfig

    return NTPConfig(
        task="cond-majority",
        d_model=16,
        n_head=2,
        batch_size=16,
        steps=steps,
        eval_size=64,
        log_every=1,
        eval_every=0,
        probe_every=0,
        checkpoint_every=3,
    )


def test_orphaned_temporaries_are_removed_on_the_next_start(tmp_path, capsys, monkeypatch):
    from originlens import progress

    monkeypatch.setattr(progress, "_VERBOSITY", None)  # status lines on
    from originlens.train.ntp import Trainer

    run = tmp_path / "run"
    Trainer(tiny_ntp(3), run).run()
    orphans = [
        run / "checkpoints" / ".step-000006.safetensors.k3j_x9qa.tmp",
        run / ".metrics.jsonl.abcdefgh.tmp",
        run / "data" / ".train.npy.ZZ00aa11.tmp",
    ]
    for o in orphans:
        o.parent.mkdir(exist_ok=True)
        o.write_bytes(b"torn")
    kept = [run / "notes.tmp", run / ".hidden.tmp", run / "checkpoints" / ".step.short.tmp"]  # not our names
    for k in kept:
        k.write_text("user's")
    nested = run / "sub-run"  # another run (own lock file): left to its own writer
    nested.mkdir()
    (nested / ".lock").write_text("")
    (nested / ".x.abcdefgh.tmp").write_text("theirs")
    capsys.readouterr()
    Trainer(tiny_ntp(6), run, resume=True).run()
    assert not any(o.exists() for o in orphans)
    assert all(k.read_text() == "user's" for k in kept) and (nested / ".x.abcdefgh.tmp").exists()
    assert "removed 3 temporary file(s) left by an interrupted write" in capsys.readouterr().err
    assert json.loads((run / "summary.json").read_text())["finished"]


@pytest.mark.parametrize("where", ["checkpoints", "metrics.jsonl", "data/deep"])
def test_a_symbolic_link_inside_a_run_is_refused_and_nothing_is_written_through_it(tmp_path, where):
    from originlens.train.ntp import Trainer

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    run = tmp_path / "run"
    link = run / where
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    with pytest.raises(ConfigError, match="is a symbolic link .* inside the run directory"):
        Trainer(tiny_ntp(), run).run()
    assert list(outside.iterdir()) == []
    assert not (run / "config.json").exists()
    assert not locks.is_held(run / ".lock")  # the refused run's lock was given back
    link.unlink()
    assert Trainer(tiny_ntp(), run).run().step == 6


def test_lm_and_sae_run_directories_refuse_links(tmp_path):
    from originlens.experiments.lm_inputs import open_lm_run as open_run

    run = tmp_path / "sae-run"
    run.mkdir()
    (run / "sae").symlink_to(tmp_path)
    with pytest.raises(ConfigError, match="symbolic link"):
        open_run(str(run), overwrite=True)


def test_the_run_directory_itself_may_be_a_link(tmp_path):
    real = tmp_path / "scratch"
    real.mkdir()
    (tmp_path / "runs").symlink_to(real)
    hold_lock(tmp_path / "runs")  # e.g. runs -> a scratch disk
    release_lock(tmp_path / "runs")
