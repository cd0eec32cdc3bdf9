"""The portable pass of the suite (``make test-portable``, run by ``.ci/run`` after ``make test``) really
runs on torch's scalar kernels and one thread per test process, so that the tolerances of the numerical
packages are tried against another summation order than this CPU's vectorised one."""

from __future__ import annotations

import os

import pytest
import torch

from tolerances import reduction_rtol


def test_the_requested_cpu_kernels_are_the_ones_torch_uses():
    want = os.environ.get("ATEN_CPU_CAPABILITY")
    if not want:
        pytest.skip("ATEN_CPU_CAPABILITY is not set (the portable pass, make test-portable, sets it)")
    assert torch.backends.cpu.get_cpu_capability().lower() == want.lower()
    assert torch.get_num_threads() == 1  # tests/conftest.py: one torch thread per test process


def test_the_tolerance_rule_is_the_summation_bound():
    """2·safety·γ_n with γ_n = n·u/(1 − n·u): float64 over 1,000 terms ≈ 8.9e-13 at safety 4, float32 ≈ 4.8e-4;
    and a real change of summation order stays inside it (float32, 100,000 terms, two orders)."""
    u64 = 2.0**-53
    assert reduction_rtol(torch.float64, 1000) == pytest.approx(8 * 1000 * u64 / (1 - 1000 * u64), rel=1e-12)
    assert reduction_rtol("float32", 1000) == pytest.approx(8 * 1000 * 2.0**-24 / (1 - 1000 * 2.0**-24), rel=1e-12)
    x = torch.rand(100_000, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    forward = x.cumsum(0)[-1]
    pairwise = x.view(100, 1000).sum(1).sum()
    assert float(abs(forward - pairwise)) <= reduction_rtol(torch.float32, x.numel()) * float(x.sum())
    with pytest.raises(ValueError):
        reduction_rtol(torch.float32, 0)
