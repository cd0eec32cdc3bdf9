"""WTHOR / transcript readers (originlens.tasks.othello_records) against hand-built bytes and a plain
Python reference engine written here (pass insertion, black score)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from originlens.errors import InputError
from originlens.tasks import format_moves, generate_games, parse_moves
from originlens.tasks.othello_records import (
    black_score,
    complete_passes,
    read_game_records,
    read_transcripts,
    read_wthor,
    write_wthor,
)

# ------------------------------------------------------------------ plain-Python reference engine
DIRS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def ref_flips(board, me, c):
    r, f = divmod(c, 8)
    out = []
    for dr, df in DIRS:
        run, rr, ff = [], r + dr, f + df
        while 0 <= rr < 8 and 0 <= ff < 8 and board[8 * rr + ff] == -me:
            run.append(8 * rr + ff)
            rr, ff = rr + dr, ff + df
        if run and 0 <= rr < 8 and 0 <= ff < 8 and board[8 * rr + ff] == me:
            out += run
    return out


def ref_legal(board, me):
    return [c for c in range(64) if board[c] == 0 and ref_flips(board, me, c)]


def ref_replay(cells):
    """Record without passes → (60 tokens with passes inserted/padded, final board (+1 black), usable:
    no padding pass was needed while the player to move had a legal move)."""
    board = [0] * 64
    board[27] = board[36] = -1
    board[28] = board[35] = 1
    me, toks, k, usable = 1, [], 0, True
    while len(toks) < 60:
        legal = ref_legal(board, me)
        if k < len(cells) and legal:
            c = cells[k]
            assert c in legal
            for x in ref_flips(board, me, c) + [c]:
                board[x] = me
            toks.append(c)
            k += 1
        else:
            usable &= not (k >= len(cells) and legal)
            toks.append(64)
        me = -me
    return toks, board, usable


def ref_score(board):
    b, w = board.count(1), board.count(-1)
    e = 64 - b - w
    return b + e if b > w else b if b < w else b + e // 2


def wthor_bytes(games_cells, *, year=2001, n_declared=None, p1=8):
    """A WTHOR file built by hand: header, then 68-byte records (moves 10·row + col, 1-based)."""
    n = len(games_cells) if n_declared is None else n_declared
    out = bytearray(struct.pack("<4BiHH4B", 20, 1, 2, 3, n, 0, year, p1, 0, 22, 0))
    for g, cells in enumerate(games_cells):
        out += struct.pack("<3H2B", 7, 100 + g, 200 + g, 33, 34)
        out += bytes(10 * (c // 8 + 1) + c % 8 + 1 for c in cells) + bytes(60 - len(cells))
    return bytes(out)


@pytest.fixture(scope="module")
def engine_games():
    g = generate_games(400, 11, feature_types=False)
    assert (g.moves[:, :-1] == 64).any(), "want some games with passes"
    return g


def test_wthor_reader_on_hand_built_bytes(tmp_path, engine_games):
    moves = engine_games.moves[:40]
    cells = [[int(c) for c in row if c != 64] for row in moves]
    path = tmp_path / "WTH_2001.wtb"
    path.write_bytes(wthor_bytes(cells))
    rec = read_wthor(path)
    assert len(rec) == 40 and rec.info["n_games"] == 40 and rec.info["game_year"] == 2001
    assert rec.info["created"] == "2001-02-03" and rec.info["theoretical_depth"] == 22
    assert rec.info["black_player"][:2] == [100, 101] and rec.info["tournament"][0] == 7
    assert rec.black_score.tolist() == [33] * 40
    for g in range(40):  # passes re-inserted as the reference engine does
        toks, _, usable = ref_replay(cells[g])
        assert rec.moves[g].tolist() == toks and rec.complete_mask[g] == usable
    np.testing.assert_array_equal(rec.moves, moves)  # the engine's own explicit-pass sequences
    short = [c[:20] for c in cells[:3]]  # unfinished records: not usable as LM games
    (tmp_path / "short.wtb").write_bytes(wthor_bytes(short))
    rec = read_wthor(tmp_path / "short.wtb")
    assert rec.n_incomplete == 3 and not any(ref_replay(c)[2] for c in short)
    assert [r[:20] for r in rec.moves.tolist()] == [ref_replay(c)[0][:20] for c in short]


def test_first_moves_decode_to_the_standard_openings(tmp_path):
    # f5 = 56, d3 = 34, c4 = 43, e6 = 65 are black's four legal first moves
    path = tmp_path / "open.wtb"
    raw = bytearray(wthor_bytes([[0]] * 4))
    for g, byte in enumerate((56, 34, 43, 65)):
        raw[16 + 68 * g + 8] = byte
    path.write_bytes(bytes(raw))
    rec = read_wthor(path)
    assert rec.moves[:, 0].tolist() == [int(parse_moves(m)[0]) for m in ("f5", "d3", "c4", "e6")]
    assert rec.n_incomplete == 4 and len(rec.complete()) == 0  # one-move records are unfinished


def test_write_wthor_round_trip_and_scores(tmp_path, engine_games):
    moves = engine_games.moves[:60]
    path = write_wthor(tmp_path / "x.wtb", moves, game_year=1999)
    assert path.stat().st_size == 16 + 68 * 60
    rec = read_game_records(path)
    np.testing.assert_array_equal(rec.moves, moves)
    want = [ref_score(ref_replay([int(c) for c in row if c != 64])[1]) for row in moves]
    assert rec.black_score.tolist() == want
    games = rec.games(feature_types=False)
    assert black_score(games, rec.complete().moves).tolist() == [w for w, ok in zip(want, rec.complete_mask) if ok]


def test_transcripts_implicit_and_explicit_passes(tmp_path, engine_games):
    moves = engine_games.moves[:30]
    explicit = format_moves(moves)
    implicit = ["".join(s for s in format_moves(row, sep=" ").split() if s != "--") for row in moves]
    p1, p2 = tmp_path / "a.txt", tmp_path / "b.txt"
    p1.write_text("\n".join(explicit))
    p2.write_text(
        "# human games\n\n"
        + "\n".join(" ".join(s[i : i + 2] for i in range(0, len(s), 2)).upper() for s in implicit)
        + "\n"
    )
    for p in (p1, p2):
        rec = read_game_records(p)
        np.testing.assert_array_equal(rec.moves, moves)
        assert rec.n_incomplete == 0
    assert read_transcripts(p2).info["lines"][0] == 3


def test_illegal_moves_name_game_and_move(tmp_path):
    ok = [int(c) for c in parse_moves("f5d6c3d3c4")]
    bad = [int(c) for c in parse_moves("f5d6c3")] + [int(parse_moves("a1")[0])]
    path = tmp_path / "bad.wtb"
    path.write_bytes(wthor_bytes([ok, bad]))
    with pytest.raises(InputError, match=r"game 2, move 4 of 4 \(a1\) is illegal for white"):
        read_wthor(path)
    t = tmp_path / "bad.txt"
    t.write_text("f5d6c3d3c4\n\n# x\nf5d6c3a1\n")
    with pytest.raises(InputError, match=r"game 2 \(line 4\), move 4"):
        read_transcripts(t)
    t.write_text("f5 --\n")  # a pass while moves exist
    with pytest.raises(InputError, match=r"game 1 \(line 1\), move 2"):
        read_transcripts(t)
    t.write_text("f5d6z9\n")
    with pytest.raises(InputError, match="line 1"):
        read_transcripts(t)


def test_moves_after_the_end_of_a_game_are_illegal():
    g = generate_games(3000, 5, feature_types=False)
    finished_early = [
        [int(c) for c in row if c != 64] for row in g.moves if (row != 64).sum() < 60 and (row[-2:] == 64).all()
    ]
    cells = next(
        c for c in finished_early if not ref_legal(ref_replay(c)[1], 1) and not ref_legal(ref_replay(c)[1], -1)
    )
    moves, complete = complete_passes([np.array(cells)])
    assert complete[0] and moves[0].tolist() == ref_replay(cells)[0]
    empty = next(c for c in range(64) if ref_replay(cells)[1][c] == 0)
    with pytest.raises(InputError, match=f"move {len(cells) + 1} of {len(cells) + 1}"):
        complete_passes([np.array(cells + [empty])])


def test_damaged_files_are_refused(tmp_path, engine_games):
    cells = [[int(c) for c in engine_games.moves[0] if c != 64]]
    good = wthor_bytes(cells)
    cases = {
        "short.wtb": good[:10],
        "trunc.wtb": good[:-5],
        "count.wtb": wthor_bytes(cells, n_declared=2),
        "size10.wtb": wthor_bytes(cells, p1=10),
    }
    bad_byte = bytearray(good)
    bad_byte[16 + 8 + 2] = 99  # row 9
    cases["byte.wtb"] = bytes(bad_byte)
    gap = bytearray(wthor_bytes([cells[0][:5]]))
    gap[16 + 8 + 7] = 56  # a move after the end marker
    cases["gap.wtb"] = bytes(gap)
    for name, data in cases.items():
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(InputError):
            read_wthor(p)
    with pytest.raises(InputError, match="not found"):
        read_game_records(tmp_path / "missing.wtb")
