"""Crash-safe, code-free artefact I/O.

* :func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_write_json`: temporary file in
  the same directory, fsync, rename; a crash never leaves a half-written file under the final name.
* :func:`save_tensors` / :func:`load_tensors`: safetensors only (never pickle), with string metadata
  that always carries ``format_version`` and ``kind``; loaders check both and the vocabulary hash.
  :func:`safetensors_header` reads a file's header alone (bounded, nothing else parsed).

Whole output directories are built by :mod:`originlens.outputs`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CompatibilityError, InputError, io_error

FORMAT_VERSION = "1"


def _current_umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


UMASK = _current_umask()  # mkstemp/mkdtemp create 0600/0700; published files get normal modes


def fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_tree(root: Path) -> None:
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
        fsync_dir(Path(d))


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (tmp file + fsync + rename)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise io_error(path, exc, "creating") from None
    try:
        os.chmod(tmp, 0o666 & ~UMASK)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise io_error(path, exc, "writing") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=json_default) + "\n")


def json_default(o: Any) -> Any:
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
        meta[k] = v if isinstance(v, str) else json.dumps(v, default=json_default)
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


def safetensors_header(path: str | os.PathLike, max_bytes: int = 100 << 20) -> dict[str, Any]:
    """The JSON header of a safetensors file (tensor names → dtype/shape/offsets, and ``__metadata__``),
    read without the tensors; an :class:`InputError` saying what is wrong when it is not one."""
    import struct

    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise InputError(f"{path} is not a safetensors file ({size} bytes)", "re-create it with originlens")
            n = struct.unpack("<Q", head)[0]
            if n > min(max_bytes, size - 8):
                raise InputError(
                    f"{path} is not a safetensors file (its header claims {n} bytes of {size})",
                    "re-create it with originlens",
                )
            header = json.loads(fh.read(n))
    except OSError as exc:
        raise InputError(f"{path} cannot be read ({exc.strerror or exc})", "check the path") from None
    except (ValueError, UnicodeDecodeError):
        raise InputError(
            f"{path} is not a safetensors file (its header is not JSON)", "re-create it with originlens"
        ) from None
    if not isinstance(header, dict):
        raise InputError(
            f"{path} is not a safetensors file (its header is not an object)", "re-create it with originlens"
        )
    return header


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
