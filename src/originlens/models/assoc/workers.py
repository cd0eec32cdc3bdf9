"""Scratch buffers and the worker team of the path implementation: cache-sized scratch sizes per device, a
reused workspace, and a small thread team that runs per-chunk jobs (torch releases the GIL in its kernels).
Part of :mod:`originlens.models.assoc`."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import numpy as np
import torch

# Scratch sizes of the path implementation (CPU: cache-sized pieces; other devices: large batches).
CHUNK_BYTES = {"cpu": 8 * 1024**2, "other": 2 * 1024**3}  # attention state of one chunk (worker task)
ROWS_BYTES = {"cpu": 4 * 1024**2, "other": 1024**3}  # gathered Z rows per block of the logits path
ROW_POSITIONS = {"cpu": 32, "other": 0}  # key positions per row block (0: all T')


class Workspace:
    """Reusable scratch tensors keyed by name (one flat buffer per name, grown on demand).

    Large fresh allocations are expensive on CPU (every first touch of a new page faults); the training
    loop reuses these buffers from step to step.  A tensor handed out under a name is valid until the
    same name is requested again.  Worker threads use distinct names.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()

    def get(
        self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, zero: bool = False
    ) -> torch.Tensor:
        n = math.prod(shape)
        with self._lock:
            buf = self._bufs.get(name)
            if buf is None or buf.numel() < n or buf.dtype != dtype or buf.device != device:
                buf = torch.empty(n, dtype=dtype, device=device)
                self._bufs[name] = buf
        out = buf[:n].view(shape)
        return out.zero_() if zero else out

    def clear(self) -> None:
        self._bufs.clear()


def fresh_pass(
    name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, *, zero: bool = False
) -> torch.Tensor:
    return (torch.zeros if zero else torch.empty)(shape, dtype=dtype, device=device)


_FTZ = threading.local()  # depth of nested subnormals_flushed() blocks in this thread
FLUSH_SUBNORMALS = True  # False: subnormals_flushed() does nothing (benchmarks/subnormals.py compares both)


def _ftz_active() -> bool:
    """Whether this thread flushes subnormal floats to zero now (probed: 1e-38 · 0.5 is subnormal)."""
    return bool(np.float32(1e-38) * np.float32(0.5) == 0)


@contextmanager
def subnormals_flushed() -> Iterator[None]:
    """Flush subnormal floats (|x| < 1.2e-38 in float32, 2.2e-308 in float64) to zero in the calling
    thread while the block runs, and in the threads of every :class:`Team` it starts; the previous mode
    is restored on exit.

    Why: from the zero initialisation of Definition 3.1 the weights grow like powers of t = sη, so the
    early products V_S W V_S'ᵀ are ≈ t^(2|S|+2|S'|+1) and fall below float32's normal range; x86 cores
    handle subnormal operands in microcode, 10–15× slower (η = 0.005, |V| = 500: 0.6 s instead of
    6–8 s per step).  Flushing them changes values far below any weight's round-off.  The flag is
    per thread: torch's intra-op threads are not reached, so the path implementation runs the |V|³
    products that may be subnormal in the team's threads (:func:`batched_mm`)."""
    if not FLUSH_SUBNORMALS:
        yield
        return
    depth = getattr(_FTZ, "depth", 0)
    prev = _ftz_active() if depth == 0 else True
    _FTZ.depth = depth + 1
    if not prev:
        torch.set_flush_denormal(True)
    try:
        yield
    finally:
        _FTZ.depth = depth
        if not prev:
            torch.set_flush_denormal(False)


def low_rank(S: int) -> tuple[int, int]:
    """(lowest layer index i in bitmask S, S without it)."""
    return (S & -S).bit_length() - 1, S & (S - 1)


class _Job:
    """Tasks grouped in lanes: a lane's tasks run in order, one at a time (they share a lane's
    accumulators and scratch); different lanes run concurrently."""

    def __init__(self, fn, lanes: list[list[int]]) -> None:
        self.fn, self.lanes = fn, lanes
        self.pos = [0] * len(lanes)
        self.busy = [False] * len(lanes)
        self.left = sum(len(q) for q in lanes)  # tasks not yet finished
        self.error: BaseException | None = None

    def take(self, w: int) -> tuple[int, int] | Literal[False] | None:
        """(lane, task) to run; None when every task is handed out (or the job failed); False when the
        remaining tasks all belong to running lanes (wait)."""
        if self.error is not None:
            return None
        n = len(self.lanes)
        order = ([w] if w < n else []) + [u for u in range(n) if u != w]
        waiting = False
        for u in order:
            if self.pos[u] < len(self.lanes[u]):
                if not self.busy[u]:
                    self.busy[u] = True
                    self.pos[u] += 1
                    return u, self.lanes[u][self.pos[u] - 1]
                waiting = True
        return False if waiting else None


class Team:
    """Worker threads for the CPU path implementation (the calling thread is worker 0).

    With n > 1 workers the chunks of a batch (:func:`path_pass`) are tasks that the workers take
    dynamically, each running single-threaded torch ops.  Compared with torch's intra-op threads (a
    barrier per op, work split evenly in advance) this avoids hundreds of small barriers per chunk
    and keeps both cores busy when one of them is shared with another process.  Results do not depend
    on which worker runs a task (a task writes its lane's accumulators, lanes in a fixed order).  With
    n = 1 the team runs everything inline.  The large |V|×|V| products use torch's intra-op threads,
    except tiny ones, split by rows over the workers (:func:`batched_mm`).  While the team is entered, the calling thread and the workers flush
    subnormal floats to zero (:func:`subnormals_flushed`).
    """

    def __init__(self, n: int) -> None:
        self.n = max(1, int(n))
        self._cond = threading.Condition()
        self._job: _Job | None = None
        self._gen = 0
        self._stop = False
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> Team:
        self._ftz = subnormals_flushed()  # every path computation runs inside a team
        self._ftz.__enter__()
        self._flush = FLUSH_SUBNORMALS
        if self.n > 1:
            self._threads = [threading.Thread(target=self._loop, args=(w,), daemon=True) for w in range(1, self.n)]
            for t in self._threads:
                t.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.n > 1:
                with self._cond:
                    self._stop = True
                    self._cond.notify_all()
                for t in self._threads:
                    t.join()
        finally:
            self._ftz.__exit__(None, None, None)

    def _loop(self, w: int) -> None:
        seen = 0
        if self._flush:
            _FTZ.depth = 1
            torch.set_flush_denormal(True)  # per thread
        with torch.no_grad():  # grad mode is thread-local: new threads start with it on
            while True:
                with self._cond:
                    while not self._stop and self._gen == seen:
                        self._cond.wait()
                    if self._stop:
                        return
                    seen, job = self._gen, self._job
                assert job is not None  # published with each new generation
                self._work(job, w)

    def _work(self, job: _Job, w: int) -> None:
        while True:
            with self._cond:
                while (got := job.take(w)) is False:
                    self._cond.wait()
                if got is None:
                    return
            lane, k = got
            try:
                job.fn(lane, k)
            except BaseException as exc:  # re-raised in the calling thread
                with self._cond:
                    if job.error is None:
                        job.error = exc
            with self._cond:
                job.busy[lane] = False
                job.left -= 1
                self._cond.notify_all()

    def run(self, fn, lanes: list[list[int]]) -> None:
        """Call ``fn(lane, task)`` for every task of every lane (see :class:`_Job`); returns when all
        are done, re-raising the first error."""
        if self.n == 1 or sum(len(q) for q in lanes) <= 1:
            for u, q in enumerate(lanes):
                for k in q:
                    fn(u, k)
            return
        job = _Job(fn, lanes)
        prev = torch.get_num_threads()
        torch.set_num_threads(1)  # workers run single-threaded ops
        try:
            with self._cond:
                self._job = job
                self._gen += 1
                self._cond.notify_all()
            self._work(job, 0)
            with self._cond:
                while (job.left > 0 and job.error is None) or any(job.busy):
                    self._cond.wait()
        finally:
            torch.set_num_threads(prev)
        if job.error is not None:
            raise job.error


TINY_PRODUCT = 1e-18  # max|a|·max|b| below which a product may reach float32's subnormal range (1.2e-38)


def batched_mm(team: Team, out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, add: bool = False) -> None:
    """``out = a @ b`` (``add``: ``out += a @ b``).

    On CPU with several workers, a product whose entries may be subnormal (max|a|·max|b| <
    :data:`TINY_PRODUCT`: the first steps from zero init) is split by rows of ``out`` over the team's
    workers, which flush subnormals (torch's intra-op threads cannot be reached, see
    :func:`subnormals_flushed`); every other product uses torch's intra-op threads (one shared packed
    operand: ≈ 1.3× faster than the row split at |V| = 1,000 on two cores).  The choice depends on the
    values and the team size only, so results are deterministic for a given thread count.  A zero factor
    (the first steps from zero init) skips the product."""
    n = team.n
    scale = (
        float(a.abs().amax()) * float(b.abs().amax()) if out.device.type == "cpu" and a.numel() and b.numel() else 1.0
    )
    if scale == 0.0:  # a zero factor (zero init): the product is exactly zero
        if not add:
            out.zero_()
        return
    if out.device.type == "cpu" and n > 1 and out.shape[0] >= 2 * n and scale < TINY_PRODUCT:
        M = out.shape[0]
        bounds = [(M * w // n, M * (w + 1) // n) for w in range(n)]

        def part(lane: int, k: int) -> None:
            r0, r1 = bounds[k]
            if add:
                out[r0:r1].addmm_(a[r0:r1], b)
            else:
                torch.mm(a[r0:r1], b, out=out[r0:r1])

        team.run(part, [[w] for w in range(n)])
    elif add:
        out.addmm_(a, b)
    else:
        torch.mm(a, b, out=out)


PAIR_BLOCK = 4096  # rows per block when packing / unpacking the pair-major products (cache-sized transposes)


def block_ranges(team: Team, N: int, fn, device: torch.device) -> None:
    """fn(r0, r1) over blocks of PAIR_BLOCK rows of 0..N−1, spread over the team's workers (one block
    on devices other than the CPU)."""
    if device.type != "cpu":
        fn(0, N)
        return
    bounds = [(r, min(N, r + PAIR_BLOCK)) for r in range(0, N, PAIR_BLOCK)]
    lanes = [list(range(w, len(bounds), team.n)) for w in range(team.n)]
    team.run(lambda lane, k: fn(*bounds[k]), lanes)
