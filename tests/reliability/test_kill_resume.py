"""Crash safety: SIGKILL at chosen and at arbitrary moments, full disk, read-only output.

* ``ntp train`` / ``assoc train``: the command runs in a subprocess and is killed (``_killpoint.py``):
  right after a checkpoint is published, in the middle of a checkpoint write (a torn temporary file on
  disk), after the final model is written but before the summary, and (NTP) by the test itself as soon
  as a checkpoint file appears.  Rerunning the same command with ``--resume`` must end with weights,
  checkpoints and metrics bit-identical to an uninterrupted run.
* ``corpus build`` / ``stats``: killed mid-way, before the output directory is published and while the
  previous version is being replaced; the final name is then absent or the previous good version, never
  a half-written one, and a rerun succeeds with the same bytes as an uninterrupted build.
* A kill between the two renames of a replacement (or after it, before the old copy is deleted) is
  repaired by the next run of the same command: the previous version is put back, dead leftovers removed.
* ``assoc train``'s ``checkpoint`` records follow their files; a lost one is logged again on resume.
* A full disk (ENOSPC injected in-process) or a read-only checkpoint directory stops training with one
  clear line; the previous checkpoint is intact and the run resumes to the same weights.

Everything runs on CPU with one thread; the subprocesses dominate the time (≈3 s of imports each).
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _helpers import SUBPROCESS_ENV, assert_killed, assert_same_tensors, jsonl, normalise, run_cli, tensors

from originlens.cli.main import main as cli_main
from originlens.storage import load_tensors

NTP = [
    "ntp",
    "train",
    "--task",
    "cond-majority",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--batch-size",
    "16",
    "--steps",
    "12",
    "--eval-size",
    "64",
    "--log-every",
    "1",
    "--eval-every",
    "0",
    "--probe-every",
    "0",
    "--checkpoint-every",
    "5",
    "--threads",
    "1",
]
NTP_CKPTS = ("step-000005", "step-000010", "step-000012")


def in_process(args, capsys=None) -> int:
    rc = cli_main(["-q", *map(str, args)])
    return rc


def metric_records(run: Path) -> list[dict]:
    return [normalise(r) for r in jsonl(run / "metrics.jsonl")]


def assert_same_ntp_run(run: Path, ref: Path) -> None:
    assert json.loads((run / "summary.json").read_text())["finished"]
    assert_same_tensors(run / "model.safetensors", ref / "model.safetensors")
    assert_same_tensors(run / "probes.safetensors", ref / "probes.safetensors")
    for c in NTP_CKPTS:
        assert_same_tensors(run / "checkpoints" / f"{c}.safetensors", ref / "checkpoints" / f"{c}.safetensors")
    # no missing records, none duplicated (the final eval/probe records are logged once)
    assert metric_records(run) == metric_records(ref)


@pytest.fixture(scope="module")
def ntp_ref(tmp_path_factory):
    ref = tmp_path_factory.mktemp("ntp") / "ref"
    assert in_process([*NTP, "--out", ref]) == 0
    return ref


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from originlens.data import build_corpus

    d = tmp_path_factory.mktemp("corpus") / "corpus"
    build_corpus(None, d, storyworld_stories=120, vocab_size=80, seq_len=10, oov="unk")
    return d


def assoc_args(corpus: Path) -> list:
    return [
        "assoc",
        "train",
        corpus,
        "--n-layers",
        "2",
        "--lr",
        "0.5",
        "--steps",
        "6",
        "--batch-size",
        "32",
        "--checkpoint-every",
        "2",
        "--holdout",
        "10",
        "--dtype",
        "float64",
        "--threads",
        "1",
    ]


@pytest.fixture(scope="module")
def assoc_ref(corpus, tmp_path_factory):
    ref = tmp_path_factory.mktemp("assoc") / "ref"
    assert in_process([*assoc_args(corpus), "--out", ref]) == 0
    return ref


def assert_same_assoc_run(run: Path, ref: Path) -> None:
    assert_same_tensors(run / "model.safetensors", ref / "model.safetensors")
    for c in ("step-000002", "step-000004", "step-000006"):
        assert_same_tensors(run / "checkpoints" / f"{c}.safetensors", ref / "checkpoints" / f"{c}.safetensors")
    assert_same_tensors(run / "statistics" / "statistics.safetensors", ref / "statistics" / "statistics.safetensors")
    roots = {str(run): "<RUN>", str(ref): "<RUN>"}
    got = [normalise(r, roots) for r in jsonl(run / "metrics.jsonl") if r["event"] != "resume"]
    want = [normalise(r, roots) for r in jsonl(ref / "metrics.jsonl")]
    # the "checkpoint" record (theory comparison) is logged after the checkpoint file: a kill in between
    # loses it, and the resumed run logs it again, so all records are identical
    assert got == want


# --------------------------------------------------------------------------------------------- ntp train


@pytest.mark.slow
def test_ntp_train_killed_at_four_points_resumes_bit_identically(ntp_ref, tmp_path):
    run = tmp_path / "run"
    ck = run / "checkpoints"
    # 1. killed while setting up, before config.json exists (the directory is there, empty)
    assert_killed(run_cli([*NTP, "--out", run], kill={"op": "call", "target": "originlens.runs:RunDir.write_config"}))
    assert not (run / "config.json").exists()
    # 2. killed right after the first checkpoint was published
    assert_killed(
        run_cli(
            [*NTP, "--out", run, "--resume"],
            kill={"op": "replace", "match": "*/checkpoints/step-000005.safetensors", "when": "after"},
        )
    )
    assert_same_tensors(ck / "step-000005.safetensors", ntp_ref / "checkpoints" / "step-000005.safetensors")
    assert not (run / "model.safetensors").exists() and not (run / "summary.json").exists()
    # 3. killed in the middle of writing the second checkpoint: a torn temporary file, never the final name
    assert_killed(
        run_cli(
            [*NTP, "--out", run, "--resume"],
            kill={"op": "write", "match": "*/checkpoints/.step-000010.safetensors.*.tmp"},
        )
    )
    torn = [p for p in ck.iterdir() if p.name.startswith(".step-000010")]
    assert torn and not (ck / "step-000010.safetensors").exists()
    assert torn[0].stat().st_size < (ntp_ref / "checkpoints" / "step-000010.safetensors").stat().st_size
    assert_same_tensors(ck / "step-000005.safetensors", ntp_ref / "checkpoints" / "step-000005.safetensors")
    # 4. killed near the end: final model written, summary not yet
    assert_killed(
        run_cli(
            [*NTP, "--out", run, "--resume"], kill={"op": "replace", "match": "*/model.safetensors", "when": "after"}
        )
    )
    assert not (run / "summary.json").exists()
    # the same command with --resume finishes the run
    assert in_process([*NTP, "--out", run, "--resume"]) == 0
    assert_same_ntp_run(run, ntp_ref)


def test_ntp_resume_after_the_final_checkpoint_does_not_duplicate_metrics(ntp_ref, tmp_path):
    """The final eval/probe records precede the final checkpoint (same step); a run killed after that
    checkpoint re-evaluates on resume and must log them once, ending identical to an uninterrupted run."""
    run = tmp_path / "run"
    assert in_process([*NTP, "--out", run]) == 0
    for name in ("summary.json", "model.safetensors", "probes.safetensors", "probe_metrics.npz"):
        (run / name).unlink()  # the state of a run killed right after its last checkpoint
    assert in_process([*NTP, "--out", run, "--resume"]) == 0
    assert [r["event"] for r in metric_records(run)][-3:] == ["train", "eval", "probe"]
    assert_same_ntp_run(run, ntp_ref)


@pytest.mark.slow
def test_ntp_train_killed_from_outside_when_a_checkpoint_appears(tmp_path):
    args = [a if a != "12" else "80" for a in NTP]  # 80 steps: long enough to be caught mid-way
    ref = tmp_path / "ref"
    assert in_process([*args, "--out", ref]) == 0
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "originlens", "-q", *args, "--out", str(run)],
        env=SUBPROCESS_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    first = run / "checkpoints" / "step-000005.safetensors"
    deadline = time.time() + 120
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.returncode == 0:  # pragma: no cover - the run outpaced the polling; nothing to resume
        pytest.skip("the run finished before it could be killed")
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
    assert not (run / "model.safetensors").exists()
    assert in_process([*args, "--out", run, "--resume"]) == 0
    assert_same_tensors(run / "model.safetensors", ref / "model.safetensors")
    assert metric_records(run) == metric_records(ref)


def _fsync_fails_for(monkeypatch, pattern: str) -> None:
    """Simulate a full disk: fsync of a file whose path contains ``pattern`` raises ENOSPC."""
    real = os.fsync

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if pattern in path:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def test_ntp_full_disk_at_checkpoint_keeps_previous_and_resumes(ntp_ref, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _fsync_fails_for(monkeypatch, ".step-000010.safetensors.")
    assert in_process([*NTP, "--out", run]) == 2
    err = capsys.readouterr().err
    assert err.startswith("originlens: error: no space left on device") and err.count("\n") == 1, err
    assert "step-000010" in err
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step-000005.safetensors"]  # no temp litter
    assert_same_tensors(ck / "step-000005.safetensors", ntp_ref / "checkpoints" / "step-000005.safetensors")
    monkeypatch.undo()  # space freed
    assert in_process([*NTP, "--out", run, "--resume"]) == 0
    assert_same_ntp_run(run, ntp_ref)


def test_ntp_full_disk_while_logging_metrics_is_a_clear_error(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _fsync_fails_for(monkeypatch, "metrics.jsonl")
    assert in_process([*NTP, "--out", run]) == 2
    err = capsys.readouterr().err
    assert err.startswith("originlens: error: no space left on device") and "metrics.jsonl" in err, err


def test_ntp_read_only_checkpoint_directory(ntp_ref, tmp_path, read_only, capsys):
    run = tmp_path / "run"
    short = [a if a != "12" else "5" for a in NTP]  # a finished 5-step run, then extended to 12
    assert in_process([*short, "--out", run]) == 0
    read_only(run / "checkpoints")
    assert in_process([*NTP, "--out", run, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("originlens: error: cannot write") and "step-000010" in err and err.count("\n") == 1, err
    assert_same_tensors(
        run / "checkpoints" / "step-000005.safetensors", ntp_ref / "checkpoints" / "step-000005.safetensors"
    )


def test_ntp_read_only_output_parent(tmp_path, read_only, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    read_only(parent)
    assert in_process([*NTP, "--out", parent / "run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("originlens: error: cannot write") and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------------- assoc train


@pytest.mark.slow
def test_assoc_train_killed_at_three_points_resumes_bit_identically(corpus, assoc_ref, tmp_path):
    run = tmp_path / "run"
    args = [*assoc_args(corpus), "--out", run]
    ck = run / "checkpoints"
    assert_killed(
        run_cli(args, kill={"op": "replace", "match": "*/checkpoints/step-000002.safetensors", "when": "after"})
    )
    assert_same_tensors(ck / "step-000002.safetensors", assoc_ref / "checkpoints" / "step-000002.safetensors")
    assert_killed(
        run_cli([*args, "--resume"], kill={"op": "write", "match": "*/checkpoints/.step-000004.safetensors.*.tmp"})
    )
    assert not (ck / "step-000004.safetensors").exists()
    assert_killed(run_cli([*args, "--resume"], kill={"op": "replace", "match": "*/model.safetensors", "when": "after"}))
    assert in_process([*args, "--resume"]) == 0
    assert_same_assoc_run(run, assoc_ref)


@pytest.mark.slow
def test_assoc_train_killed_before_config_is_written_resumes(corpus, assoc_ref, tmp_path):
    run = tmp_path / "run"
    args = [*assoc_args(corpus), "--out", run]
    assert_killed(run_cli(args, kill={"op": "call", "target": "originlens.runs:RunDir.write_config"}))
    assert in_process([*args, "--resume"]) == 0
    assert_same_assoc_run(run, assoc_ref)


def test_assoc_checkpoint_record_follows_its_file(corpus, assoc_ref, tmp_path, monkeypatch):
    """Atomic order: when a "checkpoint" record is appended to metrics.jsonl, the checkpoint it names is
    complete under its final name; a kill right after the file (before the record) loses the record, and
    the resumed run logs it again."""
    from originlens.runs import RunDir
    from originlens.train.assoc import CHECKPOINT_KIND

    seen = []
    real = RunDir.log_metrics

    def log_metrics(self, record, name="metrics.jsonl"):
        if record.get("event") == "checkpoint":
            f = self.path / record["path"]
            load_tensors(f, kind=CHECKPOINT_KIND)  # complete and readable
            assert not [p for p in f.parent.iterdir() if p.name.startswith(".")]  # no temporary left
            seen.append(record["step"])
        return real(self, record, name)

    monkeypatch.setattr(RunDir, "log_metrics", log_metrics)
    run = tmp_path / "run"
    args = [*assoc_args(corpus), "--out", run]
    assert in_process(args) == 0
    assert seen == [2, 4, 6]
    monkeypatch.undo()
    # killed after the step-4 file is published, before its record: the record is absent, then re-logged
    run2 = tmp_path / "run2"
    args2 = [*assoc_args(corpus), "--out", run2]
    assert_killed(
        run_cli(args2, kill={"op": "replace", "match": "*/checkpoints/step-000004.safetensors", "when": "after"})
    )
    assert [r["step"] for r in jsonl(run2 / "metrics.jsonl") if r["event"] == "checkpoint"] == [2]
    assert in_process([*args2, "--resume"]) == 0
    assert_same_assoc_run(run2, assoc_ref)


def test_assoc_resumed_when_finished_reports_the_real_losses(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    args = [*assoc_args(corpus), "--out", run]
    assert in_process(args) == 0
    first_line = capsys.readouterr().out.strip().splitlines()[-1]
    assert in_process([*args, "--resume"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    steps = [r for r in jsonl(run / "metrics.jsonl") if r["event"] == "step"]
    assert "nan" not in line and "already finished at step 6/6" in line, line
    assert f"loss {steps[0]['loss']:.4f} → {steps[-1]['loss']:.4f}" in line, line
    assert line.split("loss ")[1].split(" (ln")[0] == first_line.split("loss ")[1].split(" (ln")[0]
    assert "final cosines" in line and line.split("final cosines")[1] == first_line.split("final cosines")[1]


def test_assoc_full_disk_at_checkpoint_keeps_previous_and_resumes(corpus, assoc_ref, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    args = [*assoc_args(corpus), "--out", run]
    _fsync_fails_for(monkeypatch, ".step-000004.safetensors.")
    assert in_process(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("originlens: error: no space left on device") and err.count("\n") == 1, err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002.safetensors"]
    assert_same_tensors(
        run / "checkpoints" / "step-000002.safetensors", assoc_ref / "checkpoints" / "step-000002.safetensors"
    )
    monkeypatch.undo()
    assert in_process([*args, "--resume"]) == 0
    assert_same_assoc_run(run, assoc_ref)


# ------------------------------------------------------------------------------------ corpus build, stats


def _visible(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if not p.name.startswith("."))


def _hidden(parent: Path) -> list[str]:
    """Hidden leftovers of a build; the lock files (``.NAME.lock``) stay by design (originlens.locks)."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock"))


CORPUS = ["corpus", "build", "--stories", "150", "--vocab-size", "80", "--seq-len", "10", "--oov", "unk"]


@pytest.mark.slow
def test_corpus_build_killed_never_leaves_a_complete_looking_directory(tmp_path):
    ref = tmp_path / "ref"
    assert in_process([*CORPUS, "--out", ref / "corpus"]) == 0
    parent = tmp_path / "work"
    out = parent / "corpus"
    # mid-way through encoding (50th window): only a hidden partial directory exists
    assert_killed(
        run_cli([*CORPUS, "--out", out], kill={"op": "call", "target": "originlens.data.build:_Windows.add", "nth": 50})
    )
    assert _visible(parent) == [] and all(".corpus.partial-" in n for n in _hidden(parent))
    # a complete build succeeds next to the debris
    assert in_process([*CORPUS, "--out", out]) == 0
    previous = (out / "tokens.npy").read_bytes()
    assert previous == (ref / "corpus" / "tokens.npy").read_bytes()
    # rebuilding over it (--overwrite), killed when the new version is complete but not yet published:
    # the previous version stays
    assert_killed(
        run_cli(
            [*CORPUS, "--seed", "1", "--out", out, "--overwrite"],
            kill={"op": "replace", "match": str(parent / ".corpus.old-*"), "when": "before"},
        )
    )
    assert (out / "tokens.npy").read_bytes() == previous
    assert json.loads((out / "manifest.json").read_text())["seed"] == 0
    # killed after the previous version was moved aside (outputs.atomic_directory's caveat: renaming over a
    # directory is not atomic): the final name does not exist at all, nothing half-written is visible
    assert_killed(
        run_cli(
            [*CORPUS, "--seed", "1", "--out", out, "--overwrite"],
            kill={"op": "replace", "match": str(parent / ".corpus.old-*"), "when": "after"},
        )
    )
    assert _visible(parent) == []
    assert in_process([*CORPUS, "--out", out, "--overwrite"]) == 0
    assert (out / "tokens.npy").read_bytes() == previous


@pytest.mark.slow
def test_stats_killed_keeps_previous_statistics_and_rerun_succeeds(corpus, tmp_path):
    out = tmp_path / "stats"
    assert in_process(["stats", corpus, "--out", out]) == 0
    before = tensors(out / "statistics.safetensors")
    # a different computation (first 20 windows) torn while writing its statistics file
    assert_killed(
        run_cli(
            ["stats", corpus, "--max-windows", "20", "--out", out],
            kill={"op": "write", "match": "*/.stats.partial-*/.statistics.safetensors.*.tmp"},
        )
    )
    assert _visible(tmp_path) == ["stats"]
    after = tensors(out / "statistics.safetensors")
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)
    assert in_process(["stats", corpus, "--max-windows", "20", "--out", out]) == 0
    assert tensors(out / "statistics.safetensors")["bigram"].shape == before["bigram"].shape


@pytest.mark.slow
def test_kill_between_the_renames_is_repaired_by_the_next_run(corpus, tmp_path):
    """Replacing an output directory is two renames (old one aside, new one in place).  A SIGKILL between
    them leaves no directory at the final name; the next run of the same command puts the previous
    version back before it starts and removes the dead run's hidden leftovers (outputs.atomic_directory)."""
    out = tmp_path / "stats"
    assert in_process(["stats", corpus, "--out", out]) == 0
    before = (out / "statistics.safetensors").read_bytes()
    cmd = ["stats", corpus, "--max-windows", "20", "--out", out]
    assert_killed(run_cli(cmd, kill={"op": "replace", "match": str(tmp_path / ".stats.old-*"), "when": "after"}))
    assert _visible(tmp_path) == []
    first = _hidden(tmp_path)
    assert len(first) == 2 and first[0].startswith(".stats.old-") and first[1].startswith(".stats.partial-")
    # the next run of the same command, itself killed before it publishes: the previous version is back
    # (restored at its start) and only this run's own partial directory is left
    assert_killed(run_cli(cmd, kill={"op": "replace", "match": str(tmp_path / ".stats.old-*"), "when": "before"}))
    assert _visible(tmp_path) == ["stats"] and (out / "statistics.safetensors").read_bytes() == before
    second = _hidden(tmp_path)
    assert len(second) == 1 and second[0].startswith(".stats.partial-") and second[0] not in first
    # killed after the new version is in place but before the old one is deleted
    assert_killed(run_cli(cmd, kill={"op": "replace", "match": str(out), "when": "after"}))
    assert _visible(tmp_path) == ["stats"] and [h[:11] for h in _hidden(tmp_path)] == [".stats.old-"]
    # a complete run cleans everything up
    assert in_process(cmd) == 0
    assert _visible(tmp_path) == ["stats"] and _hidden(tmp_path) == []
    ref = tmp_path / "ref"
    assert in_process(["stats", corpus, "--max-windows", "20", "--out", ref / "stats"]) == 0
    assert_same_tensors(out / "statistics.safetensors", ref / "stats" / "statistics.safetensors")


def test_stats_full_disk_and_read_only_keep_previous(corpus, tmp_path, monkeypatch, read_only, capsys):
    out = tmp_path / "p" / "stats"
    assert in_process(["stats", corpus, "--out", out]) == 0
    before = (out / "statistics.safetensors").read_bytes()
    _fsync_fails_for(monkeypatch, "statistics.safetensors")
    assert in_process(["stats", corpus, "--max-windows", "20", "--out", out]) == 2
    assert capsys.readouterr().err.startswith("originlens: error: no space left on device")
    monkeypatch.undo()
    assert (out / "statistics.safetensors").read_bytes() == before and _visible(out.parent) == ["stats"]
    assert _hidden(out.parent) == []  # the partial directory was removed
    read_only(out.parent)
    assert in_process(["stats", corpus, "--max-windows", "20", "--out", out]) == 2
    err = capsys.readouterr().err
    assert err.startswith("originlens: error: cannot write") and err.count("\n") == 1, err
    assert (out / "statistics.safetensors").read_bytes() == before


# ------------------------------------------------------------------ SIGTERM / SIGINT: checkpoint, then stop


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_ntp_train_signal_checkpoints_the_current_update_and_resumes_bit_identically(ntp_ref, tmp_path, sig):
    from originlens.interrupts import Interrupted
    from originlens.train.ntp import NTPConfig, Trainer

    cfg = NTPConfig(
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
    run = tmp_path / "run"
    tr = Trainer(cfg, run)
    # what the handlers were before (a pytest-xdist worker starts with SIGINT ignored; other tests may
    # have installed Python's default handler): the trainer must put back exactly these
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    tr.callbacks["on_step_end"].append(lambda t: os.kill(os.getpid(), sig) if t.step == 7 else None)
    with pytest.raises(Interrupted) as exc:
        tr.run()
    name = signal.Signals(sig).name
    assert exc.value.signal_name == name and exc.value.exit_code == (143 if sig == signal.SIGTERM else 130)
    assert f"{name} at update 7/12" in exc.value.message and "step-000007.safetensors" in exc.value.message
    assert (run / "checkpoints" / "step-000007.safetensors").is_file()  # the update it was in
    assert not (run / "model.safetensors").exists()
    assert {s: signal.getsignal(s) for s in before} == before  # handlers restored
    assert in_process([*NTP, "--out", run, "--resume"]) == 0
    assert_same_tensors(run / "model.safetensors", ntp_ref / "model.safetensors")
    assert metric_records(run) == metric_records(ntp_ref)


def test_ntp_train_sigterm_from_outside_is_one_line_and_resumes(tmp_path):
    args = [a if a != "12" else "400" for a in NTP]
    args[args.index("--checkpoint-every") + 1] = "100"
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "originlens", "-q", *args, "--out", str(run)],
        env=SUBPROCESS_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    metrics = run / "metrics.jsonl"
    while (not metrics.exists() or metrics.stat().st_size == 0) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:  # pragma: no cover - the run outpaced the polling
        pytest.skip("the run finished before the signal")
    assert proc.returncode == 143, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("originlens: interrupted by SIGTERM at update "), err
    step = int(lines[0].split("at update ")[1].split("/")[0])
    assert (run / "checkpoints" / f"step-{step:06d}.safetensors").is_file() and "--resume" in lines[0]
    assert in_process([*args, "--out", run, "--resume"]) == 0
    assert json.loads((run / "summary.json").read_text())["finished"]


def test_assoc_train_sigterm_checkpoints_and_resumes_bit_identically(tmp_path):
    import dataclasses as dc

    import numpy as np

    from originlens.interrupts import Interrupted
    from originlens.train import AssocTrainConfig, train_assoc

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 12, size=(64, 9))
    c = AssocTrainConfig(
        steps=10,
        batch_size=16,
        lr=0.05,
        seed=0,
        data_seed=0,
        checkpoint_every=4,
        log_every=1,
        out=str(tmp_path / "full"),
    )
    full = train_assoc(tokens, 12, c)

    class Term:
        def on_step_end(self, tr):
            if tr.step == 6:
                os.kill(os.getpid(), signal.SIGTERM)

    cut = dc.replace(c, out=str(tmp_path / "cut"))
    with pytest.raises(Interrupted) as exc:
        train_assoc(tokens, 12, cut, callbacks=[Term()])
    assert "SIGTERM at step 6/10" in exc.value.message and exc.value.exit_code == 143
    assert (tmp_path / "cut" / "checkpoints" / "step-000006.safetensors").is_file()
    resumed = train_assoc(tokens, 12, cut, resume=True)
    assert resumed.resumed_from == 6
    for k, v in full.model.state_dict().items():
        assert torch_equal(v, resumed.model.state_dict()[k])


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))
