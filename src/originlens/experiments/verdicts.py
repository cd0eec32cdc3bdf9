"""The verdict a claim gets from its results file (:mod:`.claims`), and the words it may use.

At the bottom of the experiments: each experiment's ``judge`` returns a :class:`Verdict`, and the claims
registry and the README renderer (at the top) read them; a verdict is one of :data:`VERDICTS`.
"""

from __future__ import annotations

from dataclasses import dataclass

VERDICTS = ("reproduced", "partial", "not reproduced", "not tested", "needs GPU", "needs data", "not yet run")


@dataclass(frozen=True)
class Verdict:
    verdict: str
    ours: str
    scale: str

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"unknown verdict {self.verdict!r}")
