"""Corpus statistics ("basis functions") of arXiv 2601.19208: B̄, Σ, Φ̄, Φ̄ᵀB̄ᵀ, Q̄, Δ."""
from .assoc import BASES, basis_matrix, top_associations
from .corpus import (STAT_KEYS, CorpusStatistics, FirstOrder, FirstOrderSums, SecondOrderSums, assemble,
                     corpus_statistics, most_frequent_tokens)
from .io import load_statistics, save_statistics

__all__ = ["STAT_KEYS", "BASES", "CorpusStatistics", "FirstOrder", "FirstOrderSums", "SecondOrderSums",
           "assemble", "corpus_statistics", "most_frequent_tokens", "top_associations", "basis_matrix",
           "save_statistics", "load_statistics"]
