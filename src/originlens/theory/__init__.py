"""Closed-form theory: gradient leading terms of the attention-only model (arXiv 2601.19208)."""

from .leading_terms import (
    LeadingTermModel,
    ValidityWindow,
    attention_coef,
    attention_count,
    compare_to_theory,
    conditional_bigram_loss,
    cosine,
    error_bounds,
    min_cosines,
    norm_ratio,
    output_coef,
    position_coef,
    predicted_weights,
    validity_window,
    value_coef,
)

__all__ = [
    "LeadingTermModel",
    "ValidityWindow",
    "attention_coef",
    "attention_count",
    "compare_to_theory",
    "conditional_bigram_loss",
    "cosine",
    "error_bounds",
    "min_cosines",
    "norm_ratio",
    "output_coef",
    "position_coef",
    "predicted_weights",
    "validity_window",
    "value_coef",
]
