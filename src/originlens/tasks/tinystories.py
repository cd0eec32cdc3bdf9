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
:func:`originlens.outputs.atomic_directory`.  ``key`` hashes the data (name and SHA-256 of every file),
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
The task is in the registry (:func:`originlens.tasks.get_task`), so the trainer, the attribution replay
and the regime grid all take it.

The data side (story files, split, tokenisation and syntax caches) lives in :mod:`.tinystories_data`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from ..errors import ConfigError, InputError
from ..paths import ENV_VAR
from ..progress import log
from .base import TaskBatch, Tracked, check_n
from .tinystories_data import (
    NextTokenLegal,
    SyntaxTable,
    TokenisedStories,
    heldout_threshold,
    load_syntax,
    load_tokenised,
    story_files,
)

FEATURES = ("pos_int", "pos_prop")
SYNTAX_NOTE = (
    "note: tinystories: the paper's 20 part-of-speech/dependency features are off "
    "(syntax_features=False); probing pos_int and pos_prop only"
)
_SYNTAX_NOTED = False


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
                if self.syntax_features and self._annotator_obj is not None
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
            # a lazy stand-in for the dense (n, T, V) array, with the array interface the task metrics use
            legal=cast(np.ndarray, NextTokenLegal(nxt, self.vocab_size)),
            metadata={"task": self.name, "split": split, "story": story, "offset": offset, "story_len": length},
        )
