"""The package's layers: which subpackage may import which (``docs/architecture.md``).

A module may import from its own layer and from lower layers, never from a higher one; within a layer
the subpackage import graph has no cycle.  ``tests/project/test_layering.py`` checks every ``import`` of the
package (module-level and inside functions) against :data:`LAYERS`.
"""

from __future__ import annotations

# lowest first; names are the top-level modules and subpackages of ``originlens``
LAYERS: tuple[tuple[str, ...], ...] = (
    # ground floor: errors, files, run directories, devices, operator counts, site names, progress
    (
        "errors",
        "paths",
        "progress",
        "locks",
        "storage",
        "outputs",
        "sinks",
        "config",
        "devices",
        "counting",
        "interrupts",
        "sites",
        "runs",
        "layers",
    ),
    # data, exact statistics, models, probes, reports
    ("data", "stats", "models", "probes", "report"),
    # what is built on them: tasks, the leading-term theory, multi-process helpers, SAEs
    ("tasks", "theory", "distributed", "sae"),
    # training and pretrained-model tools
    ("train", "lm"),
    # the gradient-pathway attribution of training runs
    ("attribution",),
    # whole experiments: config → run directory → results file → report
    ("experiments",),
    # the end-to-end demo (a client of the experiments)
    ("demo",),
    # the command line (parses and calls) and the package's public namespace
    ("cli", "__main__", "__init__"),
)


def layer_of(name: str) -> int:
    """Index in :data:`LAYERS` of a top-level module or subpackage name (``KeyError`` if unlisted)."""
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    raise KeyError(name)
