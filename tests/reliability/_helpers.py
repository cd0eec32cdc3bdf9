"""Helpers shared by the reliability tests: running the CLI in a subprocess (optionally killed at a chosen
point by ``_killpoint.py``), comparing safetensors files bytewise, normalising JSON records."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
KILLPOINT = HERE / "_killpoint.py"
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


COMMAND_MODULE = {
    "corpus": "originlens.cli.corpus_cmd",
    "stats": "originlens.cli.stats_cmd",
    "ntp": "originlens.cli.ntp_cmd",
    "assoc": "originlens.cli.assoc_cmd",
}


def run_cli(args: Iterable[Any], *, kill: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """``python -m originlens -q ARGS`` in a fresh process; with ``kill``, through _killpoint.py."""
    args = ["-q", *map(str, args)]
    if kill and args[1] in COMMAND_MODULE:
        kill = {**kill, "modules": [COMMAND_MODULE[args[1]]]}
    cmd = (
        [sys.executable, str(KILLPOINT), json.dumps(kill), "--", *args]
        if kill
        else [sys.executable, "-m", "originlens", *args]
    )
    return subprocess.run(cmd, env=SUBPROCESS_ENV, capture_output=True, text=True, timeout=timeout)


def assert_killed(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == -signal.SIGKILL, f"expected SIGKILL, got rc {p.returncode}\n{p.stdout}\n{p.stderr}"


def assert_ok(p: subprocess.CompletedProcess) -> None:
    assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr}"


def tensors(path: str | Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


def assert_same_tensors(a: str | Path, b: str | Path, ignore: frozenset[str] = frozenset()) -> None:
    """Same keys, dtypes, shapes and bytes (bit-identical) of every tensor (except those named in ``ignore``;
    no caller needs that: every tensor originlens writes is a function of the seeds and inputs)."""
    ta, tb = tensors(a), tensors(b)
    assert sorted(ta) == sorted(tb), (a, b)
    for k in ta:
        if k in ignore:
            continue
        assert ta[k].dtype == tb[k].dtype and ta[k].shape == tb[k].shape, (k, a, b)
        assert ta[k].tobytes() == tb[k].tobytes(), f"tensor {k} differs between {a} and {b}"


# Fields that legitimately differ between two otherwise identical runs (wall-clock times).
NONDETERMINISTIC_KEYS = frozenset(
    {"time", "seconds", "wall_seconds", "train_seconds", "build_seconds", "elapsed", "timestamp", "created", "duration"}
)


def normalise(obj: Any, roots: dict[str, str] | None = None) -> Any:
    """Drop :data:`NONDETERMINISTIC_KEYS` and replace the output roots in strings by placeholders."""
    if isinstance(obj, dict):
        return {k: normalise(v, roots) for k, v in obj.items() if k not in NONDETERMINISTIC_KEYS}
    if isinstance(obj, list):
        return [normalise(v, roots) for v in obj]
    if isinstance(obj, str) and roots:
        for real, placeholder in sorted(roots.items(), key=lambda kv: -len(kv[0])):
            obj = obj.replace(real, placeholder)
    return obj


def jsonl(path: str | Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text(encoding="utf-8").splitlines() if ln.strip()]
