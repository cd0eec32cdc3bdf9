"""Crash-safe, code-free artefact I/O.

* :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_write_json`: temporary file in
  the same directory, fsync, rename; a crash never leaves a half-written file under the final name.
* :func:`atomic_directory`: build a whole output directory under a temporary sibling name and rename
  it into place only when everything succeeded, so an interrupted build never looks complete.
* :func:`save_tensors` / :func:`load_tensors`: safetensors only (never pickle), with string metadata
  that always carries ``format_version`` and ``kind``; loaders check both and the vocabulary hash.

Caveat: renaming over an existing *directory* is not atomic on POSIX; :func:`atomic_directory` moves
the old one aside (``.NAME.old-PID``) first and deletes it only after the new one is in place.  A process
killed in between leaves no directory at the final name; the next :func:`atomic_directory` of the same
path (the next run of the same command) puts the old one back first, and removes the hidden
``.NAME.partial-PID-*`` / ``.NAME.old-PID`` leftovers of processes that no longer run
(:func:`clean_stale_leftovers`).  Liveness is judged by PID on this machine: leftovers of a process on
another host sharing the directory, or whose PID was reused, are left alone.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CompatibilityError, InputError, OriginlensError

FORMAT_VERSION = "1"


def _current_umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


_UMASK = _current_umask()  # mkstemp/mkdtemp create 0600/0700; published files get normal modes


def io_error(path: Path, exc: OSError, action: str) -> OriginlensError:
    """The one-line :class:`OriginlensError` of an ``OSError`` on ``path`` (full disk, read-only or
    unwritable location, anything else), with its fix."""
    return _io_error(path, exc, action)


def _io_error(path: Path, exc: OSError, action: str) -> OriginlensError:
    if exc.errno == errno.ENOSPC:
        return OriginlensError(
            f"no space left on device while {action} {path}",
            "free disk space or choose another --out; earlier files are intact",
        )
    if exc.errno in (errno.EACCES, errno.EROFS, errno.EPERM):
        return OriginlensError(f"cannot write {path}: {exc.strerror}", "choose a writable --out directory")
    return OriginlensError(f"I/O error while {action} {path}: {exc.strerror or exc}", "check the path and the disk")


def _fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsync every regular file below ``root`` and every directory (bottom-up), ``root`` included."""
    for d, _, files in os.walk(root, topdown=False):
        for name in files:
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _fsync_dir(Path(d))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (tmp file + fsync + rename)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _io_error(path, exc, "creating") from None
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _io_error(path, exc, "writing") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; errors name the file."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path} not found", "check the path") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{path} is not valid JSON ({exc})", "regenerate the file") from None


def atomic_save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Save a plain (non-object) array as .npy atomically."""
    import io

    if array.dtype == object:
        raise TypeError("object arrays are not allowed (they would need pickle)")
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return atomic_write_bytes(path, buf.getvalue())


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
                _fsync_dir(path.parent)
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


def check_output_directory(
    path: str | os.PathLike, *, kind_file: str | None = None, kind: str = "output", inputs: Any = ()
) -> None:
    """Refuse an output directory that would destroy something it does not own.

    ``path`` must not be, or contain, any of ``inputs`` (the command's own input files or directories);
    an existing ``path`` must be empty or a directory holding ``kind_file`` (the marker every output of
    this ``kind`` has), i.e. an earlier output of the same command — never a foreign directory or a file.
    Raises :class:`~originlens.errors.OriginlensError` with the fix; ``kind_file=None`` skips that check.
    """
    path = Path(path)
    target = path.resolve()
    for item in [inputs] if isinstance(inputs, (str, os.PathLike)) else list(inputs or ()):
        src = Path(item).resolve()
        if src == target or target in src.parents:
            raise OriginlensError(
                f"the output {path} is {'the input' if src == target else 'a parent of the input'} "
                f"{item}; writing it would delete the input",
                "choose an --out outside the input",
            )
    if kind_file is not None and os.path.lexists(path):
        if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
            return  # an empty directory holds nothing to lose
        if path.is_symlink() or not path.is_dir() or not (path / kind_file).is_file():
            raise OriginlensError(
                f"{path} exists and is not a {kind} (no {kind_file} in it); refusing to replace it",
                "choose a new --out, or remove that directory yourself",
            )


@contextlib.contextmanager
def atomic_directory(
    path: str | os.PathLike,
    overwrite: bool = True,
    *,
    kind_file: str | None = None,
    kind: str = "output",
    inputs: Any = (),
) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``path`` only if the block succeeds.

    On error (or Ctrl-C / kill) the temporary directory is removed (or, after SIGKILL, left under a
    hidden ``.NAME.partial-PID-*`` name that never looks like a finished output).  Leftovers of earlier
    killed processes are cleaned up first (:func:`clean_stale_leftovers`).  ``kind_file`` / ``inputs``:
    :func:`check_output_directory` runs first, so an existing ``path`` is replaced only when it is an
    earlier output of the same kind and never when it is (or holds) an input.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        for line in clean_stale_leftovers(path):
            from .progress import log

            log(line, level=1)
        if path.exists() and not overwrite:
            raise OriginlensError(f"{path} already exists", "pass --overwrite or choose another --out")
        check_output_directory(path, kind_file=kind_file, kind=kind, inputs=inputs)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-{os.getpid()}-", dir=path.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)
    except OSError as exc:
        raise _io_error(path, exc, "creating") from None
    try:
        yield tmp
        _fsync_tree(tmp)  # files written inside with plain open() must be on disk before the rename
        old = None
        if path.exists():
            old = path.parent / f".{path.name}.old-{os.getpid()}"
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise _io_error(path, exc, "writing") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def array_sha256(a: np.ndarray) -> str:
    """SHA-256 of an array's dtype, shape and C-order bytes (``"dtype|shape|"`` prefix, then the data)."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}|{tuple(a.shape)}|".encode("ascii"))
    h.update(a.tobytes())
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vocab_hash(vocab: list[str] | None, vocab_size: int) -> str:
    """Stable short hash identifying a vocabulary (token strings, or just its size if unnamed)."""
    payload = json.dumps(vocab if vocab is not None else {"size": int(vocab_size)}, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def save_tensors(
    path: str | os.PathLike, tensors: Mapping[str, Any], *, kind: str, metadata: Mapping[str, Any] | None = None
) -> Path:
    """Write numpy arrays / torch tensors to a safetensors file atomically.

    ``metadata`` values are JSON-encoded into the safetensors string metadata; ``kind`` and
    ``format_version`` are always added.
    """
    from safetensors.numpy import save as np_save

    arrays = {}
    for k, v in tensors.items():
        if hasattr(v, "detach"):
            v = v.detach().cpu().contiguous().numpy()
        arrays[k] = np.ascontiguousarray(v)
    meta = {"format_version": FORMAT_VERSION, "kind": kind}
    for k, v in (metadata or {}).items():
        meta[k] = v if isinstance(v, str) else json.dumps(v, default=_json_default)
    return atomic_write_bytes(path, canonical_safetensors(np_save(arrays, metadata=meta)))


def canonical_safetensors(blob: bytes) -> bytes:
    """The same safetensors file with its JSON header in one canonical form (keys sorted, no spaces,
    padded with spaces to a multiple of 8 bytes).  The ``safetensors`` writer emits the metadata in a
    per-process hash order, so identical content would otherwise give different bytes in different
    processes and no checksum could verify a reproduction.  Tensor data are untouched (their offsets are
    relative to the end of the header)."""
    import struct

    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8 : 8 + n])
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + blob[8 + n :]


def load_tensors(
    path: str | os.PathLike, *, kind: str | None = None, expect_vocab_hash: str | None = None
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read a safetensors file written by :func:`save_tensors` (no code execution possible).

    Checks ``kind``, ``format_version`` and (optionally) the vocabulary hash, with clear errors.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} not found", "check the path (expected a .safetensors file)")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            arrays = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (a safetensors handle)
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(
            f"{path} is not a readable safetensors file ({exc})",
            "originlens only reads safetensors; re-create the file with originlens",
        ) from None
    if kind is not None and meta.get("kind") not in (None, kind):
        raise CompatibilityError(f"{path} holds '{meta.get('kind')}', expected '{kind}'", "pass the right file")
    fv = meta.get("format_version")
    if fv is not None and fv != FORMAT_VERSION:
        raise CompatibilityError(
            f"{path} has format version {fv}; this originlens reads {FORMAT_VERSION}",
            "re-create the file with this version of originlens",
        )
    if expect_vocab_hash is not None and meta.get("vocab_hash") not in (None, expect_vocab_hash):
        raise CompatibilityError(
            f"{path} was computed for another vocabulary (hash {meta.get('vocab_hash')}, expected {expect_vocab_hash})",
            "recompute it from this corpus / tokenizer",
        )
    return arrays, meta
