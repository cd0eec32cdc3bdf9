"""Where the project finds shared data.

One configurable data root: the environment variable ``ORIGINLENS_DATA`` if set, otherwise
``../shared/data`` relative to the project checkout (falling back to the current directory's
``../shared/data``).  Tests and benchmarks use :func:`data_path` so users can point everything at their
own copies of TinyStories or the ``stories260K`` model.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InputError

ENV_VAR = "ORIGINLENS_DATA"


def data_root() -> Path:
    """The data root directory (may not exist; see :func:`data_path`)."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    here = Path(__file__).resolve()
    # src/originlens/paths.py -> checkout root is parents[2]
    for base in (here.parents[2], Path.cwd()):
        cand = base.parent / "shared" / "data"
        if cand.is_dir():
            return cand
    return here.parents[2].parent / "shared" / "data"


def data_path(*parts: str, required: bool = True) -> Path:
    """Path under the data root; raises a clear error when ``required`` and missing."""
    p = data_root().joinpath(*parts)
    if required and not p.exists():
        raise InputError(
            f"data file {p} not found",
            f"set {ENV_VAR} to the directory holding tinystories/ and models/ (default ../shared/data)",
        )
    return p


def tinystories_files() -> list[Path]:
    """The TinyStories text files of the data root, sorted (empty list if absent)."""
    d = data_root() / "tinystories"
    return sorted(d.glob("stories-*.txt")) if d.is_dir() else []
