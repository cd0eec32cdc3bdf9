"""Othello move notation: cell names and move-record strings.

Cells are numbered ``cell = 8·row + col`` with row 0–7 for ranks 1–8 and col 0–7 for files a–h
(a1 = 0, h1 = 7, a8 = 56, h8 = 63); 64 (:data:`PASS`) is a pass.

Record syntax accepted by :func:`parse_moves` (case-insensitive): a concatenation of cells
``[a-h][1-8]`` and passes written ``pass``, ``pa`` or ``--``; whitespace and commas between moves are
ignored (``"f5d6c3"``, ``"F5 D6 C3"``, ``"f5,--,d6"`` all work).  :func:`format_moves` writes lower-case
cells and ``--`` for passes with no separator, so ``parse_moves(format_moves(m))`` returns m.

Caveat: passes must be explicit; records that silently skip a forced pass (common in game databases)
are rejected by :func:`~originlens.tasks.othello.replay` at the first move of the wrong colour.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..errors import InputError

PASS = 64
FILES = "abcdefgh"
CELL_NAMES = [f"{FILES[c % 8]}{c // 8 + 1}" for c in range(64)]
PASS_NAME = "--"

_TOKEN = re.compile(r"(pass|pa|--)|([a-h][1-8])|([\s,]+)", re.IGNORECASE)


def cell_name(move: int) -> str:
    """Name of a move: ``'d3'`` for cell 19, ``'--'`` for a pass."""
    m = int(move)
    if m == PASS:
        return PASS_NAME
    if not 0 <= m < 64:
        raise InputError(f"move {m} is not a cell (0..63) or a pass (64)", "use values 0..64")
    return CELL_NAMES[m]


def parse_cell(name: str) -> int:
    """Cell index of a name such as ``'d3'`` (case-insensitive); passes give :data:`PASS`."""
    moves = parse_moves(name)
    if moves.size != 1:
        raise InputError(f"{name!r} is not a single move", "write one cell like 'd3' or 'pass'")
    return int(moves[0])


def parse_moves(text: str) -> np.ndarray:
    """Parse a move record into a (L,) int64 array of cells 0..63 and passes (64).

    Raises:
        InputError: with the character offset of the first unreadable text.
    """
    if not isinstance(text, str):
        raise InputError(f"move record must be a string, got {type(text).__name__}", "pass text like 'f5d6c3'")
    out: list[int] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            snippet = text[pos : pos + 6]
            raise InputError(
                f"cannot read move record at offset {pos}: {snippet!r}",
                "write cells as a1..h8 and passes as 'pass', 'pa' or '--'",
            )
        if m.group(1):
            out.append(PASS)
        elif m.group(2):
            cell = m.group(2).lower()
            out.append(8 * (int(cell[1]) - 1) + FILES.index(cell[0]))
        pos = m.end()
    return np.asarray(out, dtype=np.int64)


def format_moves(moves: Any, sep: str = "") -> str | list[str]:
    """Format moves (L,) as one record string, or (n, L) as a list of strings.

    Cells are lower-case, passes ``--``; ``sep`` is put between moves.
    """
    arr = np.asarray(moves)
    if arr.ndim == 2:
        return [str(format_moves(row, sep)) for row in arr]
    if arr.ndim != 1:
        raise InputError(f"moves must be 1-D or 2-D, got shape {arr.shape}", "pass (L,) or (n, L)")
    return sep.join(cell_name(m) for m in arr.tolist())
