"""Fixtures of the reliability tests (helpers live in ``_helpers.py``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def read_only():
    """``read_only(path)`` makes a directory unwritable (chmod; ``chattr +i`` for root); undone at teardown."""
    undo: list = []

    def make(d: Path) -> None:
        d.chmod(0o500)
        undo.append(lambda: d.chmod(0o700))
        if os.geteuid() == 0:
            if (
                not shutil.which("chattr")
                or subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0
            ):
                pytest.skip("root without a working chattr: cannot make a directory read-only")
            undo.append(lambda: subprocess.run(["chattr", "-i", str(d)], capture_output=True))

    yield make
    for fn in reversed(undo):
        fn()
