"""Saving and loading statistics: ``DIR/statistics.safetensors`` with exactly the six keys.

Everything else travels in the safetensors metadata (n_pairs, vocab size, T, centring, kept token ids,
vocabulary hash, format version) and, when known, ``DIR/vocab.json`` (kept tokens in row order) and
``DIR/manifest.json`` (corpus provenance).  Loading checks the format version and, if asked, the
vocabulary hash, so statistics are never silently applied to another vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..errors import InputError
from ..outputs import OutputKind, atomic_directory
from ..storage import atomic_write_json, load_tensors, read_json, safetensors_header, save_tensors, vocab_hash
from .corpus import STAT_KEYS, CorpusStatistics
from .tensorfile import TensorFileWriter

FILENAME = "statistics.safetensors"
KIND = "corpus-statistics"


def _invalid_statistics_file(path: Path) -> str | None:
    """Why ``path`` is not a statistics file of originlens (``None`` when its header has the six keys and
    this kind)."""
    try:
        header = safetensors_header(path)
    except InputError as exc:
        return exc.what.removeprefix(f"{path} is ")
    keys = sorted(k for k in header if k != "__metadata__")
    if keys != sorted(STAT_KEYS):
        return f"its tensors are {keys or 'none'}, not the six statistics"
    kind = (header.get("__metadata__") or {}).get("kind")
    if kind != KIND:
        return f"its kind is {kind!r}, not {KIND!r}"
    return None


OUTPUT = OutputKind(
    "statistics output", FILENAME, (FILENAME, "vocab.json", "manifest.json"), invalid=_invalid_statistics_file
)


def statistics_vocab_hash(stats: CorpusStatistics) -> str:
    return vocab_hash(stats.vocab, stats.size) if stats.vocab is not None else vocab_hash(None, stats.vocab_size)


def _metadata(
    stats: CorpusStatistics | None = None, *, unigram: Any = None, token_ids: Any = None, **fields: Any
) -> dict[str, Any]:
    """The safetensors metadata of a statistics file (from ``stats``, or from the same fields by name)."""
    if stats is not None:
        fields = {k: getattr(stats, k) for k in ("n_pairs", "vocab_size", "seq_len", "centering", "size", "vocab")}
        fields["meta"] = stats.meta
        unigram, token_ids = stats.unigram, stats.token_ids
    vocab = fields["vocab"]
    return {
        "n_pairs": int(fields["n_pairs"]),
        "vocab_size": int(fields["vocab_size"]),
        "seq_len": int(fields["seq_len"]),
        "centering": float(fields["centering"]),
        "size": int(fields["size"]),
        "token_ids": None if token_ids is None else [int(i) for i in token_ids],
        "unigram": None if unigram is None else [float(u) for u in unigram],
        "vocab_hash": vocab_hash(vocab, fields["size"])
        if vocab is not None
        else vocab_hash(None, fields["vocab_size"]),
        "meta": fields["meta"],
    }


def _side_files(
    tmp: Path, vocab: list[str] | None, manifest: dict[str, Any] | None, extra_files: dict[str, Any] | None
) -> None:
    if vocab is not None:
        atomic_write_json(tmp / "vocab.json", vocab)
    if manifest is not None:
        from ..runs import git_commit, package_versions

        atomic_write_json(
            tmp / "manifest.json",
            {"environment": {"versions": package_versions(), "git_commit": git_commit()}, **manifest},
        )
    for name, obj in (extra_files or {}).items():
        atomic_write_json(tmp / name, obj)


def _specs(size: int, seq_len: int, dtype: Any) -> dict[str, tuple[Any, tuple[int, ...]]]:
    return {k: (dtype, (seq_len,) if k == "positional" else (size, size)) for k in STAT_KEYS}


def save_statistics(
    stats: CorpusStatistics,
    out: str | Path,
    *,
    manifest: dict[str, Any] | None = None,
    extra_files: dict[str, Any] | None = None,
    inputs: Any = (),
) -> Path:
    """Write ``out/statistics.safetensors`` (+ vocab.json, manifest.json) atomically; returns ``out``.

    The tensors are written straight from ``stats`` (no copy of the file in memory).  An existing ``out``
    is replaced only when it is an earlier statistics output, and never when it is (or contains) one of
    ``inputs`` (the corpus the statistics were computed from)."""
    out = Path(out)
    meta = _metadata(stats)
    arrays = {k: np.asarray(v) for k, v in stats.as_dict().items()}
    dtypes = {a.dtype for a in arrays.values()}
    specs = {k: (a.dtype, a.shape) for k, a in arrays.items()}
    with atomic_directory(out, output=OUTPUT.with_files(*(extra_files or {})), inputs=inputs) as tmp:
        if len(dtypes) == 1 and all(a.ndim >= 1 for a in arrays.values()):
            with TensorFileWriter(tmp / FILENAME, specs, kind=KIND, metadata=meta) as w:
                for k, a in arrays.items():
                    w.write(k, a)
                w.commit(meta)
        else:  # unusual content (mixed precisions, scalars): the general writer
            save_tensors(tmp / FILENAME, arrays, kind=KIND, metadata=meta)
        _side_files(tmp, stats.vocab, manifest, extra_files)
    return out


def stream_statistics(
    tokens: Any,
    vocab_size: int,
    out: str | Path,
    *,
    dtype: Any = np.float64,
    meta: dict[str, Any] | None = None,
    manifest: dict[str, Any] | Callable[[CorpusStatistics], dict[str, Any]] | None = None,
    extra_files: dict[str, Any] | None = None,
    inputs: Any = (),
    vocab: list[str] | None = None,
    chunk_size: int = 1024,
    mask: np.ndarray | None = None,
    block_bytes: int | None = None,
    **kwargs: Any,
) -> CorpusStatistics:
    """:func:`~originlens.stats.corpus_statistics` written to ``out`` as :func:`save_statistics` would,
    but each statistic goes to disk block by block as it is computed (peak memory: see
    :mod:`originlens.stats.stream`; bit-identical values and file).

    ``kwargs``: ``token_ids``, ``top_k``, ``centering``, ``pad_id``.  ``meta`` goes to the file's
    ``meta``; a ``seconds`` entry that is None there is set to the wall time of computing and writing
    the tensors (rounded to 3 decimals or, when that keeps the header's length, fewer: the header is
    written last and the data are copied once if it changed length).  ``manifest`` may be a
    function of the finished statistics.  ``block_bytes`` bounds the float64 block of Q̄ rows (each block
    is one more pass over the corpus).  Returns the statistics with their matrices memory-mapped from
    the written file (read-only; nothing is loaded until used).
    """
    import time

    from .corpus import first_pass
    from .stream import finalize_first, second_pass

    t0 = time.perf_counter()
    out = Path(out)
    with atomic_directory(out, output=OUTPUT.with_files(*(extra_files or {})), inputs=inputs) as tmp:
        arr, sums = first_pass(tokens, vocab_size, chunk_size=chunk_size, mask=mask, **kwargs)
        kept_vocab = vocab
        if vocab is not None and sums.token_ids is not None and len(vocab) == sums.vocab_size:
            kept_vocab = [vocab[i] for i in sums.token_ids]
        fields: dict[str, Any] = dict(
            n_pairs=sums.n_pairs, vocab_size=sums.vocab_size, seq_len=sums.seq_len, centering=sums.centering,
            size=sums.K, vocab=kept_vocab, token_ids=sums.token_ids,
        )  # fmt: skip
        user_meta = dict(meta or {})
        timed = "seconds" in user_meta and user_meta["seconds"] is None
        if timed:
            user_meta["seconds"] = 10.001  # a typical width for the provisional header
        unigram = sums.unigram.astype(np.float64) / float(max(sums.n_pairs, 1))
        with TensorFileWriter(
            tmp / FILENAME,
            _specs(sums.K, sums.seq_len, np.dtype(dtype)),
            kind=KIND,
            metadata=_metadata(unigram=unigram, meta=user_meta, **fields),
        ) as w:
            first = finalize_first(sums, dtype, w)
            second_pass(first, arr, mask, dtype, w, chunk_size=chunk_size, block_bytes=block_bytes)
            del first
            if timed:
                secs = time.perf_counter() - t0
                fitting = [
                    d
                    for d in (3, 2, 1, 0)
                    if w.fits(_metadata(unigram=unigram, meta={**user_meta, "seconds": round(secs, d)}, **fields))
                ]
                user_meta["seconds"] = round(secs, fitting[0] if fitting else 3)
            w.commit(_metadata(unigram=unigram, meta=user_meta, **fields))
        st = _mapped(tmp / FILENAME, kept_vocab)
        _side_files(tmp, kept_vocab, manifest(st) if callable(manifest) else manifest, extra_files)
    return st


def _mapped(file: Path, vocab: list[str] | None) -> CorpusStatistics:
    """The statistics of a file written by :func:`stream_statistics`, matrices memory-mapped."""
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    m = {k: _decode(v) for k, v in header.pop("__metadata__").items() if k not in ("format_version", "kind")}
    kinds = {"F64": np.float64, "F32": np.float32}
    arrays = {
        k: np.memmap(
            file, dtype=kinds[h["dtype"]], mode="r", offset=8 + n + h["data_offsets"][0], shape=tuple(h["shape"])
        )
        for k, h in header.items()
    }
    return CorpusStatistics(
        **{k: arrays[k] for k in STAT_KEYS},
        n_pairs=m["n_pairs"],
        vocab_size=m["vocab_size"],
        seq_len=m["seq_len"],
        centering=m["centering"],
        unigram=None if m["unigram"] is None else np.asarray(m["unigram"], dtype=np.float64),
        token_ids=None if m["token_ids"] is None else np.asarray(m["token_ids"], dtype=np.int64),
        vocab=vocab,
        meta=m.get("meta") or {},
    )


def _decode(v: str) -> Any:
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def _check_arrays(file: Path, arrays: dict[str, np.ndarray], size: int, seq_len: int) -> None:
    """The six statistics are floating point, of one precision, with the shapes the metadata implies."""
    dtypes = {str(arrays[k].dtype) for k in STAT_KEYS}
    if len(dtypes) != 1 or not np.issubdtype(arrays["bigram"].dtype, np.floating):
        raise InputError(
            f"{file} holds statistics of dtype {', '.join(sorted(dtypes))}; they are float32 or float64, all alike",
            "the file was edited or written by another program; recompute it with `originlens stats`",
        )
    square = {k: tuple(arrays[k].shape) for k in STAT_KEYS if k != "positional"}
    bad = {k: v for k, v in square.items() if v != (size, size)}
    if bad:  # the five matrices are one size×size shape (the metadata's size is checked after)
        k, v = next(iter(bad.items()))
        raise InputError(
            f"{file}: {k} has shape {v}; the five matrices must share one square shape ({square})",
            "the file was edited or written by another program; recompute it with `originlens stats`",
        )
    for k, want in _specs(size, seq_len, arrays["bigram"].dtype).items():
        if tuple(arrays[k].shape) != want[1]:
            raise InputError(
                f"{file}: {k} has shape {tuple(arrays[k].shape)}, expected {want[1]}",
                "the file was edited or written by another program; recompute it with `originlens stats`",
            )


def load_statistics(path: str | Path, *, expect_vocab_hash: str | None = None) -> CorpusStatistics:
    """Load statistics from a directory written by :func:`save_statistics` (or the file itself)."""
    path = Path(path)
    file = path / FILENAME if path.is_dir() else path
    if not file.exists():
        raise InputError(
            f"no statistics at {path} (expected {FILENAME})", "run `originlens stats ... --out DIR` first and pass DIR"
        )
    arrays, meta = load_tensors(file, kind="corpus-statistics", expect_vocab_hash=expect_vocab_hash)
    missing = [k for k in STAT_KEYS if k not in arrays]
    if missing:
        raise InputError(f"{file} lacks {', '.join(missing)}", "recompute the statistics")
    m = {k: _decode(v) for k, v in meta.items() if k not in ("format_version", "kind")}
    vocab_file = file.parent / "vocab.json"
    vocab = read_json(vocab_file) if vocab_file.exists() else None
    f = _Fields(file, m)
    size = int(np.asarray(arrays["bigram"]).shape[0])
    n_pairs, V, T = f.integer("n_pairs", 0), f.integer("vocab_size", 1), f.integer("seq_len", 1)
    _check_arrays(file, arrays, size, T)
    centering = f.number("centering")
    tok, uni = m.get("token_ids"), m.get("unigram")
    token_ids = None if tok is None else f.array("token_ids", np.int64, size, low=0, high=V - 1)
    unigram = None if uni is None else f.array("unigram", np.float64, size)
    if size > V or ("size" in m and m["size"] != size):
        f.bad("size", f"{m.get('size')!r} with {size}×{size} matrices and vocab_size {V}")
    if not isinstance(m.get("meta") or {}, dict):
        f.bad("meta", repr(m.get("meta"))[:60])
    return CorpusStatistics(
        **{k: arrays[k] for k in STAT_KEYS},
        n_pairs=n_pairs,
        vocab_size=V,
        seq_len=T,
        centering=centering,
        unigram=unigram,
        token_ids=token_ids,
        vocab=vocab,
        meta=m.get("meta") or {},
    )


class _Fields:
    """Typed reads of a statistics file's metadata: a missing or malformed field is one InputError."""

    def __init__(self, file: Path, meta: dict[str, Any]) -> None:
        self.file, self.meta = file, meta

    def bad(self, key: str, got: str) -> NoReturn:
        raise InputError(
            f"{self.file} has malformed metadata: {key} = {got}",
            "the file was edited or written by another program; recompute it with `originlens stats`",
        )

    def _get(self, key: str) -> Any:
        if key not in self.meta:
            raise InputError(f"{self.file} lacks the metadata field {key!r}", "recompute it with `originlens stats`")
        return self.meta[key]

    def integer(self, key: str, low: int) -> int:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            self.bad(key, f"{v!r} (expected an integer ≥ {low})")
        return int(v)

    def number(self, key: str) -> float:
        v = self._get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
            self.bad(key, f"{v!r} (expected a finite number)")
        return float(v)

    def array(
        self, key: str, dtype: Any, length: int, low: float | None = None, high: float | None = None
    ) -> np.ndarray:
        v = self.meta[key]
        try:
            a = np.asarray(v, dtype=dtype)
        except (TypeError, ValueError):
            a = None
        if (
            a is None
            or a.shape != (length,)
            or not np.all(np.isfinite(a))
            or (low is not None and a.size and a.min() < low)
            or (high is not None and a.size and a.max() > high)
        ):
            self.bad(
                key,
                f"{str(v)[:60]!r} (expected {length} numbers"
                + (f" in {low:g}..{high:g}" if low is not None and high is not None else "")
                + ")",
            )
        return a
