"""Saving and loading statistics: ``DIR/statistics.safetensors`` with exactly the six keys.

Everything else travels in the safetensors metadata (n_pairs, vocab size, T, centring, kept token ids,
vocabulary hash, format version) and, when known, ``DIR/vocab.json`` (kept tokens in row order) and
``DIR/manifest.json`` (corpus provenance).  Loading checks the format version and, if asked, the
vocabulary hash, so statistics are never silently applied to another vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from ..errors import InputError
from ..storage import atomic_directory, atomic_write_json, load_tensors, read_json, save_tensors, vocab_hash
from .corpus import STAT_KEYS, CorpusStatistics

FILENAME = "statistics.safetensors"


def statistics_vocab_hash(stats: CorpusStatistics) -> str:
    return vocab_hash(stats.vocab, stats.size) if stats.vocab is not None else vocab_hash(None, stats.vocab_size)


def save_statistics(
    stats: CorpusStatistics,
    out: str | Path,
    *,
    manifest: dict[str, Any] | None = None,
    extra_files: dict[str, Any] | None = None,
    inputs: Any = (),
) -> Path:
    """Write ``out/statistics.safetensors`` (+ vocab.json, manifest.json) atomically; returns ``out``.

    An existing ``out`` is replaced only when it is an earlier statistics output, and never when it is
    (or contains) one of ``inputs`` (the corpus the statistics were computed from)."""
    out = Path(out)
    meta = {
        "n_pairs": stats.n_pairs,
        "vocab_size": stats.vocab_size,
        "seq_len": stats.seq_len,
        "centering": stats.centering,
        "size": stats.size,
        "token_ids": None if stats.token_ids is None else [int(i) for i in stats.token_ids],
        "unigram": None if stats.unigram is None else [float(u) for u in stats.unigram],
        "vocab_hash": statistics_vocab_hash(stats),
        "meta": stats.meta,
    }
    with atomic_directory(out, kind_file=FILENAME, kind="statistics output", inputs=inputs) as tmp:
        save_tensors(tmp / FILENAME, stats.as_dict(), kind="corpus-statistics", metadata=meta)
        if stats.vocab is not None:
            atomic_write_json(tmp / "vocab.json", stats.vocab)
        if manifest is not None:
            from ..runs import git_commit, package_versions

            atomic_write_json(
                tmp / "manifest.json",
                {"environment": {"versions": package_versions(), "git_commit": git_commit()}, **manifest},
            )
        for name, obj in (extra_files or {}).items():
            atomic_write_json(tmp / name, obj)
    return out


def _decode(v: str) -> Any:
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


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
