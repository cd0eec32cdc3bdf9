"""Shared test configuration.

Tests that need the shared data (TinyStories subset, stories260K) skip when it is absent, so the suite
runs anywhere; CI sets ``ORIGINLENS_REQUIRE_DATA=1`` so that missing data is an error, not a silent skip.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """One torch thread per test process: tiny models are far faster that way on a shared 2-core
    machine (pytest-xdist already runs two processes)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("ORIGINLENS_REQUIRE_DATA"):
        from originlens.paths import data_root, tinystories_files

        model = data_root() / "models" / "stories260K" / "stories260K.bin"
        if not tinystories_files() or not model.exists():
            raise pytest.UsageError(
                f"ORIGINLENS_REQUIRE_DATA is set but the shared data is missing under "
                f"{data_root()} (set ORIGINLENS_DATA)"
            )
