"""Run directories: every command that trains or analyses writes one.

Layout (created by :class:`RunDir`)::

    RUN/
      config.json       the full configuration (dataclass as JSON)
      environment.json  package versions, python, platform, git commit of originlens, seeds, data hashes
      metrics.jsonl     one JSON object per logged event (appended, flushed)
      checkpoints/      safetensors (written atomically)
      report.md/.html   human-readable report
      figures/          PNG plots

The run directory is created in place (not atomically) so a killed run can resume; individual files
are written atomically.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .storage import atomic_write_json, json_default


def package_versions() -> dict[str, str]:
    """Versions of the packages that influence results."""
    from importlib import metadata

    out = {"python": sys.version.split()[0], "platform": platform.platform()}
    for name in (
        "originlens",
        "numpy",
        "scipy",
        "torch",
        "safetensors",
        "tokenizers",
        "transformers",
        "datasets",
        "matplotlib",
    ):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def git_commit() -> str | None:
    """Commit of the originlens checkout, if installed from a git checkout.  The ``ORIGINLENS_GIT_COMMIT``
    environment variable, when set, is taken instead: for a copy of a checkout on another machine, whose
    ``.git`` may be missing or not the copied tree's."""
    if os.environ.get("ORIGINLENS_GIT_COMMIT"):
        return os.environ["ORIGINLENS_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
        if out.returncode == 0:
            return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


LOCK_FILE = ".lock"


def hold_lock(path: str | os.PathLike) -> Path:
    """Lock run directory ``path`` (``path/.lock``, :mod:`originlens.locks`) for the rest of this process:
    a second writer of the same run is refused with a :class:`ConfigError` naming the owner (pid and host)
    instead of interleaving its files.  Re-entrant within a process; the lock dies with the process, so
    a killed run leaves no stale lock (the file stays, unlocked, and is reused)."""
    from . import locks

    p = Path(path)
    if not locks.is_held(p / LOCK_FILE):
        locks.acquire(p / LOCK_FILE, p)
        try:
            _tidy_run_tree(p)
        except BaseException:
            release_lock(p)
            raise
    return p


_ORPHAN_TMP = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")  # storage.atomic_write's temporary names


def _tidy_run_tree(root: Path) -> None:
    """Run when a process takes a run's lock (so no other writer of the run is alive): refuse symbolic
    links inside the run (a planted link would make the run write outside its directory) and remove the
    temporary files of writes a killed process never finished (``.NAME.XXXXXXXX.tmp``).  Sub-directories
    with their own lock file are other runs (e.g. an experiment's per-seed runs) and are left to their own
    writer."""
    from .errors import ConfigError

    removed = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        d = Path(dirpath)
        for name in list(dirnames) + filenames:
            if (d / name).is_symlink():
                raise ConfigError(
                    f"{d / name} is a symbolic link (to {os.readlink(d / name)}) inside the run "
                    f"directory {root}; runs write their files in place, never through links",
                    "remove the link (or copy what it points to), or choose another --out",
                )
        dirnames[:] = [n for n in dirnames if not (d / n / LOCK_FILE).exists()]
        for name in filenames:
            if _ORPHAN_TMP.fullmatch(name):
                (d / name).unlink(missing_ok=True)
                removed += 1
    if removed:
        from .progress import log

        log(f"{root}: removed {removed} temporary file(s) left by an interrupted write")


def release_lock(path: str | os.PathLike) -> None:
    """Give up a lock taken by :func:`hold_lock` (no-op when this process does not hold it)."""
    from . import locks

    locks.release(Path(path) / LOCK_FILE)


@contextlib.contextmanager
def exclusive(path: str | os.PathLike) -> Iterator[Path]:
    """:func:`hold_lock` for the block only (re-entrant: a lock this process already holds is kept)."""
    from . import locks

    p = Path(path)
    if p.exists() and locks.is_held(p / LOCK_FILE):
        yield p
        return
    hold_lock(p)
    try:
        yield p
    finally:
        release_lock(p)


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


CHECKPOINT_DIR = "checkpoints"
_CHECKPOINT_NAME = re.compile(r"^step-(\d{6,})\.safetensors$")


def checkpoint_name(step: int) -> str:
    """The file name of the checkpoint after ``step`` updates: ``step-NNNNNN.safetensors``."""
    return f"step-{int(step):06d}.safetensors"


def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``RUN/checkpoints/step-NNNNNN.safetensors``, ascending by step (the one
    definition of a checkpoint's name for every trainer; temporary and foreign files are ignored)."""
    d = Path(run_dir) / CHECKPOINT_DIR
    found = []
    if d.is_dir():
        for f in d.iterdir():
            m = _CHECKPOINT_NAME.match(f.name)
            if m:
                found.append((int(m.group(1)), f))
    return sorted(found)


class RunDir:
    """A run directory with config, environment, metrics and figures."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True) -> None:
        self.path = Path(path)
        if create:
            from .errors import io_error

            try:
                self.path.mkdir(parents=True, exist_ok=True)
                (self.path / CHECKPOINT_DIR).mkdir(exist_ok=True)
                (self.path / "figures").mkdir(exist_ok=True)
            except OSError as exc:
                raise io_error(self.path, exc, "creating") from None

    def file(self, *parts: str) -> Path:
        return self.path.joinpath(*parts)

    def write_config(self, config: Any) -> None:
        atomic_write_json(self.file("config.json"), to_jsonable(config))

    def write_environment(
        self,
        *,
        seeds: Mapping[str, Any] | None = None,
        data_hashes: Mapping[str, str] | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        env = {
            "versions": package_versions(),
            "git_commit": git_commit(),
            "argv": sys.argv,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seeds": dict(seeds or {}),
            "data_hashes": dict(data_hashes or {}),
        }
        env.update(extra or {})
        atomic_write_json(self.file("environment.json"), to_jsonable(env))

    def log_metrics(self, record: Mapping[str, Any], name: str = "metrics.jsonl") -> None:
        line = json.dumps(to_jsonable(record), default=json_default) + "\n"
        try:
            with open(self.file(name), "a", encoding="utf-8") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:  # full disk, read-only directory: one clear line, earlier records intact
            from .errors import io_error

            raise io_error(self.file(name), exc, "appending to") from None
        from .sinks import forward

        forward(self.path, record)  # optional TensorBoard / W&B mirrors (--log-to)

    def read_metrics(self, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
        p = self.file(name)
        if not p.exists():
            return []
        out = []
        for line in p.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from a kill: ignore it
        return out
