"""Recorded (human) Othello games: WTHOR databases and plain transcripts, replayed on the engine.

Formats:

* **WTHOR** game files ``WTH_YYYY.wtb`` of the Fédération Française d'Othello ("Format de la base
  WThor"; the layout also used by other readers, e.g. Reversi.jl's ``read_wthor``): a 16-byte header —
  century, year, month, day of creation (1 byte each), N1 = number of game records (int32, little
  endian), N2 = number of player/tournament records (int16, 0 in game files), year of the games
  (int16), board size P1 (1 byte: 0 or 8 = 8×8, 10 = 10×10), game type P2 (1 byte), depth P3 of the
  theoretical score (1 byte), 1 reserved byte — then N1 records of 68 bytes: tournament index, black
  player index, white player index (int16 each), black's score and black's theoretical score (1 byte
  each) and 60 move bytes ``10·row + column`` with row (rank) and column (file a–h) numbered 1..8, so
  f5 = 56; 0 marks the end of a game.  The file size is 16 + 68·N1.  **Passes are not recorded.**
* **Transcripts**: one game per line in the notation of :mod:`.notation` (``f5d6c3d3…``, case,
  spaces and commas ignored; passes may be written ``--`` or ``pass`` or left implicit).  Blank lines
  and lines starting with ``#`` are skipped.

Both are replayed on the vectorised engine of :mod:`.othello`: the player to move passes exactly when
he has no legal move (implicit passes are inserted, explicit ones checked); a move that is illegal
raises :class:`~originlens.errors.InputError` naming the file, the game (1-based record number) and the
move (1-based, in the record).  A game becomes 60 move tokens, the LM format of the synthetic games:
finished games are padded with passes, longer ones (inserted passes) truncated.  Records that stop
before the game is over (resignation, time, a damaged record) cannot be padded with passes — a pass is
illegal while moves exist — and are left out of :meth:`GameRecords.complete` (counted in ``n_incomplete``).

Caveats: the tests read WTHOR files written by :func:`write_wthor` from engine games.  Player and tournament names
(``WTHOR.JOU``/``WTHOR.TRN``) are not read.  The engine helpers ``legal_bitboard`` and ``flips`` of
:mod:`.othello` are used to replay all games of a file at once.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .notation import PASS, cell_name, parse_moves
from .othello import BITS, BLACK_START, N_MOVES, WHITE_START, OthelloGames, flips, legal_bitboard, replay, unpack_bits

WTHOR_HEADER = struct.Struct("<4BiHH4B")  # century, year, month, day, N1, N2, game year, P1, P2, P3, reserved
WTHOR_RECORD = 68
WTHOR_GAME_HEAD = struct.Struct("<3H2B")  # tournament, black, white, black score, theoretical score


@dataclass
class GameRecords:
    """Recorded games made explicit for the engine.

    Attributes:
        moves: (n, 60) int64 move tokens (cells 0..63, pass 64) with implicit passes inserted and the
            end padded with passes.
        complete_mask: (n,) bool — the record reaches the end of the game (or fills 60 tokens).
        n_recorded: (n,) number of moves in the record (passes not counted).
        black_score: (n,) recorded black score (WTHOR), or None.
        source: the file read.
        info: header fields (WTHOR) and other notes.
    """

    moves: np.ndarray
    complete_mask: np.ndarray
    n_recorded: np.ndarray
    black_score: np.ndarray | None
    source: str
    info: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.moves.shape[0])

    @property
    def n_incomplete(self) -> int:
        return int((~self.complete_mask).sum())

    def complete(self) -> GameRecords:
        """The games whose record reaches the end of the game (usable as 60-token LM sequences)."""
        m = self.complete_mask
        return GameRecords(
            self.moves[m],
            m[m],
            self.n_recorded[m],
            None if self.black_score is None else self.black_score[m],
            self.source,
            {**self.info, "dropped_incomplete": self.n_incomplete},
        )

    def games(self, *, feature_types: bool = True) -> OthelloGames:
        """Boards, legal sets and feature types of the complete games (engine replay, checked)."""
        return replay(self.complete().moves, feature_types=feature_types)


# ----------------------------------------------------------------------------------------------------
# making passes explicit


def complete_passes(
    records: Sequence[np.ndarray], *, source: str = "records", length: int = N_MOVES
) -> tuple[np.ndarray, np.ndarray]:
    """Replay move records (each (m,) cells 0..63, optional explicit passes 64) on all games at once.

    Returns (moves (n, length) with explicit passes and padding, complete (n,) bool: every pass in the
    tokens is forced, i.e. the record reaches the end of the game or fills the tokens).  Raises
    InputError at the first illegal move (earliest token, then lowest game).
    """
    n = len(records)
    lens = np.array([len(r) for r in records], dtype=np.int64)
    width = int(lens.max()) if n else 0
    rec = np.full((n, width + 1), -1, dtype=np.int64)  # −1 = end of record
    for g, r in enumerate(records):
        rec[g, : len(r)] = r
    out = np.full((n, length), PASS, dtype=np.int64)
    own = np.full(n, BLACK_START, dtype=np.uint64)
    opp = np.full(n, WHITE_START, dtype=np.uint64)
    ptr = np.zeros(n, dtype=np.int64)  # next record entry per game
    padded = np.zeros(n, dtype=bool)  # a padding pass was emitted with moves left
    rows = np.arange(n)
    zero = np.uint64(0)
    for t in range(length):
        legal = legal_bitboard(own, opp)
        nxt = rec[rows, ptr]
        ended = nxt < 0
        stuck = legal == zero
        over = stuck & (legal_bitboard(opp, own) == zero)
        explicit_pass = nxt == PASS
        is_cell = (nxt >= 0) & (nxt < 64)
        cell_ok = (np.right_shift(legal, np.where(is_cell, nxt, 0).astype(np.uint64)) & np.uint64(1)) != zero
        # an explicit pass is legal only when stuck; a cell must be legal, and nothing follows the game's end
        bad = ~ended & np.where(explicit_pass, ~stuck, ~is_cell | (~stuck & ~cell_ok) | over)
        if bad.any():
            _illegal(source, int(rows[bad][0]), rec, ptr, lens, t, legal)
        play = ~ended & ~stuck & ~explicit_pass  # a recorded cell is played
        padded |= ended & ~stuck
        ptr += (play | (~ended & explicit_pass)).astype(np.int64)
        out[:, t] = np.where(play, nxt, PASS)
        move_bit = np.where(play, BITS[np.clip(nxt, 0, 63)], zero)
        flipped = flips(own, opp, move_bit)
        own, opp = opp & ~flipped, own | move_bit | flipped  # next player's perspective
    # usable as an LM sequence: every pass in the 60 tokens is forced (records longer than the tokens
    # are truncated, as the synthetic games are)
    return out, ~padded


def _illegal(
    source: str, g: int, rec: np.ndarray, ptr: np.ndarray, lens: np.ndarray, t: int, legal: np.ndarray
) -> None:
    mv = int(rec[g, ptr[g]])
    k = int(ptr[g])
    allowed = [cell_name(int(c)) for c in np.flatnonzero(unpack_bits(legal[g]))] or ["none (must pass)"]
    colour = "black" if t % 2 == 0 else "white"
    what = cell_name(mv) if 0 <= mv <= PASS else str(mv)
    raise InputError(
        f"{source}: game {g + 1}, move {k + 1} of {int(lens[g])} ({what}) is illegal for {colour} "
        f"(legal: {' '.join(allowed)})",
        "check the game record; WTHOR moves are 10·row + column with rows and columns 1..8",
    )


# ----------------------------------------------------------------------------------------------------
# WTHOR


def _decode_wthor_move(v: int) -> int:
    row, col = divmod(int(v), 10)
    if not (1 <= row <= 8 and 1 <= col <= 8):
        return -1
    return 8 * (row - 1) + (col - 1)


def read_wthor(path: str | os.PathLike) -> GameRecords:
    """Read a WTHOR game file (``.wtb``) and replay its games (see the module docstring)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc.strerror or exc}", "pass an existing .wtb file") from None
    if len(data) < WTHOR_HEADER.size:
        raise InputError(
            f"{p} is {len(data)} bytes, shorter than the 16-byte WTHOR header", "pass a WTHOR game file (WTH_YYYY.wtb)"
        )
    c, y, mo, day, n1, n2, game_year, p1, p2, p3, _ = WTHOR_HEADER.unpack_from(data, 0)
    if p1 not in (0, 8):
        raise InputError(
            f"{p}: board size byte P1 = {p1} (only 8×8 games are supported; 10 = 10×10 .wtd)",
            "pass an 8×8 WTHOR game file",
        )
    want = WTHOR_HEADER.size + WTHOR_RECORD * n1
    if n1 < 0 or len(data) != want:
        raise InputError(
            f"{p}: header says {n1} games ({want} bytes) but the file has {len(data)} bytes",
            "the file is truncated or not a WTHOR game file (player/tournament files WTHOR.JOU/.TRN hold no games)",
        )
    body = np.frombuffer(data, dtype=np.uint8, offset=WTHOR_HEADER.size).reshape(n1, WTHOR_RECORD)
    heads = [WTHOR_GAME_HEAD.unpack_from(data, WTHOR_HEADER.size + WTHOR_RECORD * g) for g in range(n1)]
    records = []
    for g in range(n1):
        raw = body[g, 8:]
        end = int(np.argmax(raw == 0)) if (raw == 0).any() else 60
        if (raw[end:] != 0).any():
            k = end + int(np.argmax(raw[end:] != 0))
            raise InputError(
                f"{p}: game {g + 1} has move byte {int(raw[k])} after the end marker (move {k + 1})",
                "the record is damaged",
            )
        cells = [_decode_wthor_move(v) for v in raw[:end]]
        if -1 in cells:
            k = cells.index(-1)
            raise InputError(
                f"{p}: game {g + 1}, move {k + 1}: byte {int(raw[k])} is not 10·row + column "
                f"with row and column in 1..8",
                "the record is damaged or not a WTHOR game file",
            )
        records.append(np.asarray(cells, dtype=np.int64))
    moves, complete = complete_passes(records, source=str(p))
    info = {
        "format": "wthor",
        "created": f"{c:02d}{y:02d}-{mo:02d}-{day:02d}",
        "n_games": n1,
        "n2": n2,
        "game_year": game_year,
        "board_size": p1 or 8,
        "game_type": p2,
        "theoretical_depth": p3,
        "tournament": [h[0] for h in heads],
        "black_player": [h[1] for h in heads],
        "white_player": [h[2] for h in heads],
    }
    return GameRecords(
        moves=moves,
        complete_mask=complete,
        n_recorded=np.array([len(r) for r in records]),
        black_score=np.array([h[3] for h in heads], dtype=np.int64),
        source=str(p),
        info=info,
    )


def black_score(games: OthelloGames, moves: np.ndarray) -> np.ndarray:
    """WTHOR black score of replayed 60-token games: black's discs, plus the empty squares when black
    wins (half of them on a draw) — the FFO convention."""
    last = games.boards[:, -1].astype(np.int64)  # perspective of the next player
    n_tok = moves.shape[1]
    black_to_move_next = n_tok % 2 == 0  # tokens alternate colours from black
    own, opp = (last == 1).sum(1), (last == -1).sum(1)
    black, white = (own, opp) if black_to_move_next else (opp, own)
    empty = 64 - black - white
    return np.where(black > white, black + empty, np.where(black < white, black, black + empty // 2))


def write_wthor(
    path: str | os.PathLike,
    moves: Any,
    *,
    game_year: int = 2000,
    tournament: int = 0,
    black_player: int = 0,
    white_player: int = 0,
    created: tuple[int, int, int, int] = (20, 24, 1, 1),
) -> Path:
    """Write games (n, L) of move tokens (cells 0..63, passes 64 — dropped, as WTHOR stores none) as a
    WTHOR game file.  Black's score (byte 6) is computed by replaying the games; the theoretical score
    byte repeats it (no solver).  Returns the path."""
    from ..storage import atomic_write_bytes

    arr = np.asarray(moves, dtype=np.int64)
    if arr.ndim != 2:
        raise InputError(f"moves must be (n, L), got shape {arr.shape}", "pass one row of move tokens per game")
    games = replay(arr, feature_types=False)
    scores = black_score(games, arr)
    out = bytearray(WTHOR_HEADER.pack(*created, len(arr), 0, game_year, 8, 0, 0, 0))
    for g, row in enumerate(arr):
        cells = [int(c) for c in row if c != PASS]
        if len(cells) > 60:
            raise InputError(f"game {g + 1} has {len(cells)} moves", "a WTHOR record holds at most 60")
        enc = bytes(10 * (c // 8 + 1) + (c % 8 + 1) for c in cells) + bytes(60 - len(cells))
        out += WTHOR_GAME_HEAD.pack(tournament, black_player, white_player, int(scores[g]), int(scores[g])) + enc
    return atomic_write_bytes(path, bytes(out))


# ----------------------------------------------------------------------------------------------------
# transcripts


def read_transcripts(path: str | os.PathLike) -> GameRecords:
    """Read one game per line (``f5d6c3…``; passes ``--``/``pass`` optional), skipping blank lines and
    ``#`` comments, and replay them (see the module docstring)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {p} as UTF-8 text ({exc})", "pass a text file with one game per line") from None
    records, where = [], []
    for ln, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            records.append(parse_moves(text))
        except InputError as exc:
            raise InputError(f"{p}, line {ln}: {exc.what}", exc.fix) from None
        where.append(ln)
    if not records:
        raise InputError(f"{p} holds no game", "write one game per line, e.g. f5d6c3d3c4…")
    try:
        moves, complete = complete_passes(records, source=str(p))
    except InputError as exc:  # name the line, too
        g = int(exc.what.split("game ")[1].split(",")[0]) - 1
        raise InputError(exc.what.replace(f"game {g + 1},", f"game {g + 1} (line {where[g]}),", 1), exc.fix) from None
    return GameRecords(
        moves=moves,
        complete_mask=complete,
        n_recorded=np.array([int((r != PASS).sum()) for r in records]),
        black_score=None,
        source=str(p),
        info={"format": "transcript", "lines": where},
    )


def read_game_records(path: str | os.PathLike) -> GameRecords:
    """WTHOR (``.wtb``) or transcript file, by extension."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p} not found", "pass a WTHOR .wtb file or a text file with one game per line")
    return read_wthor(p) if p.suffix.lower() == ".wtb" else read_transcripts(p)
