"""When a test can give a verdict at all: the gates every claim's judge applies before it says
reproduced, partial or not reproduced (:mod:`.claims`).

A verdict needs a test that could have seen the effect.  Three gates, each checked on the results file,
each failing with a reason that the README row shows beside the verdict **not tested**:

1. **learned** — the model has learned what is probed in the window measured: the probed features beat
   the untrained-model null there (a one-sided test over seeds at α = 0.05).  An influence measured
   before a feature exists says nothing about where it comes from.
2. **control** — the positive control works: the measurement tells real directions from random ones
   (the real probes receive more influence than random directions of the same norm), or whatever the
   experiment's control is.
3. **detectable** — the seeds can detect the effect.  Rule: a one-sided paired t-test at α = 0.05 with
   power 0.8 detects effects of at least d_z* (:func:`~.inference.detectable_effect`; 2.30 for 3 seeds,
   1.36 for 5, 0.93 for 10).  An effect larger than :data:`PLAUSIBLE_DZ` = 2.0 standard deviations of its
   own seed-to-seed spread is larger than what a claim of these papers can plausibly show (2.0 is the
   conventional bound of a "huge" effect), so a design with d_z* > 2.0 cannot show a real effect's
   absence: its **negative** verdicts (a test that did not reach significance) become *not tested*.  A
   test that did reach significance stands — low power does not undo a detected effect.

The reported figure is always the detectable d_z of the design, never the power at the observed effect
(post-hoc power is a function of the p-value and adds nothing to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .inference import detectable_effect

PLAUSIBLE_DZ = 2.0  # the largest effect (in seed-to-seed standard deviations) a claim can plausibly show
ALPHA = 0.05


@dataclass(frozen=True)
class Gate:
    """One gate: its name, whether it passed, and the reason (shown in the README row when it failed)."""

    name: str
    passed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "reason": self.reason}


def learned(passed: bool, what: str) -> Gate:
    """Gate 1: ``what`` names the feature, the window and the numbers (e.g. "board probes r 0.24 at update
    200 vs untrained 0.26")."""
    return Gate("learned", bool(passed), ("learned: " if passed else "not learned in the window measured: ") + what)


def control(passed: bool, what: str) -> Gate:
    """Gate 2: the positive control and its numbers."""
    return Gate("control", bool(passed), ("positive control holds: " if passed else "positive control fails: ") + what)


def detectable(n_seeds: int, *, negative: bool) -> Gate:
    """Gate 3 for a design of ``n_seeds`` seeds; it can only fail a ``negative`` verdict (module docstring)."""
    dz = detectable_effect(int(n_seeds), ALPHA) if n_seeds >= 2 else float("inf")
    ok = dz <= PLAUSIBLE_DZ or not negative
    return Gate(
        "detectable",
        ok,
        f"{n_seeds} seeds detect d_z ≥ {dz:.2f} (α {ALPHA:g}, power 0.8)"
        + ("" if ok else f", more than the largest plausible effect {PLAUSIBLE_DZ:g}: a null result cannot be read"),
    )


def first_failed(gates: list[Gate]) -> Gate | None:
    """The first gate that failed, or None."""
    return next((g for g in gates if not g.passed), None)


def detectable_dz(n_seeds: int) -> float | None:
    """d_z detectable with power 0.8 at α 0.05 (one-sided paired t-test) with ``n_seeds`` seeds."""
    return detectable_effect(int(n_seeds), ALPHA) if n_seeds >= 2 else None
