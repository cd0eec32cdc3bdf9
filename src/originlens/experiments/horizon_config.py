"""The horizon study's configuration (:mod:`.horizon`): its scales and the (|V|, T) grid × seeds.

At the bottom of the experiment: :mod:`.horizon`, :mod:`.horizon_analysis` and :mod:`.horizon_report`
import from here, never the reverse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config_checks import check_overrides, check_scale, check_seeds

EXPERIMENT = "leading-terms"
SCALES: dict[str, dict[str, Any]] = {
    # |V| doubling from 50 to 400, T 16 and 32, at the paper's large η up to t = 50 (its epoch-30 point is
    # t = 48).  Measured on one core (T 16, 1,000 steps): |V| 100 ≈ 1 min, 200 ≈ 3.5 min, 400 ≈ 7 min a run;
    # the cost grows like |V|³, so |V| 800 (≈ 1 h a run) does not fit a CPU budget.
    "cpu": dict(
        vocab_sizes=[50, 100, 200, 400],
        seq_lens=[16, 32],
        layers=3,
        batch_size=256,
        lr=0.05,
        max_steps=1000,
        windows="pack",
        oov="unk",
        corpus="tinystories",
    ),
    "ci": dict(
        vocab_sizes=[40, 80],
        seq_lens=[8, 16],
        layers=2,
        batch_size=32,
        lr=2.0,
        max_steps=30,
        windows="pack",
        oov="unk",
        corpus="storyworld",
    ),
}
ALPHA = 0.05


@dataclass
class HorizonConfig:
    """The (|V|, T) grid × seeds at one scale; ``overrides`` replace scale fields."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95

    def __post_init__(self) -> None:
        check_scale(self.scale, SCALES)
        check_overrides(self.overrides, SCALES["cpu"])
        check_seeds(self.seeds)
        s = self.settings
        for key in ("vocab_sizes", "seq_lens"):
            v = s[key]
            if not v or any(isinstance(x, bool) or not isinstance(x, int) or x < 2 for x in v):
                raise ConfigError(f"{key}={v!r} must be a list of integers ≥ 2", "e.g. 150,300,600,1000")
        for key in ("layers", "batch_size", "max_steps"):
            if isinstance(s[key], bool) or not isinstance(s[key], int) or s[key] < 1:
                raise ConfigError(f"{key}={s[key]!r} must be an integer ≥ 1", f"pass a positive {key}")
        if not (isinstance(s["lr"], (int, float)) and s["lr"] > 0 and math.isfinite(s["lr"])):
            raise ConfigError(f"lr={s['lr']!r} must be a positive number", "e.g. 0.05")

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def name(self) -> str:
        return f"horizon-{self.scale}"

    @property
    def cells(self) -> list[tuple[int, int]]:
        s = self.settings
        return [(v, t) for t in s["seq_lens"] for v in s["vocab_sizes"]]

    def train_config(self, seed: int, out: Path) -> Any:
        from ..train.assoc import AssocTrainConfig

        s = self.settings
        return AssocTrainConfig(
            n_layers=s["layers"],
            lr=float(s["lr"]),
            steps=s["max_steps"],
            batch_size=s["batch_size"],
            init="zero",
            dtype="float32",
            data_seed=42 + int(seed),
            checkpoint_every=max(1, s["max_steps"] // 10),
            keep_checkpoints=2,
            log_every=1,
            stats_source="first_batch",
            out=str(out),
        )
