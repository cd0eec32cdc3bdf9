"""Multi-process runs on PyTorch distributed (``torchrun``), no home-made scheduler.

Start any supported command under ``torchrun --nproc_per_node N -m originlens ...`` (or call the
functions here from a script started by torchrun): :func:`init` reads the ``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` environment torchrun sets and joins the process group (gloo on CPU, nccl on CUDA).

* **Statistics** (:func:`distributed_corpus_statistics`): each rank accumulates its contiguous shard of
  the windows (:func:`shard_bounds`); the sums are all-gathered and merged **in rank order** on every
  rank, then finalised identically everywhere.  Integer counts (pairs, unigram, bigram counts) are
  exact and equal the single-process ones; floating-point sums (context, query-key, positional) equal
  the single-process merge of the same shards bit for bit (``corpus_statistics_sharded``), and the
  unsharded single pass to round-off (different summation order).
* Helpers for "rank 0 writes": :func:`rank_zero_first`, :func:`rank_zero_only`, :func:`barrier`; small
  collectives :func:`all_reduce_sum`, :func:`any_rank`, :func:`same_on_all_ranks` (tensors only, never
  pickle).  Data-parallel training: :mod:`originlens.train.parallel`; parallel attribution segments:
  :func:`originlens.attribution.segments.attribute_segments`.
* :func:`init` makes rank 0 the only rank with progress bars and status lines, and binds each rank to
  ``cuda:LOCAL_RANK`` under nccl.

Caveats: all-gathering the K×K accumulators costs world_size × K² × 8 bytes on every rank (fine up to a
few thousand tokens; for K = 20,000 prefer one process with more threads).  Communication is between the
ranks of one job (trusted); nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .errors import ConfigError


def env_world() -> tuple[int, int]:
    """(rank, world_size) from the torchrun environment (0, 1 when not started by torchrun)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def single_process(what: str) -> None:
    """Refuse, with one :class:`ConfigError`, to run ``what`` (a command that does not split its work over
    ranks) under ``torchrun`` with several processes: every rank would repeat the whole job and write the
    same outputs."""
    _, n = env_world()
    if n > 1:
        raise ConfigError(
            f"{what} does not split its work over torchrun's {n} processes (each would run the whole job "
            "and write the same files)",
            "run it as one process (without torchrun); `lm qscore` shares its features over the ranks",
        )


def is_distributed() -> bool:
    """True once a process group is initialised with more than one process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def init(backend: str | None = None) -> tuple[int, int]:
    """Join the process group described by torchrun's environment; returns (rank, world_size).

    A no-op returning (0, 1) outside torchrun.  ``backend`` defaults to the environment variable
    ``ORIGINLENS_DIST_BACKEND``, else nccl when CUDA is available and gloo otherwise.
    """
    rank, world = env_world()
    if world <= 1:
        return 0, 1
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError(
            "torch.distributed is not available in this PyTorch build",
            "install a PyTorch build with distributed support or run one process",
        )
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise ConfigError(
                "WORLD_SIZE > 1 but MASTER_ADDR is not set", "start the command with torchrun --nproc_per_node N ..."
            )
        backend = (
            backend or os.environ.get("ORIGINLENS_DIST_BACKEND") or ("nccl" if torch.cuda.is_available() else "gloo")
        )
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
        import atexit

        atexit.register(_shutdown)  # tear gloo/nccl down before interpreter exit (see _shutdown)
    if dist.get_rank() != 0:
        from .progress import set_verbosity

        set_verbosity(0)  # one progress bar / status stream: rank 0's
    return dist.get_rank(), dist.get_world_size()


def _shutdown() -> None:
    """Destroy the process group at exit: left to interpreter shutdown, the backend's worker threads were
    occasionally destroyed while still joinable ("terminate called without an active exception", SIGABRT
    on a rank after the command had finished and written its output)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def world() -> tuple[int, int]:
    """(rank, world_size) of the initialised group, (0, 1) without one."""
    if not is_distributed():
        return 0, 1
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


def barrier() -> None:
    if is_distributed():
        import torch.distributed as dist

        dist.barrier()


@contextlib.contextmanager
def rank_zero_first() -> Iterator[bool]:
    """Rank 0 runs the block first (e.g. writes a cache), the others after it; yields ``rank == 0``."""
    rank, _ = world()
    if rank != 0:
        barrier()
    yield rank == 0
    if rank == 0:
        barrier()


def shard_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous [start, stop) of ``n`` items for ``rank`` (the first ``n % world`` ranks get one more)."""
    base, extra = divmod(int(n), int(world_size))
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def rank_zero_only(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on rank 0 only (e.g. evaluation, writing; no collectives inside), the others wait at a
    barrier; returns fn's result on rank 0 and None elsewhere."""
    rank, _ = world()
    out = fn(*args, **kwargs) if rank == 0 else None
    barrier()
    return out


def all_reduce_sum(t: Any) -> Any:
    """Sum a tensor over the ranks in place (returned); the identity without a process group."""
    if is_distributed():
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def any_rank(flag: bool) -> bool:
    """True on every rank when ``flag`` is true on at least one (e.g. a stop request)."""
    if not is_distributed():
        return bool(flag)
    import torch

    t = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64, device=collective_device())
    return bool(all_reduce_sum(t).item() > 0)


def gather_to_rank_zero(obj: Any) -> list[Any] | None:
    """Every rank's picklable ``obj`` on rank 0, in rank order (None on the other ranks); ``[obj]``
    without a process group.  For results of moderate size (e.g. per-feature tables of one shard)."""
    if not is_distributed():
        return [obj]
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    out: list[Any] | None = [None] * n if rank == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def same_on_all_ranks(value: int, what: str) -> None:
    """Raise :class:`ConfigError` on every rank unless the integer ``value`` agrees across the ranks."""
    if not is_distributed():
        return
    import torch
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.int64, device=collective_device())
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    values = [int(o.item()) for o in out]
    if len(set(values)) > 1:
        raise ConfigError(
            f"the ranks disagree on the {what}: {values} (rank order)",
            "give every rank the same files and arguments (a shared run directory)",
        )


def collective_device() -> Any:
    """Where small collective tensors live: the current CUDA device under nccl, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather_array(a: np.ndarray) -> list[np.ndarray]:
    """All-gather a same-shape numpy array from every rank (rank order)."""
    import torch
    import torch.distributed as dist

    t = torch.from_numpy(np.ascontiguousarray(a))
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.numpy() for o in out]


def _gather_ragged(a: np.ndarray) -> list[np.ndarray]:
    """All-gather 1-D arrays of different lengths (rank order)."""
    n = np.array([a.shape[0]], dtype=np.int64)
    sizes = [int(s[0]) for s in _gather_array(n)]
    buf = np.zeros(max(sizes) if sizes else 0, dtype=a.dtype)
    buf[: a.shape[0]] = a
    return [g[:s] for g, s in zip(_gather_array(buf), sizes)]


def _allgather_first(sums: Any) -> None:
    """Replace ``sums`` (FirstOrderSums of this rank's shard) by the rank-ordered merge of all ranks."""
    import scipy.sparse as sp

    from .stats.corpus import FirstOrderSums

    coo = sums.joint.tocoo()
    rows, cols, vals = (_gather_ragged(np.asarray(x, dtype=np.int64)) for x in (coo.row, coo.col, coo.data))
    n_pairs = _gather_array(np.array([sums.n_pairs], dtype=np.int64))
    unigram = _gather_array(sums.unigram)
    context = _gather_array(sums.context_raw)
    parts = _gather_array(sums.prefix_parts)
    merged: FirstOrderSums | None = None
    for r in range(len(n_pairs)):
        shard = FirstOrderSums.__new__(FirstOrderSums)
        shard.__dict__.update(sums.__dict__)
        shard.n_pairs = int(n_pairs[r][0])
        shard.unigram = unigram[r].copy()
        shard.joint = sp.csr_matrix((vals[r], (rows[r], cols[r])), shape=sums.joint.shape)
        shard.context_raw = context[r].copy()
        shard.prefix_parts = parts[r].copy()
        merged = shard if merged is None else merged.merge(shard)
    assert merged is not None
    sums.__dict__.update(merged.__dict__)


def _allgather_second(sums: Any) -> None:
    n_pairs = _gather_array(np.array([sums.n_pairs], dtype=np.int64))
    qk = _gather_array(sums.qk_raw)
    parts = _gather_array(sums.delta_parts)
    sums.n_pairs = int(n_pairs[0][0])
    sums.qk_raw, sums.delta_parts = qk[0].copy(), parts[0].copy()
    for r in range(1, len(qk)):
        sums.n_pairs += int(n_pairs[r][0])
        sums.qk_raw += qk[r]
        sums.delta_parts += parts[r]


def corpus_statistics_sharded(
    tokens: Any,
    vocab_size: int,
    n_shards: int,
    *,
    gather: Any = None,
    shard: int | None = None,
    token_ids: np.ndarray | None = None,
    top_k: int | None = None,
    centering: float | None = None,
    pad_id: int | None = None,
    dtype: Any = np.float64,
    chunk_size: int = 1024,
    vocab: list[str] | None = None,
) -> Any:
    """Statistics as the rank-ordered merge of ``n_shards`` contiguous shards of ``tokens`` (N, T+1).

    Single process (``shard=None``): every shard is accumulated here, then merged in order — the exact
    reference for the distributed run.  With ``shard=r`` and ``gather`` (the all-gather merges), only
    shard r is accumulated locally.  ``top_k`` is resolved on the full token array on every rank
    (cheap: a bincount).
    """
    from .stats.corpus import (
        FirstOrderSums,
        SecondOrderSums,
        _check_tokens,
        assemble,
        corpus_chunks,
        most_frequent_tokens,
    )

    arr = _check_tokens(tokens, vocab_size)
    if top_k is not None:
        if token_ids is not None:
            raise ConfigError("pass either top_k or token_ids, not both", "drop one of them")
        token_ids = most_frequent_tokens(arr, vocab_size, top_k, pad_id=pad_id)
    T = arr.shape[1] - 1
    shards = [shard_bounds(arr.shape[0], r, n_shards) for r in range(n_shards)]
    mine = range(n_shards) if shard is None else [shard]

    def new_first() -> Any:
        return FirstOrderSums(vocab_size, T, token_ids=token_ids, centering=centering, pad_id=pad_id)

    first_sums = None
    for r in mine:
        part = new_first()
        a, b = shards[r]
        for chunk, m in corpus_chunks(arr[a:b], chunk_size, None, f"statistics pass 1/2 (shard {r})"):
            part.update(chunk, m)
        first_sums = part if first_sums is None else first_sums.merge(part)
    assert first_sums is not None  # mine holds at least one shard
    if gather is not None:
        gather[0](first_sums)
    first = first_sums.finalize(dtype, release=True)
    second = None
    for r in mine:
        part = SecondOrderSums(first)
        a, b = shards[r]
        for chunk, m in corpus_chunks(arr[a:b], chunk_size, None, f"statistics pass 2/2 (shard {r})"):
            part.update(chunk, m)
        second = part if second is None else second.merge(part)
    assert second is not None
    if gather is not None:
        gather[1](second)
    q, delta = second.finalize(dtype)
    return assemble(first, q, delta, vocab=vocab)


def distributed_corpus_statistics(tokens: Any, vocab_size: int, **kwargs: Any) -> Any:
    """:func:`~originlens.stats.corpus_statistics` across the ranks of the initialised process group.

    Every rank passes the same ``tokens`` (typically a memory-mapped corpus) and gets the same result.
    Without a process group this is the single-process sharded computation with one shard.
    """
    rank, world_size = world()
    if world_size == 1:
        return corpus_statistics_sharded(tokens, vocab_size, 1, **kwargs)
    return corpus_statistics_sharded(
        tokens, vocab_size, world_size, shard=rank, gather=(_allgather_first, _allgather_second), **kwargs
    )
