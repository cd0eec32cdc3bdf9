"""Benchmark: vectorised bitboard Othello generator vs a plain-Python engine.

Both compute the same fields for every game (moves, boards from the next player's perspective, legal
sets, feature types by 64 colour flips per position) from the same uniforms, so the plain engine's
games are checked to be identical.  Prints games/s of both and the ratio (target ≥ 100×).

    .venv/bin/python benchmarks/othello.py [--games 2000] [--plain-games 3] [--no-types]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.tasks.othello import generate_games

DIRS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def plain_captures(board, me, c, dr, df):
    r, f = divmod(c, 8)
    run = []
    rr, ff = r + dr, f + df
    while 0 <= rr < 8 and 0 <= ff < 8 and board[8 * rr + ff] == -me:
        run.append(8 * rr + ff)
        rr, ff = rr + dr, ff + df
    if run and 0 <= rr < 8 and 0 <= ff < 8 and board[8 * rr + ff] == me:
        return run
    return []


def plain_legal(board, me):
    return [c for c in range(64) if board[c] == 0 and any(plain_captures(board, me, c, dr, df) for dr, df in DIRS)]


def plain_game(u_row, with_types=True):
    """One game with per-game Python lists: moves, boards, legal (65), feature types."""
    board = [0] * 64
    board[27] = board[36] = -1  # white d4, e5
    board[35] = board[28] = 1  # black d5, e4
    me = 1
    legal = plain_legal(board, me)
    moves, boards, legals, types = [], [], [], []
    for t in range(60):
        if legal:
            mv = legal[min(int(u_row[t] * len(legal)), len(legal) - 1)]
            flips = [x for dr, df in DIRS for x in plain_captures(board, me, mv, dr, df)]
            board = list(board)
            board[mv] = me
            for x in flips:
                board[x] = me
        else:
            mv = 64
        me = -me
        legal = plain_legal(board, me)
        moves.append(mv)
        boards.append([v * me for v in board])
        legals.append([c in legal for c in range(64)] + [not legal])
        if with_types:
            row = []
            for c in range(64):
                if board[c] == 0:
                    row.append(0)
                    continue
                b2 = list(board)
                b2[c] = -b2[c]
                row.append(1 if plain_legal(b2, me) == legal else 2)
            types.append(row)
    return moves, boards, legals, types


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=2000, help="games for the vectorised generator")
    ap.add_argument("--plain-games", type=int, default=3, help="games for the plain engine")
    ap.add_argument("--no-types", action="store_true", help="skip feature types in both")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with_types = not args.no_types

    generate_games(64, args.seed, feature_types=with_types)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    games = generate_games(args.games, args.seed, feature_types=with_types)
    t_vec, c_vec = time.perf_counter() - t0, time.process_time() - c0

    u = np.random.default_rng(args.seed).random((args.games, 60))
    t0, c0 = time.perf_counter(), time.process_time()
    plain = [plain_game(u[g], with_types) for g in range(args.plain_games)]
    t_plain, c_plain = time.perf_counter() - t0, time.process_time() - c0

    for g, (m, b, lg, ty) in enumerate(plain):  # same games, same fields
        assert np.array_equal(games.moves[g], m) and np.array_equal(games.boards[g], b)
        assert np.array_equal(games.legal[g], lg)
        if with_types:
            assert np.array_equal(games.feature_types[g], ty)

    what = "moves+boards+legal" + ("+feature types" if with_types else "")
    print(f"othello generate_games ({what}); wall clock, CPU time in brackets")
    for label, n, wall, cpu in (
        ("vectorised", args.games, t_vec, c_vec),
        ("plain", args.plain_games, t_plain, c_plain),
    ):
        print(f"  {label:10s} : {n:6d} games in {wall:7.3f} s = {n / wall:9.1f} games/s [{n / cpu:9.1f} games/s]")
    ratio = (args.games / t_vec) / (args.plain_games / t_plain)
    ratio_cpu = (args.games / c_vec) / (args.plain_games / c_plain)
    print(f"  speed-up   : {ratio:.0f}x [{ratio_cpu:.0f}x] (target >= 100x); outputs identical")
    emit("othello.generate" + ("" if with_types else ".no_types"), ratio_cpu, cpu=True, goal=500)


if __name__ == "__main__":
    main()
