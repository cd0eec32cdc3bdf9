"""The one rule for numerical tolerances in the tests.

Two computations of the same quantity that differ only in the order of their floating-point reductions
(another CPU's kernels, another thread count, another batch size or blocking) agree to within the
worst-case bound of recursive summation: a sum of ``n`` terms carries an error of at most
``γ_n · Σ|x_i|`` with ``γ_n = n·u / (1 − n·u)`` and ``u`` the unit round-off (half the machine epsilon) of
the dtype it is accumulated in.  The tests compare two such computations, so the bound doubles.  When
nothing cancels (``Σ|x_i| = |Σ x_i|``), that is a relative tolerance; where a quantity is a chain of
reductions (a matrix product inside a softmax inside a mean) the lengths add.

:func:`reduction_rtol` is that bound, times a safety factor for the non-associative steps between
reductions (``exp``, ``log``, divisions: a few ulps each).  Tests whose values pass through float32
kernels use ``dtype=torch.float32`` even where they accumulate in float64, because the float32 rounding is
the one that differs between kernels.
"""

from __future__ import annotations

import numpy as np

__all__ = ["reduction_rtol"]


def reduction_rtol(dtype, n: int, *, safety: float = 4.0) -> float:
    """Relative tolerance between two reduction orders of ``n`` terms in ``dtype`` (numpy or torch dtype,
    or its name): ``safety · 2 · γ_n``, γ_n = n·u/(1 − n·u), u = eps/2 (see the module docstring)."""
    name = str(dtype).replace("torch.", "")
    eps = float(np.finfo(np.dtype(name)).eps)
    if n < 1:
        raise ValueError(f"a reduction has at least one term, got n={n}")
    u = eps / 2
    gamma = n * u / (1 - n * u)
    return safety * 2 * gamma
