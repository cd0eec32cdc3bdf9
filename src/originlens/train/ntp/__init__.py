"""Next-token-prediction trainer for the gradient-pathways tasks (arXiv 2603.14087).

``Trainer(NTPConfig(task=..., regime=..., seed=...), RUN).run()`` trains a :class:`~originlens.models.GPT`
in one of the regimes standard / myopic / untied / myopic+untied on Majority, Conditioned Majority,
Othello, or windows of a token store (``task="language"``), with the paper's hyper-parameters as
defaults (the paper's hyper-parameter table: Adam β = (0.9, 0.999), ε = 1e-8, no weight decay / schedule /
clipping, GPT-2 init, mean next-token cross-entropy over the T−1 loss positions).

Run directory (``originlens.runs.RunDir``)::

    RUN/config.json                       resolved NTPConfig
    RUN/environment.json                  versions, seeds, data-order rule, data hashes
    RUN/metrics.jsonl                     {"event": "train"|"eval"|"probe", "step": s, ...}
    RUN/checkpoints/step-NNNNNN.safetensors   params + Adam state + RNG states (kind "ntp-checkpoint")
    RUN/model.safetensors                 final weights (``GPT.load``-able, kind "gpt")
    RUN/probes.safetensors                final ridge probes (``ProbeSet.load``)
    RUN/probe_metrics.npz                 final probe metric arrays (plain arrays, no pickle)
    RUN/summary.json                      final eval metrics, probe summary, timings; ``finished``

Data-order rule (exact resume): the batch of update s (1-based; b = s − 1) is drawn from
``numpy.random.default_rng([seed, 7, b])`` — ``task.sample(B, rng)`` for the counting tasks with
``train_size=0`` (and for Othello with ``othello_pool=0``), else the rows ``sort(rng.integers(0, N, B))``
of a pool: the counting tasks' fixed training set ``task.sample(train_size, default_rng([seed, 11]))``
(the paper's 102,400 sequences by default; regenerated, not cached, on resume), Othello games
of N played from ``default_rng([seed, 11, c])`` per chunk c of 16384 games (cached in
``RUN/data/othello-pool.npy``; a run whose updates draw under half of the pool plays only those games
and holds them in memory, no file: the batches are the same),
or the first N windows of the token store (``corpus``: a corpus
directory or an ``.npy`` of windows).  The eval set is
``task.sample(eval_size, default_rng([eval_seed, 13]))`` (``eval_seed`` defaults to ``seed``; a task with a
held-out split, ``tinystories``, draws it with ``task.sample_eval`` instead); for the
language task it is the last ``eval_size`` windows of the store.  Model init: ``torch.manual_seed(seed)``
then ``GPT(config)``.  A fresh run also seeds NumPy's legacy global RNG (``numpy.random.seed(seed mod
2**32)``) before the first update: training never draws from it, but checkpoints record its state (for
callbacks that do), and so two identical runs write identical checkpoints.  Numbering: records with
``"step": s`` come after update s; the train loss at step s is the mean over the updates since the
previous record of the loss of each batch *before* its update.

Resume (``resume=True``) loads the latest checkpoint (weights, Adam moments and step counts, torch and
numpy RNG states) and continues; on CPU the final weights are bit-identical to an uninterrupted run
(tested; not verified on CUDA, where kernels may be non-deterministic).  ``steps`` may be raised on
resume (the run is extended with the same data order); a run directory holding another configuration
is refused unless ``overwrite=True``.  Checkpoints and the final model record the vocabulary hash of the
training data (``vocab_hash``: the task's or the corpus's token strings); resuming on data of another
vocabulary (a corpus rebuilt in place) is a :class:`~originlens.errors.CompatibilityError`.  A run resumed
from its final checkpoint re-evaluates and re-probes, replacing (not duplicating) the final eval/probe
records.  Probes (as in the paper): ridge (alpha 1.0, intercept) per (layer, position) on the first 70 %
of the eval sequences, Pearson r on the rest, position 0 skipped; one fit per layer to bound memory.

Data-parallel training: under ``torchrun --nproc_per_node W -m originlens ntp train ...`` (or after
:func:`originlens.distributed.init` in a script started by torchrun) every rank draws the same global
batch, takes its contiguous rows and the gradients are all-reduced (:mod:`originlens.train.parallel`):
the run equals single-process training to round-off.  Only rank 0 writes (metrics, checkpoints,
summary) and evaluates/probes while the others wait; resume loads the same checkpoint on every rank.
Callbacks: ``on_step_end`` fires on every rank, ``on_eval``/``on_probe``/``on_checkpoint`` on rank 0.

Caveats: the language task has no per-token features (spaCy tags are not available), so it trains
and evaluates without probes; training in bfloat16/float16 is refused (Adam state would underflow).
"""

from __future__ import annotations

from ...runs import list_checkpoints
from .checkpoints import (
    check_checkpoint_vocab,
    checkpoint_metadata,
    checkpoint_path,
    checkpoint_tensors,
    load_checkpoint,
    numpy_global_seed,
    save_checkpoint,
)
from .config import (
    CHECKPOINT_KIND,
    COUNTING_TASKS,
    EVAL_STREAM,
    EVENTS,
    LANGUAGE,
    LATER_FIELDS,
    OPERATIONAL_FIELDS,
    POOL_CHUNK,
    POOL_STREAM,
    TASK_DEFAULTS,
    TRAIN_DTYPES,
    TRAIN_STREAM,
    ModelOptions,
    NTPConfig,
    all_task_names,
    config_identity,
    get_task,
)
from .data import EvalData, othello_pool, pool_rows, train_rng
from .probing import load_probe_metrics, probe_summary, save_probe_metrics, tracked_quality
from .trainer import Trainer, TrainResult, is_finished, set_lr, train

__all__ = [
    "CHECKPOINT_KIND",
    "COUNTING_TASKS",
    "EVAL_STREAM",
    "EVENTS",
    "LANGUAGE",
    "LATER_FIELDS",
    "OPERATIONAL_FIELDS",
    "POOL_CHUNK",
    "POOL_STREAM",
    "TASK_DEFAULTS",
    "TRAIN_DTYPES",
    "TRAIN_STREAM",
    "EvalData",
    "ModelOptions",
    "NTPConfig",
    "TrainResult",
    "Trainer",
    "all_task_names",
    "check_checkpoint_vocab",
    "checkpoint_metadata",
    "checkpoint_path",
    "checkpoint_tensors",
    "config_identity",
    "get_task",
    "is_finished",
    "list_checkpoints",
    "load_checkpoint",
    "load_probe_metrics",
    "numpy_global_seed",
    "othello_pool",
    "pool_rows",
    "probe_summary",
    "save_checkpoint",
    "save_probe_metrics",
    "set_lr",
    "tracked_quality",
    "train",
    "train_rng",
]
