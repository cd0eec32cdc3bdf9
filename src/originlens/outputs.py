"""Output directories that are built whole and never destroy what their command does not own.

* :class:`OutputKind`: what one command writes into its output directory — the marker file every such
  output holds, a check that the marker is a valid file of that command, and the patterns of every file
  the command writes.
* :func:`check_output_directory`: an existing directory may be replaced only when it is empty, or when
  its marker is valid and every file in it is one the command writes; otherwise the refusal lists the
  files a replacement would have deleted.  A symbolic link is followed (its target is checked and
  replaced; the link stays).
* :func:`atomic_directory`: build the new output under a hidden sibling name and rename it into place
  only when everything succeeded, under the path's lock (:func:`originlens.locks.hold_path`), so an
  interrupted build never looks complete and two writers never interleave.

Renaming over an existing directory is not atomic on POSIX: the old one is moved aside
(``.NAME.old-PID``) first and deleted only after the new one is in place.  A process killed in between
leaves no directory at the final name; the next :func:`atomic_directory` of the same path puts the old
one back first, and removes the hidden ``.NAME.partial-PID-*`` / ``.NAME.old-PID`` leftovers of
processes that no longer run (:func:`clean_stale_leftovers`).  Liveness is judged by PID on this
machine: leftovers of a process on another host sharing the directory, or whose PID was reused, are
left alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError, OriginlensError, io_error
from .locks import holding_path
from .storage import UMASK, fsync_dir, fsync_tree


@dataclasses.dataclass(frozen=True)
class OutputKind:
    """What one command writes into its output directory.

    ``name``: how refusals call it ("statistics output"); ``marker``: the file every such output holds;
    ``writes``: :mod:`fnmatch` patterns of the relative (POSIX) paths of every file the command writes,
    the marker included; ``invalid``: given the marker's path, why it is not a valid file of this
    command (``None`` when it is) — a file that merely has the marker's name is not an earlier output."""

    name: str
    marker: str
    writes: tuple[str, ...]
    invalid: Callable[[Path], str | None] | None = None

    def owns(self, relative: str) -> bool:
        return any(fnmatch.fnmatchcase(relative, pat) for pat in self.writes)

    def with_files(self, *names: str) -> OutputKind:
        """The same kind, writing ``names`` too (e.g. a caller's extra side files)."""
        return dataclasses.replace(self, writes=self.writes + tuple(names))


def _listing(paths: list[str], limit: int = 8) -> str:
    shown = ", ".join(paths[:limit])
    return shown + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _entries(d: Path) -> list[str]:
    """Every file, link and empty directory below ``d``, as relative POSIX paths (links not followed)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(d, followlinks=False):
        rel = Path(dirpath).relative_to(d)
        for name in filenames + [n for n in dirnames if (Path(dirpath) / n).is_symlink()]:
            out.append((rel / name).as_posix())
        if not dirnames and not filenames and rel != Path("."):
            out.append(rel.as_posix() + "/")
    return sorted(out)


def resolve_output(path: str | os.PathLike) -> Path:
    """``path`` with a symbolic link followed to its target (an output is replaced where it really is)."""
    p = Path(path)
    if p.is_symlink():
        real = Path(os.path.realpath(p))
        if not real.exists():
            raise ConfigError(
                f"{p} is a symbolic link to {real}, which does not exist", "point the link at a directory, or remove it"
            )
        return real
    return p


def check_output_directory(path: str | os.PathLike, *, output: OutputKind | None = None, inputs: Any = ()) -> Path:
    """Refuse an output directory that would destroy something its command does not own; returns the
    directory to write (``path``, or the target of a link).

    ``path`` must not be, or contain, any of ``inputs`` (the command's own input files or directories).
    With ``output``, an existing ``path`` must be an empty directory, or one whose marker is a valid
    file of that command and whose every file is one it writes.  Raises
    :class:`~originlens.errors.ConfigError` saying which rule failed and what would have been lost."""
    path = Path(path)
    target = path.resolve()
    for item in [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs or ()):
        src = Path(item).resolve()
        if src == target or target in src.parents:
            raise ConfigError(
                f"the output {path} is {'the input' if src == target else 'a parent of the input'} "
                f"{item}; writing it would delete the input",
                "choose an --out outside the input",
            )
    if output is None or not os.path.lexists(path):
        return path
    real = resolve_output(path)
    if not real.is_dir():
        raise ConfigError(
            f"{path} is a file, not a {output.name} directory; refusing to replace it", "choose a directory for --out"
        )
    entries = _entries(real)
    if not entries:
        return real  # an empty directory holds nothing to lose
    keep = "choose a new --out, or move those files away yourself"
    if not (real / output.marker).is_file():
        raise ConfigError(
            f"{path} is not a {output.name} (no {output.marker} in it); replacing it would delete {_listing(entries)}",
            keep,
        )
    why = output.invalid(real / output.marker) if output.invalid is not None else None
    if why is not None:
        raise ConfigError(
            f"{path} is not a {output.name}: its {output.marker} is not one ({why}); replacing it would delete "
            f"{_listing(entries)}",
            keep,
        )
    foreign = [e for e in entries if not output.owns(e)]
    if foreign:
        raise ConfigError(
            f"{path} holds files that are not part of a {output.name}: {_listing(foreign)}; "
            "replacing it would delete them",
            keep,
        )
    return real


def _pid_alive(pid: int) -> bool:
    """True unless no process with this PID exists on this machine (signal 0 probe)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists (another user's process)
        return True
    return True


_PARTIAL_PID = re.compile(r"(\d+)-.+")


def clean_stale_leftovers(path: str | os.PathLike) -> list[str]:
    """Undo what :func:`atomic_directory` for ``path`` left behind when its process was killed.

    ``.NAME.old-PID`` of a dead process is the previous output moved aside: it is renamed back to ``path``
    when nothing is there (the new one never got into place), else removed (the new one is in place).
    ``.NAME.partial-PID-*`` of a dead process (an unfinished build) is removed.  Leftovers of live processes
    (a concurrent build) and of unknown form are kept.  Returns what was done, one line per entry;
    errors are ignored (a leftover that cannot be removed never blocks a new build).
    """
    path = Path(path)
    old_prefix, partial_prefix = f".{path.name}.old-", f".{path.name}.partial-"
    olds, partials = [], []
    try:
        entries = sorted(path.parent.iterdir())
    except OSError:
        return []
    for e in entries:
        n = e.name
        if n.startswith(old_prefix) and n[len(old_prefix) :].isdigit():
            if not _pid_alive(int(n[len(old_prefix) :])):
                olds.append(e)
        elif n.startswith(partial_prefix):
            m = _PARTIAL_PID.fullmatch(n[len(partial_prefix) :])
            if m and not _pid_alive(int(m.group(1))):
                partials.append(e)
    done = []
    for old in olds:
        if not os.path.lexists(path):
            try:
                os.replace(old, path)
                fsync_dir(path.parent)
                done.append(f"restored {path} from {old.name} (its replacement was interrupted)")
                continue
            except OSError:
                pass
        shutil.rmtree(old, ignore_errors=True)
        done.append(f"removed {old.name} (left by an interrupted run)")
    for d in partials:
        shutil.rmtree(d, ignore_errors=True)
        done.append(f"removed {d.name} (left by an interrupted run)")
    return done


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike, overwrite: bool = True, *, output: OutputKind | None = None, inputs: Any = ()
) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``path`` only if the block succeeds.

    The path's lock is held for the block (a second writer is refused).  On error (or Ctrl-C / kill) the
    temporary directory is removed (or, after SIGKILL, left under a hidden ``.NAME.partial-PID-*`` name
    that never looks like a finished output).  Leftovers of earlier killed processes are cleaned up first
    (:func:`clean_stale_leftovers`).  ``output`` / ``inputs``: :func:`check_output_directory` runs first,
    so an existing ``path`` is replaced only when it is an earlier output of the same command holding
    nothing else, and never when it is (or holds) an input.  A link is followed: its target is replaced.
    """
    path = resolve_output(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error(path, exc, "creating") from None
    with holding_path(path):
        try:
            for line in clean_stale_leftovers(path):
                from .progress import log

                log(line, level=1)
            if path.exists() and not overwrite:
                raise OriginlensError(f"{path} already exists", "pass --overwrite or choose another --out")
            check_output_directory(path, output=output, inputs=inputs)
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-{os.getpid()}-", dir=path.parent))
            os.chmod(tmp, 0o777 & ~UMASK)
        except OSError as exc:
            raise io_error(path, exc, "creating") from None
        try:
            yield tmp
            fsync_tree(tmp)  # files written inside with plain open() must be on disk before the rename
            old = None
            if path.exists():
                old = path.parent / f".{path.name}.old-{os.getpid()}"
                os.replace(path, old)
            os.replace(tmp, path)
            fsync_dir(path.parent)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise io_error(path, exc, "writing") from None
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
