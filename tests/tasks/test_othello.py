"""Othello generator, replay, tokens and notation against a plain-Python reference engine."""

from __future__ import annotations

import numpy as np
import pytest

from originlens.errors import ConfigError, InputError
from originlens.tasks import (
    OthelloTask,
    cell_name,
    format_moves,
    generate_games,
    get_task,
    legal_accuracy,
    legal_from_boards,
    moves_to_tokens,
    parse_cell,
    parse_moves,
    replay,
    tokens_to_moves,
)

# ------------------------------------------------------------------ plain-Python reference engine
# Board: list of 64 ints in absolute colours (+1 black, -1 white); cell = 8*row + col.

DIRS = [(-1, -1), (-1, 0), (-1, 1), (0, -1), (0, 1), (1, -1), (1, 0), (1, 1)]


def ref_start() -> list[int]:
    b = [0] * 64
    b[8 * 3 + 3] = b[8 * 4 + 4] = -1  # white d4, e5
    b[8 * 4 + 3] = b[8 * 3 + 4] = 1  # black d5, e4
    return b


def ref_captures(board, me, c, dr, df):
    r, f = divmod(c, 8)
    run = []
    rr, ff = r + dr, f + df
    while 0 <= rr < 8 and 0 <= ff < 8 and board[8 * rr + ff] == -me:
        run.append(8 * rr + ff)
        rr, ff = rr + dr, ff + df
    if run and 0 <= rr < 8 and 0 <= ff < 8 and board[8 * rr + ff] == me:
        return run
    return []


def ref_legal(board, me) -> list[int]:
    return [c for c in range(64) if board[c] == 0 and any(ref_captures(board, me, c, dr, df) for dr, df in DIRS)]


def ref_play(board, me, c) -> list[int]:
    new = list(board)
    if c == 64:
        return new
    assert new[c] == 0
    flips = [x for dr, df in DIRS for x in ref_captures(board, me, c, dr, df)]
    assert flips, "illegal move in reference"
    new[c] = me
    for x in flips:
        new[x] = me
    return new


def ref_types(board, me, legal) -> list[int]:
    out = []
    for c in range(64):
        if board[c] == 0:
            out.append(0)
            continue
        b2 = list(board)
        b2[c] = -b2[c]
        out.append(1 if ref_legal(b2, me) == legal else 2)
    return out


def ref_game(u_row, moves=None, types_at=()):
    """Play one game; returns moves, boards (relative), legal (65), {t: types}."""
    board, me = ref_start(), 1
    legal = ref_legal(board, me)
    out_m, out_b, out_l, out_t = [], [], [], {}
    for t in range(60):
        if moves is not None:
            mv = int(moves[t])
        elif legal:
            mv = legal[min(int(u_row[t] * len(legal)), len(legal) - 1)]
        else:
            mv = 64
        assert (mv == 64) == (not legal) and (mv == 64 or mv in legal)
        board = ref_play(board, me, mv)
        me = -me
        legal = ref_legal(board, me)
        out_m.append(mv)
        out_b.append([v * me for v in board])
        out_l.append([c in legal for c in range(64)] + [not legal])
        if t in types_at:
            out_t[t] = ref_types(board, me, legal)
    return out_m, out_b, out_l, out_t


# --------------------------------------------------------------------------- engine vs reference


def test_generated_games_equal_reference_engine():
    n, seed = 80, 3
    games = generate_games(n, seed, feature_types=False)
    u = np.random.default_rng(seed).random((n, 60))
    for g in range(n):
        m, b, lg, _ = ref_game(u[g])
        np.testing.assert_array_equal(games.moves[g], m)
        np.testing.assert_array_equal(games.boards[g], np.array(b, dtype=np.int8))
        np.testing.assert_array_equal(games.legal[g], np.array(lg, dtype=bool))
    assert games.feature_types is None


def test_feature_types_equal_colour_flip_recomputation():
    n, seed = 40, 11
    games = generate_games(n, seed)
    rng = np.random.default_rng(0)
    for g in range(n):
        k = 60 if g == 0 else 4  # one whole game, then 4 random positions per game
        ts = tuple(sorted(rng.choice(60, size=k, replace=False).tolist()))
        _, _, _, types = ref_game(None, moves=games.moves[g], types_at=ts)
        for t in ts:
            np.testing.assert_array_equal(games.feature_types[g, t], types[t], err_msg=f"{g},{t}")
    ft = games.feature_types
    assert set(np.unique(ft)) <= {0, 1, 2}
    np.testing.assert_array_equal(ft == 0, games.boards == 0)
    assert (ft == 1).any() and (ft == 2).any()


def test_every_move_legal_and_pass_exactly_when_stuck():
    games = generate_games(300, 5, feature_types=False)
    before = np.concatenate(
        [np.broadcast_to(legal_from_boards(_start_board())[None, None], (300, 1, 65)), games.legal[:, :-1]], axis=1
    )
    chosen = np.take_along_axis(before, games.moves[..., None], axis=2)[..., 0]
    assert chosen.all()
    np.testing.assert_array_equal(games.moves == 64, before[..., 64])
    np.testing.assert_array_equal(before[..., 64], ~before[..., :64].any(-1))
    assert games.moves.shape == (300, 60)


def _start_board() -> np.ndarray:
    return np.array(ref_start(), dtype=np.int8)  # black (+1) to move


def test_replay_reproduces_generated_fields():
    games = generate_games(200, 9)
    again = replay(games.moves, chunk_size=64)
    for name in ("moves", "boards", "legal", "feature_types"):
        np.testing.assert_array_equal(getattr(again, name), getattr(games, name), err_msg=name)


def test_determinism_and_prefix():
    a = generate_games(40, 123, feature_types=False)
    b = generate_games(40, 123, feature_types=False)
    c = generate_games(70, 123, feature_types=False, chunk_size=16)
    d = generate_games(40, 124, feature_types=False)
    np.testing.assert_array_equal(a.moves, b.moves)
    np.testing.assert_array_equal(a.moves, c.moves[:40])
    np.testing.assert_array_equal(a.boards, c.boards[:40])
    assert not np.array_equal(a.moves, d.moves)
    e = generate_games(0, 1)
    assert e.moves.shape == (0, 60) and e.feature_types.shape == (0, 60, 64)


# ------------------------------------------------------------------------- hand-checked positions


def test_opening_moves_and_cell_convention():
    # d3 = row 2 (rank 3), col 3 (file d); c4 = (3, 2); f5 = (4, 5); e6 = (5, 4)
    expected = {8 * 2 + 3, 8 * 3 + 2, 8 * 4 + 5, 8 * 5 + 4}
    assert {parse_cell(s) for s in ("d3", "c4", "f5", "e6")} == expected
    assert set(ref_legal(ref_start(), 1)) == expected
    legal0 = legal_from_boards(_start_board())
    assert set(np.flatnonzero(legal0[:64]).tolist()) == expected and not legal0[64]
    batch = OthelloTask().sample(4, np.random.default_rng(0))
    assert set(np.flatnonzero(batch.legal[0, 0]).tolist()) == {c + 3 for c in expected}
    assert set(batch.metadata["moves"][:, 0].tolist()) <= expected


def test_known_opening_board():
    # Tiger opening f5 d6 c3 d3 c4, worked by hand: after it white (to move) has d3 d5 d6 and
    # black has c3 c4 d4 e4 e5 f5.
    games = replay(parse_moves("f5 d6 c3 d3 c4"))
    board = games.boards[0, 4]
    own = {cell_name(c) for c in np.flatnonzero(board == 1)}
    opp = {cell_name(c) for c in np.flatnonzero(board == -1)}
    assert own == {"d3", "d5", "d6"}
    assert opp == {"c3", "c4", "d4", "e4", "e5", "f5"}
    # after f5 (move 0) white sees black's f5, e5, e4, d5 and its own d4
    b0 = games.boards[0, 0]
    assert {cell_name(c) for c in np.flatnonzero(b0 == 1)} == {"d4"}
    assert {cell_name(c) for c in np.flatnonzero(b0 == -1)} == {"d5", "e4", "e5", "f5"}


def test_forced_pass_hand_constructed_position():
    # Player to move: one stone on b2; opponent fills rank 1.  Every line through the opponent's
    # stones leaves the board, so the player must pass; the opponent can answer a3, b3 or c3.
    board = np.zeros(64, dtype=np.int8)
    board[[parse_cell(f"{f}1") for f in "abcdefgh"]] = -1
    board[parse_cell("b2")] = 1
    lg = legal_from_boards(board)
    assert lg[64] and not lg[:64].any()
    assert ref_legal(board.tolist(), 1) == []
    opp = legal_from_boards(-board)
    assert {cell_name(c) for c in np.flatnonzero(opp[:64])} == {"a3", "b3", "c3"}
    assert {cell_name(c) for c in ref_legal(board.tolist(), -1)} == {"a3", "b3", "c3"}


def test_forced_pass_in_a_record():
    # Found in generated games (seed 123) and checked by the reference engine: after 8 moves black
    # has no move, passes, and white goes on with e3.
    rec = "d3c3b3b2e6a3a1c1--e3f2f6"
    moves = parse_moves(rec)
    board, me = ref_start(), 1
    for mv in moves[:8]:
        board, me = ref_play(board, me, int(mv)), -me
    assert me == 1 and ref_legal(board, 1) == [] and ref_legal(board, -1)
    games = replay(moves)
    assert games.legal[0, 7, 64] and not games.legal[0, 7, :64].any()
    assert not games.legal[0, 8, 64]  # white (after black's pass) has moves
    with pytest.raises(InputError, match="game 0, move 8"):
        replay(parse_moves("d3c3b3b2e6a3a1c1e3"))  # skipping the pass is an error


def test_wipeout_game_ends_with_passes():
    # A 9-move game (f5 f6 d3 e3 f3 f4 g7 f2 f1) after which white has no stone left.
    moves = np.concatenate([parse_moves("f5f6d3e3f3f4g7f2f1"), np.full(51, 64)])
    board, me = ref_start(), 1
    for mv in moves[:9]:
        board, me = ref_play(board, me, int(mv)), -me
    assert board.count(-1) == 0 and board.count(1) == 13
    games = replay(moves)
    assert (games.boards[0, 8] == 1).sum() == 0 and (games.boards[0, 8] == -1).sum() == 13
    assert games.legal[0, 8:, 64].all() and not games.legal[0, 8:, :64].any()
    np.testing.assert_array_equal(games.boards[0, 8::2], np.repeat(games.boards[0, 8:9], 26, 0))


def test_game_ends_are_passes():
    games = generate_games(300, 21, feature_types=False)
    m, lg = games.moves, games.legal
    n_over = n_full = 0
    for g in range(len(m)):
        both = lg[g, :-1, 64] & lg[g, 1:, 64]  # both players stuck in a row: game over
        if both.any():
            n_over += 1
            t0 = int(np.argmax(both))
            assert (m[g, t0 + 1 :] == 64).all() and lg[g, t0:, 64].all()
            board = games.boards[g, t0].tolist()
            assert ref_legal(board, 1) == [] and ref_legal(board, -1) == []
        if not (m[g] == 64).any():  # no pass at all: board full after 60 moves
            n_full += 1
            assert (games.boards[g, -1] != 0).all() and lg[g, -1, 64]
    assert n_over > 0 and n_full > 0


# ------------------------------------------------------------------------------- errors, tokens


def test_illegal_move_error_names_game_and_move():
    games = generate_games(6, 2, feature_types=False)
    moves = games.moves.copy()
    legal_before = games.legal[3, 16]
    bad = int(np.flatnonzero(~legal_before[:64] & (games.boards[3, 16] == 0))[0])
    moves[3, 17] = bad
    colour = "black" if 17 % 2 == 0 else "white"
    with pytest.raises(InputError, match=rf"game 3, move 17 \({cell_name(bad)}\): illegal for {colour}"):
        replay(moves)
    moves[3, 17] = 99
    with pytest.raises(InputError, match="game 3, move 17"):
        replay(moves)
    with pytest.raises(InputError, match="game 0, move 0"):
        replay(parse_moves("pass"))  # black has moves at the start


def test_tokens_round_trip_and_errors():
    games = generate_games(5, 4, feature_types=False)
    tok = moves_to_tokens(games.moves)
    assert tok.min() >= 2 and tok.max() <= 66
    np.testing.assert_array_equal(tok == 2, games.moves == 64)
    np.testing.assert_array_equal(tokens_to_moves(tok), games.moves)
    with pytest.raises(InputError, match="not an Othello move token"):
        tokens_to_moves(np.array([3, 1, 4]))
    with pytest.raises(InputError):
        moves_to_tokens([65])


def test_notation_round_trip_and_errors():
    games = generate_games(20, 8, feature_types=False)
    for row in games.moves:
        np.testing.assert_array_equal(parse_moves(format_moves(row)), row)
    assert format_moves(games.moves[:2]) == [format_moves(games.moves[0]), format_moves(games.moves[1])]
    np.testing.assert_array_equal(parse_moves("F5 d6,PASS pa -- h8A1"), [37, 43, 64, 64, 64, 63, 0])
    assert parse_moves("").shape == (0,)
    with pytest.raises(InputError, match="offset 4"):
        parse_moves("f5d6i3")
    with pytest.raises(InputError, match="offset 2"):
        parse_moves("f5x")


def test_othello_task_batch():
    task = get_task("othello")
    assert task.vocab_size == 67 and task.seq_len == 61 and task.vocab[2] == "pass"
    assert task.vocab[3] == "a1" and task.vocab[66] == "h8"
    batch = task.sample(8, np.random.default_rng(1))
    games = generate_games(8, np.random.default_rng(1))
    assert batch.tokens.shape == (8, 61) and (batch.tokens[:, 0] == 1).all()
    np.testing.assert_array_equal(batch.tokens[:, 1:], moves_to_tokens(games.moves))
    assert not batch.features[:, 0].any() and not batch.feature_types[:, 0].any()
    np.testing.assert_array_equal(batch.features[:, 1:], games.boards.astype(np.float32))
    np.testing.assert_array_equal(batch.feature_types[:, 1:], games.feature_types)
    np.testing.assert_array_equal(batch.legal[:, 1:, 2], games.legal[..., 64])
    np.testing.assert_array_equal(batch.legal[:, 1:, 3:], games.legal[..., :64])
    assert not batch.legal[..., :2].any()
    # predicting the actual next token is always legal
    pred = np.concatenate([batch.tokens[:, 1:], np.zeros((8, 1), np.int64)], axis=1)
    assert legal_accuracy(pred, batch) == 1.0
    tr = task.tracked
    assert tr.layers == (1, 2, 3, 4, 5, 6) and tr.positions == tuple(range(4, 57, 4))
    assert len(tr.features) == 16 and set(tr.features) == {f"{f}{r}" for f in "cdef" for r in (3, 4, 5, 6)}
    fast = get_task("othello", with_feature_types=False).sample(2, np.random.default_rng(0))
    assert fast.feature_types is None


def test_registry_errors():
    with pytest.raises(ConfigError, match="majority, cond-majority, othello"):
        get_task("chess")
    with pytest.raises(ConfigError, match="no option"):
        get_task("othello", board_size=6)


def test_kth_bit_matches_sorted_list_rule():
    from originlens.tasks.othello import _kth_bit, pack_bits

    rng = np.random.default_rng(12)
    cells = rng.random((400, 64)) < rng.random((400, 1))
    cells[:5] = False  # empty boards
    u = rng.random(400)
    got = _kth_bit(pack_bits(cells), u)
    for r in range(400):
        cand = sorted(np.flatnonzero(cells[r]).tolist())
        assert got[r] == (cand[int(u[r] * len(cand))] if cand else 0)


def test_render_and_protocol():
    from originlens.tasks import Task, render_board

    text = render_board(_start_board())
    rows = text.splitlines()
    assert rows[8 - 4] == "4 . . . O X . . ." and rows[8 - 5] == "5 . . . X O . . ."
    assert isinstance(OthelloTask(), Task)
