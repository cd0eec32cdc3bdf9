"""Safetensors files written piece by piece, for outputs too large to hold in memory at once.

:class:`TensorFileWriter` declares the tensors (name, dtype, shape) up front, takes rows of each in any
order straight from the caller's arrays, and renames the finished file into place, so a statistics run
at |V| = 20,000 streams 1.6 GB float32 matrices to disk one block at a time.  The bytes are those of
:func:`originlens.storage.save_tensors` for the same content (header in the canonical form of
:func:`originlens.storage.canonical_safetensors`; tensors laid out in the order the ``safetensors``
library uses), so identical tensors still give identical files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import io_error
from ..storage import FORMAT_VERSION, UMASK, fsync_dir, json_default

_SAFETENSORS_DTYPES = {
    np.dtype(np.float64): "F64",
    np.dtype(np.float32): "F32",
    np.dtype(np.float16): "F16",
    np.dtype(np.int64): "I64",
    np.dtype(np.int32): "I32",
    np.dtype(np.int16): "I16",
    np.dtype(np.int8): "I8",
    np.dtype(np.uint64): "U64",
    np.dtype(np.uint32): "U32",
    np.dtype(np.uint16): "U16",
    np.dtype(np.uint8): "U8",
    np.dtype(np.bool_): "BOOL",
}


class TensorFileWriter:
    """A safetensors file written piece by piece, byte-identical to :func:`save_tensors` of the same content.

    The tensors are declared up front (``specs``: name → (dtype, shape)); :meth:`write` puts rows of one
    of them in place, in any order and from any number of calls, straight from the caller's array (no
    copy of the whole file is ever held in memory); :meth:`columns` reads a column slab of a 2-D tensor
    written before; :meth:`commit` adds the header (``metadata`` as in :func:`save_tensors`), fsyncs
    and renames the temporary file (``.NAME.*.tmp`` beside ``path``) into place.  Leaving the ``with``
    block without :meth:`commit` (or with an error) deletes the temporary file.

    The data are laid out for the header of the ``metadata`` given at construction; when the header
    of the committed metadata has another length, the data are copied once (inside the kernel) behind
    it.  Every row of every tensor must have been written before :meth:`commit`.  Little-endian only.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        specs: Mapping[str, tuple[Any, tuple[int, ...]]],
        *,
        kind: str,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.path, self.kind = Path(path), kind
        self.specs = {k: (np.dtype(d), tuple(int(n) for n in shape)) for k, (d, shape) in specs.items()}
        bad = [k for k, (d, _) in self.specs.items() if d not in _SAFETENSORS_DTYPES or d.byteorder == ">"]
        if bad:
            raise TypeError(f"cannot write {', '.join(bad)}: unsupported dtype")
        self.offsets: dict[str, tuple[int, int]] = {}
        pos = 0
        for k in _safetensors_order(self.specs):
            d, shape = self.specs[k]
            n = d.itemsize * int(np.prod(shape, dtype=np.int64))
            self.offsets[k] = (pos, pos + n)
            pos += n
        self.size = pos
        self.rows_written = dict.fromkeys(self.specs, 0)
        self.base = len(self._header(metadata))
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        except OSError as exc:
            raise io_error(self.path, exc, "creating") from None
        self.tmp = Path(tmp)
        os.chmod(tmp, 0o666 & ~UMASK)
        self._f: Any = os.fdopen(fd, "wb")
        self._guard(lambda: self._f.truncate(self.base + self.size))

    def _header(self, metadata: Mapping[str, Any] | None) -> bytes:
        meta = {"format_version": FORMAT_VERSION, "kind": self.kind}
        for k, v in (metadata or {}).items():
            meta[k] = v if isinstance(v, str) else json.dumps(v, default=json_default)
        header: dict[str, Any] = {"__metadata__": meta}
        for k, (a, b) in self.offsets.items():
            d, shape = self.specs[k]
            header[k] = {"dtype": _SAFETENSORS_DTYPES[d], "shape": list(shape), "data_offsets": [a, b]}
        text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
        text += b" " * (-len(text) % 8)
        return len(text).to_bytes(8, "little") + text

    def fits(self, metadata: Mapping[str, Any] | None) -> bool:
        """Whether :meth:`commit` with this metadata writes the header in place (no copy of the data)."""
        return len(self._header(metadata)) == self.base

    def _guard(self, fn: Any) -> Any:
        try:
            return fn()
        except OSError as exc:
            self.abort()
            raise io_error(self.path, exc, "writing") from None

    def _row_bytes(self, name: str) -> int:
        d, shape = self.specs[name]
        return d.itemsize * int(np.prod(shape[1:], dtype=np.int64))

    def write(self, name: str, array: Any, row: int = 0) -> None:
        """Write ``array`` as rows ``row``, ``row + 1``, … of tensor ``name`` (its dtype, trailing shape)."""
        d, shape = self.specs[name]
        a = np.ascontiguousarray(array)
        if a.dtype != d or tuple(a.shape[1:]) != shape[1:] or (a.ndim == 0) != (len(shape) == 0):
            raise ValueError(f"{name}: got {a.dtype} {a.shape}, expected {d} rows of {shape}")
        n = a.shape[0] if a.ndim else 1
        if not 0 <= row <= (shape[0] if shape else 1) - n:
            raise ValueError(f"{name}: rows {row}..{row + n - 1} outside its {shape[0] if shape else 1} rows")
        start = self.base + self.offsets[name][0] + row * self._row_bytes(name)

        def put() -> None:
            self._f.seek(start)
            if a.nbytes:
                self._f.write(a.data.cast("B"))

        self._guard(put)
        self.rows_written[name] += n

    def columns(self, name: str, start: int, stop: int) -> np.ndarray:
        """Columns ``start:stop`` of the 2-D tensor ``name`` as written so far, as a new (rows, stop − start) array."""
        d, shape = self.specs[name]
        out = np.empty((shape[0], stop - start), dtype=d)
        first = self.base + self.offsets[name][0] + start * d.itemsize
        step = self._row_bytes(name)

        def read() -> None:
            self._f.flush()
            fd = self._f.fileno()
            for i in range(shape[0]):
                buf = out[i].data.cast("B")
                if os.preadv(fd, [buf], first + i * step) != len(buf):
                    raise OSError(errno.EIO, "short read of a tensor being written")

        self._guard(read)
        return out

    def commit(self, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the header, fsync and rename into place; returns the final path."""
        missing = [k for k, (_, shape) in self.specs.items() if self.rows_written[k] < (shape[0] if shape else 1)]
        if missing:
            self.abort()
            raise RuntimeError(f"tensors not completely written: {', '.join(missing)}")
        header = self._header(metadata)

        def finish() -> None:
            if len(header) != self.base:  # the header grew or shrank: copy the data behind the new one
                fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
                os.chmod(tmp, 0o666 & ~UMASK)
                with os.fdopen(fd, "wb") as g:
                    g.write(header)
                    g.flush()
                    self._f.flush()
                    done = 0
                    while done < self.size:
                        n = os.copy_file_range(
                            self._f.fileno(), g.fileno(), self.size - done, self.base + done, len(header) + done
                        )
                        if n <= 0:
                            raise OSError(errno.EIO, "short copy of tensor data")
                        done += n
                    os.fsync(g.fileno())
                old, self.tmp = self.tmp, Path(tmp)
                self._f.close()
                os.unlink(old)
            else:
                self._f.seek(0)
                self._f.write(header)
                self._f.flush()
                os.fsync(self._f.fileno())
                self._f.close()
            os.replace(self.tmp, self.path)
            fsync_dir(self.path.parent)

        self._guard(finish)
        return self.path

    def abort(self) -> None:
        """Close and delete the temporary file (nothing at ``path`` changes)."""
        with contextlib.suppress(OSError, ValueError):
            self._f.close()
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)

    def __enter__(self) -> TensorFileWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self._f.closed or self.tmp.exists():
            self.abort()


def _safetensors_order(specs: Mapping[str, tuple[np.dtype, tuple[int, ...]]]) -> list[str]:
    """Names in the order the ``safetensors`` writer lays the tensors out (it sorts by dtype, then name):
    asked of the library itself with one-element stand-ins, so a change of its rule is followed."""
    from safetensors.numpy import save as np_save

    blob = np_save({k: np.zeros(1, dtype=d) for k, (d, _) in specs.items()})
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8 : 8 + n])
    header.pop("__metadata__", None)
    return sorted(header, key=lambda k: header[k]["data_offsets"][0])
