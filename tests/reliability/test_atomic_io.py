"""Atomic artefact writes: failures leave previous files intact and no half-written outputs."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from originlens.errors import OriginlensError
from originlens.outputs import atomic_directory
from originlens.storage import atomic_write_bytes, atomic_write_json, load_tensors, save_tensors


def test_failed_write_keeps_previous_file(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.safetensors"
    save_tensors(target, {"w": np.arange(3.0)}, kind="test")
    real_fsync = os.fsync

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OriginlensError, match="no space left"):
        save_tensors(target, {"w": np.zeros(3)}, kind="test")
    monkeypatch.setattr(os, "fsync", real_fsync)
    arrays, _ = load_tensors(target)
    np.testing.assert_array_equal(arrays["w"], np.arange(3.0))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.safetensors"]  # no temp litter


def _make_read_only(d):
    """chmod for normal users; root ignores modes, so use the immutable attribute when available."""
    d.chmod(0o500)
    if os.geteuid() == 0:
        import shutil
        import subprocess

        if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(d)]).returncode != 0:
            pytest.skip("root without chattr: cannot make a directory read-only")
        return lambda: subprocess.run(["chattr", "-i", str(d)])
    return lambda: d.chmod(0o700)


def test_read_only_directory_gives_clear_error_and_keeps_checkpoint(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    save_tensors(ro / "step-000001.safetensors", {"w": np.ones(2)}, kind="test")
    undo = _make_read_only(ro)
    try:
        with pytest.raises(OriginlensError, match="cannot write"):
            atomic_write_json(ro / "x.json", {})
        with pytest.raises(OriginlensError, match="cannot write"):
            save_tensors(ro / "step-000001.safetensors", {"w": np.zeros(2)}, kind="test")
    finally:
        undo()
    arrays, _ = load_tensors(ro / "step-000001.safetensors")
    np.testing.assert_array_equal(arrays["w"], np.ones(2))


def test_read_only_path_gives_clear_error(tmp_path):
    # a file where a directory is expected fails for root too
    (tmp_path / "file").write_text("x")
    with pytest.raises(OriginlensError):
        atomic_write_bytes(tmp_path / "file" / "x.bin", b"1")


def test_atomic_directory_publishes_only_on_success(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_directory(out) as d:
        (d / "half.txt").write_text("x")
        raise RuntimeError("boom")
    # nothing but the lock file (``.out.lock``, kept for the next writer: see originlens.locks)
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == [".out.lock"]
    with atomic_directory(out) as d:
        (d / "a.txt").write_text("1")
    with pytest.raises(RuntimeError), atomic_directory(out) as d:
        (d / "a.txt").write_text("2")
        raise RuntimeError("boom")
    assert (out / "a.txt").read_text() == "1"  # the previous complete output survives
    with atomic_directory(out) as d:
        (d / "a.txt").write_text("3")
    assert (out / "a.txt").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.lock", "out"]


def _dead_pid() -> int:
    """The PID of a process that has exited (reaped), i.e. of a run killed earlier."""
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_leftovers_of_a_killed_replacement_are_repaired(tmp_path):
    """A process killed between the two renames of a replacement leaves no directory at the final name
    (the previous one is hidden as .NAME.old-PID) and its .NAME.partial-PID-* build; the next
    atomic_directory of that path restores the previous output and removes the dead process's debris,
    but never touches the leftovers of a live process."""
    out = tmp_path / "out"
    with atomic_directory(out) as d:
        (d / "a.txt").write_text("1")
    dead = _dead_pid()
    os.replace(out, tmp_path / f".out.old-{dead}")  # the state after a kill between the renames
    (tmp_path / f".out.partial-{dead}-x1y2").mkdir()
    (tmp_path / f".out.partial-{dead}-x1y2" / "a.txt").write_text("2")
    live = tmp_path / f".out.partial-{os.getppid()}-live"  # a concurrent build of a running process
    live.mkdir()
    other = tmp_path / f".other.old-{dead}"  # another output's leftovers are not ours
    other.mkdir()
    with pytest.raises(OriginlensError, match="already exists"):  # the previous output is back in place
        with atomic_directory(out, overwrite=False):
            pass
    assert (out / "a.txt").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".other.old-" + str(dead), live.name, ".out.lock", "out"]
    )
    # killed after the second rename (the new output is in place): the hidden old one is removed
    (tmp_path / f".out.old-{dead}").mkdir()
    with atomic_directory(out) as d:
        (d / "a.txt").write_text("3")
    assert (out / "a.txt").read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".other.old-" + str(dead), live.name, ".out.lock", "out"]
    )


def test_partial_directories_carry_the_pid(tmp_path):
    with atomic_directory(tmp_path / "out") as d:
        assert d.name.startswith(f".out.partial-{os.getpid()}-")


# every place in the package that opens a file for writing by hand, and why it cannot leave a half-written
# file under a name a reader uses (everything else goes through originlens.storage's atomic writers)
_HAND_WRITES = {
    "storage.py": "the atomic writer itself: a temporary file, then rename",
    "stats/tensorfile.py": "streams to a temporary file renamed when complete",
    "locks.py": "the lock file: holds only the owner's pid and host, never read as data",
    "cli/main.py": "os.devnull",
    "experiments/paper_scale_report.py": "a temporary archive, renamed when complete",
    "data/build.py": "corpus arrays written inside the hidden partial directory of atomic_directory",
    "runs.py": "the append-only metrics log: one fsynced line per record; readers skip a torn last line",
}


def test_every_hand_written_file_is_a_temporary_one():
    """No module writes a file in place: ``open(..., 'w'/'a')``, ``os.fdopen(..., 'w')``,
    ``Path.write_text`` / ``write_bytes`` appear only where the table above says why that is safe."""
    import ast
    from pathlib import Path

    import originlens

    root = Path(originlens.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in ("write_text", "write_bytes"):
                hit = True
            elif name in ("open", "fdopen"):
                modes = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
                modes += [k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
                hit = any(isinstance(m, str) and any(c in m for c in "wax+") for m in modes)
            else:
                hit = False
            if hit:
                found.setdefault(path.relative_to(root).as_posix(), []).append(node.lineno)
    unexplained = {p: lines for p, lines in found.items() if p not in _HAND_WRITES}
    assert not unexplained, f"files written in place (use originlens.storage's atomic writers): {unexplained}"
    assert set(_HAND_WRITES) <= set(found), f"stale entries: {set(_HAND_WRITES) - set(found)}"
