"""Stopping a long job cleanly on SIGINT (Ctrl-C) or SIGTERM (``kill``, a batch scheduler's time limit).

* :func:`terminate_as_interrupt` (installed by the CLI for a command's lifetime): SIGTERM raises
  ``KeyboardInterrupt`` like Ctrl-C does, so ``finally`` blocks run, partial outputs stay hidden and locks
  are released, instead of the process dying at once.
* :func:`deferred` (used by the training loops): while active, the first SIGINT or SIGTERM only sets
  ``stop.signal``; the loop finishes the update it is in, writes a checkpoint and raises
  :class:`Interrupted`, which names the checkpoint.  A second signal interrupts at once.

Handlers can only be installed from the main thread; elsewhere both are no-ops (the signal then has its
usual effect).  Caveat: under ``torchrun`` every rank must see the stop at the same update, so the loops
combine ``stop.signal`` over ranks (:func:`originlens.distributed.any_rank`).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}


class Interrupted(KeyboardInterrupt):
    """A training loop stopped by a signal after writing a checkpoint (``message`` says which)."""

    def __init__(self, message: str, signal_name: str = "SIGINT") -> None:
        super().__init__(message)
        self.message = message
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        return EXIT_CODES.get(self.signal_name, 130)


@dataclass
class StopRequest:
    """Set by :func:`deferred`'s handler: the name of the first signal received, or None."""

    signal: str | None = None

    @property
    def requested(self) -> bool:
        return self.signal is not None


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM raises ``KeyboardInterrupt`` while active (the previous handler is restored after)."""
    if not _main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt("SIGTERM")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextmanager
def deferred() -> Iterator[StopRequest]:
    """While active, the first SIGINT/SIGTERM is recorded in the yielded :class:`StopRequest` instead of
    interrupting; a second one raises ``KeyboardInterrupt`` at once."""
    stop = StopRequest()
    if not _main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.requested:
            raise KeyboardInterrupt(signal.Signals(signum).name)
        stop.signal = signal.Signals(signum).name

    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)
