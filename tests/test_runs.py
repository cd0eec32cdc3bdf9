"""``originlens.runs``: the one definition of checkpoint file names, shared by both trainers and the
leading-term tracking."""

from __future__ import annotations

from originlens.runs import RunDir, checkpoint_name, list_checkpoints
from originlens.theory.tracking import checkpoint_files


def test_checkpoint_names_round_trip_and_foreign_files_are_ignored(tmp_path):
    run = RunDir(tmp_path / "run")
    for step in (12, 3, 1_000_000):
        (run.path / "checkpoints" / checkpoint_name(step)).write_bytes(b"")
    for name in ("step-12.safetensors", ".step-000004.safetensors.abcdefgh.tmp", "step-000005.json", "notes.txt"):
        (run.path / "checkpoints" / name).write_bytes(b"")
    got = list_checkpoints(run.path)
    assert [s for s, _ in got] == [3, 12, 1_000_000]
    assert [p.name for _, p in got] == [
        "step-000003.safetensors",
        "step-000012.safetensors",
        "step-1000000.safetensors",
    ]
    assert checkpoint_files(run.path) == got


def test_a_run_without_checkpoints_lists_none(tmp_path):
    assert list_checkpoints(tmp_path / "missing") == [] and list_checkpoints(tmp_path) == []
