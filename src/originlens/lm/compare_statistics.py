"""Corpus statistics in a language model's own tokenizer, for the checkpoint comparison of
:mod:`originlens.lm.compare` (arXiv 2601.19208, the Pythia comparison).

* **Vocabulary checks**: :class:`VocabIdentity` (size, and a hash of the token strings when known) of the
  model (:func:`model_identity`) and of a tokenizer (:func:`tokenizer_identity`,
  :func:`tokenizer_vocab`); :func:`check_vocab` refuses a corpus tokenised with another tokenizer
  (vocabulary size, and hash when both sides know theirs).
* **Windows**: :func:`windows_from_texts` tokenises each text with the **model's** tokenizer, prepends BOS
  (when the model has one; not twice) and cuts or pads (padding masked) to ``window_tokens`` tokens:
  ``windows`` (N, window_tokens) int64 and ``valid`` (N, window_tokens − 1) marking real pairs;
  :func:`prepend_bos` does the same for windows already tokenised.
* **Statistics**: :func:`comparison_statistics` is :func:`~originlens.stats.corpus_statistics` on the K
  most frequent real tokens (:func:`top_tokens`; ties by smaller id, only tokens that occur), rows in that
  order, with the centring constant 1/|V| of the model's vocabulary unless given.

Caveat: the corpus may have fewer than K distinct tokens; then K is what it has (logged).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError
from ..progress import log


@dataclass
class VocabIdentity:
    """What is known of a vocabulary: its size, and a hash of its token strings when available."""

    vocab_size: int
    vocab_hash: str | None = None
    source: str = ""


def tokenizer_vocab(tokenizer: Any) -> list[str]:
    """Token strings by id of an originlens tokenizer (``vocab``), a llama2.c tokenizer (``pieces``), a
    Hugging Face ``tokenizers.Tokenizer`` or ``transformers`` tokenizer (``get_vocab()``; ids without a
    string become ``<id:N>``), or a :class:`~originlens.lm.loading.TextCodec` wrapping one of them."""
    inner = getattr(tokenizer, "inner", None)
    if inner is not None and hasattr(tokenizer, "encode_fn"):
        return tokenizer_vocab(inner)
    vocab = getattr(tokenizer, "vocab", None)
    if isinstance(vocab, list):
        return vocab
    pieces = getattr(tokenizer, "pieces", None)
    if pieces is not None:
        return [p.decode("utf-8", errors="backslashreplace") for p in pieces]
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if callable(get_vocab):
        by_id = {int(i): str(t) for t, i in get_vocab().items()}
        n = max(by_id) + 1 if by_id else 0
        return [by_id.get(i, f"<id:{i}>") for i in range(n)]
    raise ConfigError(
        f"cannot read the vocabulary of {type(tokenizer).__name__}",
        "pass an originlens, tokenizer.json or llama2.c tokenizer",
    )


def tokenizer_identity(tokenizer: Any, source: str = "tokenizer") -> VocabIdentity:
    from ..storage import vocab_hash

    vocab = tokenizer_vocab(tokenizer)
    return VocabIdentity(len(vocab), vocab_hash(vocab, len(vocab)), source)


def model_identity(adapter: Any, tokenizer: Any | None = None) -> VocabIdentity:
    """The model's vocabulary: its size, plus the hash of ``tokenizer`` (or of the tokenizer the adapter
    carries, or the ``vocab_hash`` recorded in the checkpoint)."""
    tok = tokenizer if tokenizer is not None else getattr(adapter, "tokenizer", None)
    if tok is not None:
        ident = tokenizer_identity(tok, "model tokenizer")
        return VocabIdentity(int(adapter.vocab_size), ident.vocab_hash, "model tokenizer")
    return VocabIdentity(int(adapter.vocab_size), getattr(adapter, "vocab_hash", None), "checkpoint")


def check_vocab(
    model: VocabIdentity, corpus: VocabIdentity, what: str, *, tokenizer_size: int | None = None
) -> list[str]:
    """Raise :class:`CompatibilityError` when ``corpus`` was not tokenised with the model's tokenizer.

    Sizes must agree (or the corpus may be smaller than a padded model vocabulary when the hashes prove
    the tokenizer); hashes must agree when both are known.  Returns warnings (what could not be checked).
    """
    fix = (
        "tokenize the corpus with the model's tokenizer (pass the raw text as --corpus together with "
        "--tokenizer), or pass the model that goes with this corpus"
    )
    hashes_known = model.vocab_hash is not None and corpus.vocab_hash is not None
    if hashes_known and model.vocab_hash != corpus.vocab_hash:
        raise CompatibilityError(
            f"{what} was tokenized with another vocabulary than the model's "
            f"(vocabulary hash {corpus.vocab_hash} vs {model.vocab_hash})",
            fix,
        )
    same_size = corpus.vocab_size == model.vocab_size or (
        hashes_known
        and tokenizer_size is not None
        and corpus.vocab_size == tokenizer_size
        and corpus.vocab_size <= model.vocab_size
    )
    if not same_size:
        raise CompatibilityError(
            f"{what} has a vocabulary of {corpus.vocab_size} tokens but the model has "
            f"{model.vocab_size}: it was tokenized with another tokenizer",
            fix,
        )
    if not hashes_known:
        return [
            f"could only check the vocabulary size of {what} ({corpus.vocab_size}); no vocabulary hash "
            "on " + ("the model side" if model.vocab_hash is None else "the corpus side")
        ]
    return []


def windows_from_texts(
    texts: Iterable[str],
    encode: Callable[[str], list[int]],
    *,
    bos_id: int | None,
    window_tokens: int = 128,
    max_texts: int | None = None,
    min_tokens: int = 0,
    min_chars: int = 0,
    counts: dict[str, int] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Each text tokenised, BOS prepended (unless already first), cut or padded to
    ``window_tokens`` tokens.  Returns ``(windows (N, window_tokens) int64, valid (N, window_tokens−1))``;
    ``valid[n, t]`` marks a real (x_t, x_{t+1}) pair (padding is 0 and not counted).

    ``min_chars`` / ``min_tokens``: texts with fewer characters / tokens (before BOS and cutting) are
    skipped — the paper's OpenWebText protocol keeps texts of ≥ 512 characters; ``min_tokens =
    window_tokens − 1`` keeps only texts that fill a window; ``max_texts`` counts the texts *kept*;
    ``counts`` (if given) receives ``read``, ``kept`` and ``skipped_short``."""
    if window_tokens < 2:
        raise ConfigError(f"window_tokens must be ≥ 2 (got {window_tokens})", "e.g. 128")
    if min_tokens < 0 or min_chars < 0:
        raise ConfigError(
            f"min_tokens / min_chars must be ≥ 0 (got {min_tokens} / {min_chars})",
            "e.g. --min-chars 512 (the paper's OpenWebText filter)",
        )
    rows: list[list[int]] = []
    lens: list[int] = []
    tally = {"read": 0, "kept": 0, "skipped_short": 0}
    for text in texts:
        if max_texts is not None and len(rows) >= max_texts:
            break
        tally["read"] += 1
        if len(text) < min_chars:
            tally["skipped_short"] += 1
            continue
        ids = list(encode(text))
        if len(ids) < min_tokens:
            tally["skipped_short"] += 1
            continue
        if bos_id is not None and (not ids or ids[0] != bos_id):
            ids = [bos_id] + ids
        ids = ids[:window_tokens]
        if len(ids) < 2:
            continue
        lens.append(len(ids))
        rows.append(ids + [0] * (window_tokens - len(ids)))
    tally["kept"] = len(rows)
    if counts is not None:
        counts.update(tally)
    if not rows:
        lim = min_tokens or min_chars
        raise InputError(
            "no text gave at least two tokens" + (" and passed the length filter" if lim else ""),
            "pass a corpus with some text" + (", or lower --min-tokens / --min-chars" if lim else ""),
        )
    windows = np.asarray(rows, dtype=np.int64)
    valid = np.arange(window_tokens - 1)[None, :] + 1 < np.asarray(lens)[:, None]
    return windows, valid


def prepend_bos(windows: np.ndarray, bos_id: int | None) -> np.ndarray:
    """Windows (N, T+1) with BOS as first token: ``[BOS] + w[:-1]`` for rows not already starting with it."""
    w = np.asarray(windows).astype(np.int64)
    if bos_id is None:
        return w
    out = w.copy()
    need = w[:, 0] != bos_id
    out[need, 1:] = w[need, :-1]
    out[need, 0] = bos_id
    return out


def top_tokens(windows: np.ndarray, valid: np.ndarray | None, vocab_size: int, k: int) -> np.ndarray:
    """The ``k`` most frequent real tokens of the windows (ties by smaller id), only tokens that occur."""
    if k < 1:
        raise ConfigError(f"--top-tokens must be ≥ 1 (got {k})", "e.g. --top-tokens 2000")
    w = np.asarray(windows)
    if valid is None:
        real = np.ones(w.shape, dtype=bool)
    else:
        real = np.concatenate([valid[:, :1], valid], axis=1)  # token t+1 is real iff pair t is
    counts = np.bincount(w[real].astype(np.int64), minlength=vocab_size)
    order = np.lexsort((np.arange(len(counts)), -counts))
    order = order[counts[order] > 0]
    return order[:k]


def comparison_statistics(
    windows: np.ndarray,
    vocab_size: int,
    *,
    valid: np.ndarray | None = None,
    top_k: int = 2000,
    centering: float | None = None,
    vocab: list[str] | None = None,
) -> Any:
    """:func:`~originlens.stats.corpus_statistics` on the top-K tokens of ``windows`` (ids < vocab_size,
    the model's vocabulary), with padding masked; centring 1/vocab_size unless given."""
    from ..stats import corpus_statistics

    w = np.asarray(windows)
    if int(w.max()) >= vocab_size or int(w.min()) < 0:
        raise CompatibilityError(
            f"corpus token id {int(w.max())} is outside the model's vocabulary 0..{vocab_size - 1}",
            "tokenize the corpus with the model's tokenizer",
        )
    ids = top_tokens(w, valid, vocab_size, top_k)
    if len(ids) < top_k:
        log(f"note: the corpus has only {len(ids)} distinct tokens; K = {len(ids)} (asked for {top_k})")
    return corpus_statistics(w, vocab_size, token_ids=ids, centering=centering, mask=valid, vocab=vocab)
