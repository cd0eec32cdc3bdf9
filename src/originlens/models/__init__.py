"""Models: ``gpt`` (pre-LN GPT-2-style decoder with standard / myopic / untied regimes) and ``assoc``
(the one-hot attention-only model of arXiv 2601.19208, Def. 3.1)."""

from .assoc import AssocConfig, AssocModel, load_assoc
from .gpt import GPT, GPTConfig

__all__ = ["GPT", "AssocConfig", "AssocModel", "GPTConfig", "load_assoc"]
