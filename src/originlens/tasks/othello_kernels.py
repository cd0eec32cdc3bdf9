"""Compiled (numba) per-game Othello kernel behind :func:`~originlens.tasks.othello.generate_games` and
:func:`~originlens.tasks.othello.replay`.

The vectorised numpy engine of :mod:`.othello` pays numpy's per-call overhead about 150 times per move
(shifts and masks over arrays of games), which dominates below a few thousand games, and evaluates the
feature types on padded (n, K) arrays.  This kernel plays one game at a time on two scalar uint64
bitboards (own, opponent) with shift-and-mask fills (runs of up to 6 stones found in 4 steps), the same
move rule (the ⌊u·c⌋-th legal cell in increasing cell order) and the same feature-type definition, and
writes the per-move fields straight into the output arrays; the loops over the 64 cells (legal sets,
feature types) carry no state from cell to cell, so LLVM compiles them to vector code.  Its results are
bit-identical to the numpy engine's (tested on several seeds and sizes in
``tests/tasks/test_othello_kernels.py``).

Arrays (n games, L moves):

* ``moves`` (n, L) int64 — written when drawing (``draw``), else read and checked;
* ``u`` (n, L) float64 uniforms (read only when drawing);
* ``boards`` (n, L, 8) uint64: a ``.view(np.uint64)`` of the (n, L, 64) int8 boards (C-contiguous);
  ``legal`` (n, L, 65) bool, ``types`` (n, L, 64) uint8 (written only with
  ``with_types``; pass any uint8 (·, ·, 64) array otherwise);
* ``with_fields=False`` writes neither boards, legal sets nor types (only the moves: pass empty arrays);
* ``err_t`` (n,) int64 — the move index of a game's first illegal or out-of-range move when checking
  (that game stops there; its later fields are left unwritten), else −1.

Caveats: numba promotes mixed uint64/int64 arithmetic to float64, so every constant and shift amount
below is a ``np.uint64``.  Compiled with ``cache=True`` (the first call in a fresh environment compiles,
a few seconds, then cached); serial and single-threaded (no numba threading layer is started, so torch's
thread settings are untouched).
"""

from __future__ import annotations

import numba
import numpy as np

_ONE = np.uint64(1)
_ZERO = np.uint64(0)
_INNER = np.uint64(0x7E7E7E7E7E7E7E7E)  # files b..g
_BLACK_START = np.uint64((1 << 35) | (1 << 28))  # d5, e4
_WHITE_START = np.uint64((1 << 27) | (1 << 36))  # d4, e5
_S1, _S7, _S8, _S9 = np.uint64(1), np.uint64(7), np.uint64(8), np.uint64(9)
_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)
_S56 = np.uint64(56)
_BYTE = np.uint64(0xFF)
PASS = 64
# _SPREAD[b, j] = bit j of byte b; _SPREAD64[b]: those 8 bytes as one native uint64 word (stored through
# a uint64 view of the int8 boards, byte j lands on cell 8k + j whatever the host's byte order)
_SPREAD = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(np.uint8)
_SPREAD64 = _SPREAD.view(np.uint64)[:, 0].copy()


@numba.njit(cache=True, inline="always")
def _popcount(x):  # pragma: no cover - compiled
    x = x - ((x >> _S1) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return (x * _H01) >> _S56


@numba.njit(cache=True, inline="always")
def _run_left(own, o, k):  # pragma: no cover - compiled
    """Stones of ``o`` reached from ``own`` by an unbroken run along shift k (≤ 6 long): two single
    steps, then two double steps through pairs of ``o`` (runs of 2, 4, then 6)."""
    x = (own << k) & o
    x |= (x << k) & o
    pair = o & (o << k)
    k2 = k + k
    x |= (x << k2) & pair
    x |= (x << k2) & pair
    return x


@numba.njit(cache=True, inline="always")
def _run_right(own, o, k):  # pragma: no cover - compiled
    x = (own >> k) & o
    x |= (x >> k) & o
    pair = o & (o >> k)
    k2 = k + k
    x |= (x >> k2) & pair
    x |= (x >> k2) & pair
    return x


@numba.njit(cache=True, inline="always")
def legal_moves(own, opp):  # pragma: no cover - compiled
    """Legal-cell bitboard of the player owning ``own`` (scalar uint64), as ``othello.legal_bitboard``."""
    empty = ~(own | opp)
    oi = opp & _INNER
    m = (_run_left(own, oi, _S1) << _S1) | (_run_right(own, oi, _S1) >> _S1)
    m |= (_run_left(own, opp, _S8) << _S8) | (_run_right(own, opp, _S8) >> _S8)
    m |= (_run_left(own, oi, _S9) << _S9) | (_run_right(own, oi, _S9) >> _S9)
    m |= (_run_left(own, oi, _S7) << _S7) | (_run_right(own, oi, _S7) >> _S7)
    return m & empty


@numba.njit(cache=True)
def flipped(own, opp, bit):  # pragma: no cover - compiled
    """Opponent stones flipped by playing the cell ``bit`` (scalar uint64), as ``othello.flips``."""
    oi = opp & _INNER
    f = _ZERO
    x = _run_left(bit, oi, _S1)
    if (x << _S1) & own:
        f |= x
    x = _run_right(bit, oi, _S1)
    if (x >> _S1) & own:
        f |= x
    x = _run_left(bit, opp, _S8)
    if (x << _S8) & own:
        f |= x
    x = _run_right(bit, opp, _S8)
    if (x >> _S8) & own:
        f |= x
    x = _run_left(bit, oi, _S9)
    if (x << _S9) & own:
        f |= x
    x = _run_right(bit, oi, _S9)
    if (x >> _S9) & own:
        f |= x
    x = _run_left(bit, oi, _S7)
    if (x << _S7) & own:
        f |= x
    x = _run_right(bit, oi, _S7)
    if (x >> _S7) & own:
        f |= x
    return f


@numba.njit(cache=True, inline="always")
def _kth_cell(bb, u):  # pragma: no cover - compiled
    """Cell of the ⌊u·c⌋-th lowest set bit of ``bb`` (c = popcount; clipped to c − 1), as ``_kth_bit``."""
    cnt = np.int64(_popcount(bb))
    k = np.int64(np.floor(u * cnt))
    if k > cnt - 1:
        k = cnt - 1
    x = bb
    for _ in range(k):
        x &= x - _ONE
    low = x & (~x + _ONE)
    return np.int64(_popcount(low - _ONE))


@numba.njit(cache=True, nogil=True)
def play_games(moves, u, draw, boards, legal, types, with_fields, with_types, err_t):  # pragma: no cover - compiled
    """Play every game (see the module docstring for the arrays); returns the number of games with an
    illegal move (always 0 when drawing)."""
    n, length = moves.shape
    n_bad = 0
    for g in range(n):
        err_t[g] = -1
        own = _BLACK_START
        opp = _WHITE_START
        lg = legal_moves(own, opp)
        for t in range(length):
            if draw:
                mv = PASS if lg == _ZERO else _kth_cell(lg, u[g, t])
                moves[g, t] = mv
            else:
                mv = moves[g, t]
                ok = False
                if mv == PASS:
                    ok = lg == _ZERO
                elif 0 <= mv < PASS:
                    ok = ((lg >> np.uint64(mv)) & _ONE) != _ZERO
                if not ok:
                    err_t[g] = t
                    n_bad += 1
                    break
            if mv == PASS:
                own, opp = opp, own
            else:
                bit = _ONE << np.uint64(mv)
                f = flipped(own, opp, bit)
                own, opp = opp & ~f, own | bit | f  # next player's perspective
            lg = legal_moves(own, opp)
            if not with_fields:
                continue
            for k in range(8):  # 8 cells at a time; a board byte is 1 (own), 0xFF (−1, opponent) or 0
                sh = np.uint64(8 * k)
                ob, pb = (own >> sh) & _BYTE, (opp >> sh) & _BYTE
                boards[g, t, k] = _SPREAD64[ob] | (_SPREAD64[pb] * _BYTE)
            for c in range(64):  # no loop-carried state: compiled to vector shifts
                legal[g, t, c] = ((lg >> np.uint64(c)) & _ONE) != _ZERO
            legal[g, t, 64] = lg == _ZERO
            if with_types:
                occ = own | opp
                for c in range(64):  # branch-free (an empty cell toggles nothing): compiled to vector code
                    cu = np.uint64(c)
                    tog = (_ONE << cu) & occ
                    ch = legal_moves(own ^ tog, opp ^ tog) != lg
                    types[g, t, c] = np.uint8((occ >> cu) & _ONE) * (np.uint8(1) + np.uint8(ch))
    return n_bad
