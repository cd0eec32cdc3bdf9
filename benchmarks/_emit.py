"""Machine-readable benchmark figures for ``benchmarks/run_all.py``.

A benchmark calls :func:`emit` next to the ratio it prints; when the environment variable
``ORIGINLENS_BENCH_JSON`` names a file, one JSON line per figure is appended to it (otherwise nothing
happens, so the scripts behave as before when run by hand).  Every figure is a speed-up of our path over
the straightforward one measured in the same run, as a ratio of process CPU times where the script
measures them (less sensitive to other processes than wall time), higher is better.
"""

from __future__ import annotations

import json
import os

ENV = "ORIGINLENS_BENCH_JSON"


def emit(name: str, value: float, *, cpu: bool, goal: float | None = None) -> None:
    """Record figure ``name`` (a ratio, higher is better); ``cpu``: a ratio of CPU times (else wall);
    ``goal``: the figure the project aims for (printed beside the floor by run_all)."""
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"name": name, "value": float(value), "cpu": cpu, "goal": goal}) + "\n")
