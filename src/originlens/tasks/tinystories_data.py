"""The data of the TinyStories task (:mod:`.tinystories`): the story files of the data root, the held-out
split by story hash, the lazily built next-token "legal" array, the tokenisation cache (a corpus-trained
BPE and the tokenised stories, keyed by the files' hashes and the vocabulary size) and the syntax-feature
cache (per-token tags and labels of an annotator).  Caches live under :func:`cache_root` and are rebuilt
when their key changes; loaded values are kept per process (``_LOADED``, ``_LOADED_SYNTAX``)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError, OriginlensError
from ..outputs import OutputKind, atomic_directory
from ..paths import ENV_VAR, data_root
from ..progress import log
from ..storage import atomic_save_npy, atomic_write_json, read_json, sha256_file

CACHE_ENV_VAR = "ORIGINLENS_CACHE"
CACHE_FORMAT = 1
SYNTAX_CACHE_FORMAT = 1


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """Run-independent cache directory: ``cache_dir``, ``$ORIGINLENS_CACHE``, ``$XDG_CACHE_HOME/originlens``
    or ``~/.cache/originlens``."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get(CACHE_ENV_VAR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "originlens"


def story_files(root: str | os.PathLike | None = None) -> list[Path]:
    """The ``tinystories/stories-*.txt`` files under the data root (``root`` or ``ORIGINLENS_DATA``), sorted.

    Raises:
        InputError: no such files (the message names ``ORIGINLENS_DATA``).
    """
    base = Path(root).expanduser() if root else data_root()
    d = base / "tinystories"
    files = sorted(d.glob("stories-*.txt")) if d.is_dir() else []
    if not files:
        raise InputError(
            f"no TinyStories files (tinystories/stories-*.txt) under the data root {base}",
            f"set {ENV_VAR} to the directory holding tinystories/ (default ../shared/data)",
        )
    return files


def read_stories(files: list[Path]) -> list[str]:
    """Stories in file order: every non-blank line (``\\r\\n`` line ends tolerated), unchanged otherwise."""
    from ..data.readers import iter_documents

    return list(iter_documents([str(f) for f in files], split_mode="line"))


def heldout_threshold(heldout_frac: float) -> int:
    """Smallest integer ≥ ``heldout_frac · 2**64``: story s is held out iff ``story_hash(s) < threshold``."""
    return min(math.ceil(float(heldout_frac) * 2**64), 2**64 - 1)


def story_hash(text: str) -> int:
    """First 8 bytes of SHA-256 of the UTF-8 text, big-endian (the held-out split's key)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


# ----------------------------------------------------------------------------------------------------
# lazy next-token "legal" array


class NextTokenLegal:
    """Read-only (n, T, V) boolean array ``legal[b, i, v] = (v == next_ids[b, i])`` without storing it.

    ``next_ids`` (n, T) int64 holds the observed next token of each position, −1 where there is none.
    Supports what the task metrics use: ``shape``/``ndim``/``dtype``, indexing of the leading axes
    (ints, slices, integer or boolean arrays), full fancy indexing with three integer arrays (as
    ``np.take_along_axis`` does), ``any(axis=2)`` and ``np.asarray`` (dense one-hot; small inputs only).
    """

    dtype = np.dtype(bool)

    def __init__(self, next_ids: np.ndarray, vocab_size: int) -> None:
        self.next_ids = np.asarray(next_ids, dtype=np.int64)
        if self.next_ids.ndim != 2:
            raise ValueError(f"next_ids must be (n, T), got shape {self.next_ids.shape}")
        self.vocab_size = int(vocab_size)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (*self.next_ids.shape, self.vocab_size)

    @property
    def ndim(self) -> int:
        return 3

    def __len__(self) -> int:
        return int(self.next_ids.shape[0])

    def __getitem__(self, index: Any) -> Any:
        idx = index if isinstance(index, tuple) else (index,)
        if len(idx) == 3 and all(isinstance(a, np.ndarray) and a.dtype.kind in "iu" for a in idx):
            a, b, v = np.broadcast_arrays(*idx)
            return self.next_ids[a, b] == v
        if len(idx) > 2 or any(i is Ellipsis or i is None for i in idx):
            return np.asarray(self)[index]
        sub = self.next_ids[index]
        if sub.ndim != 2:
            return np.asarray(self)[index]
        return NextTokenLegal(sub, self.vocab_size)

    def any(self, axis: int | None = None) -> Any:
        if axis in (2, -1):
            return (self.next_ids >= 0) & (self.next_ids < self.vocab_size)
        return np.asarray(self).any(axis=axis)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.zeros(self.shape, dtype=bool)
        ok = (self.next_ids >= 0) & (self.next_ids < self.vocab_size)
        b, i = np.nonzero(ok)
        out[b, i, self.next_ids[b, i]] = True
        return out if dtype is None else out.astype(dtype)


# ----------------------------------------------------------------------------------------------------
# tokenisation cache


@dataclass(frozen=True)
class TokenisedStories:
    """All stories of the data root, tokenised: ``tokens`` flat (N,) uint16/uint32, story s is
    ``tokens[starts[s]:starts[s+1]]``; ``hashes`` (S,) uint64 (:func:`story_hash`); ``path`` the cache entry."""

    tokens: np.ndarray
    starts: np.ndarray
    hashes: np.ndarray
    tokenizer: Any
    path: Path
    manifest: dict[str, Any]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.starts)

    def story(self, s: int) -> np.ndarray:
        return self.tokens[self.starts[s] : self.starts[s + 1]]


def cache_key(files: list[Path], bpe_vocab_size: int) -> tuple[str, dict[str, Any]]:
    """(hex key, key material): data hash (file names + SHA-256), tokenizer settings, library version."""
    import tokenizers

    material = {
        "format": CACHE_FORMAT,
        "data": [{"name": f.name, "sha256": sha256_file(f)} for f in files],
        "tokenizer": {
            "kind": "bpe",
            "vocab_size": int(bpe_vocab_size),
            "pre_tokenizer": "Whitespace",
            "wrap": False,
            "trained_on": "all stories, file order",
        },
        "stories": "non-blank lines",
        "tokenizers_version": tokenizers.__version__,
    }
    blob = json.dumps(material, sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest(), material


_LOADED: dict[str, TokenisedStories] = {}


def _invalid_manifest(columns: str) -> Any:
    """A check of a cache entry's ``manifest.json``: a JSON object with its ``key`` and ``columns``."""

    def invalid(marker: Path) -> str | None:
        try:
            m = read_json(marker)
        except (OSError, ValueError, OriginlensError) as exc:
            return f"unreadable: {exc}"
        if not isinstance(m, dict) or "key" not in m or columns not in m:
            return f"no 'key' and '{columns}' in it"
        return None

    return invalid


# what the two cache entries hold: an existing directory at an entry's name is replaced only when it is an
# entry of the same kind holding nothing else (a cache root set to a directory of the user's is safe)
TOKENISED_ENTRY = OutputKind(
    "TinyStories tokenisation cache entry",
    "manifest.json",
    ("manifest.json", "tokens.npy", "starts.npy", "hashes.npy", "tokenizer/*"),
    invalid=_invalid_manifest("vocab_size"),
)
SYNTAX_ENTRY = OutputKind(
    "TinyStories syntax-feature cache entry",
    "manifest.json",
    ("manifest.json", "features_packed.npy", "spans.npy", "span_starts.npy", "tag_ids.npy", "dep_ids.npy"),
    invalid=_invalid_manifest("columns"),
)


def load_tokenised(
    files: list[Path], bpe_vocab_size: int, cache_dir: str | os.PathLike | None = None
) -> TokenisedStories:
    """The tokenised stories of ``files``, from the cache or built (and cached) on first use."""
    from ..data.tokenizers import BPETokenizer

    key, material = cache_key(files, bpe_vocab_size)
    entry = cache_root(cache_dir) / "tinystories" / f"bpe{int(bpe_vocab_size)}-{key[:16]}"
    if str(entry) in _LOADED and _LOADED[str(entry)].manifest.get("key") == key and entry.is_dir():
        return _LOADED[str(entry)]
    got = _read_entry(entry, key)
    if got is None:
        stories = read_stories(files)
        if not stories:
            raise InputError(
                f"the TinyStories files under {files[0].parent} hold no stories",
                f"point {ENV_VAR} at a data root with non-empty tinystories/stories-*.txt",
            )
        log(
            f"tinystories: training a {bpe_vocab_size}-id BPE on {len(stories)} stories and tokenising them "
            f"(cached in {entry})",
            level=1,
        )
        tok = BPETokenizer.train(stories, int(bpe_vocab_size), wrap=False)
        ids = [tok.encode(s) for s in stories]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        dtype = np.uint16 if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
        flat = np.fromiter((i for x in ids for i in x), dtype=dtype, count=int(lengths.sum()))
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hashes = np.array([story_hash(s) for s in stories], dtype=np.uint64)
        manifest = {
            "key": key,
            "key_material": material,
            "stories": len(stories),
            "tokens": int(flat.size),
            "vocab_size": tok.vocab_size,
        }
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            with atomic_directory(entry, output=TOKENISED_ENTRY) as tmp:
                tok.save(tmp / "tokenizer")
                atomic_save_npy(tmp / "tokens.npy", flat)
                atomic_save_npy(tmp / "starts.npy", starts)
                atomic_save_npy(tmp / "hashes.npy", hashes)
                atomic_write_json(tmp / "manifest.json", manifest)
        except ConfigError as exc:  # something that is not an entry of ours sits at the entry's name
            raise InputError(
                f"cannot write the tokenisation cache {entry}: {exc.what}",
                f"move {entry} away, or set {CACHE_ENV_VAR} to another directory",
            ) from None
        except (OSError, OriginlensError) as exc:
            raise InputError(
                f"cannot write the tokenisation cache {entry} ({exc})", f"set {CACHE_ENV_VAR} to a writable directory"
            ) from None
        got = TokenisedStories(flat, starts, hashes, tok, entry, manifest)
    _LOADED[str(entry)] = got
    return got


def _read_entry(entry: Path, key: str) -> TokenisedStories | None:
    """A valid cache entry, or None (missing or inconsistent: it is rebuilt)."""
    from ..data.tokenizers import BPETokenizer

    if not (entry / "manifest.json").is_file():
        return None
    try:
        manifest = read_json(entry / "manifest.json")
        if manifest.get("key") != key:
            return None
        tokens = np.load(entry / "tokens.npy", allow_pickle=False)
        starts = np.load(entry / "starts.npy", allow_pickle=False)
        hashes = np.load(entry / "hashes.npy", allow_pickle=False)
        tok = BPETokenizer.load(entry / "tokenizer")
    except (OSError, ValueError, OriginlensError):
        log(f"tinystories: cache entry {entry} is unreadable; rebuilding it", level=1)
        return None
    ok = (
        starts.ndim == 1
        and len(starts) == len(hashes) + 1
        and starts[0] == 0
        and starts[-1] == len(tokens)
        and np.all(np.diff(starts) >= 0)
        and manifest.get("stories") == len(hashes)
        and (tokens.size == 0 or int(tokens.max()) < tok.vocab_size)
    )
    if not ok:
        log(f"tinystories: cache entry {entry} is inconsistent; rebuilding it", level=1)
        return None
    return TokenisedStories(tokens, starts, hashes, tok, entry, manifest)


# ----------------------------------------------------------------------------------------------------
# syntax-feature cache


@dataclass(frozen=True)
class SyntaxTable:
    """The 20 syntax indicators of every token of :class:`TokenisedStories` (same flat order):
    ``features`` (N, 20) bool, columns :data:`originlens.tasks.syntax.SYNTAX_FEATURES`; ``provides`` the
    label sets the annotator gave (columns of a missing set are all False); ``path`` the cache entry."""

    features: np.ndarray
    provides: frozenset[str]
    path: Path
    manifest: dict[str, Any]


def syntax_cache_key(data: TokenisedStories, annotator: Any) -> tuple[str, dict[str, Any]]:
    """(hex key, key material): the tokenisation key (data + BPE), the annotator's name and version, the
    feature columns and :data:`SYNTAX_CACHE_FORMAT`."""
    from .syntax import SYNTAX_FEATURES

    material = {
        "format": SYNTAX_CACHE_FORMAT,
        "tokenisation_key": data.manifest["key"],
        "annotator": annotator.name,
        "annotator_version": annotator.version,
        "columns": list(SYNTAX_FEATURES),
        "alignment": "expand (character overlap)",
        "annotated": "whole stories",
    }
    blob = json.dumps(material, sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest(), material


_LOADED_SYNTAX: dict[str, SyntaxTable] = {}


def load_syntax(
    data: TokenisedStories, files: list[Path], annotator: Any, cache_dir: str | os.PathLike | None = None
) -> SyntaxTable:
    """The syntax indicators of every token, from the cache or computed (whole stories through
    ``annotator``, aligned by :func:`originlens.tasks.syntax.align`) and cached on first use."""
    key, material = syntax_cache_key(data, annotator)
    entry = cache_root(cache_dir) / "tinystories" / f"syntax-{annotator.name}-{key[:16]}"
    if str(entry) in _LOADED_SYNTAX and _LOADED_SYNTAX[str(entry)].manifest.get("key") == key and entry.is_dir():
        return _LOADED_SYNTAX[str(entry)]
    got = _read_syntax_entry(entry, key, int(data.tokens.size))
    if got is None:
        got = _build_syntax(data, files, annotator, entry, key, material)
    _LOADED_SYNTAX[str(entry)] = got
    return got


def _build_syntax(
    data: TokenisedStories, files: list[Path], annotator: Any, entry: Path, key: str, material: dict[str, Any]
) -> SyntaxTable:
    from .syntax import DEPS, SYNTAX_FEATURES, TAGS, align

    stories = read_stories(files)
    if len(stories) != len(data.hashes) or any(story_hash(t) != int(h) for t, h in zip(stories, data.hashes)):
        raise InputError(
            f"the TinyStories files under {files[0].parent} changed while in use",
            "run again (the caches are rebuilt for the new files)",
        )
    log(
        f"tinystories: annotating {len(stories)} stories with {annotator.name} ({annotator.version}); "
        f"cached in {entry}",
        level=1,
    )
    feats = np.zeros((int(data.tokens.size), len(SYNTAX_FEATURES)), dtype=bool)
    spans, tag_ids, dep_ids, counts = [], [], [], []
    tag_vocab: dict[str, int] = {}
    dep_vocab: dict[str, int] = {}
    chunk = 500
    for lo in range(0, len(stories), chunk):
        try:
            anns = annotator.annotate(stories[lo : lo + chunk])
        except OriginlensError as exc:
            raise type(exc)(
                f"tinystories: annotating stories {lo}..{min(lo + chunk, len(stories)) - 1} "
                f"(text i = story {lo} + i): {exc.what}",
                exc.fix,
            ) from None
        for s, ann in enumerate(anns, start=lo):
            ids, offsets = data.tokenizer.encode_offsets(stories[s])
            if not np.array_equal(np.asarray(ids, dtype=np.int64), data.story(s).astype(np.int64)):
                raise CompatibilityError(
                    f"tinystories: the cached token ids of story {s} differ from its tokenisation now ({data.path})",
                    "delete that cache entry",
                )
            feats[data.starts[s] : data.starts[s + 1]] = align(ann, offsets, len(ids), story=s)
            counts.append(len(ann.spans))
            for a, b, tag, dep in ann.spans:
                spans.append((a, b))
                tag_ids.append(-1 if tag is None else tag_vocab.setdefault(tag, len(tag_vocab)))
                dep_ids.append(-1 if dep is None else dep_vocab.setdefault(dep, len(dep_vocab)))
        if len(stories) > chunk:
            log(f"tinystories: annotated {min(lo + chunk, len(stories))}/{len(stories)} stories", level=2)
    span_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
    manifest = {
        "key": key,
        "key_material": material,
        "stories": len(stories),
        "tokens": int(feats.shape[0]),
        "columns": list(SYNTAX_FEATURES),
        "provides": sorted(annotator.provides),
        "tag_vocab": list(tag_vocab),
        "dep_vocab": list(dep_vocab),
        "annotator_tokens": int(span_starts[-1]),
        "files": {
            "features_packed.npy": "(tokens, 3) uint8: np.packbits of the (tokens, 20) bool features "
            "along axis 1, bitorder little",
            "spans.npy": "(annotator tokens, 2) int32 character spans, story by story",
            "span_starts.npy": "(stories + 1,) int64: story s owns spans[span_starts[s]:span_starts[s+1]]",
            "tag_ids.npy": "(annotator tokens,) int16 index into tag_vocab, -1 = none",
            "dep_ids.npy": "(annotator tokens,) int16 index into dep_vocab, -1 = none",
        },
        "tags": list(TAGS),
        "deps": list(DEPS),
    }
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with atomic_directory(entry, output=SYNTAX_ENTRY) as tmp:
            atomic_save_npy(tmp / "features_packed.npy", np.packbits(feats, axis=1, bitorder="little"))
            atomic_save_npy(tmp / "spans.npy", np.asarray(spans, dtype=np.int32).reshape(-1, 2))
            atomic_save_npy(tmp / "span_starts.npy", span_starts)
            atomic_save_npy(tmp / "tag_ids.npy", np.asarray(tag_ids, dtype=np.int16))
            atomic_save_npy(tmp / "dep_ids.npy", np.asarray(dep_ids, dtype=np.int16))
            atomic_write_json(tmp / "manifest.json", manifest)
    except ConfigError as exc:  # something that is not an entry of ours sits at the entry's name
        raise InputError(
            f"cannot write the syntax-feature cache {entry}: {exc.what}",
            f"move {entry} away, or set {CACHE_ENV_VAR} to another directory",
        ) from None
    except (OSError, OriginlensError) as exc:
        raise InputError(
            f"cannot write the syntax-feature cache {entry} ({exc})", f"set {CACHE_ENV_VAR} to a writable directory"
        ) from None
    return SyntaxTable(feats, frozenset(annotator.provides), entry, manifest)


def _read_syntax_entry(entry: Path, key: str, n_tokens: int) -> SyntaxTable | None:
    """A valid syntax cache entry, or None (missing or inconsistent: it is rebuilt)."""
    from .syntax import SYNTAX_FEATURES

    if not (entry / "manifest.json").is_file():
        return None
    try:
        manifest = read_json(entry / "manifest.json")
        if manifest.get("key") != key:
            return None
        packed = np.load(entry / "features_packed.npy", allow_pickle=False)
    except (OSError, ValueError, OriginlensError):
        log(f"tinystories: syntax cache entry {entry} is unreadable; rebuilding it", level=1)
        return None
    n_cols = len(SYNTAX_FEATURES)
    if packed.dtype != np.uint8 or packed.shape != (n_tokens, (n_cols + 7) // 8) or manifest.get("tokens") != n_tokens:
        log(f"tinystories: syntax cache entry {entry} is inconsistent; rebuilding it", level=1)
        return None
    feats = np.unpackbits(packed, axis=1, count=n_cols, bitorder="little").astype(bool)
    return SyntaxTable(feats, frozenset(manifest.get("provides", [])), entry, manifest)
