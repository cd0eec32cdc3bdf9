"""Tokenizers as the LM tools see them: :class:`TextCodec` (the package's
:class:`originlens.data.TextTokenizer` protocol plus the special ids a model needs) and its constructors
for llama2.c ``tokenizer.bin``, Hugging Face ``tokenizer.json`` (through ``tokenizers``, no remote code),
a local ``AutoTokenizer`` directory (offline, never remote code) and the corpus tokenizers of
:mod:`originlens.data.tokenizers`.  Which one a model path gets is decided in :mod:`.loading`;
:func:`check_vocab` checks a codec against a model's adapter."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CompatibilityError, InputError, OriginlensError
from .llama2c_tokenizer import BOS_ID, EOS_ID, Llama2cTokenizer


@dataclass
class TextCodec:
    """A tokenizer as the lm tools use it: the package's :class:`originlens.data.TextTokenizer` protocol
    plus the special ids a model needs.

    ``encode(text)`` gives the ids of the plain text (no BOS/EOS added); ``decode(ids)`` the text of
    ids, control tokens (BOS/EOS and other special tokens) dropped.  ``bos_id``/``eos_id`` are the
    tokenizer's own, ``None`` when it has none; ``inner`` is the wrapped tokenizer object.
    """

    encode_fn: Callable[[str], list[int]]
    decode_fn: Callable[[list[int]], str]
    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    source: str = ""
    inner: Any = field(default=None, repr=False)

    def encode(self, text: str) -> list[int]:
        return list(self.encode_fn(text))

    def decode(self, ids: Iterable[int] | torch.Tensor) -> str:
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.decode_fn([int(i) for i in ids])


def count_llama2c_pieces(path: Path) -> int:
    """Number of tokens in a llama2.c tokenizer file (records until the end of the file)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read tokenizer {path}: {exc.strerror or exc}", "check the --tokenizer path") from None
    pos, n = 4, 0
    while pos + 8 <= len(raw):
        length = int(np.frombuffer(raw, "<i4", 1, pos + 4)[0])
        if length < 0:
            break
        pos += 8 + length
        n += 1
    if n == 0 or pos != len(raw):
        raise InputError(
            f"{path} is not a llama2.c tokenizer file (records do not end at the file end)",
            "pass a llama2.c tokenizer .bin, a tokenizer.json or a tokenizer directory",
        )
    return n


def llama2c_codec(path: str | os.PathLike, vocab_size: int | None = None) -> TextCodec:
    """A llama2.c ``tokenizer.bin`` (``vocab_size`` checked exactly when given, else counted)."""
    p = Path(path)
    tok = Llama2cTokenizer.from_file(p, vocab_size if vocab_size is not None else count_llama2c_pieces(p))
    return TextCodec(lambda t: tok.encode(t, bos=False), tok.decode, tok.vocab_size, BOS_ID, EOS_ID, str(p), tok)


def tokenizer_json_codec(path: str | os.PathLike, *, bos_id: int | None = None, eos_id: int | None = None) -> TextCodec:
    """A Hugging Face ``tokenizer.json`` through ``tokenizers`` (no transformers, no remote code)."""
    from tokenizers import Tokenizer

    p = Path(path)
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as exc:  # tokenizers raises a bare Exception on parse errors
        raise InputError(
            f"{p} is not a readable tokenizer.json ({' '.join(str(exc).split())[:160]})",
            "pass a fast-tokenizer file saved by Hugging Face tokenizers/transformers",
        ) from None
    return TextCodec(
        lambda t: tok.encode(t, add_special_tokens=False).ids,
        lambda ids: tok.decode(ids, skip_special_tokens=True),
        tok.get_vocab_size(with_added_tokens=True),
        bos_id,
        eos_id,
        str(p),
        tok,
    )


def auto_tokenizer_codec(directory: str | os.PathLike) -> TextCodec:
    """``transformers.AutoTokenizer`` of a local directory (offline, never remote code)."""
    from .hf_hub import quiet_transformers, require_transformers

    tf = require_transformers()
    d = Path(directory)
    with quiet_transformers():
        try:
            tok = tf.AutoTokenizer.from_pretrained(str(d), local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError, ImportError) as exc:
            raise InputError(
                f"no usable tokenizer in {d} ({' '.join(str(exc).split())[:160]})",
                "pass --tokenizer (a tokenizer.json file or a directory holding one)",
            ) from None
    return TextCodec(
        lambda t: tok.encode(t, add_special_tokens=False),
        lambda ids: tok.decode(ids, skip_special_tokens=True),
        len(tok),
        tok.bos_token_id,
        tok.eos_token_id,
        str(d),
        tok,
    )


def originlens_codec(tok: Any, source: str = "") -> TextCodec:
    """A tokenizer of :mod:`originlens.data.tokenizers` (word, BPE, pretrained)."""
    bos = getattr(tok, "bos_id", None)
    eos = getattr(tok, "eot_id", None)
    wrap = bool(getattr(tok, "wrap", False))
    if bos is None:
        bos = eos  # packed word corpora separate documents by <eot>: start after one
    control = {i for i in (bos, eos) if i is not None}

    def encode(text: str) -> list[int]:
        ids = tok.encode(text)
        return ids[1:-1] if wrap and len(ids) >= 2 else ids

    return TextCodec(
        encode, lambda ids: tok.decode([i for i in ids if i not in control]), tok.vocab_size, bos, eos, source, tok
    )


def check_vocab(adapter: Any, codec: TextCodec) -> None:
    """:class:`CompatibilityError` when the tokenizer has ids the model cannot embed, or when the model file
    records a vocabulary hash (``adapter.vocab_hash``, written by ``ntp train``) that the tokenizer's
    token strings do not have.  Without a recorded hash only the size is checked."""
    if codec.vocab_size > adapter.vocab_size:
        raise CompatibilityError(
            f"tokenizer {codec.source or ''} has {codec.vocab_size} tokens but the model only {adapter.vocab_size}",
            "use the tokenizer the model was trained with",
        )
    want = getattr(adapter, "vocab_hash", None)
    if want is None or codec.inner is None:
        return
    from .compare_statistics import tokenizer_identity

    try:
        got = tokenizer_identity(codec.inner).vocab_hash
    except OriginlensError:  # a tokenizer whose token strings cannot be listed: size check only
        return
    if got != want:
        raise CompatibilityError(
            f"tokenizer {codec.source or ''} is not the model's: its vocabulary hash is "
            f"{got}, the model was trained on {want}",
            "use the tokenizer (corpus vocabulary) the model was trained with",
        )
