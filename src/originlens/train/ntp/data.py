"""Training and eval data of a next-token-prediction run: the per-update batch rule
(``default_rng([seed, 7, b])``), the fixed pools (counting tasks' training set, Othello games, token-store
windows) and the eval set.  Part of :mod:`originlens.train.ntp` (its docstring states the data-order rule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...tasks import BOS_ID, TaskBatch, moves_to_tokens
from ...tasks.othello import generate_games
from .config import POOL_CHUNK, POOL_STREAM, TRAIN_STREAM


def train_rng(seed: int, b: int) -> np.random.Generator:
    """Generator of training batch b (0-based; used for update b + 1)."""
    return np.random.default_rng([int(seed), TRAIN_STREAM, int(b)])


class _SampledData:
    """Batches drawn afresh from the task's sampler for every step."""

    def __init__(self, task: Any, seed: int, batch_size: int) -> None:
        self.task, self.seed, self.batch_size = task, seed, batch_size

    def batch(self, b: int) -> np.ndarray:
        return self.task.sample(self.batch_size, train_rng(self.seed, b)).tokens

    def describe(self) -> str:
        return (
            f"batch b = {self.task.name}.sample({self.batch_size}, numpy.random.default_rng([seed, "
            f"{TRAIN_STREAM}, b])).tokens, b = update - 1"
        )


class _PoolData:
    """Batches of rows of a fixed pool (N, T), indices ``default_rng([seed, 7, b]).integers(0, N, B)``."""

    def __init__(self, pool: np.ndarray, seed: int, batch_size: int, what: str) -> None:
        self.pool, self.seed, self.batch_size, self.what = pool, seed, batch_size, what

    def indices(self, b: int) -> np.ndarray:
        return np.sort(train_rng(self.seed, b).integers(0, len(self.pool), self.batch_size))

    def batch(self, b: int) -> np.ndarray:
        return np.asarray(self.pool[self.indices(b)], dtype=np.int64)

    def describe(self) -> str:
        return (
            f"batch b = rows sort(numpy.random.default_rng([seed, {TRAIN_STREAM}, b]).integers(0, N, "
            f"{self.batch_size})) of {self.what} (N = {len(self.pool)}), b = update - 1"
        )


def othello_pool(n: int, seed: int) -> np.ndarray:
    """(n, 61) uint8 tokens of n random games; chunk c of 16384 games from ``default_rng([seed, 11, c])``."""
    out = np.empty((n, 61), dtype=np.uint8)
    out[:, 0] = BOS_ID
    for c, a in enumerate(range(0, n, POOL_CHUNK)):
        b = min(n, a + POOL_CHUNK)
        games = generate_games(b - a, np.random.default_rng([int(seed), POOL_STREAM, c]), feature_types=False)
        out[a:b, 1:] = moves_to_tokens(games.moves)
    return out


@dataclass
class EvalData:
    """The fixed evaluation set: tokens (n, T) and, for the synthetic tasks, the full TaskBatch."""

    tokens: np.ndarray
    batch: TaskBatch | None


# ----------------------------------------------------------------------------------------------------
# Checkpoints
