"""Synthetic Othello games on vectorised bitboards (the Othello task of arXiv 2603.14087).

Conventions:

* cell = 8·row + col, row 0–7 = ranks 1–8, col 0–7 = files a–h; move 64 = pass (see
  :mod:`.notation`).  Standard start: white on d4 and e5, black on d5 and e4; black moves first.
* A game is always 60 move tokens.  A player without a legal move passes; finished games are padded
  with passes.  Because passes are tokens, colours alternate strictly: move t is black's when t is
  even.  A game with a mid-game pass may be unfinished after 60 tokens (it is truncated).
* ``boards[g, t]`` is the position after move t seen by the player to move next (the one who plays
  move t+1): +1 own stone, −1 opponent's (the player who just moved), 0 empty.
* ``legal[g, t]`` (65 entries) is that player's legal set; entry 64 (pass) is True exactly when no
  cell is legal.
* ``feature_types[g, t, c]``: 0 empty cell; otherwise flip the colour of that stone and recompute the
  next player's legal set: 1 if unchanged (NTP-useless), 2 if changed (NTP-useful).

Engine: each position is two uint64 bitboards (own, opponent) per game; moves and flips are found by
shift-and-mask fills in the 8 directions.  Games are played by the compiled per-game kernel of
:mod:`.othello_kernels` (numba), which writes boards, legal sets and feature types straight into the
output arrays.  The vectorised numpy engine (:func:`_play`: numpy arrays over all games, feature types
evaluated on an (n, K) array of colour-flipped bitboards) is kept as the reference the kernel is tested
against (``_run(..., compiled=False)``), and reports illegal moves in :func:`replay`; its helpers
:func:`legal_bitboard` and :func:`flips` serve :mod:`.othello_records`.

Randomness: ``u = default_rng(seed).random((n, 60))``; move t of game g is the ⌊u[g,t]·c⌋-th legal
cell in increasing cell order (c legal cells).  Hence games of ``generate_games(n, s)`` are a prefix of
``generate_games(m, s)`` for m ≥ n, and a plain per-game engine reproduces them exactly.

LM vocabulary: ``["<pad>", "<bos>", "pass", "a1", …, "h8"]`` (67 tokens): token = cell + 3, pass = 2.

Caveats: the first call in a fresh environment compiles the kernel (seconds; cached afterwards).
Memory is about 12 KB per game (boards, legal sets, types; 16 KB more as float32 task
features), so generate eval sets of 20,480 games in one call but training data on the fly (use
``feature_types=False`` there).  Bit ↔ cell unpacking converts to ``'<u8'`` first, so the cell order
does not depend on the host's byte order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ..errors import ConfigError, InputError
from .base import BOS_ID, SPECIAL_TOKENS, TaskBatch, Tracked, check_n
from .notation import CELL_NAMES, PASS, cell_name

N_MOVES = 60
PASS_TOKEN = 2
CELL_TOKEN0 = 3
VOCAB = SPECIAL_TOKENS + ["pass"] + CELL_NAMES

_U = np.uint64
BITS = np.left_shift(_U(1), np.arange(64, dtype=np.uint64))  # BITS[c] = 1 << c
_INNER_COLS = _U(0x7E7E7E7E7E7E7E7E)  # files b..g
BLACK_START = int(BITS[35] | BITS[28])  # d5, e4
WHITE_START = int(BITS[27] | BITS[36])  # d4, e5

# (shift, left?, needs the inner-column mask): cell deltas +1, −1, +8, −8, +9, −9, +7, −7.
_DIRS = [
    (_U(1), True, True),
    (_U(1), False, True),
    (_U(8), True, False),
    (_U(8), False, False),
    (_U(9), True, True),
    (_U(9), False, True),
    (_U(7), True, True),
    (_U(7), False, True),
]


def _shift(b: np.ndarray, k: np.uint64, left: bool, out: np.ndarray | None = None) -> np.ndarray:
    return np.left_shift(b, k, out=out) if left else np.right_shift(b, k, out=out)


def legal_bitboard(own: np.ndarray, opp: np.ndarray) -> np.ndarray:
    """Legal cells (as a bitboard) of the player owning ``own``; any shape, uint64.

    Per direction: the opponent stones reachable from ``own`` by an unbroken run (≤ 6 long), then
    the empty cell just beyond.  For directions with a column step the opponent board is restricted
    to files b–g, which also removes every wrap-around between rows.
    """
    own, opp = np.broadcast_arrays(np.asarray(own, dtype=np.uint64), np.asarray(opp, dtype=np.uint64))
    empty = ~(own | opp)
    opp_in = opp & _INNER_COLS
    moves = np.zeros(own.shape, dtype=np.uint64)
    x = np.empty_like(moves)
    tmp = np.empty_like(moves)
    for k, left, inner in _DIRS:
        o = opp_in if inner else opp
        _shift(own, k, left, out=x)
        x &= o
        for _ in range(5):
            _shift(x, k, left, out=tmp)
            tmp &= o
            x |= tmp
        _shift(x, k, left, out=tmp)
        tmp &= empty
        moves |= tmp
    return moves


def flips(own: np.ndarray, opp: np.ndarray, move_bit: np.ndarray) -> np.ndarray:
    """The opponent stones flipped by playing ``move_bit``: ``own`` / ``opp`` (n,) uint64 bitboards of the
    player to move and of the opponent (bit c = cell c), ``move_bit`` (n,) uint64 with the played cell's
    bit (0 for a pass, which flips nothing); returns (n,) uint64 bitboards.  The move is not checked."""
    opp_in = opp & _INNER_COLS
    flips = np.zeros_like(own)
    zero = _U(0)
    for k, left, inner in _DIRS:
        o = opp_in if inner else opp
        x = _shift(move_bit, k, left) & o
        for _ in range(5):
            x |= _shift(x, k, left) & o
        closed = (_shift(x, k, left) & own) != zero
        flips |= np.where(closed, x, zero)
    return flips


def unpack_bits(b: np.ndarray) -> np.ndarray:
    """(...,) uint64 bitboards → (..., 64) uint8 with entry c = bit c."""
    b = np.asarray(b, dtype="<u8")
    flat = np.ascontiguousarray(b.reshape(-1))
    bits = np.unpackbits(flat.view(np.uint8).reshape(-1, 8), axis=1, bitorder="little")
    return bits.reshape(*b.shape, 64)


def pack_bits(cells: np.ndarray) -> np.ndarray:
    """(..., 64) bool/0-1 → (...,) uint64 bitboards (inverse of :func:`unpack_bits`)."""
    c = np.asarray(cells).astype(bool)
    if c.shape[-1:] != (64,):
        raise InputError(f"boards must have 64 cells in the last axis, got shape {c.shape}", "pass (..., 64) arrays")
    packed = np.ascontiguousarray(np.packbits(c, axis=-1, bitorder="little"))
    return packed.view("<u8").reshape(c.shape[:-1]).astype(np.uint64)


def legal_from_boards(boards: np.ndarray) -> np.ndarray:
    """Legal sets (..., 65) bool of boards (..., 64) in {−1, 0, +1} (perspective of the player to
    move); entry 64 (pass) is True when no cell is legal."""
    b = np.asarray(boards)
    moves = unpack_bits(legal_bitboard(pack_bits(b > 0), pack_bits(b < 0))).astype(bool)
    return np.concatenate([moves, ~moves.any(axis=-1, keepdims=True)], axis=-1)


def _feature_types(own: np.ndarray, opp: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """(n, 64) uint8 feature types of positions (own, opp) with legal bitboards ``legal``.

    The colour flips are evaluated only for occupied cells: each game's occupied cells are gathered
    into the first K columns (K = the largest stone count in the batch), the rest padded with no-ops.
    """
    n = own.shape[0]
    occ_bits = unpack_bits(own | opp).view(bool)  # (n, 64)
    k = int(occ_bits.sum(axis=1).max()) if n else 0
    cells = np.argsort(~occ_bits, axis=1, kind="stable")[:, :k]  # occupied cells first
    valid = np.take_along_axis(occ_bits, cells, axis=1)
    toggle = np.where(valid, BITS[cells], _U(0))  # the flipped stone, or 0
    changed = legal_bitboard(own[:, None] ^ toggle, opp[:, None] ^ toggle) != legal[:, None]
    out = np.zeros((n, 64), dtype=np.uint8)
    rows = np.broadcast_to(np.arange(n)[:, None], cells.shape)
    out[rows[valid], cells[valid]] = 1 + changed[valid]
    return out


@dataclass
class OthelloGames:
    """A batch of games.

    Attributes:
        moves: (n, L) int64, cells 0..63 or 64 (pass); L = 60 for generated games.
        boards: (n, L, 64) int8, position after move t from the next player's perspective.
        legal: (n, L, 65) bool, legal moves of the next player after move t (64 = pass).
        feature_types: (n, L, 64) uint8 (0 empty, 1 NTP-useless, 2 NTP-useful), or None.
    """

    moves: np.ndarray
    boards: np.ndarray
    legal: np.ndarray
    feature_types: np.ndarray | None

    def __len__(self) -> int:
        return int(self.moves.shape[0])


def initial_legal() -> np.ndarray:
    """(65,) bool legal set of black in the start position (d3, c4, f5, e6)."""
    own, opp = np.array([BLACK_START], dtype=np.uint64), np.array([WHITE_START], dtype=np.uint64)
    cells = unpack_bits(legal_bitboard(own, opp))[0].astype(bool)
    return np.append(cells, not cells.any())


def popcount(x: np.ndarray) -> np.ndarray:
    """Number of set bits of uint64 values (int64)."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return np.bitwise_count(x).astype(np.int64)
    return unpack_bits(x).sum(axis=-1, dtype=np.int64)


def _kth_bit(bb: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Cell of the ⌊u·c⌋-th lowest set bit of each bitboard (c = popcount); the same rule as
    :func:`~.base.choose_uniform` on the unpacked cells.  Empty boards give 0."""
    cnt = popcount(bb)
    k = np.minimum(np.floor(u * cnt).astype(np.int64), np.maximum(cnt - 1, 0))
    x = bb.copy()
    one = _U(1)
    for i in range(int(k.max()) if k.size else 0):  # clear the k lowest set bits
        x = np.where(k > i, x & (x - one), x)
    low = x & (~x + one)  # lowest remaining bit
    return np.where(low != _U(0), popcount(low - one), 0)


def _play(
    moves_out: np.ndarray, *, u: np.ndarray | None, check: bool, types_out: np.ndarray | None, offset: int = 0
) -> tuple[np.ndarray, ...]:
    """Play len(moves_out) games for moves_out.shape[1] moves.

    With ``u`` the moves are drawn and written into ``moves_out``; otherwise ``moves_out`` holds the
    moves to replay and (``check``) each is verified.  Feature types go into ``types_out`` (n, L, 64)
    when given.  Returns the per-move bitboards (own, opp, legal), each (n, L) uint64, from the next
    player's perspective.
    """
    n, length = moves_out.shape
    own = np.full(n, BLACK_START, dtype=np.uint64)
    opp = np.full(n, WHITE_START, dtype=np.uint64)
    legal = legal_bitboard(own, opp)
    hist = np.empty((3, length, n), dtype=np.uint64)
    zero = _U(0)
    for t in range(length):
        no_move = legal == zero
        if u is not None:
            mv = _kth_bit(legal, u[:, t])
            mv[no_move] = PASS
            moves_out[:, t] = mv
        else:
            mv = moves_out[:, t]
            if check:
                _check_moves(mv, legal, no_move, t, offset)
        move_bit = np.where(mv != PASS, BITS[np.minimum(mv, 63)], zero)
        flipped = flips(own, opp, move_bit)
        own, opp = opp & ~flipped, own | move_bit | flipped  # next player's perspective
        legal = legal_bitboard(own, opp)
        hist[0, t], hist[1, t], hist[2, t] = own, opp, legal
        if types_out is not None:
            types_out[:, t] = _feature_types(own, opp, legal)
    return hist[0].T, hist[1].T, hist[2].T


def _check_moves(mv: np.ndarray, legal: np.ndarray, no_move: np.ndarray, t: int, offset: int) -> None:
    bad = (mv < 0) | (mv > PASS)
    if bad.any():
        g = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"game {g + offset}, move {t}: value {int(mv[g])} is not a cell (0..63) or a pass (64)",
            "use move values 0..64",
        )
    is_pass = mv == PASS
    cell_ok = (np.right_shift(legal, np.minimum(mv, 63).astype(np.uint64)) & _U(1)) != _U(0)
    ok = np.where(is_pass, no_move, cell_ok)
    if not ok.all():
        g = int(np.flatnonzero(~ok)[0])
        colour = "black" if t % 2 == 0 else "white"
        allowed = [cell_name(int(c)) for c in np.flatnonzero(unpack_bits(legal[g]))] or ["pass"]
        what = "a pass is illegal while" if is_pass[g] else "illegal for"
        raise InputError(
            f"game {g + offset}, move {t} ({cell_name(mv[g])}): {what} {colour}"
            f"{' has legal moves' if is_pass[g] else ''}; legal: {' '.join(allowed)}",
            "give a legal record (moves are 0-based; black plays even moves; passes are explicit)",
        )


def _run(
    moves: np.ndarray, u: np.ndarray | None, feature_types: bool, chunk_size: int, *, compiled: bool = True
) -> OthelloGames:
    """Play (``u`` given: draw, else replay and check) the games; ``compiled`` picks the numba kernel of
    :mod:`.othello_kernels`, else the vectorised numpy engine :func:`_play` (the reference)."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
        raise ConfigError(f"chunk_size must be an integer >= 1, got {chunk_size!r}", "use e.g. 2048")
    n, length = moves.shape
    boards = np.empty((n, length, 64), dtype=np.int8)
    legal = np.empty((n, length, 65), dtype=bool)
    types = np.empty((n, length, 64), dtype=np.uint8) if feature_types else None
    if compiled:
        from .othello_kernels import play_games

        err_t = np.empty(n, dtype=np.int64)
        draw = u is not None
        uu = u if u is not None else np.zeros((0, 0))
        tt = types if types is not None else np.zeros((0, 0, 64), dtype=np.uint8)
        if play_games(moves, uu, draw, boards.view(np.uint64), legal, tt, True, feature_types, err_t):
            # the first illegal move (earliest move, then lowest game): the numpy engine words the error
            t_bad = np.where(err_t >= 0, err_t, np.iinfo(np.int64).max)
            g = int(np.lexsort((np.arange(n), t_bad))[0])
            _play(moves[g : g + 1], u=None, check=True, types_out=None, offset=g)
            raise AssertionError(f"game {g}: the compiled and numpy engines disagree on legality")  # unreachable
        return OthelloGames(moves, boards, legal, types)
    for a in range(0, n, chunk_size):
        b = min(n, a + chunk_size)
        own, opp, lg = _play(
            moves[a:b],
            u=None if u is None else u[a:b],
            check=u is None,
            types_out=None if types is None else types[a:b],
            offset=a,
        )
        np.subtract(unpack_bits(own).view(np.int8), unpack_bits(opp).view(np.int8), out=boards[a:b])
        legal[a:b, :, :64] = unpack_bits(lg).view(bool)
        legal[a:b, :, 64] = lg == _U(0)
    return OthelloGames(moves, boards, legal, types)


def generate_games(
    n: int, seed: int | np.random.Generator | None = 0, *, feature_types: bool = True, chunk_size: int = 1024
) -> OthelloGames:
    """n random games of 60 tokens (uniform over legal moves, passes when stuck).

    ``seed``: int or ``numpy.random.Generator`` (consumed: one (n, 60) uniform draw).
    ``feature_types=False`` skips the 64 colour-flip recomputations per position (much faster;
    enough for training data).  ``chunk_size``: games played at once by the numpy reference engine
    (validated, otherwise unused by the compiled kernel, which plays one game at a time; results
    never depend on it).
    """
    n = check_n(n)
    u = np.random.default_rng(seed).random((n, N_MOVES))
    return _run(np.empty((n, N_MOVES), dtype=np.int64), u, feature_types, chunk_size)


def generate_moves(n: int, seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """(n, 60) int64 moves of the games of :func:`generate_games` ``(n, seed)`` (the same uniforms are
    consumed), without boards or legal sets: for training data, which needs the tokens only."""
    n = check_n(n)
    return moves_from_uniforms(np.random.default_rng(seed).random((n, N_MOVES)))


def moves_from_uniforms(u: np.ndarray) -> np.ndarray:
    """(n, 60) int64 moves of the games played from the uniforms ``u`` (n, 60) (row g drives game g:
    :func:`generate_moves` with a generator is this on that generator's ``random((n, 60))``)."""
    from .othello_kernels import play_games

    u = np.ascontiguousarray(u, dtype=np.float64)
    if u.ndim != 2 or u.shape[1] != N_MOVES:
        raise InputError(f"uniforms of shape {u.shape}, need (n, {N_MOVES})", "draw generator.random((n, 60))")
    n = len(u)
    moves = np.empty((n, N_MOVES), dtype=np.int64)
    boards, legal, types = np.empty((0, 0, 8), np.uint64), np.empty((0, 0, 65), bool), np.empty((0, 0, 64), np.uint8)
    play_games(moves, u, True, boards, legal, types, False, False, np.empty(n, dtype=np.int64))
    return moves


def replay(moves: Any, *, feature_types: bool = True, chunk_size: int = 1024) -> OthelloGames:
    """Recompute boards, legal sets and feature types of given move sequences.

    ``moves``: (n, L) or (L,) integers (cells 0..63, pass 64), e.g. from :func:`parse_moves`.
    Raises :class:`InputError` naming the (0-based) game and move of the first illegal move
    (earliest move number; lowest game index among those).
    """
    arr = np.asarray(moves)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError(
            f"moves must be an integer array of shape (n, L) or (L,), got {arr.dtype} {arr.shape}",
            "pass cells 0..63 and passes 64",
        )
    return _run(arr.astype(np.int64, copy=True), None, feature_types, chunk_size)


# --------------------------------------------------------------------------------- LM tokens


def moves_to_tokens(moves: Any) -> np.ndarray:
    """Moves (cells 0..63, pass 64) → LM token ids (cell + 3, pass 2); same shape, int64."""
    m = np.asarray(moves, dtype=np.int64)
    if m.size and (m.min() < 0 or m.max() > PASS):
        raise InputError("moves outside 0..64", "use cells 0..63 and pass 64")
    return np.where(m == PASS, PASS_TOKEN, m + CELL_TOKEN0)


def tokens_to_moves(tokens: Any) -> np.ndarray:
    """LM token ids (pass 2, cells 3..66) → moves (cells 0..63, pass 64); same shape, int64."""
    t = np.asarray(tokens, dtype=np.int64)
    bad = (t < PASS_TOKEN) | (t >= len(VOCAB))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InputError(
            f"token {int(t[where])} at index {where} is not an Othello move token",
            f"strip <pad>/<bos> and use ids {PASS_TOKEN}..{len(VOCAB) - 1}",
        )
    return np.where(t == PASS_TOKEN, PASS, t - CELL_TOKEN0)


def _legal_to_vocab(legal65: np.ndarray) -> np.ndarray:
    out = np.zeros((*legal65.shape[:-1], len(VOCAB)), dtype=bool)
    out[..., PASS_TOKEN] = legal65[..., 64]
    out[..., CELL_TOKEN0:] = legal65[..., :64]
    return out


def render_board(board: Any) -> str:
    """Text diagram of one board (64,) in {−1,0,+1}: ``X`` own, ``O`` opponent, ``.`` empty; rank 8
    on top, files a–h left to right."""
    b = np.asarray(board).reshape(8, 8)
    sym = {1: "X", -1: "O", 0: "."}
    lines = [f"{r + 1} " + " ".join(sym[int(v)] for v in b[r]) for r in range(7, -1, -1)]
    return "\n".join(lines + ["  a b c d e f g h"])


# ----------------------------------------------------------------------------------- the task

CENTRAL_CELLS = tuple(CELL_NAMES[8 * r + c] for r in range(2, 6) for c in range(2, 6))


@dataclass
class OthelloTask:
    """Othello as an LM task: BOS + 60 move tokens (T = 61), 64 board features per position.

    ``with_feature_types=False`` leaves ``feature_types`` None (faster; enough for training).
    """

    with_feature_types: bool = True

    name: ClassVar[str] = "othello"

    @property
    def vocab(self) -> list[str]:
        return list(VOCAB)

    @property
    def vocab_size(self) -> int:
        return len(VOCAB)

    @property
    def seq_len(self) -> int:
        return 1 + N_MOVES

    @property
    def feature_names(self) -> list[str]:
        return list(CELL_NAMES)

    @property
    def tracked(self) -> Tracked:
        return Tracked(
            layers=(1, 2, 3, 4, 5, 6),
            positions=tuple(range(4, 57, 4)),
            features=CENTRAL_CELLS,
            one_position_per_run=True,
            per_type=True,
        )

    def sample(self, n: int, rng: np.random.Generator) -> TaskBatch:
        """Draw n games; ``metadata["moves"]`` (n, 60) holds the raw moves."""
        games = generate_games(n, rng, feature_types=self.with_feature_types)
        return self.batch_from_games(games)

    def batch_from_games(self, games: OthelloGames) -> TaskBatch:
        """Wrap :class:`OthelloGames` as a :class:`TaskBatch` (prepends the BOS position)."""
        n, length = games.moves.shape
        tokens = np.empty((n, length + 1), dtype=np.int64)
        tokens[:, 0] = BOS_ID
        tokens[:, 1:] = moves_to_tokens(games.moves)
        features = np.zeros((n, length + 1, 64), dtype=np.float32)
        features[:, 1:] = games.boards
        types = None
        if games.feature_types is not None:
            types = np.zeros((n, length + 1, 64), dtype=np.uint8)
            types[:, 1:] = games.feature_types
        legal = np.empty((n, length + 1, len(VOCAB)), dtype=bool)
        legal[:, 0] = _legal_to_vocab(initial_legal())
        legal[:, 1:] = _legal_to_vocab(games.legal)
        return TaskBatch(
            tokens=tokens,
            features=features,
            feature_names=self.feature_names,
            feature_types=types,
            legal=legal,
            useful_positions=None,
            metadata={"task": self.name, "moves": games.moves},
        )
