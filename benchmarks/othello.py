"""Benchmark: compiled Othello generator vs a plain-Python per-game engine (and the numpy engine).

All engines compute the same fields for every game (moves, boards from the next player's perspective,
legal sets, feature types by 64 colour flips per position) from the same uniforms, so the plain engine's
games are checked to be identical.  Prints, per size (64, 256, 2,000 games), the median process CPU time
of ``generate_games`` with its spread (min–max over the repeats) beside the median wall time, games/s,
and the CPU speed-up over the plain engine's median per-game CPU time; goal ≥ 500× from 256 games up.
The previous vectorised numpy engine (``_run(..., compiled=False)``, kept as the reference) is timed too.

    .venv/bin/python benchmarks/othello.py [--games 64,256,2000] [--plain-games N] [--no-types] [--pool 500000]

``--pool N`` also times ``originlens.train.ntp.othello_pool(N, seed)``, the trainer's Othello data (moves
only, chunks of 16,384 games), and, with ``--pool-draws STEPS,BATCH`` (default 300,64: ``make demo``'s
Othello run), what a run of that many updates holds instead: the rows it draws (``pool_rows``) and only
those games (``othello_pool(N, seed, rows)``; checked equal to the whole pool's rows), with the ratio.

Profile (cProfile and process CPU time, 2 shared cores, load ≈ 3, 2026-12-04).  Previous numpy engine:
256 games 0.071 s with types / 0.024 s without, 2,000 games 0.47 s / 0.092 s.  With types 64 % (2,000
games) is in ``legal_bitboard`` (242 calls, 20,000 ``_shift`` array ops), then ``_feature_types``'
argsort / take_along_axis padding; without types ``unpack_bits`` (38 %), ``flips``, ``legal_bitboard``
and ``_kth_bit``: ≈ 150 numpy calls per move, each a pass over the whole chunk with a fixed µs overhead,
which is why 64–256 games were slow.  Compiled kernel (``othello_kernels.play_games``, > 98 % of the
time): 256 games 0.0037 s / 0.0017 s, 2,000 games 0.024 s / 0.0089 s.  Without types, per game: ≈ 2.4 µs
in the kernel on buffers already written to (bitboard logic plus writing 7.7 KB of boards and legal
sets), ≈ 0.1 µs drawing the uniforms, and at 256 games ≈ 1.8 µs more on freshly allocated output arrays
(first-touch page faults of the ≈ 1 MB arrays; at 2,000 games the difference vanishes, presumably as
numpy advises huge pages from 4 MB) — what bounds the 256-game ratio.  With types ≈ 9 µs per game:
60 × 64 branch-free legal-set recomputations, vectorised.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
from _emit import emit  # benchmarks/_emit.py (the script's own folder is on sys.path)

from originlens.tasks.othello import _run, generate_games

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


def _median_spread(xs: list[float]) -> tuple[float, float, float]:
    return float(np.median(xs)), float(min(xs)), float(max(xs))


def _time(fn, repeat: int) -> tuple[list[float], list[float]]:
    """CPU and wall seconds of ``repeat`` calls of ``fn``."""
    cpu, wall = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return cpu, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", default="64,256,2000", help="comma list of game counts for our generator")
    ap.add_argument("--plain-games", type=int, default=None, help="plain-engine games (default 4, 40 --no-types)")
    ap.add_argument("--repeat", type=int, default=7, help="timed calls per size (medians)")
    ap.add_argument("--numpy-repeat", type=int, default=3, help="timed calls of the numpy engine (0: skip)")
    ap.add_argument("--no-types", action="store_true", help="skip feature types in all engines")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pool", type=int, default=0, help="also time the trainer's pool of this many games")
    ap.add_argument("--pool-draws", default="300,64", help="STEPS,BATCH of a run drawing from that pool")
    args = ap.parse_args()
    with_types = not args.no_types
    sizes = [int(x) for x in args.games.split(",") if x]
    n_plain = args.plain_games or (4 if with_types else 40)

    generate_games(64, args.seed, feature_types=with_types)  # warm-up (and compilation)
    u = np.random.default_rng(args.seed).random((max(max(sizes), n_plain), 60))
    gc.disable()  # as timeit does: a cyclic collection (≈ 25 ms here) would land in one timed game or call
    plain_cpu, plain_wall, plain = [], [], []
    for g in range(n_plain):  # per-game times of the plain engine
        t0, c0 = time.perf_counter(), time.process_time()
        plain.append(plain_game(u[g], with_types))
        plain_wall.append(time.perf_counter() - t0)
        plain_cpu.append(time.process_time() - c0)
    games = generate_games(n_plain, args.seed, feature_types=with_types)
    for g, (m, b, lg, ty) in enumerate(plain):  # same games, same fields
        assert np.array_equal(games.moves[g], m) and np.array_equal(games.boards[g], b)
        assert np.array_equal(games.legal[g], lg)
        if with_types:
            assert np.array_equal(games.feature_types[g], ty)
    pc, pc_lo, pc_hi = _median_spread(plain_cpu)
    pw = float(np.median(plain_wall))

    what = "moves+boards+legal" + ("+feature types" if with_types else "")
    print(f"othello generate_games ({what}); medians, CPU spread min-max in brackets")
    print(
        f"  plain engine : {n_plain} games, {1e3 * pc:.1f} ms CPU/game [{1e3 * pc_lo:.1f}-{1e3 * pc_hi:.1f}], "
        f"{1e3 * pw:.1f} ms wall/game = {1 / pc:.1f} games/s CPU"
    )
    worst = float("inf")
    for n in sizes:
        cpu, wall = _time(lambda n=n: generate_games(n, args.seed, feature_types=with_types), args.repeat)
        c, lo, hi = _median_spread(cpu)
        w = float(np.median(wall))
        ratio = pc / (c / n)
        goal = " (goal >= 500x)" if n >= 256 else ""
        line = (
            f"  {n:5d} games  : CPU {1e3 * c:8.2f} ms [{1e3 * lo:.2f}-{1e3 * hi:.2f}], wall {1e3 * w:8.2f} ms, "
            f"{n / c:9.0f} games/s CPU; vs plain {ratio:6.0f}x CPU, {pw / (w / n):6.0f}x wall{goal}"
        )
        if args.numpy_repeat > 0:
            uu = np.random.default_rng(args.seed).random((n, 60))
            ncpu, _ = _time(
                lambda n=n, uu=uu: _run(np.empty((n, 60), np.int64), uu, with_types, 1024, compiled=False),
                args.numpy_repeat,
            )
            nc = float(np.median(ncpu))
            line += f"; numpy engine {1e3 * nc:.1f} ms CPU ({pc / (nc / n):.0f}x vs plain)"
        print(line)
        if len(sizes) > 1:  # per size; the figure with a floor is the worst from 256 games up
            emit(
                f"othello.generate{'' if with_types else '.no_types'}.n{n}",
                ratio,
                cpu=True,
                goal=500 if n >= 256 else None,
            )
        if n >= 256 or n == max(sizes):
            worst = min(worst, ratio)
    gc.enable()
    print("  outputs identical to the plain engine")
    if args.pool:
        from originlens.train.ntp import othello_pool

        cpu, wall = _time(lambda: othello_pool(args.pool, args.seed), 3)
        c, lo, hi = _median_spread(cpu)
        print(
            f"  trainer pool (moves only): {args.pool} games, CPU {c:.2f} s [{lo:.2f}-{hi:.2f}], "
            f"wall {float(np.median(wall)):.2f} s = {args.pool / c:.0f} games/s CPU"
        )
        from originlens.train.ntp import pool_rows

        steps, batch = (int(v) for v in args.pool_draws.split(","))
        drawn = lambda: othello_pool(args.pool, args.seed, pool_rows(args.pool, args.seed, batch, steps))
        rows = pool_rows(args.pool, args.seed, batch, steps)
        assert np.array_equal(drawn(), othello_pool(args.pool, args.seed)[rows]), "drawn games differ"
        dcpu, dwall = _time(drawn, 5)
        d, dlo, dhi = _median_spread(dcpu)
        print(
            f"  a run of {steps} updates of {batch} games draws {len(rows)} distinct games: rows and those games "
            f"CPU {d:.3f} s [{dlo:.3f}-{dhi:.3f}], wall {float(np.median(dwall)):.3f} s; whole pool / drawn "
            f"{c / d:.1f}x CPU (games identical)"
        )
    emit("othello.generate" + ("" if with_types else ".no_types"), worst, cpu=True, goal=500)


if __name__ == "__main__":
    main()
