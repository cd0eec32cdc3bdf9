"""Counts of what a piece of torch code asks of the machine: operators dispatched and host reads.

``with count_dispatch() as counts: ...`` records

* ``counts.ops`` — every ATen operator that reached the dispatcher (a ``TorchDispatchMode``), by name,
  and ``counts.kernels`` — those that are not views (a view moves no data and launches nothing): an
  upper bound on the kernels a device would launch;
* ``counts.host_reads`` — every read of a tensor's values into Python (a ``TorchFunctionMode`` sees
  ``item``, ``tolist``, ``numpy``, ``float``/``int``/``bool`` of a tensor, and ``cpu``/``to`` a CPU
  device from another device), by name: on an accelerator each is a host synchronisation.

The counts depend on the code path only, not on the machine, its load or its number of threads: they
are the figures a CPU can measure for a GPU's launch and synchronisation overheads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_READS = {
    torch.Tensor.item: "item",
    torch.Tensor.tolist: "tolist",
    torch.Tensor.numpy: "numpy",
    torch.Tensor.__float__: "float",
    torch.Tensor.__int__: "int",
    torch.Tensor.__bool__: "bool",
    torch.Tensor.__index__: "index",
}


@dataclass
class DispatchCounts:
    """Operators (ATen name → calls) and host reads (kind → calls) seen inside :func:`count_dispatch`."""

    ops: Counter = field(default_factory=Counter)
    kernels: Counter = field(default_factory=Counter)  # the operators that are not views (no data moved)
    host_reads: Counter = field(default_factory=Counter)
    excluded_reads: Counter = field(default_factory=Counter)  # reads of the tensors passed as ``exclude``

    @property
    def n_ops(self) -> int:
        return sum(self.ops.values())

    @property
    def n_kernels(self) -> int:
        return sum(self.kernels.values())

    @property
    def n_host_reads(self) -> int:
        return sum(self.host_reads.values())


def _to_host(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``func(*args, **kwargs)`` copies a tensor on another device to the CPU."""
    if not args or not isinstance(args[0], torch.Tensor) or args[0].device.type == "cpu":
        return False
    if func is torch.Tensor.cpu:
        return True
    if func is torch.Tensor.to:
        target = kwargs.get("device", args[1] if len(args) > 1 else None)
        return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"
    return False


class _Reads(TorchFunctionMode):
    def __init__(self, counts: DispatchCounts, exclude: frozenset[int]) -> None:
        super().__init__()
        self.counts = counts
        self.exclude = exclude

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        kind = _READS.get(func)
        if kind is not None and args and id(args[0]) in self.exclude:
            self.counts.excluded_reads[kind] += 1
        elif kind is not None:
            self.counts.host_reads[kind] += 1
        elif _to_host(func, args, kwargs):
            self.counts.host_reads["to_cpu"] += 1
        return func(*args, **kwargs)


class _Ops(TorchDispatchMode):
    def __init__(self, counts: DispatchCounts) -> None:
        super().__init__()
        self.counts = counts

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket.__name__)
        self.counts.ops[name] += 1
        if not getattr(func, "is_view", False):
            self.counts.kernels[name] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def count_dispatch(exclude: Iterable[torch.Tensor] = ()) -> Iterator[DispatchCounts]:
    """Count the operators and host reads of the code inside the ``with`` block (module docstring).

    ``exclude``: tensors whose reads are counted apart (``excluded_reads``) — those that stay on the CPU
    on every device, such as the step counters of a (non-capturable, non-fused) ``torch.optim.Adam``
    (:func:`optimizer_step_counters`)."""
    counts = DispatchCounts()
    with _Reads(counts, frozenset(id(t) for t in exclude)), _Ops(counts):
        yield counts


def optimizer_step_counters(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The per-parameter ``step`` tensors of ``optimizer``'s state (CPU scalars unless it is capturable
    or fused): reading them is not a device synchronisation."""
    return [st["step"] for st in optimizer.state.values() if isinstance(st.get("step"), torch.Tensor)]
