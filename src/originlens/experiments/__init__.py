"""Experiments: whole reproductions of the papers' claims, each a config dataclass → run directory →
results file → report.  The CLI only parses arguments and calls these.

* :mod:`.results` — the results-file format (``results/<experiment>/<name>.json``) and provenance;
* :mod:`.inference` — CIs over seeds (Fisher z, t, bootstrap), paired tests, power, Holm;
* :mod:`.toy_grid` — Majority / Conditioned Majority regime grids with initial-model nulls;
* :mod:`.claims` — the papers' claims, each with the results file that backs it and its verdict;
* :mod:`.render` — the README's reproduction status and ``docs/results.md``, generated from the files.
"""

from .inference import bootstrap_ci, correlation_ci, holm, mean_ci, paired_test
from .results import load_all, read_results, write_results
from .results import load_all as load_results
from .toy_grid import ToyGridConfig, run_toy_grid

__all__ = [
    "ToyGridConfig",
    "bootstrap_ci",
    "correlation_ci",
    "holm",
    "load_all",
    "load_results",
    "mean_ci",
    "paired_test",
    "read_results",
    "run_toy_grid",
    "write_results",
]
