"""The paper-scale run's configuration (:mod:`.paper_scale`): the budget, the device and what runs in it.

At the bottom of the experiment: :mod:`.paper_scale` and :mod:`.paper_scale_calibration` import from
here, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError

EXPERIMENT = "paper-scale"
TOY_TASKS = ("cond-majority", "majority")
SEED_ROUNDS = (3, 5, 10)
# what plan_othello reads from a calibration
OTHELLO_CALIBRATION = ("othello_step_seconds", "decomposed_update_seconds", "recorded_update_seconds")


@dataclass
class PaperScaleConfig:
    """One budgeted run; ``jobs`` 0 = automatic (CUDA: min(16, CPUs) processes share the GPU; CPU: 2)."""

    budget_minutes: float = 8.0
    device: str = "auto"
    smoke: bool = False
    matmul_precision: str = "tf32"
    jobs: int = 0
    tasks: list[str] = field(default_factory=lambda: list(TOY_TASKS))
    seed_rounds: list[int] = field(default_factory=lambda: list(SEED_ROUNDS))
    othello: bool = True
    othello_seeds: int = 3
    toy_steps: int | None = None  # override of the toy grids' 3,000 steps (a deviation; for trial runs)
    toy_share: float = 0.4  # of the time left after calibration
    calibration_share: float = 0.35  # of the budget, at most
    replay_rtol: float = 1e-3  # on CUDA (0 on the CPU: bit-exact)
    reserve_seconds: float = 20.0  # kept for the records, the archive and the summary
    calibration: str | None = None  # an earlier paper-scale results file whose calibration is reused

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_minutes, (int, float)) and 0 < self.budget_minutes <= 600):
            raise ConfigError(f"budget_minutes={self.budget_minutes!r} must lie in (0, 600]", "e.g. 8")
        if bad := set(self.tasks) - set(TOY_TASKS):
            raise ConfigError(f"unknown toy task(s) {sorted(bad)}", f"use {', '.join(TOY_TASKS)}")
        if not self.seed_rounds or sorted(self.seed_rounds) != list(self.seed_rounds) or self.seed_rounds[0] < 1:
            raise ConfigError(f"seed_rounds {self.seed_rounds} must be increasing counts ≥ 1", "e.g. 3,5,10")
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 0:
            raise ConfigError(f"jobs must be an integer ≥ 0 (0: automatic), got {self.jobs!r}", "e.g. --jobs 8")
        if not 0 < self.toy_share < 1:
            raise ConfigError(f"toy_share={self.toy_share} must lie in (0, 1)", "e.g. 0.4")
        if not 0 < self.calibration_share < 1:
            raise ConfigError(f"calibration_share={self.calibration_share} must lie in (0, 1)", "e.g. 0.35")
        if self.toy_steps is not None and (isinstance(self.toy_steps, bool) or self.toy_steps < 1):
            raise ConfigError(f"toy_steps={self.toy_steps!r} must be ≥ 1", "e.g. 300")
        if not 1 <= self.othello_seeds <= 10:
            raise ConfigError(f"othello_seeds={self.othello_seeds} must lie in 1..10", "e.g. 3")
        from ..devices import check_device_spec, check_matmul_precision

        self.device = check_device_spec(self.device)
        self.matmul_precision = check_matmul_precision(self.matmul_precision)
