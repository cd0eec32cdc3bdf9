"""Common interface of the synthetic worlds (the tasks of arXiv 2603.14087).

Every task produces a :class:`TaskBatch`: ``<bos>`` + generated tokens, the probed feature vector
after every token, optional per-(position, feature) types (0 = no feature / empty, 1 = NTP-useless,
2 = NTP-useful) and the legal set of the *next* token at every position.  :func:`get_task` builds a
task by its registry name; the metric helpers score arg-max predictions against the legal sets.

Conventions (0-based):

* vocabulary ``["<pad>", "<bos>"] + task tokens``: pad is id 0, bos id 1; ``tokens[:, 0] == 1``.
* ``features[:, i]`` is the feature vector after token i (all zeros at the BOS position 0).
* ``legal[:, i, v]`` is True when token v may follow ``tokens[:, :i+1]``; logits at position i predict
  token i+1.  At the last position i = T−1 there is no next token in the sequence; a task sets it to
  the legal continuation when the world defines one (Othello) and to all False otherwise (Majority).
* Metrics take arg-max predictions ``pred[:, i]`` for position i (shape (n, T) or (n, T−1); the
  column T−1, if given, is ignored) and score ``legal[b, i, pred[b, i]]``.

Caveat: the registry imports the task modules lazily so that :mod:`originlens.tasks.base` has no
import cycle with them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..errors import ConfigError, InputError

PAD_ID = 0
BOS_ID = 1
SPECIAL_TOKENS = ["<pad>", "<bos>"]

# Feature-type codes shared by all tasks.
TYPE_NONE = 0  # no feature here (BOS position, Othello empty cell)
TYPE_USELESS = 1  # does not help predict the immediate next token
TYPE_USEFUL = 2  # helps predict the immediate next token


@dataclass
class TaskBatch:
    """A batch of sequences with features and legal next-token sets.

    Attributes:
        tokens: (n, T) int64, ``tokens[:, 0] == BOS_ID``.
        features: (n, T, F) float32, feature vector after each token (zeros at position 0).
        feature_names: F names.
        feature_types: (n, T, F) uint8 with codes :data:`TYPE_NONE`/:data:`TYPE_USELESS`/
            :data:`TYPE_USEFUL`, or None when not computed.
        legal: (n, T, V) bool, legal set of the next token at every position.
        useful_positions: (T,) bool, positions whose features are NTP-useful for every sequence
            (position-level tasks), or None when usefulness varies per feature (Othello: use
            ``feature_types``).
        metadata: task-specific extras (e.g. ``output_positions``, ``first_output_position``).
    """

    tokens: np.ndarray
    features: np.ndarray
    feature_names: list[str]
    feature_types: np.ndarray | None
    legal: np.ndarray
    useful_positions: np.ndarray | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n, t = self.tokens.shape
        f = len(self.feature_names)
        if self.features.shape != (n, t, f):
            raise ValueError(f"features shape {self.features.shape} != {(n, t, f)}")
        if self.feature_types is not None and self.feature_types.shape != (n, t, f):
            raise ValueError(f"feature_types shape {self.feature_types.shape} != {(n, t, f)}")
        if self.legal.shape[:2] != (n, t):
            raise ValueError(f"legal shape {self.legal.shape} does not start with {(n, t)}")
        if self.useful_positions is not None and self.useful_positions.shape != (t,):
            raise ValueError(f"useful_positions shape {self.useful_positions.shape} != {(t,)}")

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.tokens.shape[1])

    def select(self, index: Any) -> TaskBatch:
        """Rows ``index`` (slice, int array or bool mask) of every per-sequence array."""
        idx = np.arange(len(self))[index]
        idx = np.atleast_1d(idx)
        return TaskBatch(
            tokens=self.tokens[idx],
            features=self.features[idx],
            feature_names=list(self.feature_names),
            feature_types=None if self.feature_types is None else self.feature_types[idx],
            legal=self.legal[idx],
            useful_positions=self.useful_positions,
            metadata=dict(self.metadata),
        )


@dataclass(frozen=True)
class Tracked:
    """Default probe sites of a task.

    ``layers`` are site indices k (k = 0 is the embedding output), ``positions`` sequence positions,
    ``features`` feature names.  With ``one_position_per_run`` each position is its own run (Othello:
    one of {4, 8, …, 56} per run); otherwise all positions are tracked together.
    """

    layers: tuple[int, ...]
    positions: tuple[int, ...]
    features: tuple[str, ...]
    one_position_per_run: bool = False
    per_type: bool = False


@runtime_checkable
class Task(Protocol):
    """What every synthetic world provides."""

    name: str

    @property
    def vocab(self) -> list[str]: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def seq_len(self) -> int: ...

    @property
    def feature_names(self) -> list[str]: ...

    @property
    def tracked(self) -> Tracked: ...

    def sample(self, n: int, rng: np.random.Generator) -> TaskBatch: ...


# --------------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, tuple[str, str]] = {
    "majority": ("originlens.tasks.majority", "MajorityTask"),
    "cond-majority": ("originlens.tasks.majority", "CondMajorityTask"),
    "othello": ("originlens.tasks.othello", "OthelloTask"),
    "tinystories": ("originlens.tasks.tinystories", "TinyStoriesTask"),
}


def task_names() -> list[str]:
    """Registered task names."""
    return list(_REGISTRY)


def get_task(name: str, **kw: Any) -> Task:
    """Build the task registered as ``name`` with configuration keywords ``kw``.

    Raises:
        ConfigError: unknown name or unknown/invalid keyword.
    """
    if name not in _REGISTRY:
        raise ConfigError(f"unknown task {name!r}", f"use one of: {', '.join(_REGISTRY)}")
    module, cls_name = _REGISTRY[name]
    cls = getattr(importlib.import_module(module), cls_name)
    known = set(getattr(cls, "__dataclass_fields__", {}))
    bad = sorted(set(kw) - known)
    if bad:
        raise ConfigError(
            f"task {name!r} has no option(s) {', '.join(bad)}", f"valid options: {', '.join(sorted(known)) or 'none'}"
        )
    return cls(**kw)


def check_n(n: int) -> int:
    """Validate a requested number of sequences."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError(f"number of sequences must be a non-negative integer, got {n!r}", "pass n >= 0")
    return int(n)


# ---------------------------------------------------------------------------------------- metrics


def _pred_array(pred_tokens: Any, batch: TaskBatch) -> np.ndarray:
    pred = np.asarray(pred_tokens)
    n, t = batch.tokens.shape
    if pred.ndim != 2 or pred.shape[0] != n or pred.shape[1] not in (t, t - 1):
        raise InputError(
            f"predictions of shape {pred.shape} do not fit a batch of {(n, t)}",
            f"pass arg-max token ids of shape ({n}, {t}) or ({n}, {t - 1})",
        )
    if pred.shape[1] == t:
        pred = pred[:, : t - 1]
    v = batch.legal.shape[2]
    if pred.size and (pred.min() < 0 or pred.max() >= v):
        raise InputError(f"predicted token ids outside [0, {v})", "pass arg-max ids of the task vocabulary")
    return pred.astype(np.int64)


def legal_hits(pred_tokens: Any, batch: TaskBatch) -> np.ndarray:
    """(n, T−1) bool: whether the prediction at position i is in the legal set of token i+1."""
    pred = _pred_array(pred_tokens, batch)
    legal = batch.legal[:, : pred.shape[1]]
    return np.take_along_axis(legal, pred[..., None], axis=2)[..., 0]


def legal_accuracy(pred_tokens: Any, batch: TaskBatch, positions: Any = None) -> float:
    """Mean legal-move accuracy of arg-max predictions ``pred_tokens`` (n, T) or (n, T−1).

    ``positions``: predicting positions to average over (default: every position 0..T−2 whose legal
    set is non-empty).  Returns NaN when nothing is selected.
    """
    hits = legal_hits(pred_tokens, batch)
    if positions is None:
        mask = batch.legal[:, : hits.shape[1]].any(axis=2)
    else:
        pos = np.atleast_1d(np.asarray(positions, dtype=np.int64))
        if pos.size and (pos.min() < 0 or pos.max() >= hits.shape[1]):
            raise InputError(
                f"positions {pos.tolist()} outside 0..{hits.shape[1] - 1}",
                "choose predicting positions below the last one",
            )
        mask = np.zeros_like(hits)
        mask[:, pos] = True
    if not mask.any():
        return float("nan")
    return float(hits[mask].mean())


def output_legal_accuracy(pred_tokens: Any, batch: TaskBatch) -> float:
    """Legal accuracy over the positions that predict output tokens (Majority tasks)."""
    return legal_accuracy(pred_tokens, batch, batch.metadata["output_positions"])


def first_output_accuracy(pred_tokens: Any, batch: TaskBatch) -> float:
    """Accuracy of the prediction of the first output token (Majority tasks)."""
    return legal_accuracy(pred_tokens, batch, [batch.metadata["first_output_position"]])


def task_metrics(pred_tokens: Any, batch: TaskBatch) -> dict[str, float]:
    """The task metrics for this batch: Majority tasks get ``legal_output_acc`` and
    ``first_output_token_acc``; every task gets ``legal_acc`` over all predicting positions."""
    out = {"legal_acc": legal_accuracy(pred_tokens, batch)}
    if "output_positions" in batch.metadata:
        out["legal_output_acc"] = output_legal_accuracy(pred_tokens, batch)
        out["first_output_token_acc"] = first_output_accuracy(pred_tokens, batch)
    return out


# ------------------------------------------------------------------------------ shared sampling


def choose_uniform(mask: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Index of the ⌊u·c⌋-th True entry of each row of ``mask`` (c = row count), in column order.

    ``mask`` (n, K) bool, ``u`` (n,) uniforms in [0, 1).  Rows without a True entry return 0 (callers
    handle them).  This is the one sampling rule of all tasks: given the same uniforms, a plain loop
    over ``sorted(candidates)[int(u * len(candidates))]`` picks the same element.
    """
    m = mask.astype(np.int64, copy=False)
    cnt = m.sum(axis=1)
    k = np.minimum(np.floor(u * cnt).astype(np.int64), np.maximum(cnt - 1, 0))
    csum = np.cumsum(m, axis=1)
    return np.argmax(csum > k[:, None], axis=1)
