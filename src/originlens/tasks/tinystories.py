"""TinyStories next-token task (arXiv 2603.14087): 64-token story windows with story-position features.

Data: the stories of the shared TinyStories subset (``originlens.paths.tinystories_files()``, one story per
line, file order; the data root comes from ``ORIGINLENS_DATA``), tokenised with a BPE trained on those
stories by the corpus pipeline (:class:`originlens.data.BPETokenizer`, Whitespace pre-tokenizer, no
special tokens around a story; ``bpe_vocab_size`` ids, 4096 by default).  Stories shorter than
``window`` tokens are skipped.  A window is a uniformly random run of ``window`` consecutive tokens of
a story (no BOS): ``sample(n, rng)`` draws n stories uniformly from the **train** split and one offset
per story uniformly from ``0 .. len − window``; ``sample_eval(n, rng)`` does the same on the **held-out**
split and sorts the rows by story, so a 70/30 probe split of the eval set shares at most one story.

Held-out split (deterministic, order-free): story s is held out when the first 8 bytes of
``sha256(text_s)`` (UTF-8), read as a big-endian integer u, satisfy ``u / 2**64 < heldout_frac``
(default 0.1).  Identical texts always fall on the same side, so the splits are disjoint as texts.

Features after token i of a window (``TaskBatch.features[:, i]``, float32):

* ``pos_int``  = absolute index of token i in its story (0-based), i.e. ``offset + i``;
* ``pos_prop`` = ``pos_int / story length in tokens`` (in [0, 1); not inferable from the window alone).

Syntax features (``syntax_features=True``; arXiv 2603.14087, § on the TinyStories model): indicators of
10 Penn-Treebank tags and 10 dependency labels after each token (0/1 floats), computed on the **whole
story** by an annotator (:mod:`originlens.tasks.syntax`: ``annotator="spacy"`` with ``spacy_model``
``en_core_web_sm``, the paper's choice; ``"lingua"``, tags only; ``"gold"``, storyworld stories only)
and aligned to the BPE tokens through character spans in expand mode (a token gets every tag/label of
every annotator word it overlaps).  ``feature_names`` is then ``tag_NN … tag_CC, dep_nsubj … dep_aux,
pos_int, pos_prop`` (22; ``syntax_labels="tags"`` or ``"deps"`` keeps 10 of the 20).  A missing
annotator, or dependency labels asked of a tagger without them, raises ``ConfigError`` at construction.
Off (the default), the features are the two above and the omission is noted once per process.
``feature_types`` is ``None`` (no useful/useless typing is defined for these features).

``legal`` is :class:`NextTokenLegal`, a lazy (n, T, V) boolean "array" whose only True entry per
position is the observed next token (none at i = T−1), so the shared metric ``legal_acc`` is top-1
next-token accuracy without materialising n·T·V booleans.

Tokenisation cache: the tokenizer, the token ids of every story and the per-story hashes are stored in a
run-independent directory ``CACHE/tinystories/bpe{V}-{key}`` built with
:func:`originlens.storage.atomic_directory`.  ``key`` hashes the data (name and SHA-256 of every file),
the tokenizer configuration, the ``tokenizers`` version and :data:`CACHE_FORMAT`; changing any of them
builds a new entry (old entries are left in place).  ``CACHE`` is ``cache_dir`` if given, else the
environment variable ``ORIGINLENS_CACHE``, else ``$XDG_CACHE_HOME/originlens``, else
``~/.cache/originlens``.

Syntax cache: ``CACHE/tinystories/syntax-{annotator}-{key}`` (also via :func:`atomic_directory`), keyed
by the tokenisation key, the annotator's name and version (spaCy and pipeline versions; Lingua's version)
and :data:`SYNTAX_CACHE_FORMAT`; it holds the aligned (tokens, 20) indicators bit-packed
(``features_packed.npy``) and the annotator's raw words (character spans, tag and label ids into the
manifest's vocabularies), all ``.npy`` + JSON.  Because the key includes the BPE, another
``bpe_vocab_size`` annotates the stories again.

Caveats: the BPE is trained on all stories (train and held-out), not on the train split only; the
paper uses the pretrained ``TinyStories-1M`` tokenizer (50,257 ids), which is not available offline, so
token indices (``pos_int``) and losses are not on the paper's scale.  The subset holds ~7,100 stories
(~1.4M tokens) against the paper's 300,000 windows, so long runs revisit stories (at fresh offsets).
The trainer registers this task in :mod:`originlens.train.ntp`, not in :func:`originlens.tasks.get_task`,
so attribution replay and the regime grid do not know it yet.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError, OriginlensError
from ..paths import ENV_VAR, data_root
from ..progress import log
from ..storage import atomic_directory, atomic_save_npy, atomic_write_json, read_json, sha256_file
from .base import TaskBatch, Tracked, check_n

CACHE_ENV_VAR = "ORIGINLENS_CACHE"
CACHE_FORMAT = 1
SYNTAX_CACHE_FORMAT = 1
FEATURES = ("pos_int", "pos_prop")
SYNTAX_NOTE = (
    "note: tinystories: the paper's 20 part-of-speech/dependency features are off "
    "(syntax_features=False); probing pos_int and pos_prop only"
)
_SYNTAX_NOTED = False


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
            with atomic_directory(entry) as tmp:
                tok.save(tmp / "tokenizer")
                atomic_save_npy(tmp / "tokens.npy", flat)
                atomic_save_npy(tmp / "starts.npy", starts)
                atomic_save_npy(tmp / "hashes.npy", hashes)
                atomic_write_json(tmp / "manifest.json", manifest)
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
        with atomic_directory(entry) as tmp:
            atomic_save_npy(tmp / "features_packed.npy", np.packbits(feats, axis=1, bitorder="little"))
            atomic_save_npy(tmp / "spans.npy", np.asarray(spans, dtype=np.int32).reshape(-1, 2))
            atomic_save_npy(tmp / "span_starts.npy", span_starts)
            atomic_save_npy(tmp / "tag_ids.npy", np.asarray(tag_ids, dtype=np.int16))
            atomic_save_npy(tmp / "dep_ids.npy", np.asarray(dep_ids, dtype=np.int16))
            atomic_write_json(tmp / "manifest.json", manifest)
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


# ----------------------------------------------------------------------------------------------------
# the task


@dataclass
class TinyStoriesTask:
    """TinyStories windows with ``pos_int`` / ``pos_prop`` and optional syntax features (module docstring).

    Options: ``bpe_vocab_size`` (BPE ids, 4096), ``window`` (T, 64), ``heldout_frac`` (0.1),
    ``data_root`` (default: ``ORIGINLENS_DATA`` / ``../shared/data``), ``cache_dir`` (default
    :func:`cache_root`), ``syntax_features`` (False: the two position features only), ``annotator``
    (``spacy`` | ``lingua`` | ``gold``), ``spacy_model`` (``en_core_web_sm``), ``syntax_labels``
    (``all``: 10 tags + 10 labels, ``tags``, ``deps``).
    Tokenisation and annotation happen lazily on first use (``vocab_size``, ``sample``...), from the cache
    when possible; a missing annotator fails at construction.
    """

    bpe_vocab_size: int = 4096
    window: int = 64
    heldout_frac: float = 0.1
    data_root: str | None = None
    cache_dir: str | None = None
    syntax_features: bool = False
    annotator: str = "spacy"
    spacy_model: str = "en_core_web_sm"
    syntax_labels: str = "all"

    name: ClassVar[str] = "tinystories"

    def __post_init__(self) -> None:
        global _SYNTAX_NOTED
        for key, low in (("bpe_vocab_size", 5), ("window", 2)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ConfigError(f"tinystories: {key} must be an integer ≥ {low}, got {v!r}", f"set {key} ≥ {low}")
        if not isinstance(self.heldout_frac, (int, float)) or not 0 < self.heldout_frac < 1:
            raise ConfigError(
                f"tinystories: heldout_frac must lie in (0, 1), got {self.heldout_frac!r}", "e.g. heldout_frac=0.1"
            )
        if not isinstance(self.syntax_features, (bool, np.bool_)):
            raise ConfigError(
                f"tinystories: syntax_features must be true or false, got {self.syntax_features!r}",
                "set syntax_features=True for the 20 tag/label features",
            )
        from . import syntax

        self._syntax_cols = syntax.selected_columns(self.syntax_labels)
        if self.annotator not in syntax.ANNOTATORS:
            raise ConfigError(
                f"tinystories: unknown syntax annotator {self.annotator!r}",
                f"use one of: {', '.join(syntax.ANNOTATORS)}",
            )
        self._annotator_obj = None
        if self.syntax_features:
            self._annotator_obj = syntax.get_annotator(self.annotator, spacy_model=self.spacy_model)
            syntax.check_provides(self._annotator_obj, self.syntax_labels)
        self.files = story_files(self.data_root)  # fails early, naming ORIGINLENS_DATA
        if not self.syntax_features and not _SYNTAX_NOTED:
            _SYNTAX_NOTED = True
            log(SYNTAX_NOTE, level=1)

    # -- data --------------------------------------------------------------------------------------
    @functools.cached_property
    def data(self) -> TokenisedStories:
        return load_tokenised(self.files, self.bpe_vocab_size, self.cache_dir)

    @functools.cached_property
    def syntax(self) -> SyntaxTable:
        """The per-token syntax indicators (only with ``syntax_features=True``)."""
        if self._annotator_obj is None:
            raise ConfigError("tinystories: syntax features are off", "construct the task with syntax_features=True")
        return load_syntax(self.data, self.files, self._annotator_obj, self.cache_dir)

    @functools.cached_property
    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(train story ids, held-out story ids), ascending; only stories of ≥ ``window`` tokens."""
        d = self.data
        heldout = d.hashes < np.uint64(heldout_threshold(self.heldout_frac))
        long_enough = d.lengths >= self.window
        train = np.flatnonzero(long_enough & ~heldout)
        held = np.flatnonzero(long_enough & heldout)
        if len(train) == 0 or len(held) == 0:
            raise InputError(
                f"tinystories: {len(train)} train and {len(held)} held-out stories of ≥ {self.window} "
                f"tokens under {self.files[0].parent}",
                f"use more stories (point {ENV_VAR} at the full subset) or a shorter window",
            )
        return train, held

    @property
    def tokenizer(self) -> Any:
        return self.data.tokenizer

    @property
    def vocab(self) -> list[str]:
        return list(self.data.tokenizer.vocab)

    @property
    def vocab_size(self) -> int:
        return int(self.data.tokenizer.vocab_size)

    @property
    def seq_len(self) -> int:
        return int(self.window)

    @property
    def feature_names(self) -> list[str]:
        """``pos_int, pos_prop``; with syntax features the selected ``tag_*`` / ``dep_*`` names come first
        (22 names for ``syntax_labels="all"``)."""
        if not self.syntax_features:
            return list(FEATURES)
        from .syntax import FEATURE_NAMES

        return [FEATURE_NAMES[c] for c in self._syntax_cols] + list(FEATURES)

    @property
    def tracked(self) -> Tracked:
        """Tracked sites: layers 1–4, positions 30–39, every feature."""
        return Tracked(layers=(1, 2, 3, 4), positions=tuple(range(30, 40)), features=tuple(self.feature_names))

    def describe(self) -> dict[str, Any]:
        train, held = self.split
        d = self.data
        return {
            "cache": str(d.path),
            "key": d.manifest["key"],
            "stories": len(d.hashes),
            "tokens": int(d.tokens.size),
            "vocab_size": self.vocab_size,
            "train_stories": len(train),
            "heldout_stories": len(held),
            "skipped_short": int((d.lengths < self.window).sum()),
            "train_tokens": int(d.lengths[train].sum()),
            "heldout_tokens": int(d.lengths[held].sum()),
            **(
                {
                    "syntax_cache": str(self.syntax.path),
                    "annotator": self._annotator_obj.name,
                    "annotator_version": self._annotator_obj.version,
                }
                if self.syntax_features
                else {}
            ),
        }

    # -- sampling ----------------------------------------------------------------------------------
    def sample(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """n windows of the train split: stories ``rng.integers(0, S_train, n)``, offsets
        ``⌊u·(len − T + 1)⌋`` with ``u = rng.random(n)``."""
        return self._windows(self.split[0], check_n(n), rng, sort=False, split="train")

    def sample_eval(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """n windows of the held-out split (same rule), rows sorted by story (then by draw order)."""
        return self._windows(self.split[1], check_n(n), rng, sort=True, split="heldout")

    def _windows(self, stories: np.ndarray, n: int, rng: np.random.Generator, *, sort: bool, split: str) -> TaskBatch:
        d, T = self.data, self.window
        pick = rng.integers(0, len(stories), n)
        u = rng.random(n)
        if sort:
            order = np.argsort(pick, kind="stable")
            pick, u = pick[order], u[order]
        story = stories[pick]
        length = d.lengths[story]
        offset = np.minimum(np.floor(u * (length - T + 1)).astype(np.int64), length - T)
        idx = (d.starts[story] + offset)[:, None] + np.arange(T)
        tokens = d.tokens[idx].astype(np.int64)
        pos_int = offset[:, None] + np.arange(T)
        features = np.stack([pos_int, pos_int / length[:, None]], axis=-1).astype(np.float32)
        if self.syntax_features:
            syn = self.syntax.features[idx][..., self._syntax_cols].astype(np.float32)
            features = np.concatenate([syn, features], axis=-1)
        nxt = np.full((n, T), -1, dtype=np.int64)
        nxt[:, :-1] = tokens[:, 1:]
        return TaskBatch(
            tokens=tokens,
            features=features,
            feature_names=self.feature_names,
            feature_types=None,
            legal=NextTokenLegal(nxt, self.vocab_size),
            metadata={"task": self.name, "split": split, "story": story, "offset": offset, "story_len": length},
        )
