"""Training and eval data of a next-token-prediction run: the per-update batch rule
(``default_rng([seed, 7, b])``), the fixed pools (counting tasks' training set, Othello games, token-store
windows) and the eval set.  Part of :mod:`originlens.train.ntp` (its docstring states the data-order rule)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...errors import InputError
from ...tasks import BOS_ID, TaskBatch, moves_to_tokens
from ...tasks.othello import N_MOVES, moves_from_uniforms
from .config import POOL_CHUNK, POOL_STREAM, TRAIN_STREAM


def train_rng(seed: int, b: int) -> np.random.Generator:
    """Generator of training batch b (0-based; used for update b + 1)."""
    return np.random.default_rng([int(seed), TRAIN_STREAM, int(b)])


class SampledData:
    """Batches drawn afresh from the task's sampler for every step."""

    def __init__(self, task: Any, seed: int, batch_size: int) -> None:
        self.task, self.seed, self.batch_size = task, seed, batch_size

    def batch(self, b: int) -> np.ndarray:
        return self.task.sample(self.batch_size, train_rng(self.seed, b)).tokens

    def device_batch(self, b: int, device: torch.device, vocab_size: int) -> torch.Tensor:
        """:meth:`batch` as int64 on ``device``, its ids checked on the host (no device synchronisation)."""
        x = self.batch(b)
        check_ids(x, vocab_size)
        return _upload(torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64)), device)

    def describe(self) -> str:
        return (
            f"batch b = {self.task.name}.sample({self.batch_size}, numpy.random.default_rng([seed, "
            f"{TRAIN_STREAM}, b])).tokens, b = update - 1"
        )


DEVICE_POOL_BYTES = 1 << 30  # pools up to this size are copied to the device once (fast path)


class PoolData:
    """Batches of rows of a fixed pool of N rows, indices ``default_rng([seed, 7, b]).integers(0, N, B)``.

    ``pool``: the (N, T) rows, or with ``rows`` (sorted, unique) only those rows of the N, in that order
    (``n`` = N): a run that draws a small part of a large pool holds only what it draws
    (:func:`pool_rows`); the batches are the same either way."""

    def __init__(
        self, pool: np.ndarray, seed: int, batch_size: int, what: str, *, rows: np.ndarray | None = None, n: int = 0
    ) -> None:
        self.pool, self.seed, self.batch_size, self.what = pool, seed, batch_size, what
        self.rows = rows
        self.n = n if rows is not None else len(pool)
        self._on_device: tuple[tuple[str, int], torch.Tensor] | None = None

    def indices(self, b: int) -> np.ndarray:
        """The pool rows (in 0..N-1) of batch b."""
        return np.sort(train_rng(self.seed, b).integers(0, self.n, self.batch_size))

    def _held(self, b: int) -> np.ndarray:
        """Where batch b's rows sit in :attr:`pool`."""
        idx = self.indices(b)
        if self.rows is None:
            return idx
        at = np.searchsorted(self.rows, idx)
        if at.size and (
            at[-1] >= len(self.rows) or not np.array_equal(self.rows[np.minimum(at, len(self.rows) - 1)], idx)
        ):
            raise InputError(
                f"batch {b} draws pool rows this run's partial pool does not hold",
                "delete the run's data/ directory: the pool is regenerated from the seed",
            )
        return at

    def batch(self, b: int) -> np.ndarray:
        return np.asarray(self.pool[self._held(b)], dtype=np.int64)

    def device_batch(self, b: int, device: torch.device, vocab_size: int) -> torch.Tensor:
        """:meth:`batch` as int64 on ``device``, the same rows: the pool is copied to the device once (its
        ids checked once on the host) and each batch is gathered there, so only the B row indices travel."""
        if self.pool.nbytes > DEVICE_POOL_BYTES:  # a large token store: gather on the host
            x = self.batch(b)
            check_ids(x, vocab_size)
            return _upload(torch.from_numpy(x), device)
        key = (str(device), vocab_size)
        if self._on_device is None or self._on_device[0] != key:
            check_ids(self.pool, vocab_size)
            self._on_device = (key, torch.from_numpy(np.ascontiguousarray(self.pool)).to(device))
        idx = _upload(torch.from_numpy(self._held(b)), device)
        return self._on_device[1].index_select(0, idx).long()

    def describe(self) -> str:
        return (
            f"batch b = rows sort(numpy.random.default_rng([seed, {TRAIN_STREAM}, b]).integers(0, N, "
            f"{self.batch_size})) of {self.what} (N = {self.n}), b = update - 1"
        )


def check_ids(tokens: np.ndarray, vocab_size: int) -> None:
    """Raise :class:`InputError` unless every id lies in [0, vocab_size) (checked on the host)."""
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise InputError(
            f"token ids span [{int(tokens.min())}, {int(tokens.max())}] outside the vocabulary [0, {vocab_size})",
            "use the tokenizer/vocabulary the model was built for",
        )


def _upload(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on ``device``: through pinned memory without blocking the host on CUDA."""
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def othello_pool(n: int, seed: int, rows: np.ndarray | None = None) -> np.ndarray:
    """(n, 61) uint8 tokens of n random games; chunk c of 16384 games from ``default_rng([seed, 11, c])``
    (the games of ``generate_games(len(chunk), that generator)``; only their moves are computed).

    ``rows`` (sorted, unique, in 0..n-1): only those games, ``othello_pool(n, seed)[rows]``, each played
    from its own row of its chunk's uniforms (a chunk's uniforms are drawn whole, ≈ 8 MB; only the games
    asked for are played)."""
    if rows is None:
        rows_of = [np.arange(a, min(n, a + POOL_CHUNK)) for a in range(0, n, POOL_CHUNK)]
    else:
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows[0] < 0 or rows[-1] >= n or np.any(np.diff(rows) <= 0)):
            raise InputError(f"pool rows must be sorted, unique and in [0, {n})", "use pool_rows()")
        bounds = np.searchsorted(rows, np.arange(0, n + POOL_CHUNK, POOL_CHUNK))
        rows_of = [rows[bounds[c] : bounds[c + 1]] for c in range(len(bounds) - 1)]
    out = np.empty((sum(len(r) for r in rows_of), 61), dtype=np.uint8)
    out[:, 0] = BOS_ID
    at = 0
    for c, chunk_rows in enumerate(rows_of):
        if not len(chunk_rows):
            continue
        a = c * POOL_CHUNK
        u = np.random.default_rng([int(seed), POOL_STREAM, c]).random((min(n, a + POOL_CHUNK) - a, N_MOVES))
        played = moves_from_uniforms(u if len(chunk_rows) == len(u) else u[chunk_rows - a])
        out[at : at + len(chunk_rows), 1:] = moves_to_tokens(played)
        at += len(chunk_rows)
    return out


def pool_rows(n: int, seed: int, batch_size: int, steps: int) -> np.ndarray:
    """The sorted rows of an n-row pool that updates 1..steps draw (batch b = update − 1:
    ``default_rng([seed, 7, b]).integers(0, n, batch_size)``)."""
    used = np.zeros(n, dtype=bool)
    for b in range(steps):
        used[train_rng(seed, b).integers(0, n, batch_size)] = True
    return np.flatnonzero(used)


@dataclass
class EvalData:
    """The fixed evaluation set: tokens (n, T) and, for the synthetic tasks, the full TaskBatch."""

    tokens: np.ndarray
    batch: TaskBatch | None


# ----------------------------------------------------------------------------------------------------
# Checkpoints
