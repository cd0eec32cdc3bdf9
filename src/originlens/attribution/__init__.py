"""Exact gradient-pathway attribution (arXiv 2603.14087: the Prop. 3.1 decomposition, optimizer-aware
steps, influence; see ``docs/concepts.md``).

* :mod:`.stopgrad` — ``stop_gradient(model, layer=k, position=i)``: value-preserving gradient block at r^k_i.
* :mod:`.decompose` — ``decompose(model, tokens, sites)``: ∇L = G_dir + G_pre + G_sh at every site
  (``method="fast"``: structured backward of :mod:`.structured` for originlens GPTs; ``"autograd"``: 2
  backwards + batched VJPs, any hooked model; ``"brute"``: the stop-gradient definition).
* :mod:`.steps` — optimizer-aware component steps Δ_c: ``sgd_steps``, ``AdamAttributor`` (checked
  against the real Adam/AdamW update at every step).
* :mod:`.influence` — mismatch R and influences I_c = ⟨Δ_c, ∇R⟩ (``influence_table``: batched on the
  device, one columnar table per batch); :mod:`.jvp` — the forward-mode JVPs J_{k,i} v they use.

* :mod:`.replay` — ``attribute_run(RUN, ...)``: influences over a finished training run, replayed from its
  checkpoints and data order (segments; bit-exact checks); :mod:`.store` — Parquet observables,
  integrated influence with CIs, report.
"""

from .decompose import (
    COMPONENTS,
    Adjoints,
    PathwayGradients,
    attention_impl,
    decompose,
    pathway_adjoints,
    trainable_parameters,
)
from .influence import (
    Influence,
    InfluenceTable,
    Probe,
    influence_table,
    influences,
    mismatch,
    projections,
    reference_projections,
)
from .jvp import site_jvp
from .steps import AdamAttributor, sgd_steps, step_sum
from .stopgrad import stop_gradient, stop_gradient_hooks

__all__ = [
    "COMPONENTS",
    "AdamAttributor",
    "Adjoints",
    "Influence",
    "InfluenceTable",
    "PathwayGradients",
    "Probe",
    "attention_impl",
    "decompose",
    "influence_table",
    "influences",
    "mismatch",
    "pathway_adjoints",
    "projections",
    "reference_projections",
    "sgd_steps",
    "site_jvp",
    "step_sum",
    "stop_gradient",
    "stop_gradient_hooks",
    "trainable_parameters",
]

# Replay of a saved training run and the observable store (attribution/replay.py, attribution/store.py).
from .replay import SegmentResult, attribute_run
from .run import RunReplay
from .segments import attribute_segments, segment_bounds
from .store import integrate, load_observables, summarize
from .store_report import write_report

__all__ += [
    "RunReplay",
    "SegmentResult",
    "attribute_run",
    "attribute_segments",
    "integrate",
    "load_observables",
    "segment_bounds",
    "summarize",
    "write_report",
]
