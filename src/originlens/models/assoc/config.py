"""Shape and initialisation of the one-hot attention model (:class:`AssocConfig`), the implementation names and
the artefact kinds.  Part of :mod:`originlens.models.assoc`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ...errors import ConfigError

IMPLS = ("auto", "paths", "gather", "dense")
MODEL_KIND = "assoc-model"
CHECKPOINT_KIND = "assoc-checkpoint"


@dataclass
class AssocConfig:
    """Shape and initialisation of an :class:`AssocModel`.

    ``init``: ``"zero"`` (paper experiments, Thm D.9) or ``"gaussian"`` (i.i.d. N(0, init_std²) on every
    parameter, Thm D.12 uses std = v/|V|^{1+ξ}).  ``seed`` seeds the Gaussian draw.
    """

    vocab_size: int
    seq_len: int
    n_layers: int = 3
    init: str = "zero"
    init_std: float = 0.0
    dtype: str = "float32"
    seed: int = 0
    impl: str = "auto"

    def validate(self) -> None:
        if int(self.vocab_size) < 1:
            raise ConfigError(f"vocab_size must be ≥ 1 (got {self.vocab_size})", "pass a positive vocabulary size")
        if int(self.seq_len) < 1:
            raise ConfigError(f"seq_len must be ≥ 1 (got {self.seq_len})", "pass T ≥ 1")
        if int(self.n_layers) < 1:
            raise ConfigError(f"n_layers must be ≥ 1 (got {self.n_layers})", "pass L ≥ 1")
        if self.init not in ("zero", "gaussian"):
            raise ConfigError(f"unknown init '{self.init}'", "use init='zero' or init='gaussian'")
        if self.init == "gaussian" and not (self.init_std > 0 and math.isfinite(self.init_std)):
            raise ConfigError(f"gaussian init needs init_std > 0 (got {self.init_std})", "pass init_std")
        if self.dtype not in ("float32", "float64"):
            raise ConfigError(f"dtype must be float32 or float64 (got {self.dtype})", "pick one of the two")
        if self.impl not in IMPLS:
            raise ConfigError(f"unknown impl '{self.impl}'", f"use one of {', '.join(IMPLS)}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32


def weight_names(n_layers: int) -> list[str]:
    """On-disk names in a fixed order: ``W_O``, then ``W.l``, ``V.l``, ``P.l`` for l = 1..L."""
    names = ["W_O"]
    for l in range(1, n_layers + 1):
        names += [f"W.{l}", f"V.{l}", f"P.{l}"]
    return names
