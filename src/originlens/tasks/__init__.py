"""Synthetic worlds of the gradient-pathways paper (arXiv 2603.14087): Majority, Conditioned Majority, Othello.

``get_task(name, **kw)`` builds a task (``majority``, ``cond-majority``, ``othello``); ``task.sample(n,
rng)`` returns a :class:`TaskBatch` (tokens, features, feature types, legal next-token sets).  The
Othello engine (:func:`generate_games`, :func:`replay`) and the move notation are usable on their own.
"""

from __future__ import annotations

from .base import (
    BOS_ID,
    PAD_ID,
    TYPE_NONE,
    TYPE_USEFUL,
    TYPE_USELESS,
    Task,
    TaskBatch,
    Tracked,
    first_output_accuracy,
    get_task,
    legal_accuracy,
    legal_hits,
    output_legal_accuracy,
    task_metrics,
    task_names,
)
from .majority import CondMajorityTask, MajorityTask
from .notation import PASS, cell_name, format_moves, parse_cell, parse_moves
from .othello import (
    OthelloGames,
    OthelloTask,
    generate_games,
    legal_from_boards,
    moves_to_tokens,
    render_board,
    replay,
    tokens_to_moves,
)

__all__ = [
    "BOS_ID",
    "PAD_ID",
    "PASS",
    "TYPE_NONE",
    "TYPE_USEFUL",
    "TYPE_USELESS",
    "CondMajorityTask",
    "MajorityTask",
    "OthelloGames",
    "OthelloTask",
    "Task",
    "TaskBatch",
    "Tracked",
    "cell_name",
    "first_output_accuracy",
    "format_moves",
    "generate_games",
    "get_task",
    "legal_accuracy",
    "legal_from_boards",
    "legal_hits",
    "moves_to_tokens",
    "output_legal_accuracy",
    "parse_cell",
    "parse_moves",
    "render_board",
    "replay",
    "task_metrics",
    "task_names",
    "tokens_to_moves",
]
