"""Compiled (numba) kernels for the O(N·T²) parts of the corpus statistics.

Both kernels walk every (target position t, prefix position j ≤ t) pair of every sequence once, but
organise the work so that the V×V accumulator row being written (and the row of G being read) stays in
cache: the row index is fixed by t, only the column varies with j.  Work is split into a fixed number of
*partitions* by the accumulator row (``row % n_parts``), so each partition writes disjoint rows and
results are bit-identical whatever the number of threads.

Thread settings: numba's OpenMP threading layer resets the process's OpenMP thread count when it first
starts (to ``NUMBA_NUM_THREADS``), which silently undid ``torch.set_num_threads`` (e.g. ``--threads 1``) for
everything torch ran afterwards — and made the first training in a process use another thread count than
later ones.  The public kernels below restore torch's setting after every call.

Token arrays are already remapped to the kept token set (``-1`` = outside the set) and ``valid`` marks
the counted (input position, target) pairs.
"""

from __future__ import annotations

import sys

import numba
import numpy as np

N_PARTS = 8  # fixed partition count: results do not depend on the thread count


@numba.njit(parallel=True, cache=True, nogil=True)
def _context_kernel(x, y, valid, w, context_raw, prefix_raw_parts):  # pragma: no cover - compiled
    """Accumulate F[a, b] += w_t [y_t = a] #{m ≤ t : x_m = b} and prefix[b] += w_t #{m ≤ t: x_m = b}.

    x, y: (n, T) int32 remapped inputs / targets; valid: (n, T) bool; w: (T,) float64 = 1/(t+1);
    context_raw: (K, K) float64 (in/out); prefix_raw_parts: (N_PARTS, K) float64 (in/out).
    """
    n, T = x.shape
    for part in numba.prange(N_PARTS):
        pre = prefix_raw_parts[part]
        for s in range(n):
            for t in range(T):
                if not valid[s, t]:
                    continue
                a = y[s, t]
                owner = a % N_PARTS if a >= 0 else s % N_PARTS
                if owner != part:
                    continue
                wt = w[t]
                if a >= 0:
                    row = context_raw[a]
                    for m in range(t + 1):
                        b = x[s, m]
                        if b >= 0:
                            row[b] += wt
                            pre[b] += wt
                else:
                    for m in range(t + 1):
                        b = x[s, m]
                        if b >= 0:
                            pre[b] += wt


@numba.njit(parallel=True, cache=True, nogil=True)
def _query_key_kernel(x, y, valid, w, G, g_sub, qk_raw, delta_parts, row0, with_delta):  # pragma: no cover
    """Accumulate Q̄_raw[x_t, x_j] += Q_n[t, j] and Δ_raw[t − j] += Q_n[t, j] (:mod:`.corpus`).

    M[t, j] = G[y_t, x_j]·[y_t kept] − g_sub[x_j] for kept x_j, else 0;
    Q_n[t, j] = M[t, j]/(t+1) − (Σ_{m≤t} M[t, m])/(t+1)²  for j ≤ t.
    G: (K, K) float (next token × prefix token); g_sub: (K,) = c·Σ_a G[a, :];
    qk_raw: (R, K) float64 (in/out), rows row0..row0+R−1 of Q̄_raw (R = K, row0 = 0: all of it);
    delta_parts: (N_PARTS, T) float64 (in/out), accumulated only when ``with_delta``.  Positions whose
    query token lies outside the row block are skipped unless ``with_delta``, so a row-blocked run
    (one call per block, ``with_delta`` in one of them) adds every term once and in the same order.
    """
    n, T = x.shape
    row1 = row0 + qk_raw.shape[0]
    for part in numba.prange(N_PARTS):
        dl = delta_parts[part]
        for s in range(n):
            for t in range(T):
                if not valid[s, t]:
                    continue
                q = x[s, t]
                owner = q % N_PARTS if q >= 0 else s % N_PARTS
                if owner != part:
                    continue
                inside = q >= row0 and q < row1 and q >= 0
                if not inside and not with_delta:
                    continue
                a = y[s, t]
                wt = w[t]
                # pass 1: row sum r_t of M over the prefix
                r = 0.0
                if a >= 0:
                    grow = G[a]
                    for j in range(t + 1):
                        b = x[s, j]
                        if b >= 0:
                            r += grow[b] - g_sub[b]
                else:
                    for j in range(t + 1):
                        b = x[s, j]
                        if b >= 0:
                            r -= g_sub[b]
                corr = r * wt * wt
                # pass 2: centred, normalised entries
                if inside:
                    qrow = qk_raw[q - row0]
                    for j in range(t + 1):
                        b = x[s, j]
                        if b >= 0:
                            m = (G[a, b] if a >= 0 else 0.0) - g_sub[b]
                            v = m * wt - corr
                            qrow[b] += v
                        else:
                            v = -corr
                        if with_delta:
                            dl[t - j] += v
                else:
                    for j in range(t + 1):
                        b = x[s, j]
                        if b >= 0:
                            m = (G[a, b] if a >= 0 else 0.0) - g_sub[b]
                            v = m * wt - corr
                        else:
                            v = -corr
                        dl[t - j] += v


def partitions() -> int:
    return N_PARTS


def empty_parts(width: int) -> np.ndarray:
    return np.zeros((N_PARTS, width), dtype=np.float64)


def _keep_torch_threads(kernel):
    """Run ``kernel`` and put torch's intra-op thread count back if numba changed it (see the docstring)."""

    def call(*args):
        torch = sys.modules.get("torch")
        n = torch.get_num_threads() if torch is not None else None
        try:
            return kernel(*args)
        finally:
            if torch is not None and torch.get_num_threads() != n:
                torch.set_num_threads(n)

    call.__name__ = kernel.__name__.lstrip("_")
    call.__doc__ = kernel.__doc__
    return call


context_kernel = _keep_torch_threads(_context_kernel)
query_key_kernel = _keep_torch_threads(_query_key_kernel)
