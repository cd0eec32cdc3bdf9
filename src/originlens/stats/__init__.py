"""Corpus statistics ("basis functions") of arXiv 2601.19208: B̄, Σ, Φ̄, Φ̄ᵀB̄ᵀ, Q̄, Δ."""

from .assoc import BASES, basis_matrix, top_associations
from .corpus import (
    STAT_KEYS,
    CorpusStatistics,
    FirstOrder,
    FirstOrderSums,
    SecondOrderSums,
    assemble,
    corpus_statistics,
    most_frequent_tokens,
)
from .io import load_statistics, save_statistics, stream_statistics

__all__ = [
    "BASES",
    "STAT_KEYS",
    "CorpusStatistics",
    "FirstOrder",
    "FirstOrderSums",
    "SecondOrderSums",
    "assemble",
    "basis_matrix",
    "corpus_statistics",
    "load_statistics",
    "most_frequent_tokens",
    "save_statistics",
    "stream_statistics",
    "top_associations",
]
