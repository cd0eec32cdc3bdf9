"""The compiled Othello kernel (originlens.tasks.othello_kernels) against the vectorised numpy engine of
originlens.tasks.othello, which stays as the reference (``_run(..., compiled=False)``): same games, boards,
legal sets and feature types from the same uniforms, same replay results and error messages."""

from __future__ import annotations

import re

import numpy as np
import pytest

from originlens.errors import InputError
from originlens.tasks.othello import (
    N_MOVES,
    PASS,
    _run,
    flips,
    generate_games,
    generate_moves,
    legal_bitboard,
    replay,
)
from originlens.tasks.othello_kernels import flipped, legal_moves

FIELDS = ("moves", "boards", "legal", "feature_types")


def _both(moves: np.ndarray, u: np.ndarray | None, types: bool, chunk: int = 1024):
    a = _run(moves.copy(), u, types, chunk)
    b = _run(moves.copy(), u, types, chunk, compiled=False)
    return a, b


def _assert_same(a, b) -> None:
    for name in FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if y is None:
            assert x is None, name
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.mark.parametrize(
    "n, seed, types", [(1, 0, True), (64, 1, True), (257, 2, True), (300, 3, False), (2000, 4, False), (0, 5, True)]
)
def test_generated_games_identical_to_numpy_engine(n, seed, types):
    u = np.random.default_rng(seed).random((n, N_MOVES))
    a, b = _both(np.empty((n, N_MOVES), dtype=np.int64), u, types, chunk=97)
    _assert_same(a, b)
    if n:  # the public entry point uses the kernel and consumes the same uniforms
        _assert_same(generate_games(n, seed, feature_types=types), b)


def test_generator_seed_consumption_unchanged():
    rng = np.random.default_rng(7)
    first = generate_games(30, rng, feature_types=False)
    second = generate_games(30, rng, feature_types=False)
    ref = np.random.default_rng(7)
    u1, u2 = ref.random((30, N_MOVES)), ref.random((30, N_MOVES))
    for games, u in ((first, u1), (second, u2)):
        _assert_same(games, _run(np.empty((30, N_MOVES), dtype=np.int64), u, False, 1024, compiled=False))


@pytest.mark.parametrize("n, seed", [(0, 1), (1, 2), (700, 3)])
def test_generate_moves_are_the_games_moves(n, seed):
    moves = generate_moves(n, np.random.default_rng([seed, 11, 0]))
    assert moves.dtype == np.int64 and moves.shape == (n, N_MOVES)
    u = np.random.default_rng([seed, 11, 0]).random((n, N_MOVES))
    np.testing.assert_array_equal(moves, _run(np.empty((n, N_MOVES), np.int64), u, False, 1024, compiled=False).moves)


@pytest.mark.parametrize("length", [0, 1, 13, 60])
def test_replay_identical_to_numpy_engine(length):
    moves = generate_games(150, 8, feature_types=False).moves[:, :length]
    a, b = _both(moves.astype(np.int64), None, True, chunk=33)
    _assert_same(a, b)
    _assert_same(replay(moves), b)


def test_passes_and_finished_games_identical():
    games = generate_games(4000, 12, feature_types=False)
    has_pass = (games.moves == PASS).any(axis=1)
    assert has_pass.sum() > 10  # finished games and mid-game passes are in the sample
    a, b = _both(games.moves[has_pass], None, True)
    _assert_same(a, b)


def _error(moves: np.ndarray, compiled: bool) -> str:
    with pytest.raises(InputError) as exc:
        _run(moves.copy(), None, False, 1024, compiled=compiled)
    return str(exc.value)


def test_replay_errors_identical_to_numpy_engine():
    moves = generate_games(12, 2, feature_types=False).moves
    rng = np.random.default_rng(0)
    cases = []
    for g, t, v in ((3, 17, None), (5, 40, 99), (0, 0, PASS), (11, 59, -1), (7, 9, None)):
        m = moves.copy()
        m[g, t] = v if v is not None else int(rng.integers(0, 64))
        cases.append(m)
    m = moves.copy()  # two bad games: the earliest move wins, then the lowest game
    m[8, 20], m[2, 30], m[9, 20] = 99, 99, 99
    cases.append(m)
    for m in cases:
        msg = _error(m, compiled=True)
        assert msg == _error(m, compiled=False)
        assert re.search(r"game \d+, move \d+", msg)
    assert "game 8, move 20" in _error(cases[-1], compiled=True)


def test_scalar_helpers_equal_array_helpers():
    rng = np.random.default_rng(3)
    cells = rng.integers(0, 3, size=(500, 64))
    own = np.packbits(cells == 1, axis=1, bitorder="little").view("<u8")[:, 0].astype(np.uint64)
    opp = np.packbits(cells == 2, axis=1, bitorder="little").view("<u8")[:, 0].astype(np.uint64)
    want = legal_bitboard(own, opp)
    assert all(legal_moves(own[i], opp[i]) == want[i] for i in range(len(own)))
    for i in range(len(own)):
        for c in np.flatnonzero(cells[i] == 0)[:3]:
            bit = np.uint64(1) << np.uint64(c)
            ref = flips(own[i : i + 1], opp[i : i + 1], np.array([bit], dtype=np.uint64))[0]
            assert flipped(own[i], opp[i], bit) == ref
