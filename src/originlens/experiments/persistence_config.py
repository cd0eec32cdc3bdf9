"""The persistence experiment's configuration (:mod:`.persistence`): its scales, the (η × seeds) grid,
the logging points and the deviations from the paper's protocol.

At the bottom of the experiment: :mod:`.persistence`, :mod:`.persistence_analysis` and
:mod:`.persistence_report` import from here, never the reverse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config_checks import check_overrides, check_scale, check_seeds

EXPERIMENT = "leading-terms"
PAPER_STEPS_PER_EPOCH = 32
SCALES: dict[str, dict[str, Any]] = {
    "paper": dict(
        vocab_size=3000,
        seq_len=200,
        windows="first",
        oov="drop",
        max_windows=65536,
        layers=3,
        batch_size=2048,
        steps=3200,
        log_every=64,
        corpus="tinystories",
        tokenizer="words",
        lrs=[0.005, 0.05],
    ),
    "cpu": dict(
        vocab_size=500,
        seq_len=32,
        windows="pack",
        oov="unk",
        max_windows=None,
        layers=3,
        batch_size=512,
        steps=3200,
        log_every=64,
        corpus="tinystories",
        tokenizer="words",
        lrs=[0.005, 0.05],
    ),
    # Table 2: BPE (HF tokenizers, specials <unk> <pad> <s> </s>, each text wrapped in <s> … </s>), the
    # first T + 1 tokens of each story, 10 epochs capped at 50 steps, logging every 0.1 epoch, η = 0.005
    "paper-bpe": dict(
        vocab_size=10000,
        seq_len=200,
        windows="first",
        oov="drop",
        max_windows=102400,
        layers=3,
        batch_size=2048,
        steps=500,
        log_every=5,
        corpus="tinystories",
        tokenizer="bpe",
        lrs=[0.005],
    ),
    "cpu-bpe": dict(
        vocab_size=500,
        seq_len=32,
        windows="first",
        oov="drop",
        max_windows=None,
        layers=3,
        batch_size=512,
        steps=500,
        log_every=5,
        corpus="tinystories",
        tokenizer="bpe",
        lrs=[0.005],
    ),
    "ci": dict(
        vocab_size=80,
        seq_len=16,
        windows="pack",
        oov="unk",
        max_windows=None,
        layers=2,
        batch_size=32,
        steps=24,
        log_every=4,
        corpus="storyworld",
        tokenizer="words",
        lrs=[0.005, 0.05],
    ),
}
SUMMARIES = {
    "paper": "the paper's configuration (Table 1, Fig. 4)",
    "cpu": "a CPU-sized corpus (Table 1, Fig. 4)",
    "paper-bpe": "the paper's BPE configuration (Table 2)",
    "cpu-bpe": "a CPU-sized BPE corpus (Table 2's protocol)",
    "ci": "a plumbing check, not a result",
}
PAPER_OF = {"paper": "paper", "cpu": "paper", "ci": "paper", "paper-bpe": "paper-bpe", "cpu-bpe": "paper-bpe"}


@dataclass
class PersistenceConfig:
    """Learning rates × seeds at one scale; ``overrides`` replace scale fields (recorded as deviations)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    lrs: list[float] | None = None  # default: the scale's
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95

    def __post_init__(self) -> None:
        check_scale(self.scale, SCALES)
        check_overrides(self.overrides, sorted(set(SCALES["paper"]) - {"lrs"}), also="and lrs=")
        check_seeds(self.seeds)
        if self.lrs is None:
            self.lrs = list(SCALES[self.scale]["lrs"])
        if not self.lrs or any(not (isinstance(x, (int, float)) and x > 0 and math.isfinite(x)) for x in self.lrs):
            raise ConfigError(f"learning rates must be positive numbers, got {self.lrs!r}", "e.g. --lrs 0.005,0.05")
        s = self.settings
        for key in ("steps", "log_every", "batch_size", "layers", "vocab_size", "seq_len"):
            v = s[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{key}={v!r} must be an integer ≥ 1", f"pass a positive {key}")
        if s["tokenizer"] not in ("words", "bpe"):
            raise ConfigError(f"tokenizer {s['tokenizer']!r} unknown", "use words or bpe")
        if s["corpus"] not in ("tinystories", "storyworld"):
            raise ConfigError(f"corpus {s['corpus']!r} unknown", "use tinystories or storyworld")

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def name(self) -> str:
        return f"persistence-{self.scale}"

    @property
    def logging_points(self) -> list[int]:
        s = self.settings
        return sorted({*range(s["log_every"], s["steps"] + 1, s["log_every"]), s["steps"]})

    @property
    def epoch30_step(self) -> int:
        """The paper's epoch 30 in steps (32 steps per paper epoch), capped at the run's length."""
        return min(30 * PAPER_STEPS_PER_EPOCH, self.settings["steps"])

    @property
    def paper_scale(self) -> str:
        """The paper's protocol this scale stands for: ``paper`` (Table 1, Fig. 4) or ``paper-bpe`` (Table 2)."""
        return PAPER_OF[self.scale]

    def deviations(self) -> list[str]:
        paper, used = SCALES[self.paper_scale], self.settings
        out = [
            f"{k} {used[k]} (paper {paper[k]})"
            for k in (
                "vocab_size",
                "seq_len",
                "windows",
                "oov",
                "max_windows",
                "layers",
                "batch_size",
                "steps",
                "log_every",
                "corpus",
                "tokenizer",
            )
            if used[k] != paper[k]
        ]
        if len(self.seeds) != 1:
            out.append(f"{len(self.seeds)} data-order seeds (paper 1, seed 42)")
        return out

    def train_config(self, lr: float, seed: int, out: Path) -> Any:
        from ..train.assoc import AssocTrainConfig

        s = self.settings
        return AssocTrainConfig(
            n_layers=s["layers"],
            lr=float(lr),
            steps=s["steps"],
            batch_size=s["batch_size"],
            init="zero",
            dtype="float32",
            data_seed=42 + int(seed),
            checkpoint_every=s["log_every"],
            keep_checkpoints=2,
            log_every=1,
            stats_source="first_batch",
            out=str(out),
        )


# ----------------------------------------------------------------------------------------------------
# the runs
