"""Results files: a result is a file.

Every experiment command ends by writing one small JSON file, ``results/<experiment>/<name>.json``,
that holds everything a reader needs to trust and re-derive its numbers::

    {"format": "originlens-results/1",
     "experiment": "toy-grid", "name": "cond-majority",
     "command": "originlens ntp experiment grid --task cond-majority ...",   # exactly what ran
     "created": "2026-12-02T06:10:00+00:00",
     "git_commit": "<sha>" (+ "+dirty" when the checkout had uncommitted changes),
     "versions": {"originlens": ..., "torch": ..., ...}, "machine": {"cpus": 2, "platform": ...},
     "config": {...}, "seeds": [...], "scale": {"summary": ..., "deviations": [...]},
     "data_hashes": {...},
     "quality": {...},          # the models' own quality (loss, task accuracy) with CIs over seeds
     "numbers": {...},          # the experiment's measurements with CIs over seeds
     "tests": {...},            # the paper's claims tested as hypotheses (p-values, power)
     "runs": [...]}             # one entry per trained run (seed, regime, per-run values, wall time)

The docs tables (README's reproduction status, ``docs/results.md``) are generated from these files
by :mod:`originlens.experiments.render`; a test checks that the committed docs equal what the
committed files generate.  Run directories (checkpoints, metrics) are not results files: they are
large and stay out of the repository.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..locks import holding_path
from ..runs import git_commit, package_versions, to_jsonable
from ..storage import atomic_write_json, read_json

FORMAT = "originlens-results/1"
REQUIRED = (
    "format",
    "experiment",
    "name",
    "command",
    "created",
    "git_commit",
    "versions",
    "config",
    "seeds",
    "scale",
    "numbers",
)


def default_results_path(experiment: str, name: str, root: str | os.PathLike = "results") -> Path:
    """``ROOT/<experiment>/<name>.json`` (ROOT relative to the working directory by default)."""
    return Path(root) / experiment / f"{name}.json"


def command_line(argv: list[str] | None = None, cwd: str | os.PathLike | None = None) -> str:
    """The command as typed: ``originlens`` + the CLI arguments (``sys.argv[1:]`` by default).

    Results files are committed, so no argument names the machine it ran on: an absolute path inside the
    working directory is written relative to it, one outside as ``<elsewhere>/`` + its last component
    (``--out=/x/y`` alike)."""
    args = sys.argv[1:] if argv is None else argv
    here = Path(cwd if cwd is not None else os.getcwd()).resolve()
    return "originlens " + shlex.join(_portable_argument(a, here) for a in args)


def _portable_argument(arg: str, here: Path) -> str:
    prefix, sep, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
    if not os.path.isabs(value):
        return arg
    path = Path(os.path.normpath(value))
    try:
        shown = path.relative_to(here).as_posix() or "."
    except ValueError:
        shown = "<elsewhere>/" + (path.name or "")
    return prefix + sep + shown


def provenance() -> dict[str, Any]:
    """Creation time, git commit, package versions and machine facts of this process."""
    return {
        "created": _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat(),
        "git_commit": git_commit(),
        "versions": package_versions(),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
    }


def write_results(
    path: str | os.PathLike,
    *,
    experiment: str,
    name: str,
    command: str,
    config: Any,
    seeds: list[int],
    scale: dict[str, Any],
    numbers: dict[str, Any],
    data_hashes: dict[str, Any] | None = None,
    quality: dict[str, Any] | None = None,
    tests: dict[str, Any] | None = None,
    runs: list[dict[str, Any]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write a results file atomically (see the module docstring for the layout); returns its path."""
    record = {
        "format": FORMAT,
        "experiment": experiment,
        "name": name,
        "command": command,
        **provenance(),
        "config": to_jsonable(config),
        "seeds": [int(s) for s in seeds],
        "scale": to_jsonable(scale),
        "data_hashes": to_jsonable(data_hashes or {}),
        "quality": to_jsonable(quality or {}),
        "numbers": to_jsonable(numbers),
        "tests": to_jsonable(tests or {}),
        "runs": to_jsonable(runs or []),
        **to_jsonable(extra or {}),
    }
    with holding_path(path):  # a second writer of the same file is refused, never interleaved
        return atomic_write_json(path, record)


def read_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read and check one results file (missing keys or another format: :class:`InputError`)."""
    rec = read_json(path)
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise InputError(
            f"{path} is not an originlens results file (format {FORMAT})",
            "regenerate it with the experiment command that writes it",
        )
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}", "regenerate it with its experiment command")
    return rec


def load_all(root: str | os.PathLike = "results") -> dict[str, dict[str, Any]]:
    """Every results file under ``root``, keyed ``"<experiment>/<name>"`` (sorted)."""
    root = Path(root)
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(root.glob("*/*.json")) if root.is_dir() else ():
        out[f"{p.parent.name}/{p.stem}"] = read_results(p)
    return out
