"""The Othello experiment's configuration (:mod:`.othello`): its scales, the run's settings, and the
sampling design of the strata — which updates a stratum covers and which checkpoint each (seed, stratum)
segment starts from (:mod:`.othello_strata` attributes them).

At the bottom of the experiment: every other Othello module imports from here, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError
from .config_checks import check_overrides, check_scale, check_seeds

SCALES: dict[str, dict[str, Any]] = {
    "paper": dict(
        n_layer=6,
        d_model=256,
        n_head=4,
        batch_size=1024,
        steps=5000,
        eval_size=20480,
        othello_pool=500_000,
        positions=list(range(4, 57, 4)),
        checkpoint_every=500,
        strata=10,
        burn_in=50,
        stratum_updates=50,
        check_updates=1200,
        check_positions=[24],
        lr_decay=None,
    ),
    "cpu": dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        batch_size=64,
        steps=12000,
        eval_size=4096,
        othello_pool=500_000,
        positions=[12, 24, 36, 48],
        checkpoint_every=300,
        strata=10,
        burn_in=50,
        stratum_updates=50,
        check_updates=1200,
        check_positions=[24],
        lr_decay=[9600, 12000],
    ),
    "ci": dict(
        n_layer=2,
        d_model=32,
        n_head=2,
        batch_size=16,
        steps=30,
        eval_size=200,
        othello_pool=2000,
        positions=[8, 20],
        checkpoint_every=3,
        strata=5,
        burn_in=1,
        stratum_updates=2,
        check_updates=12,
        check_positions=[8],
        lr_decay=None,
    ),
}
STAGES = ("all", "train", "stratum", "mismatch", "check", "combine")


@dataclass
class OthelloConfig:
    """Seeds × the scale's model; ``overrides`` replace scale fields (each recorded as a deviation).
    ``strata_run``: the strata a ``stratum`` stage attributes (default all)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    layers: list[int] | None = None  # attributed layers (default 1..L)
    random_directions: int = 2
    overrides: dict[str, Any] = field(default_factory=dict)
    lr: float = 1e-3
    device: str = "cpu"
    confidence: float = 0.95
    matmul_precision: str = "highest"  # "tf32": CUDA products in TF32 (training and replay)
    replay_rtol: float = 0.0  # tolerance of the replay's checks against training (0: bit-exact)
    strata_run: list[int] | None = None

    def __post_init__(self) -> None:
        check_scale(self.scale, SCALES)
        check_overrides(self.overrides, SCALES["paper"])
        check_seeds(self.seeds)
        s = self.settings
        L = s["n_layer"]
        if any(not 1 <= k <= L for k in self.attr_layers):
            raise ConfigError(f"attributed layers {self.attr_layers} outside 1..{L}", f"use layers in 1..{L}")
        for key in ("positions", "check_positions"):
            if not s[key] or any(not 1 <= i <= 59 for i in s[key]):
                raise ConfigError(f"{key} {s[key]} must be non-empty and lie in 1..59", "e.g. 12,24,36,48")
        if not set(s["check_positions"]) <= set(s["positions"]):
            raise ConfigError(
                f"check positions {s['check_positions']} are not among the probed positions {s['positions']}",
                "check at probed positions",
            )
        if not self.replay_rtol >= 0:
            raise ConfigError(f"replay_rtol={self.replay_rtol!r} must be ≥ 0", "use 0 (bit-exact) on the CPU")
        cu = s["check_updates"]
        if isinstance(cu, bool) or not isinstance(cu, int) or not 1 <= cu <= s["steps"]:
            raise ConfigError(f"check_updates={cu!r} outside 1..{s['steps']}", "e.g. a tenth of training")
        validate_strata(self)
        if self.strata_run is not None and any(not 0 <= h < s["strata"] for h in self.strata_run):
            raise ConfigError(f"strata {self.strata_run} outside 0..{s['strata'] - 1}", "e.g. strata 0-9")
        self.ntp_config(self.seeds[0], initial=False)  # the trainer's own validation

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def attr_layers(self) -> list[int]:
        return list(range(1, self.settings["n_layer"] + 1)) if self.layers is None else list(self.layers)

    @property
    def strata(self) -> list[int]:
        return list(range(int(self.settings["strata"]))) if self.strata_run is None else list(self.strata_run)

    @property
    def curve_every(self) -> int:
        """Held-out evaluation every tenth of training (the learning curve's points)."""
        return max(1, self.settings["steps"] // 10)

    def ntp_config(self, seed: int, *, initial: bool) -> Any:
        from ..train.ntp import NTPConfig

        s = self.settings
        return NTPConfig(
            task="othello",
            regime="standard",
            seed=int(seed),
            n_layer=s["n_layer"],
            d_model=s["d_model"],
            n_head=s["n_head"],
            batch_size=s["batch_size"],
            steps=0 if initial else s["steps"],
            lr=self.lr,
            eval_size=s["eval_size"],
            othello_pool=s["othello_pool"],
            probe_positions=sorted(s["positions"]),
            probe_every=0,
            lr_decay=None if initial else s.get("lr_decay"),
            eval_every=0 if initial else self.curve_every,
            checkpoint_every=0 if initial else int(s["checkpoint_every"]),
            keep_checkpoints=0,
            device=self.device,
            matmul_precision=self.matmul_precision,
        )

    def sampled_fraction(self) -> float:
        """The fraction of training's updates whose influence is recorded."""
        s = self.settings
        return s["strata"] * s["stratum_updates"] / s["steps"]

    def deviations(self) -> list[str]:
        paper, used = SCALES["paper"], self.settings
        out = [
            f"{k} {used[k]} (paper {paper[k]})"
            for k in ("n_layer", "d_model", "n_head", "batch_size", "steps", "eval_size")
            if used[k] != paper[k]
        ]
        if used["positions"] != paper["positions"]:
            out.append(f"attributed positions {used['positions']} (paper 4, 8, …, 56)")
        if used.get("lr_decay"):
            a, b = used["lr_decay"]
            out.append(f"learning rate cooled down linearly over updates {a}..{b} (paper: constant)")
        out.append(
            f"influence integrated over all {used['steps']} updates by a stratified sample: {used['strata']} "
            f"strata, in each {used['burn_in']} burn-in and {used['stratum_updates']} recorded updates from a "
            f"checkpoint drawn per seed ({self.sampled_fraction():.1%} of updates recorded; paper: every update)"
        )
        if len(self.seeds) != 1:
            out.append(f"{len(self.seeds)} seeds (paper 1)")
        return out

    @property
    def name(self) -> str:
        return f"othello-{self.scale}"


def stratum_bounds(config: OthelloConfig, h: int) -> tuple[int, int]:
    """Stratum h covers updates lo+1..hi: (lo, hi) = (hN, (h+1)N), N = steps / strata (the last stratum
    takes the remainder)."""
    s = config.settings
    H, S = int(s["strata"]), int(s["steps"])
    if not 0 <= h < H:
        raise ConfigError(f"stratum {h} outside 0..{H - 1}", f"choose strata in 0..{H - 1}")
    N = S // H
    return h * N, (S if h == H - 1 else (h + 1) * N)


def segment_length(config: OthelloConfig) -> int:
    s = config.settings
    return int(s["burn_in"]) + int(s["stratum_updates"])


def segment_starts(config: OthelloConfig, h: int) -> list[int]:
    """The checkpoints c of stratum h whose segment c+1..c+burn_in+stratum_updates lies in the stratum."""
    lo, hi = stratum_bounds(config, h)
    every = int(config.settings["checkpoint_every"])
    return [c for c in range(lo + (-lo) % every, hi, every) if c + segment_length(config) <= hi]


def stratum_segment(config: OthelloConfig, seed: int, h: int) -> tuple[int, int, list[int]]:
    """(start checkpoint c, end, recorded updates) of stratum h of ``seed``: c drawn uniformly among
    :func:`segment_starts` by ``default_rng([seed, 38, h])``."""
    starts = segment_starts(config, h)
    if not starts:
        lo, hi = stratum_bounds(config, h)
        raise ConfigError(
            f"no checkpoint of stratum {h} (updates {lo + 1}..{hi}) leaves room for burn_in + stratum_updates = "
            f"{segment_length(config)} updates",
            "checkpoint more often (checkpoint_every), use fewer strata or shorter segments",
        )
    c = starts[int(np.random.default_rng([int(seed), 38, int(h)]).integers(len(starts)))]
    b, n = int(config.settings["burn_in"]), int(config.settings["stratum_updates"])
    return c, c + b + n, list(range(c + b + 1, c + b + n + 1))


def validate_strata(config: OthelloConfig) -> None:
    """Every stratum has a segment, and the burn-in lets the carried share fall below 1 % (β1 = 0.9)."""
    s = config.settings
    for key in ("strata", "burn_in", "stratum_updates", "checkpoint_every"):
        v = s[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "burn_in" else 1):
            raise ConfigError(f"{key}={v!r} must be a positive integer", f"e.g. {key} 10")
    if int(s["strata"]) > int(s["steps"]):
        raise ConfigError(f"strata={s['strata']} exceed the {s['steps']} updates", "use fewer strata")
    for h in range(int(s["strata"])):
        if not segment_starts(config, h):
            stratum_segment(config, 0, h)  # raises the explanation
    if config.scale != "ci" and 0.9 ** int(s["burn_in"]) > 0.01:
        raise ConfigError(
            f"burn_in={s['burn_in']} leaves a carried share of 0.9^{s['burn_in']} = {0.9 ** int(s['burn_in']):.3g} "
            "of the first moment at the first recorded update (> 1 %)",
            "use burn_in ≥ 44 (0.9⁴⁴ < 1 %)",
        )
