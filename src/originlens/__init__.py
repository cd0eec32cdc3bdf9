"""originlens: where do transformer features come from?

Implements the corpus-statistic leading terms of arXiv 2601.19208 and the gradient pathways of
arXiv 2603.14087.  The public API below is imported lazily (``import originlens`` stays cheap and
does not import torch until a model is used).
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API = {
    # errors
    "OriginlensError": "originlens.errors",
    # data
    "build_corpus": "originlens.data",
    "TokenStore": "originlens.data",
    "load_token_array": "originlens.data",
    "WordTokenizer": "originlens.data",
    "generate_stories": "originlens.data",
    # statistics
    "corpus_statistics": "originlens.stats",
    "CorpusStatistics": "originlens.stats",
    "top_associations": "originlens.stats",
    "save_statistics": "originlens.stats",
    "load_statistics": "originlens.stats",
    # models
    "GPT": "originlens.models",
    "GPTConfig": "originlens.models",
    # reports
    "Report": "originlens.report",
}

__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str) -> Any:
    mod = _API.get(name)
    if mod is None:
        raise AttributeError(f"module 'originlens' has no attribute '{name}'")
    value = getattr(importlib.import_module(mod), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
