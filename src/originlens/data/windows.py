"""Token windows as one value: :class:`TokenWindows` (ids, vocabulary, vocabulary hash, manifest, source).

Every consumer of training windows (statistics, the one-hot trainer, the GPT trainer, the leading-term
reports, the LM tools) reads them through :meth:`TokenWindows.load`, which validates once (2-D integer
array (N, T+1), T+1 ≥ 2, N ≥ 1, 0 ≤ ids < |V|) and settles the vocabulary size and hash once:

* a corpus directory (:class:`originlens.data.TokenStore`): the stored vocabulary; its hash is the
  manifest's (checked against the vocabulary when the store is opened);
* a bare ``.npy`` of ids: no token strings, ``vocab_size`` as given (or max id + 1) and ``vocab_hash``
  ``None`` (nothing names the ids).

``tokens`` is the memory-mapped, read-only array; slicing (``windows[:n]``) returns a new value over the
first n windows with the same vocabulary.  Caveat: validation reads the whole array once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, InputError
from ..storage import vocab_hash as _hash_vocab
from .store import TOKENS, TokenStore, _check_tokens, _load_npy

__all__ = ["TokenWindows", "load_token_array"]


@dataclass(frozen=True)
class TokenWindows:
    """Validated token windows of one source.

    ``tokens``: (N, T+1) integer array (row n = x_0..x_T); ``vocab``: token string per id, or ``None``
    for a bare array; ``vocab_size``: |V| (all ids are below it); ``manifest``: the corpus manifest or
    ``None``; ``source``: where they were read from.
    """

    tokens: np.ndarray
    vocab: list[str] | None
    vocab_size: int
    manifest: dict[str, Any] | None
    source: Path

    @classmethod
    def load(cls, path_or_dir: str | Path, vocab_size: int | None = None) -> TokenWindows:
        """Windows of a corpus directory or a bare ``.npy`` file, validated.

        ``vocab_size``: the bound every id is checked against and the value's ``vocab_size``; default
        the corpus's |V| (a bare array: max id + 1).
        """
        p = Path(path_or_dir)
        if p.is_dir():
            store = TokenStore.open(p)
            vs = store.vocab_size if vocab_size is None else int(vocab_size)
            _check_tokens(store.tokens, store.path / TOKENS, vs)
            return cls(store.tokens, store.vocab, vs, store.manifest, p)
        if not p.exists():
            raise InputError(
                f"token file or corpus directory {p} does not exist",
                "pass a corpus directory (originlens corpus build) or an .npy file of token ids",
            )
        if p.suffix.lower() != ".npy":
            raise InputError(
                f"{p} is neither a corpus directory nor an .npy file",
                "pass a corpus directory (originlens corpus build) or an .npy file of token ids",
            )
        tokens = _load_npy(p)
        vs = _check_tokens(tokens, p, None if vocab_size is None else int(vocab_size))
        return cls(tokens, None, vs, None, p)

    # -- shape ---------------------------------------------------------------------------------------
    @property
    def n_windows(self) -> int:
        """N, the number of windows."""
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        """T: each window holds T inputs and T targets (T + 1 ids)."""
        return int(self.tokens.shape[1]) - 1

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, rows: slice) -> TokenWindows:
        """The windows selected by a slice of rows, same vocabulary and source."""
        if not isinstance(rows, slice):
            raise TypeError("TokenWindows takes a slice of rows; use .tokens[i] for one window")
        return replace(self, tokens=self.tokens[rows])

    # -- identity ------------------------------------------------------------------------------------
    @property
    def vocab_hash(self) -> str | None:
        """:func:`originlens.storage.vocab_hash` of the token strings (the corpus manifest's value), or
        ``None`` when no token strings name the ids."""
        if self.vocab is None:
            return None
        recorded = (self.manifest or {}).get("vocab_hash")
        return str(recorded) if recorded is not None else _hash_vocab(self.vocab, len(self.vocab))

    @property
    def tokens_sha256(self) -> str | None:
        """The corpus manifest's sha256 of ``tokens.npy`` (``None`` for a bare array)."""
        value = (self.manifest or {}).get("tokens_sha256")
        return None if value is None else str(value)

    def require_vocab_size(self, vocab_size: int | None) -> int:
        """|V| agreed between these windows and a requested size: a corpus's vocabulary must equal a
        requested size (:class:`CompatibilityError` otherwise); ``None`` takes the windows' own."""
        if vocab_size is None:
            return self.vocab_size
        if self.vocab is not None and int(vocab_size) != len(self.vocab):
            raise CompatibilityError(
                f"--vocab-size {vocab_size} differs from the corpus vocabulary ({len(self.vocab)})",
                "drop --vocab-size when training on a corpus directory",
            )
        return int(vocab_size)

    def as_tuple(self) -> tuple[np.ndarray, list[str] | None, dict[str, Any] | None]:
        """``(tokens, vocab, manifest)``, the value :func:`originlens.data.load_token_array` returns."""
        return self.tokens, self.vocab, self.manifest

    def __repr__(self) -> str:
        names = "named" if self.vocab is not None else "unnamed"
        return f"TokenWindows({self.n_windows} × T={self.seq_len}, |V|={self.vocab_size} {names}, {self.source})"


def load_token_array(
    path_or_dir: str | Path, vocab_size: int | None = None
) -> tuple[np.ndarray, list[str] | None, dict[str, Any] | None]:
    """Token windows from a corpus directory or a bare ``.npy`` file, validated, as a tuple.

    Returns ``(tokens, vocab, manifest)`` (``vocab`` and ``manifest`` are ``None`` for a bare ``.npy``):
    ``TokenWindows.load(path_or_dir, vocab_size).as_tuple()``; :class:`TokenWindows` also carries the
    vocabulary size and hash.
    """
    return TokenWindows.load(path_or_dir, vocab_size).as_tuple()
