"""Majority and Conditioned Majority (arXiv 2603.14087).

Sequence layout (defaults: 3 symbols, 10 inputs, 10 outputs, T = 21): position 0 is ``<bos>``, inputs
at positions 1..10, outputs at 11..20.  Symbol s has token id s + 2 (``<0>`` = 2).  Logits at position
i predict token i+1, so the predicting positions of the outputs are 10..19.

**Majority.** Inputs are i.i.d. uniform.  Each output is uniform over the arg-max set of the running
counts of everything so far (inputs and earlier outputs); outputs increment the counts too, so from
the second output on the majority is unique and repeated.  Feature ``is_majority_<s>`` after token i
(i ≥ 1) is 1 when s is tied for the maximum of the counts *including* token i.  NTP-useful at
positions 10..19 (the next token is an output), useless at 1..9 (next token random) and at 20 (no
next token).

**Conditioned Majority.** Key token ``<0>``.  During the input section the count of token x_i
(2 ≤ i ≤ 10) increments only if the *previous* token x_{i−1} is ``<0>`` (x_1 follows ``<bos>`` and
never counts); counts are frozen during the output, and every output is drawn independently and
uniformly from the arg-max set of the final conditional counts.  Feature ``prev_is_<s>`` at position
i is the one-hot of token x_{i−1} for i ≥ 2 and all zeros at i = 0, 1 (the previous token there is
``<bos>`` or nothing), matching the authors' sampler.  It is typed NTP-useless
everywhere: it is needed by later positions that aggregate "tokens following ``<0>``".

Randomness: one ``rng.random((n, inputs + outputs))`` draw; input i uses ⌊3u⌋, output j picks the
⌊u·c⌋-th member (in symbol order) of its arg-max set of size c (:func:`~.base.choose_uniform`).  So
``sample(n, default_rng(s))`` is a prefix of ``sample(m, default_rng(s))`` for m ≥ n.

Caveat: with the running-count rule the first output's arg-max set can hold several symbols; the
metrics accept any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import ConfigError
from .base import (
    BOS_ID,
    SPECIAL_TOKENS,
    TYPE_NONE,
    TYPE_USEFUL,
    TYPE_USELESS,
    TaskBatch,
    Tracked,
    check_n,
    choose_uniform,
)


@dataclass
class _CountingTask:
    """Shared configuration and layout of the two majority worlds."""

    n_symbols: int = 3
    n_inputs: int = 10
    n_outputs: int = 10

    name: ClassVar[str] = ""
    _feature_prefix: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for key, low in (("n_symbols", 2), ("n_inputs", 1), ("n_outputs", 1)):
            val = getattr(self, key)
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < low:
                raise ConfigError(f"{self.name}: {key} must be an integer >= {low}, got {val!r}", f"set {key} >= {low}")

    @property
    def symbols(self) -> list[str]:
        return [f"<{s}>" for s in range(self.n_symbols)]

    @property
    def vocab(self) -> list[str]:
        return SPECIAL_TOKENS + self.symbols

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    @property
    def seq_len(self) -> int:
        return 1 + self.n_inputs + self.n_outputs

    @property
    def feature_names(self) -> list[str]:
        return [f"{self._feature_prefix}{s}" for s in self.symbols]

    @property
    def output_positions(self) -> list[int]:
        """Predicting positions whose next token is an output (10..19 by default)."""
        return list(range(self.n_inputs, self.n_inputs + self.n_outputs))

    def _tracked_positions(self) -> tuple[int, ...]:
        return tuple(range(2, self.seq_len - 1))

    def _batch(
        self, tokens: np.ndarray, features: np.ndarray, legal: np.ndarray, counts: np.ndarray, useful: np.ndarray
    ) -> TaskBatch:
        n, t = tokens.shape
        types_row = np.where(useful, TYPE_USEFUL, TYPE_USELESS).astype(np.uint8)
        types_row[0] = TYPE_NONE
        types = np.repeat(types_row[None, :, None], n, axis=0).repeat(self.n_symbols, axis=2)
        return TaskBatch(
            tokens=tokens,
            features=features,
            feature_names=self.feature_names,
            feature_types=types,
            legal=legal,
            useful_positions=useful,
            metadata={
                "task": self.name,
                "counts": counts,
                "output_positions": self.output_positions,
                "first_output_position": self.n_inputs,
            },
        )


@dataclass
class MajorityTask(_CountingTask):
    """Majority: outputs repeat the running majority; features ``is_majority_<s>``."""

    name: ClassVar[str] = "majority"
    _feature_prefix: ClassVar[str] = "is_majority_"

    @property
    def tracked(self) -> Tracked:
        return Tracked(layers=(1, 2), positions=self._tracked_positions(), features=tuple(self.feature_names))

    def sample(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """Draw n sequences.  Returns a :class:`TaskBatch` with T = 1 + inputs + outputs;
        ``metadata["counts"]`` (n, T, S) int64 are the running counts after each token."""
        n = check_n(n)
        s_, ni, t = self.n_symbols, self.n_inputs, self.seq_len
        u = rng.random((n, ni + self.n_outputs))
        rows = np.arange(n)
        tokens = np.empty((n, t), dtype=np.int64)
        tokens[:, 0] = BOS_ID
        counts = np.zeros((n, t, s_), dtype=np.int64)
        features = np.zeros((n, t, s_), dtype=np.float32)
        legal = np.zeros((n, t, self.vocab_size), dtype=bool)
        cur = np.zeros((n, s_), dtype=np.int64)
        for i in range(1, t):
            if i <= ni:
                legal[:, i - 1, 2:] = True
                sym = np.minimum(np.floor(u[:, i - 1] * s_).astype(np.int64), s_ - 1)
            else:
                argmax_set = cur == cur.max(axis=1, keepdims=True)
                legal[:, i - 1, 2:] = argmax_set
                sym = choose_uniform(argmax_set, u[:, i - 1])
            tokens[:, i] = sym + 2
            cur[rows, sym] += 1
            counts[:, i] = cur
            features[:, i] = cur == cur.max(axis=1, keepdims=True)
        useful = np.zeros(t, dtype=bool)
        useful[self.output_positions] = True
        return self._batch(tokens, features, legal, counts, useful)


@dataclass
class CondMajorityTask(_CountingTask):
    """Conditioned Majority: count tokens following ``<0>``; features ``prev_is_<s>``."""

    name: ClassVar[str] = "cond-majority"
    _feature_prefix: ClassVar[str] = "prev_is_"

    @property
    def tracked(self) -> Tracked:
        return Tracked(layers=(1, 2), positions=self._tracked_positions(), features=(f"{self._feature_prefix}<0>",))

    def sample(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """Draw n sequences.  ``metadata["counts"]`` (n, T, S) int64 are the conditional counts
        after each token (frozen from position ``n_inputs`` on)."""
        n = check_n(n)
        s_, ni, t = self.n_symbols, self.n_inputs, self.seq_len
        u = rng.random((n, ni + self.n_outputs))
        rows = np.arange(n)
        tokens = np.empty((n, t), dtype=np.int64)
        tokens[:, 0] = BOS_ID
        counts = np.zeros((n, t, s_), dtype=np.int64)
        legal = np.zeros((n, t, self.vocab_size), dtype=bool)
        cur = np.zeros((n, s_), dtype=np.int64)
        sym_prev = np.full(n, -1, dtype=np.int64)  # -1: previous token is <bos>
        argmax_set = None
        for i in range(1, t):
            if i <= ni:
                legal[:, i - 1, 2:] = True
                sym = np.minimum(np.floor(u[:, i - 1] * s_).astype(np.int64), s_ - 1)
                cur[rows, sym] += sym_prev == 0
            else:
                if argmax_set is None:
                    argmax_set = cur == cur.max(axis=1, keepdims=True)
                legal[:, i - 1, 2:] = argmax_set
                sym = choose_uniform(argmax_set, u[:, i - 1])
            tokens[:, i] = sym + 2
            counts[:, i] = cur
            sym_prev = sym
        features = np.zeros((n, t, s_), dtype=np.float32)
        prev = tokens[:, 1 : t - 1] - 2  # token i-1 for positions i = 2..T-1
        features[:, 2:] = np.eye(s_, dtype=np.float32)[prev]
        useful = np.zeros(t, dtype=bool)
        return self._batch(tokens, features, legal, counts, useful)
