"""One writer at a time: advisory locks (``fcntl.flock``) on lock files, held by this process.

Two forms, one mechanism:

* a **run directory**, written in place by one command over a long time, is locked by ``RUN/.lock``
  (:func:`originlens.runs.hold_lock`);
* any **output path** — an output directory rebuilt under a temporary name and renamed into place, a
  file written atomically (a results file, a unit record, README.md), or a run directory before the
  command has looked at it — is locked by a hidden sibling, ``PARENT/.NAME.lock`` (:func:`hold_path`):
  the path itself may be swapped for a new one, or must not be created before it has been checked.
  The CLI takes this lock on every path a command declares it writes before the command starts.

A lock file holds its owner's pid and host; a second writer is refused with a
:class:`~originlens.errors.ConfigError` naming them.  Locks are re-entrant within a process and die with
it: a killed writer leaves an unlocked file that the next writer reuses.  The CLI gives up every lock a
command took when the command ends (:func:`release_all`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError, io_error

_HELD: dict[str, Any] = {}  # resolved lock-file path -> its open file, for the locks this process holds


def _key(lock_file: Path) -> str:
    return str(lock_file.parent.resolve() / lock_file.name)


def acquire(lock_file: str | os.PathLike, what: str | os.PathLike) -> None:
    """Hold ``lock_file`` (created if missing) for the rest of this process, or until :func:`release`.
    ``what`` is the path the lock protects, named in the refusal a second writer gets."""
    import fcntl
    import socket

    lock_file = Path(lock_file)
    if lock_file.parent.exists() and not lock_file.parent.is_dir():
        raise ConfigError(f"{lock_file.parent} is a file, not a directory", "choose a directory for --out")
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error(lock_file.parent, exc, "locking") from None
    key = _key(lock_file)
    if key in _HELD:
        return
    try:
        fh = open(lock_file, "a+")  # noqa: SIM115 (held for the lock's lifetime)
    except OSError as exc:
        raise io_error(Path(what), exc, "locking") from None
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        owner = fh.read().strip()
        fh.close()
        raise ConfigError(
            f"{what} is being written by another process ({owner or 'owner unknown'})",
            "wait for it to finish, or choose another output",
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    fh.flush()
    _HELD[key] = fh


def is_held(lock_file: str | os.PathLike) -> bool:
    """True when this process holds ``lock_file``."""
    return _key(Path(lock_file)) in _HELD


def release(lock_file: str | os.PathLike) -> None:
    """Give up ``lock_file`` (no-op when this process does not hold it)."""
    fh = _HELD.pop(_key(Path(lock_file)), None)
    if fh is not None:
        fh.close()


def release_all() -> None:
    """Give up every lock this process holds (the CLI does this when a command ends)."""
    for key in list(_HELD):
        _HELD.pop(key).close()


def sibling_lock_file(path: str | os.PathLike) -> Path:
    """``PARENT/.NAME.lock`` of a replaced path, symbolic links followed (a link and its target share it)."""
    real = Path(os.path.realpath(path))
    return real.parent / f".{real.name}.lock"


def hold_path(path: str | os.PathLike) -> Path:
    """Lock a replaced path (an output directory or a file) for the rest of this process; returns it."""
    acquire(sibling_lock_file(path), path)
    return Path(path)


@contextlib.contextmanager
def holding_path(path: str | os.PathLike) -> Iterator[Path]:
    """:func:`hold_path` for the block only; a lock this process already held is kept after it."""
    lock_file = sibling_lock_file(path)
    held_before = is_held(lock_file)
    acquire(lock_file, path)
    try:
        yield Path(path)
    finally:
        if not held_before:
            release(lock_file)
