"""Token store: a corpus directory of fixed-length windows (validated loading: :mod:`.windows`).

Layout of a corpus directory (written by :func:`originlens.data.build.build_corpus`)::

    DIR/
      tokens.npy     (N, T+1) unsigned ints (uint8/uint16/uint32, the smallest holding |V|-1)
      vocab.json     token string per id (list, index = id)
      tokenizer/     the saved tokenizer (rebuild with TokenStore.tokenizer())
      manifest.json  format_version, kind, sources (path, bytes, sha256), tokenizer settings,
                     vocab_size, seq_len, windows, oov, counts, vocab_hash, dtype, shape, tokens_sha256

Row n of ``tokens`` is one sequence x_0..x_T: inputs x_0..x_{T-1}, targets x_1..x_T.
Arrays are opened memory-mapped and read-only (``np.load(mmap_mode="r", allow_pickle=False)``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, InputError
from ..outputs import OutputKind
from ..storage import FORMAT_VERSION, read_json, vocab_hash

CORPUS_KIND = "originlens.corpus"
TOKENS = "tokens.npy"
VOCAB = "vocab.json"
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
WINDOW_DOCUMENTS = "window_documents.npy"  # first/split: the source document (0-based, reading order) of each window


def smallest_uint(vocab_size: int) -> np.dtype:
    """Smallest unsigned dtype holding ids 0..vocab_size-1."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)


def _invalid_corpus_manifest(path: Path) -> str | None:
    try:
        kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError, AttributeError):
        return "not a JSON object"
    return None if kind == CORPUS_KIND else f"its kind is {kind!r}, not {CORPUS_KIND!r}"


OUTPUT = OutputKind(
    "corpus directory",
    MANIFEST,
    (MANIFEST, TOKENS, VOCAB, WINDOW_DOCUMENTS, f"{TOKENIZER_DIR}/*"),
    invalid=_invalid_corpus_manifest,
)


def is_corpus_dir(path: str | Path) -> bool:
    """True when ``path`` is a directory with an originlens corpus manifest (not fully validated)."""
    m = Path(path) / MANIFEST
    if not m.is_file():
        return False
    try:
        return json.loads(m.read_text(encoding="utf-8")).get("kind") == CORPUS_KIND
    except (OSError, ValueError, AttributeError):
        return False


def _load_npy(path: Path) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:  # object arrays need pickle
        raise InputError(
            f"{path} cannot be read without pickle ({exc})",
            "save token ids as a plain integer array (np.save of a uint16/int64 array)",
        ) from None
    except (OSError, EOFError) as exc:
        raise InputError(f"{path} is not a readable .npy file ({exc})", "check or re-create the file") from None


class TokenStore:
    """A validated corpus directory. Attributes: ``path``, ``tokens`` (N, T+1) memmap, ``vocab``,
    ``vocab_size``, ``seq_len`` (T), ``manifest``, ``vocab_hash``."""

    def __init__(self, path: Path, tokens: np.ndarray, vocab: list[str], manifest: dict[str, Any]) -> None:
        self.path = Path(path)
        self.tokens = tokens
        self.vocab = vocab
        self.manifest = manifest

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["vocab_size"])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1]) - 1

    @property
    def vocab_hash(self) -> str:
        return str(self.manifest["vocab_hash"])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def window_documents(self) -> np.ndarray | None:
        """Each window's source document (0-based reading order) for ``first``/``split`` corpora built
        since it was recorded; None otherwise."""
        f = self.path / "window_documents.npy"
        if not f.is_file():
            return None
        arr = _load_npy(f)
        if arr.shape != (len(self),) or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(f"{f} does not have one integer per window", "rebuild the corpus")
        return arr

    def __repr__(self) -> str:
        return f"TokenStore({str(self.path)!r}, windows={len(self)}, T={self.seq_len}, |V|={self.vocab_size})"

    def tokenizer(self):
        """The tokenizer that produced the ids (from ``tokenizer/``)."""
        from .tokenizers import load_saved

        return load_saved(self.path / TOKENIZER_DIR)

    @classmethod
    def open(cls, directory: str | Path) -> TokenStore:
        d = Path(directory)
        fix = "build one with `originlens corpus build ... --out DIR`"
        if not d.is_dir():
            raise InputError(
                f"corpus directory {d} does not exist" if not d.exists() else f"{d} is a file, not a corpus directory",
                fix,
            )
        if not (d / MANIFEST).is_file():
            raise InputError(f"{d} is not a corpus directory (no {MANIFEST})", fix)
        m = read_json(d / MANIFEST)
        if not isinstance(m, dict) or m.get("kind") != CORPUS_KIND:
            raise InputError(f"{d / MANIFEST} is not an originlens corpus manifest", fix)
        if str(m.get("format_version")) != FORMAT_VERSION:
            raise CompatibilityError(
                f"{d} has corpus format version {m.get('format_version')}; this originlens reads {FORMAT_VERSION}",
                "rebuild the corpus",
            )
        for f in (TOKENS, VOCAB):
            if not (d / f).is_file():
                raise InputError(f"corpus directory {d} lacks {f}", "rebuild the corpus")
        tokens = _load_npy(d / TOKENS)
        vocab = read_json(d / VOCAB)
        if not isinstance(vocab, list) or not all(isinstance(t, str) for t in vocab):
            raise InputError(f"{d / VOCAB} is not a list of token strings", "rebuild the corpus")
        shape = tuple(m.get("shape", ()))
        if tokens.shape != shape or str(tokens.dtype) != m.get("dtype"):
            raise InputError(
                f"{d / TOKENS} has shape {tokens.shape} / dtype {tokens.dtype}, manifest says "
                f"{shape} / {m.get('dtype')}",
                "the directory was modified; rebuild the corpus",
            )
        if len(vocab) != m.get("vocab_size") or vocab_hash(vocab, len(vocab)) != m.get("vocab_hash"):
            raise InputError(
                f"{d / VOCAB} does not match the manifest (size or hash)",
                "the directory was modified; rebuild the corpus",
            )
        _check_tokens(tokens, d / TOKENS, len(vocab), scan=False)
        return cls(d, tokens, vocab, m)


def check_window_array(tokens: Any, where: Path | str = "token array") -> np.ndarray:
    """The structural checks every reader of token windows applies, in one place: a 2-D (N, T+1)
    integer array with T+1 ≥ 2 and N ≥ 1 (:class:`InputError` naming ``where`` otherwise). Returns
    ``np.asarray(tokens)`` (no copy); the id range is the caller's (it needs |V|)."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise InputError(
            f"{where} holds a {tokens.ndim}-D array of shape {tokens.shape}; expected 2-D (N, T+1)",
            "save windows as an (N, T+1) array, one row per sequence",
        )
    if not (np.issubdtype(tokens.dtype, np.integer) and tokens.dtype != np.bool_):
        raise InputError(
            f"{where} has dtype {tokens.dtype}; token ids must be integers",
            "save the ids as an integer array (e.g. tokens.astype(np.uint16))",
        )
    n, t1 = tokens.shape
    if t1 < 2:
        raise InputError(
            f"{where} has windows of {t1} token(s); at least 2 are needed (T+1 >= 2)", "rebuild with --seq-len >= 1"
        )
    if n == 0:
        raise InputError(
            f"{where} holds no windows (empty, shape {tokens.shape})",
            "rebuild the corpus with a smaller --seq-len or more text",
        )
    return tokens


def _check_tokens(tokens: np.ndarray, where: Path | str, vocab_size: int | None, *, scan: bool = True) -> int:
    """Validate a token array; returns the vocabulary size (given, or max id + 1)."""
    check_window_array(tokens, where)
    if vocab_size is not None and vocab_size < 1:
        raise InputError(f"vocab_size must be >= 1, got {vocab_size}", "pass a positive --vocab-size")
    if not scan:
        return int(vocab_size)  # type: ignore[arg-type]
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0:
        raise InputError(f"{where} contains negative token id {lo}", "token ids must be in 0..|V|-1")
    if vocab_size is None:
        return hi + 1
    if hi >= vocab_size:
        raise InputError(
            f"{where} contains token id {hi} but vocab_size is {vocab_size}",
            f"pass a vocab size >= {hi + 1}, or rebuild the corpus with this vocabulary",
        )
    return int(vocab_size)
