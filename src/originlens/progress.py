"""Progress bars that stay quiet where nobody watches.

``progress(iterable, ...)`` wraps tqdm (``tqdm.auto``: widgets in a notebook); bars are shown on an
interactive terminal or in a Jupyter kernel and hidden in CI or when output is not a TTY, unless forced
with :func:`set_verbosity`.  The CLI's ``--quiet``/``--verbose``
flags call :func:`set_verbosity`.

Where the bar is hidden only because nobody is at a terminal (a log file, ``nohup``, a batch job) and
quiet was not asked for, ``progress`` prints a plain **heartbeat** line instead at most every
``ORIGINLENS_HEARTBEAT`` seconds (default 30; ``0`` turns it off): the description, ``n/total``, the
rate, the time left and the last ``set_postfix`` values, so a long job in a log is never silent.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tqdm.auto import tqdm

T = TypeVar("T")
_VERBOSITY: int | None = None  # None = automatic, 0 = quiet, 1 = normal, 2 = verbose


def set_verbosity(level: int | None) -> None:
    """0 quiet, 1 normal (bars), 2 verbose; None restores TTY detection."""
    global _VERBOSITY
    _VERBOSITY = level


def in_notebook() -> bool:
    """True inside a Jupyter (ipykernel) kernel, whose stderr is no TTY but shows tqdm widgets.  Looks at
    an IPython that is already imported, never imports it."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None) if ipython is not None else None
    shell = get() if callable(get) else None
    return shell is not None and getattr(shell, "kernel", None) is not None


def verbosity() -> int:
    if _VERBOSITY is not None:
        return _VERBOSITY
    if os.environ.get("CI") or not (sys.stderr.isatty() or in_notebook()):
        return 0
    return 1


def heartbeat_seconds() -> float:
    """Seconds between heartbeat lines (``ORIGINLENS_HEARTBEAT``, default 30; ≤ 0 disables)."""
    try:
        return float(os.environ.get("ORIGINLENS_HEARTBEAT", "30"))
    except ValueError:
        return 30.0


class Heartbeat:
    """The bar's stand-in without a terminal: the methods of tqdm that the package uses (``update``,
    ``set_postfix``, ``close``, iteration), printing one line to stderr at most every ``every`` seconds."""

    def __init__(
        self,
        iterable: Iterable[Any] | None,
        *,
        total: int | None,
        desc: str,
        unit: str,
        initial: int = 0,
        every: float = 30.0,
        clock=time.monotonic,
    ) -> None:
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)  # type: ignore[arg-type]
        self.n, self.every, self._clock = int(initial), float(every), clock
        self._start_n, self._t0 = self.n, clock()
        self._last = self._t0
        self.postfix: dict[str, Any] = {}

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable or ():
            yield item
            self.update(1)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self._clock()
        if now - self._last >= self.every:
            self._last = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float | None = None) -> str:
        now = self._clock() if now is None else now
        done, secs = self.n - self._start_n, max(now - self._t0, 1e-9)
        rate = done / secs
        parts = [f"{self.desc or 'progress'}: {self.n}" + (f"/{self.total}" if self.total else "") + f" {self.unit}"]
        parts.append(f"{rate:.3g} {self.unit}/s" if rate >= 1 else f"{1 / rate:.3g} s/{self.unit}" if rate else "…")
        if self.total and rate:
            parts.append(f"{_duration((self.total - self.n) / rate)} left")
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        return ", ".join(parts)

    def set_postfix(self, **kw: Any) -> None:
        self.postfix = dict(kw)

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self) -> None:
        pass

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def progress(
    iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "", unit: str = "it", **kw
) -> Iterator[T] | tqdm | Heartbeat:
    """A tqdm bar with rate and ETA on a terminal; without one (and not asked to be quiet) a
    :class:`Heartbeat`; nothing when quiet."""
    if verbosity() < 1 and _VERBOSITY is None and heartbeat_seconds() > 0:
        return Heartbeat(
            iterable, total=total, desc=desc, unit=unit, initial=int(kw.get("initial", 0)), every=heartbeat_seconds()
        )
    from tqdm.auto import tqdm  # imported on first use: the CLI's start-up stays light

    return tqdm(
        iterable, total=total, desc=desc, unit=unit, disable=verbosity() < 1, dynamic_ncols=True, leave=False, **kw
    )


def log(msg: str, level: int = 1) -> None:
    """Print a status line to stderr when verbosity allows (level 1 = normal, 2 = verbose)."""
    v = _VERBOSITY if _VERBOSITY is not None else 1
    if v >= level:
        print(msg, file=sys.stderr, flush=True)
