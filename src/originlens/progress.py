"""Progress bars that stay quiet where nobody watches.

``progress(iterable, ...)`` wraps tqdm; bars are shown on an interactive terminal and hidden in CI or
when output is not a TTY, unless forced with :func:`set_verbosity`.  The CLI's ``--quiet``/``--verbose``
flags call :func:`set_verbosity`.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, Iterator, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
_VERBOSITY: int | None = None  # None = automatic, 0 = quiet, 1 = normal, 2 = verbose


def set_verbosity(level: int | None) -> None:
    """0 quiet, 1 normal (bars), 2 verbose; None restores TTY detection."""
    global _VERBOSITY
    _VERBOSITY = level


def verbosity() -> int:
    if _VERBOSITY is not None:
        return _VERBOSITY
    if os.environ.get("CI") or not sys.stderr.isatty():
        return 0
    return 1


def progress(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "",
             unit: str = "it", **kw) -> Iterator[T] | tqdm:
    """A tqdm bar with rate and ETA, disabled when quiet."""
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=verbosity() < 1,
                dynamic_ncols=True, leave=False, **kw)


def log(msg: str, level: int = 1) -> None:
    """Print a status line to stderr when verbosity allows (level 1 = normal, 2 = verbose)."""
    v = _VERBOSITY if _VERBOSITY is not None else 1
    if v >= level:
        print(msg, file=sys.stderr, flush=True)
