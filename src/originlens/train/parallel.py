"""Data-parallel training on PyTorch distributed (``torchrun``): one global batch, sliced over the ranks.

Both trainers (:class:`~originlens.train.ntp.Trainer`, :class:`~originlens.train.assoc.AssocTrainer`) call
these functions; without a process group (a plain single process) every one of them is the identity,
so single-process training is unchanged bit for bit.

Rule (``W`` ranks, global batch of B sequences for update b, the same on every rank because the data
order is a deterministic function of (seed, b)):

* rank r takes the contiguous rows ``shard_bounds(B, r, W)`` (unequal slices when W ∤ B);
* its loss is the single-process loss restricted to its rows — for the GPT the weights
  ω_{b,t} = 1/(B(T−1)) of the **global** batch (:func:`shard_loss`), for the attention-only model the
  slice's mean scaled by B_r / B (:func:`mean_over_shards`) — so the losses of the ranks sum to the
  single-process loss and their gradients to its gradient;
* gradients are summed over the ranks with one ``all_reduce`` (SUM) on a flattened buffer per bucket
  (:func:`allreduce_gradients`); every rank then takes the same optimiser step;
* the logged loss is the all-reduced global loss (:func:`global_value`).

The result equals single-process training with the same global batch up to round-off (the sums are
taken in another order): ~1e-16 relative per step in float64, float32 round-off in float32 (tested in
float64 to 1e-10 after several Adam steps).  :func:`check_in_sync` verifies at every checkpoint that the
ranks still hold bit-identical weights.

Caveats: bit-exact resume needs the same number of processes (the summation order depends on it);
``W`` must not exceed the batch size; dropout (off in the trainers) would draw other masks than one
process; a run trained with W > 1 replays in one process (``ntp attribute``) only to round-off, so the
replay's bit-exact checks need ``--replay-rtol``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from ..distributed import all_reduce_sum, collective_device, is_distributed, shard_bounds, world
from ..errors import ConfigError, NumericalError

BUCKET_ELEMENTS = 1 << 24  # gradients are all-reduced in flat buckets of at most this many values


def shard_rows(n: int) -> tuple[int, int]:
    """This rank's contiguous rows [start, stop) of a global batch of ``n`` sequences ((0, n) alone)."""
    rank, world_size = world()
    if world_size > n:
        raise ConfigError(
            f"{world_size} processes cannot share a batch of {n} sequences",
            f"use a batch size ≥ {world_size} or fewer processes (--nproc_per_node)",
        )
    return shard_bounds(n, rank, world_size)


def shard_loss(model: Any, tokens: torch.Tensor) -> torch.Tensor:
    """This rank's part of the GPT training loss on the global batch ``tokens`` (B, T).

    Rows ``shard_rows(B)`` with the global weights ω = 1/(B(T−1)): Σ over ranks = ``model.loss(tokens)``.
    Without a process group this is ``model.loss(tokens)`` itself.
    """
    if not is_distributed():
        return model.loss(tokens)
    B, T = tokens.shape
    a, b = shard_rows(B)
    # float64 weights, rounded once to the model's dtype inside position_losses
    w = torch.full((b - a, T - 1), 1.0 / (B * (T - 1)), dtype=torch.float64, device=tokens.device)
    return model.loss(tokens[a:b], weights=w)


def global_value(loss: torch.Tensor) -> float:
    """Σ over ranks of a scalar loss (float64), as a Python float; ``float(loss)`` alone."""
    if not is_distributed():
        return float(loss.detach())
    t = loss.detach().double().reshape(1).clone()
    return float(all_reduce_sum(t).item())


def allreduce_gradients(params: Iterable[torch.nn.Parameter]) -> None:
    """Sum ``.grad`` over the ranks in place (parameters without a gradient are skipped on every rank —
    whether a parameter gets one depends on the graph, not the data, so the ranks agree)."""
    if not is_distributed():
        return
    grads = [p.grad for p in params if p.grad is not None]
    bucket: list[torch.Tensor] = []
    size = 0
    for g in grads + [None]:  # None flushes the last bucket
        if g is not None and (
            not bucket
            or (size + g.numel() <= BUCKET_ELEMENTS and g.dtype == bucket[0].dtype and g.device == bucket[0].device)
        ):
            bucket.append(g)
            size += g.numel()
            continue
        if bucket:
            flat = all_reduce_sum(torch.cat([b.reshape(-1) for b in bucket]))
            offset = 0
            for b in bucket:
                b.copy_(flat[offset : offset + b.numel()].view_as(b))
                offset += b.numel()
        bucket, size = ([g], g.numel()) if g is not None else ([], 0)


def mean_over_shards(
    accumulate: Callable[[torch.Tensor], float], batch: torch.Tensor, params: Iterable[torch.nn.Parameter]
) -> float:
    """Data-parallel form of a mean-loss gradient accumulator ``accumulate(rows) -> mean loss`` that adds
    ∇(mean loss over ``rows``) to ``.grad``: this rank's slice, scaled by B_r / B, summed over the ranks.
    Returns the global mean loss (the same on every rank).  Alone: ``accumulate(batch)``.  A rank left
    without rows (a short last batch of an epoch) contributes zeros; parameters without a gradient get
    zeros (plain SGD: no change).
    """
    if not is_distributed():
        return accumulate(batch)
    n = batch.shape[0]
    rank, world_size = world()
    a, b = shard_bounds(n, rank, world_size)  # a short last batch may leave a rank without rows
    params = list(params)
    total = accumulate(batch[a:b]) if b > a else 0.0
    scale = (b - a) / n
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)  # every rank sends a buffer of the same layout
            else:
                p.grad.mul_(scale)
    allreduce_gradients(params)
    return float(all_reduce_sum(torch.tensor([total * scale], dtype=torch.float64, device=_device_of(params))).item())


def check_in_sync(params: Iterable[torch.Tensor], where: str) -> None:
    """Raise :class:`NumericalError` on every rank unless all ranks hold bit-identical ``params``
    (compares a float64 checksum; a no-op alone)."""
    if not is_distributed():
        return
    import torch.distributed as dist

    params = [p.detach() for p in params]
    dev = _device_of(params)
    s = torch.zeros(2, dtype=torch.float64, device=dev)
    for i, p in enumerate(params):
        d = p.double().reshape(-1)
        s[0] += d.sum()
        s[1] += (d * (1.0 + (torch.arange(d.numel(), device=dev, dtype=torch.float64) % 7) + i)).sum()
    s = s.to(collective_device())  # gloo gathers CPU tensors only
    out = [torch.empty_like(s) for _ in range(dist.get_world_size())]
    dist.all_gather(out, s)
    if any(not torch.equal(o, out[0]) for o in out[1:]):
        raise NumericalError(
            f"the ranks' weights differ at {where} (data-parallel runs must stay identical)",
            "report this as a bug; resume from the last checkpoint with one process",
        )


def _device_of(params: Sequence[torch.Tensor]) -> torch.device:
    return params[0].device if params else torch.device("cpu")
