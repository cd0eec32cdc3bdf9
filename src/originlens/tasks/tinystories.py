"""TinyStories next-token task (spec gradient-pathways §6.4): 64-token story windows with story-position features.

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

Features after token i of a window (``TaskBatch.features[:, i]``, float32; spec §6.4):

* ``pos_int``  = absolute index of token i in its story (0-based), i.e. ``offset + i``;
* ``pos_prop`` = ``pos_int / story length in tokens`` (in [0, 1); not inferable from the window alone).

The spec's 20 spaCy features (10 Penn-Treebank tags, 10 dependency labels) are **not** provided: spaCy
and ``en_core_web_sm`` are not installed here.  ``syntax_features=True`` raises ``ConfigError``; the
default notes the omission once per process.  ``feature_types`` is ``None`` (the spec defines no
useful/useless typing for these features).

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

Caveats: the BPE is trained on all stories (train and held-out), not on the train split only; the
spec uses the pretrained ``TinyStories-1M`` tokenizer (50,257 ids), which is not available offline, so
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

from ..errors import ConfigError, InputError, OriginlensError
from ..paths import ENV_VAR, data_root
from ..progress import log
from ..storage import atomic_directory, atomic_save_npy, atomic_write_json, read_json, sha256_file
from .base import TaskBatch, Tracked, check_n

CACHE_ENV_VAR = "ORIGINLENS_CACHE"
CACHE_FORMAT = 1
FEATURES = ("pos_int", "pos_prop")
SYNTAX_NOTE = ("note: tinystories: the spec's 20 spaCy part-of-speech/dependency features are skipped "
               "(spaCy and en_core_web_sm are not installed); probing pos_int and pos_prop only")
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
        raise InputError(f"no TinyStories files (tinystories/stories-*.txt) under the data root {base}",
                         f"set {ENV_VAR} to the directory holding tinystories/ (default ../shared/data)")
    return files


def read_stories(files: list[Path]) -> list[str]:
    """Stories in file order: every non-blank line (``\\r\\n`` line ends tolerated), unchanged otherwise."""
    from ..data.readers import iter_documents
    return list(iter_documents([str(f) for f in files], split_mode="line"))


def heldout_threshold(heldout_frac: float) -> int:
    """Smallest integer ≥ ``heldout_frac · 2**64``: story s is held out iff ``story_hash(s) < threshold``."""
    return min(math.ceil(float(heldout_frac) * 2 ** 64), 2 ** 64 - 1)


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
        return self.tokens[self.starts[s]:self.starts[s + 1]]


def cache_key(files: list[Path], bpe_vocab_size: int) -> tuple[str, dict[str, Any]]:
    """(hex key, key material): data hash (file names + SHA-256), tokenizer settings, library version."""
    import tokenizers
    material = {"format": CACHE_FORMAT,
                "data": [{"name": f.name, "sha256": sha256_file(f)} for f in files],
                "tokenizer": {"kind": "bpe", "vocab_size": int(bpe_vocab_size), "pre_tokenizer": "Whitespace",
                              "wrap": False, "trained_on": "all stories, file order"},
                "stories": "non-blank lines", "tokenizers_version": tokenizers.__version__}
    blob = json.dumps(material, sort_keys=True).encode("utf-8")
    return hashlib.sha256(blob).hexdigest(), material


_LOADED: dict[str, TokenisedStories] = {}


def load_tokenised(files: list[Path], bpe_vocab_size: int, cache_dir: str | os.PathLike | None = None
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
            raise InputError(f"the TinyStories files under {files[0].parent} hold no stories",
                             f"point {ENV_VAR} at a data root with non-empty tinystories/stories-*.txt")
        log(f"tinystories: training a {bpe_vocab_size}-id BPE on {len(stories)} stories and tokenising them "
            f"(cached in {entry})", level=1)
        tok = BPETokenizer.train(stories, int(bpe_vocab_size), wrap=False)
        ids = [tok.encode(s) for s in stories]
        lengths = np.array([len(x) for x in ids], dtype=np.int64)
        dtype = np.uint16 if tok.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
        flat = np.fromiter((i for x in ids for i in x), dtype=dtype, count=int(lengths.sum()))
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        hashes = np.array([story_hash(s) for s in stories], dtype=np.uint64)
        manifest = {"key": key, "key_material": material, "stories": len(stories), "tokens": int(flat.size),
                    "vocab_size": tok.vocab_size}
        try:
            entry.parent.mkdir(parents=True, exist_ok=True)
            with atomic_directory(entry) as tmp:
                tok.save(tmp / "tokenizer")
                atomic_save_npy(tmp / "tokens.npy", flat)
                atomic_save_npy(tmp / "starts.npy", starts)
                atomic_save_npy(tmp / "hashes.npy", hashes)
                atomic_write_json(tmp / "manifest.json", manifest)
        except (OSError, OriginlensError) as exc:
            raise InputError(f"cannot write the tokenisation cache {entry} ({exc})",
                             f"set {CACHE_ENV_VAR} to a writable directory") from None
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
    ok = (starts.ndim == 1 and len(starts) == len(hashes) + 1 and starts[0] == 0 and starts[-1] == len(tokens)
          and np.all(np.diff(starts) >= 0) and manifest.get("stories") == len(hashes)
          and (tokens.size == 0 or int(tokens.max()) < tok.vocab_size))
    if not ok:
        log(f"tinystories: cache entry {entry} is inconsistent; rebuilding it", level=1)
        return None
    return TokenisedStories(tokens, starts, hashes, tok, entry, manifest)


# ----------------------------------------------------------------------------------------------------
# the task


@dataclass
class TinyStoriesTask:
    """TinyStories windows with ``pos_int`` / ``pos_prop`` features (see the module docstring).

    Options: ``bpe_vocab_size`` (BPE ids, 4096), ``window`` (T, 64), ``heldout_frac`` (0.1),
    ``data_root`` (default: ``ORIGINLENS_DATA`` / ``../shared/data``), ``cache_dir`` (default
    :func:`cache_root`), ``syntax_features`` (spaCy tags; unavailable, must stay False).
    Tokenisation happens lazily on first use (``vocab_size``, ``sample``...), from the cache when possible.
    """

    bpe_vocab_size: int = 4096
    window: int = 64
    heldout_frac: float = 0.1
    data_root: str | None = None
    cache_dir: str | None = None
    syntax_features: bool = False

    name: ClassVar[str] = "tinystories"

    def __post_init__(self) -> None:
        global _SYNTAX_NOTED
        for key, low in (("bpe_vocab_size", 5), ("window", 2)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ConfigError(f"tinystories: {key} must be an integer ≥ {low}, got {v!r}", f"set {key} ≥ {low}")
        if not isinstance(self.heldout_frac, (int, float)) or not 0 < self.heldout_frac < 1:
            raise ConfigError(f"tinystories: heldout_frac must lie in (0, 1), got {self.heldout_frac!r}",
                              "e.g. heldout_frac=0.1")
        if self.syntax_features:
            raise ConfigError("tinystories: the spaCy part-of-speech/dependency features are not available "
                              "(spaCy and en_core_web_sm are not installed, and originlens does not compute them yet)",
                              "use syntax_features=False (pos_int and pos_prop only)")
        self.files = story_files(self.data_root)        # fails early, naming ORIGINLENS_DATA
        if not _SYNTAX_NOTED:
            _SYNTAX_NOTED = True
            log(SYNTAX_NOTE, level=1)

    # -- data --------------------------------------------------------------------------------------
    @functools.cached_property
    def data(self) -> TokenisedStories:
        return load_tokenised(self.files, self.bpe_vocab_size, self.cache_dir)

    @functools.cached_property
    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """(train story ids, held-out story ids), ascending; only stories of ≥ ``window`` tokens."""
        d = self.data
        heldout = d.hashes < np.uint64(heldout_threshold(self.heldout_frac))
        long_enough = d.lengths >= self.window
        train = np.flatnonzero(long_enough & ~heldout)
        held = np.flatnonzero(long_enough & heldout)
        if len(train) == 0 or len(held) == 0:
            raise InputError(f"tinystories: {len(train)} train and {len(held)} held-out stories of ≥ {self.window} "
                             f"tokens under {self.files[0].parent}",
                             f"use more stories (point {ENV_VAR} at the full subset) or a shorter window")
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
        return list(FEATURES)

    @property
    def tracked(self) -> Tracked:
        """Spec §6.4: layers 1–4, positions 30–39, every feature."""
        return Tracked(layers=(1, 2, 3, 4), positions=tuple(range(30, 40)), features=FEATURES)

    def describe(self) -> dict[str, Any]:
        train, held = self.split
        d = self.data
        return {"cache": str(d.path), "key": d.manifest["key"], "stories": int(len(d.hashes)),
                "tokens": int(d.tokens.size), "vocab_size": self.vocab_size, "train_stories": int(len(train)),
                "heldout_stories": int(len(held)), "skipped_short": int((d.lengths < self.window).sum()),
                "train_tokens": int(d.lengths[train].sum()), "heldout_tokens": int(d.lengths[held].sum())}

    # -- sampling ----------------------------------------------------------------------------------
    def sample(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """n windows of the train split: stories ``rng.integers(0, S_train, n)``, offsets
        ``⌊u·(len − T + 1)⌋`` with ``u = rng.random(n)``."""
        return self._windows(self.split[0], check_n(n), rng, sort=False, split="train")

    def sample_eval(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """n windows of the held-out split (same rule), rows sorted by story (then by draw order)."""
        return self._windows(self.split[1], check_n(n), rng, sort=True, split="heldout")

    def _windows(self, stories: np.ndarray, n: int, rng: np.random.Generator, *, sort: bool,
                 split: str) -> TaskBatch:
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
        nxt = np.full((n, T), -1, dtype=np.int64)
        nxt[:, :-1] = tokens[:, 1:]
        return TaskBatch(tokens=tokens, features=features, feature_names=list(FEATURES), feature_types=None,
                         legal=NextTokenLegal(nxt, self.vocab_size),
                         metadata={"task": self.name, "split": split, "story": story, "offset": offset,
                                   "story_len": length})

