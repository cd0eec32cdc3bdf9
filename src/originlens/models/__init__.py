"""Model definitions for the gradient-pathways lab (``gpt``: pre-LN GPT-2-style decoder)."""
from .gpt import GPT, GPTConfig

__all__ = ["GPT", "GPTConfig"]
