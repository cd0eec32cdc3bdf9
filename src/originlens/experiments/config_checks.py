"""The checks every experiment's configuration shares: its scale, its overrides of the scale's fields, its
seeds, its job count — one rule and one message each (the experiments' ``*_config`` modules call them).

At the bottom of the experiments: it imports nothing of theirs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import ConfigError


def check_scale(scale: str, scales: Mapping[str, Any]) -> None:
    """``scale`` is one of ``scales``' names."""
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}", f"use one of: {', '.join(scales)}")


def check_overrides(overrides: Mapping[str, Any], allowed: Iterable[str], *, also: str = "") -> None:
    """Every key of ``overrides`` is an ``allowed`` field (``also``: words on what else is accepted)."""
    allowed = list(allowed)
    bad = sorted(set(overrides) - set(allowed))
    if bad:
        raise ConfigError(f"unknown override(s) {bad}", f"use: {', '.join(allowed)}" + (f" ({also})" if also else ""))


def check_seeds(seeds: Iterable[Any]) -> None:
    """At least one seed; distinct non-negative integers (booleans are not seeds)."""
    seeds = list(seeds)
    if (
        not seeds
        or len(set(seeds)) != len(seeds)
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds)
    ):
        raise ConfigError(f"seeds must be distinct non-negative integers, got {seeds!r}", "e.g. seeds=[0, 1, 2]")


def check_jobs(jobs: Any) -> None:
    """A positive integer number of worker processes."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs must be an integer ≥ 1, got {jobs!r}", "e.g. jobs=2")
