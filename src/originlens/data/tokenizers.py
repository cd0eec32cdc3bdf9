"""Tokenizers: the papers' word-level tokenizer, a corpus-trained BPE, and pretrained ``tokenizer.json``.

One protocol for every tokenizer of the package, in two levels: :class:`TextTokenizer`
(``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``) is what any consumer of text may
rely on, and what the LM tools' :class:`originlens.lm.loading.TextCodec` (llama2.c, ``tokenizer.json``,
``AutoTokenizer``, and the tokenizers below) implements; :class:`Tokenizer` adds what a corpus needs:
``vocab`` (token string per id), ``unk_id`` and ``eot_id`` (``None`` when absent), ``settings()``
(JSON-able) and ``save(dir)``.  All three tokenizers below follow :class:`Tokenizer`;
:func:`load_saved` reads back any saved one.

Word tokenizer (arXiv 2601.19208 §5.1.1, see :func:`pre_tokenize`): the text is lower-cased
*as a whole* (``str.lower``, so Greek final sigma follows its context), then every maximal run of
alphabetic characters (``str.isalpha``) is a token and every other non-whitespace character
(punctuation, each digit, apostrophes, combining marks, emoji) is a token of its own; all whitespace
(``str.isspace``) is dropped. There is no Unicode normalisation: a decomposed "é" (e + U+0301) splits
into ``e`` and the combining accent. The vocabulary is the most frequent tokens, ties broken by first
occurrence in the training documents (``collections.Counter.most_common`` order). ``vocab_size``
counts *every* id, special tokens included: with ``oov="unk"`` the ids are ``<unk>`` (id 0) plus the
``vocab_size - 1`` most frequent words. Difference from the paper: the paper drops only spaces and
newlines; tabs and other Unicode spaces would be tokens there (and, being rare, make a story OOV).
Word decoding joins tokens with single spaces (lossy).

BPE (paper Table 2 protocol): Hugging Face ``tokenizers`` BPE model, Whitespace pre-tokenizer, special
tokens ``<unk> <pad> <s> </s>`` (ids 0-3), each text wrapped as ``<s> … </s>`` when ``wrap=True``.

Pretrained: a ``tokenizer.json`` (or a directory holding one) read with
``tokenizers.Tokenizer.from_file``: no ``transformers``, no remote code.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..errors import CompatibilityError, ConfigError, InputError
from ..storage import atomic_write_json, read_json

UNK = "<unk>"
EOT = "<eot>"
BPE_SPECIALS = ("<unk>", "<pad>", "<s>", "</s>")
SAVED_NAME = "originlens_tokenizer.json"
HF_NAME = "tokenizer.json"
OOV_MODES = ("drop", "unk")
_EOT_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|eot_id|>", EOT)


@runtime_checkable
class TextTokenizer(Protocol):
    """Text ↔ ids: ``encode`` gives the ids of plain text (no BOS/EOS added unless the tokenizer's own
    settings wrap every text), ``decode`` the text of ids; every id is below ``vocab_size``."""

    @property
    def vocab_size(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Iterable[int]) -> str: ...


@runtime_checkable
class Tokenizer(TextTokenizer, Protocol):
    """A corpus tokenizer: a :class:`TextTokenizer` with named ids, special ids, settings and storage."""

    vocab: list[str]
    unk_id: int | None
    eot_id: int | None

    def settings(self) -> dict[str, Any]: ...
    def save(self, directory: str | Path) -> Path: ...


# --------------------------------------------------------------------------------------- words

# alphabetic runs (may include non-decimal numerics such as '²', split again below) | any other char
_WORD_RE = re.compile(r"[^\W\d_]+|\S")


@functools.cache
def _numeric_letters() -> frozenset[str]:
    """Characters matched by ``[^\\W\\d_]`` that are not alphabetic ('²', '½', 'Ⅻ', ...; ~1k of them).
    A set: ``isdisjoint`` scans text ~100x faster than a regex class of these scattered code points."""
    return frozenset(c for c in map(chr, range(0x110000)) if c.isalnum() and not c.isalpha() and not c.isdecimal())


def pre_tokenize(text: str) -> list[str]:
    """The paper's word-level pre-tokenisation (see the module docstring).

    Invariant: ``"".join(pre_tokenize(s)) == "".join(c for c in s.lower() if not c.isspace())``;
    note ``s.lower()`` of the whole text, which is not always ``"".join(s.split()).lower()``
    (final sigma) and may be longer than ``s`` ("İ" → "i̇").
    """
    low = text.lower()
    toks = _WORD_RE.findall(low)
    if low.isascii() or _numeric_letters().isdisjoint(low):
        return toks
    out: list[str] = []
    for tok in toks:
        if len(tok) == 1 or tok.isalpha():
            out.append(tok)
            continue
        run = ""  # rare: a run containing numeric non-alphabetic characters
        for ch in tok:
            if ch.isalpha():
                run += ch
            else:
                if run:
                    out.append(run)
                    run = ""
                out.append(ch)
        if run:
            out.append(run)
    return out


def _check_oov(oov: str) -> None:
    if oov not in OOV_MODES:
        raise ConfigError(f"unknown OOV policy {oov!r}", "use 'drop' or 'unk'")


def _check_vocab_size(vocab_size: int, n_special: int) -> None:
    if not isinstance(vocab_size, int) or vocab_size < n_special + 1:
        raise ConfigError(
            f"vocab size {vocab_size} is too small (needs at least {n_special + 1}: "
            f"{n_special} special token(s) + 1 word)",
            "pass a larger --vocab-size",
        )


class WordTokenizer:
    """Word-level tokenizer with a fixed vocabulary (token string per id)."""

    kind = "words"

    def __init__(self, vocab: list[str], *, oov: str = "drop") -> None:
        _check_oov(oov)
        if len(set(vocab)) != len(vocab):
            raise InputError("word vocabulary has duplicate tokens", "rebuild the tokenizer")
        if oov == "unk" and UNK not in vocab:
            raise ConfigError("oov='unk' needs '<unk>' in the vocabulary", "train with oov='unk'")
        self.vocab = list(vocab)
        self.oov = oov
        self._ids = {t: i for i, t in enumerate(self.vocab)}
        self.unk_id = self._ids.get(UNK) if oov == "unk" else None
        self.eot_id = self._ids.get(EOT)

    @classmethod
    def train(
        cls, docs: Iterable[str], vocab_size: int, *, oov: str = "drop", specials: Iterable[str] = ()
    ) -> WordTokenizer:
        """Vocabulary = specials (``<unk>`` first when ``oov="unk"``) + most frequent tokens, ``vocab_size``
        ids in all (fewer if the documents have fewer distinct tokens)."""
        counts = count_tokens(docs)
        return cls.from_counts(counts, vocab_size, oov=oov, specials=specials)

    @classmethod
    def from_counts(
        cls, counts: Counter, vocab_size: int, *, oov: str = "drop", specials: Iterable[str] = ()
    ) -> WordTokenizer:
        _check_oov(oov)
        sp = ([UNK] if oov == "unk" else []) + [s for s in specials if s != UNK]
        _check_vocab_size(vocab_size, len(sp))
        words = [t for t, _ in counts.most_common() if t not in sp][: vocab_size - len(sp)]
        return cls(sp + words, oov=oov)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def encode_with_oov(self, text: str) -> tuple[list[int], int]:
        """Token ids and the number of out-of-vocabulary tokens (dropped, or mapped to ``<unk>``)."""
        ids, n_oov, get, unk = [], 0, self._ids.get, self.unk_id
        for tok in pre_tokenize(text):
            i = get(tok)
            if i is None:
                n_oov += 1
                if unk is None:
                    continue
                i = unk
            ids.append(i)
        return ids, n_oov

    def encode(self, text: str) -> list[int]:
        return self.encode_with_oov(text)[0]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.vocab[int(i)] for i in ids)

    def settings(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "oov": self.oov,
            "lowercase": True,
            "pre_tokenize": "isalpha runs + single non-space characters; whitespace dropped",
            "tie_break": "first occurrence",
            "unk_id": self.unk_id,
            "eot_id": self.eot_id,
        }

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        atomic_write_json(d / SAVED_NAME, {"kind": self.kind, "settings": self.settings(), "vocab": self.vocab})
        return d

    @classmethod
    def load(cls, directory: str | Path) -> WordTokenizer:
        obj = _read_saved(directory, cls.kind)
        return cls(obj["vocab"], oov=obj["settings"].get("oov", "drop"))


def count_tokens(docs: Iterable[str]) -> Counter:
    """Word-token frequencies over ``docs`` (insertion order = first occurrence)."""
    counts: Counter = Counter()
    for d in docs:
        counts.update(pre_tokenize(d))
    return counts


# --------------------------------------------------------------------------------------- HF-backed


class _HFBacked:
    """Shared code for tokenizers wrapping a ``tokenizers.Tokenizer``."""

    kind = "hf"

    def __init__(self, tok: Any) -> None:
        self._tok = tok
        vocab = tok.get_vocab(with_added_tokens=True)
        size = max(vocab.values()) + 1 if vocab else 0
        self.vocab = [f"<id:{i}>" for i in range(size)]  # placeholders for unused ids
        for t, i in vocab.items():
            self.vocab[i] = t
        unk = getattr(tok.model, "unk_token", None)
        self.unk_id = tok.token_to_id(unk) if unk else None
        self.eot_id = next((tok.token_to_id(t) for t in _EOT_CANDIDATES if tok.token_to_id(t) is not None), None)

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def _ids(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode(self, text: str) -> list[int]:
        return self._ids(text)

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids of the bare text (no special tokens, no ``<s> … </s>`` wrap) and each token's character
        span ``(start, end)`` in ``text`` (Python string indices, end exclusive)."""
        enc = self._tok.encode(text, add_special_tokens=False)
        return list(enc.ids), [(int(a), int(b)) for a, b in enc.offsets]

    def encode_with_oov(self, text: str) -> tuple[list[int], int]:
        """Ids and the number of ``unk_id`` occurrences (characters unknown to the model)."""
        ids = self.encode(text)
        return ids, (ids.count(self.unk_id) if self.unk_id is not None else 0)

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


class BPETokenizer(_HFBacked):
    """Byte-pair encoding trained on the corpus (Hugging Face ``tokenizers``), paper Table 2 protocol."""

    kind = "bpe"

    def __init__(self, tok: Any, *, wrap: bool = True) -> None:
        super().__init__(tok)
        self.wrap = wrap
        self.bos_id = tok.token_to_id("<s>")
        self.eot_id = tok.token_to_id("</s>")
        if self.bos_id is None or self.eot_id is None:
            raise InputError("BPE tokenizer lacks the <s>/</s> special tokens", "retrain it with originlens")

    @classmethod
    def train(cls, docs: Iterable[str], vocab_size: int, *, wrap: bool = True) -> BPETokenizer:
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models, pre_tokenizers, trainers

        _check_vocab_size(vocab_size, len(BPE_SPECIALS))
        tok = HFTokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(BPE_SPECIALS), show_progress=False)
        tok.train_from_iterator(docs, trainer=trainer)
        got = tok.get_vocab_size()
        if got > vocab_size:  # the trainer always keeps every character it saw, whatever vocab_size says
            raise ConfigError(
                f"a BPE vocabulary of {vocab_size} ids cannot cover this text: its special tokens and "
                f"the characters it contains already take {got} ids",
                f"pass --vocab-size ≥ {got} (or the word tokenizer)",
            )
        return cls(tok, wrap=wrap)

    def encode(self, text: str) -> list[int]:
        ids = self._ids(text)
        if not self.wrap:
            return ids
        assert self.eot_id is not None  # __init__ refuses a tokenizer without </s>
        return [self.bos_id, *ids, self.eot_id]

    def settings(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "model": "BPE",
            "pre_tokenizer": "Whitespace",
            "special_tokens": list(BPE_SPECIALS),
            "wrap": self.wrap,
            "unk_id": self.unk_id,
            "eot_id": self.eot_id,
        }

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        from ..storage import atomic_write_text

        atomic_write_text(d / HF_NAME, self._tok.to_str())
        atomic_write_json(d / SAVED_NAME, {"kind": self.kind, "settings": self.settings()})
        return d

    @classmethod
    def load(cls, directory: str | Path) -> BPETokenizer:
        obj = _read_saved(directory, cls.kind)
        return cls(_hf_from_file(Path(directory) / HF_NAME), wrap=obj["settings"].get("wrap", True))


class PretrainedTokenizer(_HFBacked):
    """A pretrained fast tokenizer from a local ``tokenizer.json`` (never downloads, never runs code).

    ``add_special_tokens=True`` applies the file's post-processor (e.g. a BOS token); the default
    encodes the bare text, so BOS handling stays explicit.
    """

    kind = "pretrained"

    def __init__(self, tok: Any, *, source: str = "", add_special_tokens: bool = False) -> None:
        super().__init__(tok)
        self.source = source
        self.add_special_tokens = add_special_tokens

    @classmethod
    def from_path(cls, path: str | Path, *, add_special_tokens: bool = False) -> PretrainedTokenizer:
        p = Path(path)
        f = p / HF_NAME if p.is_dir() else p
        if p.is_dir() and not f.is_file():
            raise InputError(
                f"no {HF_NAME} in directory {p}",
                "pass a Hugging Face model directory with a fast tokenizer (tokenizer.json); "
                "sentencepiece .model files must be converted first",
            )
        return cls(_hf_from_file(f), source=str(f), add_special_tokens=add_special_tokens)

    def _ids(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=self.add_special_tokens).ids

    def settings(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "vocab_size": self.vocab_size,
            "source": self.source,
            "add_special_tokens": self.add_special_tokens,
            "unk_id": self.unk_id,
            "eot_id": self.eot_id,
        }

    def save(self, directory: str | Path) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        from ..storage import atomic_write_text

        atomic_write_text(d / HF_NAME, self._tok.to_str())
        atomic_write_json(d / SAVED_NAME, {"kind": self.kind, "settings": self.settings()})
        return d

    @classmethod
    def load(cls, directory: str | Path) -> PretrainedTokenizer:
        obj = _read_saved(directory, cls.kind)
        s = obj["settings"]
        return cls(
            _hf_from_file(Path(directory) / HF_NAME),
            source=s.get("source", ""),
            add_special_tokens=s.get("add_special_tokens", False),
        )


def _hf_from_file(f: Path) -> Any:
    from tokenizers import Tokenizer as HFTokenizer

    if not f.is_file():
        raise InputError(f"tokenizer file {f} not found", "pass a tokenizer.json file or a directory holding one")
    try:
        return HFTokenizer.from_file(str(f))
    except Exception as exc:  # tokenizers raises a bare Exception on parse errors
        msg = " ".join(str(exc).split())[:160]
        raise InputError(
            f"{f} is not a readable tokenizer.json ({msg})",
            "pass a fast-tokenizer file saved by Hugging Face tokenizers/transformers",
        ) from None


# --------------------------------------------------------------------------------------- factory

_CLASSES = {c.kind: c for c in (WordTokenizer, BPETokenizer, PretrainedTokenizer)}


def _read_saved(directory: str | Path, kind: str | None = None) -> dict:
    d = Path(directory)
    obj = read_json(d / SAVED_NAME)
    if not isinstance(obj, dict) or not isinstance(obj.get("kind"), str) or obj["kind"] not in _CLASSES:
        raise InputError(f"{d / SAVED_NAME} does not describe an originlens tokenizer", "rebuild the corpus")
    if kind is not None and obj["kind"] != kind:
        raise CompatibilityError(f"{d} holds a '{obj['kind']}' tokenizer, not '{kind}'", "load it with load_saved()")
    vocab = obj.get("vocab")
    if not isinstance(obj.get("settings"), dict) or (
        obj["kind"] == "words" and not (isinstance(vocab, list) and all(isinstance(t, str) for t in vocab))
    ):
        raise InputError(
            f"{d / SAVED_NAME} is malformed (needs a 'settings' object and, for words, a 'vocab' list of strings)",
            "rebuild the corpus",
        )
    return obj


def load_saved(directory: str | Path) -> Tokenizer:
    """Read a tokenizer written by ``save(directory)`` (any kind)."""
    return _CLASSES[_read_saved(directory)["kind"]].load(directory)


def load_tokenizer(
    spec: str | Path,
    *,
    docs: Iterable[str] | None = None,
    vocab_size: int = 1000,
    oov: str = "drop",
    specials: Iterable[str] = (),
    wrap: bool = True,
) -> Tokenizer:
    """``"words"`` / ``"bpe"``: train on ``docs`` with ``vocab_size`` ids; otherwise a path: a directory
    written by ``save()`` (e.g. a corpus's ``tokenizer/``), a ``tokenizer.json`` file, or a directory
    holding one."""
    if spec in ("words", "bpe"):
        if docs is None:
            raise ConfigError(f"the '{spec}' tokenizer must be trained on documents", "pass docs=")
        if spec == "words":
            return WordTokenizer.train(docs, vocab_size, oov=oov, specials=specials)
        return BPETokenizer.train(docs, vocab_size, wrap=wrap)
    p = Path(spec)
    if not p.exists():
        raise InputError(
            f"tokenizer {spec!r} is neither 'words', 'bpe' nor an existing path",
            "use --tokenizer words|bpe or a tokenizer.json file / directory",
        )
    if p.is_dir() and (p / SAVED_NAME).is_file():
        return load_saved(p)
    return PretrainedTokenizer.from_path(p)
