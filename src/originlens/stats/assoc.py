"""Top associations of a token under a basis map (arXiv 2601.19208, Figure 5).

``top_associations(stats, "context", "fish", k=10)`` returns the k largest entries of the token's row
(``direction="row"``) or column (``direction="column"``) of the chosen matrix, as (token, value) pairs.
Rows/columns follow the orientation table of :mod:`originlens.stats.corpus`: for ``bigram`` a row is
"what follows this token", a column "what precedes it"; for ``context`` a row is "the context this token
appears in" (target × prefix), a column "the targets this prefix token predicts".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import numpy as np

from ..errors import ConfigError, OriginlensError
from .corpus import CorpusStatistics

BASES = ("bigram", "interchangeability", "context", "value_target", "query_key")


def basis_matrix(stats: CorpusStatistics, basis: str) -> np.ndarray:
    if basis not in BASES:
        raise ConfigError(f"unknown basis '{basis}'", f"choose one of {', '.join(BASES)}")
    return getattr(stats, basis)


def top_associations(
    stats: CorpusStatistics,
    basis: str,
    token: str | int,
    k: int = 10,
    *,
    direction: Literal["row", "column"] = "row",
    exclude_self: bool = True,
    exclude: Iterable[str | int] = (),
) -> list[tuple[str, float]]:
    """The ``k`` strongest associations of ``token`` (string or original id) under ``basis``.

    ``exclude`` lists tokens (e.g. ``"<unk>"``) never to report; unknown ones are ignored.
    """
    if k < 1:
        raise ConfigError(f"k must be ≥ 1 (got {k})", "pass -k 10 or similar")
    if direction not in ("row", "column"):
        raise ConfigError(f"direction must be 'row' or 'column' (got {direction})", "use row or column")
    M = basis_matrix(stats, basis)
    i = stats.index_of(token)
    vec = np.array(M[i] if direction == "row" else M[:, i], dtype=np.float64)
    if exclude_self:
        vec[i] = -np.inf
    for tok in exclude:
        try:
            vec[stats.index_of(tok)] = -np.inf
        except OriginlensError:
            pass
    k = min(k, int(np.isfinite(vec).sum()))
    if k == 0:
        return []
    top = np.argpartition(-vec, k - 1)[:k] if k < len(vec) else np.arange(len(vec))
    top = top[np.lexsort((top, -vec[top]))]
    return [(stats.token_name(int(j)), float(vec[j])) for j in top[:k]]
