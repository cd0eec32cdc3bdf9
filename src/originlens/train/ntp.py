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
pre-generated once per run from ``default_rng([seed, 11, c])`` per chunk c of 16384 games (cached in
``RUN/data/othello-pool.npy``), or the first N windows of the token store (``corpus``: a corpus
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

import io
import json
import math
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import distributed as dist_
from ..errors import CompatibilityError, ConfigError, InputError, NumericalError
from ..interrupts import Interrupted, deferred
from ..models.gpt import GPT, REGIMES, GPTConfig
from ..probes import ProbeMetrics, ProbeSet, fit_probes
from ..progress import log, progress
from ..runs import RunDir, to_jsonable
from ..storage import (
    array_sha256,
    atomic_save_npy,
    atomic_write_bytes,
    atomic_write_json,
    load_tensors,
    read_json,
    save_tensors,
    sha256_file,
    vocab_hash,
)
from ..tasks import BOS_ID, TaskBatch, moves_to_tokens, task_metrics, task_names
from ..tasks import get_task as registry_task
from ..tasks.othello import generate_games
from . import parallel

TRAIN_STREAM, POOL_STREAM, EVAL_STREAM = 7, 11, 13
POOL_CHUNK = 16384
LANGUAGE = "language"
COUNTING_TASKS = ("majority", "cond-majority")
CHECKPOINT_KIND = "ntp-checkpoint"
EVENTS = ("on_step_end", "on_eval", "on_probe", "on_checkpoint")
TRAIN_DTYPES = ("float32", "float64")

# The paper's hyper-parameter table (None entries of NTPConfig are filled from here).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "majority": dict(
        n_layer=2,
        d_model=128,
        n_head=4,
        batch_size=256,
        steps=3000,
        eval_size=10240,
        probe_every=500,
        eval_every=500,
        untie_at=[10],
        probe_positions="all",
        train_size=102400,
    ),
    "cond-majority": dict(
        n_layer=2,
        d_model=128,
        n_head=4,
        batch_size=256,
        steps=3000,
        eval_size=10240,
        probe_every=500,
        eval_every=500,
        untie_at=[10],
        probe_positions="all",
        train_size=102400,
    ),
    "othello": dict(
        n_layer=6,
        d_model=256,
        n_head=4,
        batch_size=1024,
        steps=5000,
        eval_size=20480,
        probe_every=1000,
        eval_every=500,
        untie_at=None,
        probe_positions="tracked",
        train_size=0,
    ),
    LANGUAGE: dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        batch_size=256,
        steps=1000,
        eval_size=30000,
        probe_every=0,
        eval_every=100,
        untie_at=None,
        probe_positions="all",
        train_size=0,
    ),
    "tinystories": dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        batch_size=256,
        steps=1000,
        eval_size=30000,
        probe_every=100,
        eval_every=0,
        untie_at=None,
        probe_positions="tracked",
        train_size=0,
    ),
}
# Trainer tasks outside originlens.tasks' registry: name -> (module, class); built by get_task below.
EXTRA_TASKS: dict[str, tuple[str, str]] = {}  # tasks outside originlens.tasks' registry (none at present)
# Fields that may change between a run and its resumption (they do not change the trained weights).
OPERATIONAL_FIELDS = ("steps", "checkpoint_every", "keep_checkpoints", "device", "log_every")
# Fields added after runs were first recorded, with the value every earlier run implicitly had: at that
# value they are left out of a run's identity, so earlier runs stay finished / resumable.
LATER_FIELDS = {"task_options": {}}


def config_identity(d: dict[str, Any]) -> dict[str, Any]:
    """A configuration mapping without :data:`OPERATIONAL_FIELDS` and without :data:`LATER_FIELDS` at their
    default values: what defines the trained model."""
    return {
        k: v for k, v in d.items() if k not in OPERATIONAL_FIELDS and not (k in LATER_FIELDS and v == LATER_FIELDS[k])
    }


def all_task_names() -> list[str]:
    """Tasks the trainer accepts: the synthetic worlds, :data:`EXTRA_TASKS` and ``language`` (a token store)."""
    return [*task_names(), *EXTRA_TASKS, LANGUAGE]


def get_task(name: str, **kw: Any) -> Any:
    """:func:`originlens.tasks.get_task` extended by :data:`EXTRA_TASKS` (``tinystories``)."""
    if name in EXTRA_TASKS:
        import importlib

        module, cls_name = EXTRA_TASKS[name]
        return getattr(importlib.import_module(module), cls_name)(**kw)
    return registry_task(name, **kw)


@dataclass
class NTPConfig:
    """Configuration of one next-token-prediction run; ``None`` fields take the task's :data:`TASK_DEFAULTS` entry.

    ``untie_at``: range boundaries for the untied regimes (default [10] on the majority tasks, none
    elsewhere); ignored (set to None) for standard/myopic.  ``probe_positions``: ``"all"`` (1..T−1),
    ``"tracked"`` (the task's tracked positions) or a list.  ``othello_pool``: games pre-generated once
    per run (0 = fresh games every step).  ``corpus``: token store for ``task="language"``.
    ``checkpoint_every=0``: only the final checkpoint; ``keep_checkpoints=0``: keep all.
    ``train_size``: the counting tasks' fixed training set (the paper's 102,400 sequences, drawn once per
    run; 0 = fresh sequences every step; must be 0 for the other tasks).  ``untie_scope``: what the untied
    regimes duplicate; ``"everything"`` (the paper: a complete second model with its own embeddings, final
    LayerNorm and head) or ``"blocks"`` (the transformer blocks only).  ``task_options``: keyword
    arguments of the task (e.g. ``{"syntax_features": True, "annotator": "lingua", "syntax_labels": "tags"}``
    for ``tinystories``); part of the run's identity.
    """

    task: str = "cond-majority"
    regime: str = "standard"
    seed: int = 0
    n_layer: int | None = None
    d_model: int | None = None
    n_head: int | None = None
    batch_size: int | None = None
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    steps: int | None = None
    log_every: int = 10
    eval_every: int | None = None
    probe_every: int | None = None
    eval_size: int | None = None
    probe_size: int | None = None
    probe_positions: str | list[int] | None = None
    probe_alpha: float = 1.0
    probe_train_frac: float = 0.7
    checkpoint_every: int = 500
    keep_checkpoints: int = 0
    untie_at: list[int] | str | None = None
    untie_scope: str = "everything"
    train_size: int | None = None
    task_options: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    device: str = "cpu"
    attn_impl: str = "sdpa"
    othello_pool: int = 500_000
    corpus: str | None = None
    eval_seed: int | None = None

    def __post_init__(self) -> None:
        if self.task not in all_task_names():
            raise ConfigError(f"unknown task {self.task!r}", f"use one of: {', '.join(all_task_names())}")
        if self.regime not in REGIMES:
            raise ConfigError(f"unknown regime {self.regime!r}", f"use one of: {', '.join(REGIMES)}")
        defaults = TASK_DEFAULTS[self.task]
        for name, value in defaults.items():
            if name == "untie_at":
                continue
            if getattr(self, name) is None:
                setattr(self, name, value)
        if "untied" in self.regime:
            if self.untie_at is None:
                self.untie_at = defaults["untie_at"]
        else:
            self.untie_at = None
        if isinstance(self.untie_at, (tuple, list)):
            self.untie_at = [int(m) for m in self.untie_at]
        if self.probe_size is None:
            self.probe_size = self.eval_size
        self.betas = tuple(float(b) for b in self.betas)  # type: ignore[assignment]
        self._validate()

    def _validate(self) -> None:
        def need_int(name: str, low: int) -> None:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ConfigError(f"{name} must be an integer ≥ {low}, got {v!r}", f"set {name} ≥ {low}")

        for name in ("n_layer", "d_model", "n_head", "batch_size", "log_every"):
            need_int(name, 1)
        for name in (
            "seed",
            "steps",
            "eval_every",
            "probe_every",
            "eval_size",
            "probe_size",
            "checkpoint_every",
            "keep_checkpoints",
            "othello_pool",
            "train_size",
        ):
            need_int(name, 0)
        if self.eval_seed is not None:
            need_int("eval_seed", 0)
        for name in ("lr", "eps"):
            v = getattr(self, name)
            # the upper bound: Adam's bias-corrected step lr / (1 - β1^t) must stay inside float32
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= 1e30:
                raise ConfigError(f"{name} must be a positive number ≤ 1e30, got {v!r}", f"e.g. {name}=1e-3")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must be two numbers in [0, 1), got {self.betas!r}", "use (0.9, 0.999)")
        if not 0 < self.probe_train_frac < 1 or not (math.isfinite(self.probe_alpha) and self.probe_alpha >= 0):
            raise ConfigError(
                f"need 0 < probe_train_frac < 1 and a finite probe_alpha ≥ 0, got "
                f"{self.probe_train_frac!r} and {self.probe_alpha!r}",
                "use 0.7 and 1.0",
            )
        if self.dtype not in TRAIN_DTYPES:
            raise ConfigError(
                f"training dtype {self.dtype!r} is not supported",
                f"use one of: {', '.join(TRAIN_DTYPES)} (Adam state underflows in 16 bits)",
            )
        from ..devices import check_device_spec

        check_device_spec(self.device)
        if self.probe_size > self.eval_size:
            raise ConfigError(
                f"probe_size={self.probe_size} exceeds eval_size={self.eval_size}",
                "probes use the first probe_size eval sequences; lower probe_size",
            )
        pp = self.probe_positions
        if isinstance(pp, str):
            if pp not in ("all", "tracked"):
                raise ConfigError(f"probe_positions={pp!r} is not understood", "use all, tracked or a list")
        elif isinstance(pp, (list, tuple)):
            self.probe_positions = [int(i) for i in pp]
            if not self.probe_positions or min(self.probe_positions) < 1:
                raise ConfigError(
                    f"probe_positions {pp} must be a non-empty list of positions ≥ 1",
                    "position 0 (BOS) is never probed",
                )
        else:
            raise ConfigError(f"probe_positions={pp!r} is not understood", "use all, tracked or a list")
        if self.train_size and self.task not in COUNTING_TASKS:
            raise ConfigError(
                f"train_size applies to the counting tasks ({', '.join(COUNTING_TASKS)}), not {self.task!r}",
                "drop --train-size (Othello: --othello-pool; language: the token store)",
            )
        if self.task == LANGUAGE and self.task_options:
            raise ConfigError("task 'language' takes no task options (it reads a token store)", "drop --task-option")
        if self.task == LANGUAGE:
            if not self.corpus:
                raise ConfigError(
                    "task 'language' needs a token store",
                    "pass corpus=DIR (--corpus DIR), a directory from `originlens corpus build`",
                )
        else:
            if self.corpus:
                raise ConfigError(f"corpus is only used by task 'language', not {self.task!r}", "drop --corpus")
            task = self.make_task()
            self.gpt_config(task.vocab_size, task.seq_len)  # GPT's own validation (heads, untie_at, ...)

    # -- derived -----------------------------------------------------------------------------------
    def make_task(self, **extra: Any) -> Any:
        """The task object with ``task_options`` (unknown options: :class:`ConfigError`)."""
        try:
            return get_task(self.task, **{**self.task_options, **extra})
        except TypeError as exc:
            raise ConfigError(
                f"task {self.task!r} does not take the options {sorted(self.task_options)} ({exc})",
                "drop the unknown --task-option",
            ) from None

    def gpt_config(self, vocab_size: int, seq_len: int) -> GPTConfig:
        """The model configuration (position table of size T + 1)."""
        return GPTConfig(
            vocab_size=vocab_size,
            seq_len=seq_len,
            n_layer=self.n_layer,
            d_model=self.d_model,
            n_head=self.n_head,
            regime=self.regime,
            untie_at=self.untie_at,
            untie_scope=self.untie_scope,
            n_positions=seq_len + 1,
            dtype=self.dtype,
            attn_impl=self.attn_impl,
        )

    @property
    def effective_eval_seed(self) -> int:
        return self.seed if self.eval_seed is None else int(self.eval_seed)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    def identity(self) -> dict[str, Any]:
        """The fields that define the trained model (see :func:`config_identity`)."""
        return config_identity(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = "NTPConfig") -> NTPConfig:
        """Build from a mapping (unknown keys, wrong types: ConfigError; see ``originlens.config``)."""
        from ..config import from_mapping

        return from_mapping(cls, d, where=where)

    def replace(self, **changes: Any) -> NTPConfig:
        return NTPConfig.from_dict({**self.to_dict(), **changes})


# ----------------------------------------------------------------------------------------------------
# Data


def train_rng(seed: int, b: int) -> np.random.Generator:
    """Generator of training batch b (0-based; used for update b + 1)."""
    return np.random.default_rng([int(seed), TRAIN_STREAM, int(b)])


class _SampledData:
    """Batches drawn afresh from the task's sampler for every step."""

    def __init__(self, task: Any, seed: int, batch_size: int) -> None:
        self.task, self.seed, self.batch_size = task, seed, batch_size

    def batch(self, b: int) -> np.ndarray:
        return self.task.sample(self.batch_size, train_rng(self.seed, b)).tokens

    def describe(self) -> str:
        return (
            f"batch b = {self.task.name}.sample({self.batch_size}, numpy.random.default_rng([seed, "
            f"{TRAIN_STREAM}, b])).tokens, b = update - 1"
        )


class _PoolData:
    """Batches of rows of a fixed pool (N, T), indices ``default_rng([seed, 7, b]).integers(0, N, B)``."""

    def __init__(self, pool: np.ndarray, seed: int, batch_size: int, what: str) -> None:
        self.pool, self.seed, self.batch_size, self.what = pool, seed, batch_size, what

    def indices(self, b: int) -> np.ndarray:
        return np.sort(train_rng(self.seed, b).integers(0, len(self.pool), self.batch_size))

    def batch(self, b: int) -> np.ndarray:
        return np.asarray(self.pool[self.indices(b)], dtype=np.int64)

    def describe(self) -> str:
        return (
            f"batch b = rows sort(numpy.random.default_rng([seed, {TRAIN_STREAM}, b]).integers(0, N, "
            f"{self.batch_size})) of {self.what} (N = {len(self.pool)}), b = update - 1"
        )


def othello_pool(n: int, seed: int) -> np.ndarray:
    """(n, 61) uint8 tokens of n random games; chunk c of 16384 games from ``default_rng([seed, 11, c])``."""
    out = np.empty((n, 61), dtype=np.uint8)
    out[:, 0] = BOS_ID
    for c, a in enumerate(range(0, n, POOL_CHUNK)):
        b = min(n, a + POOL_CHUNK)
        games = generate_games(b - a, np.random.default_rng([int(seed), POOL_STREAM, c]), feature_types=False)
        out[a:b, 1:] = moves_to_tokens(games.moves)
    return out


@dataclass
class EvalData:
    """The fixed evaluation set: tokens (n, T) and, for the synthetic tasks, the full TaskBatch."""

    tokens: np.ndarray
    batch: TaskBatch | None


# ----------------------------------------------------------------------------------------------------
# Checkpoints


def _encode_json_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8).copy()


def numpy_global_seed(seed: int) -> int:
    """The seed a fresh run gives NumPy's legacy global RNG (``numpy.random.seed`` takes 32 bits)."""
    return int(seed) % (1 << 32)


def _numpy_rng_state() -> np.ndarray:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return _encode_json_bytes([name, keys.tolist(), int(pos), int(has_gauss), float(cached)])


def _set_numpy_rng_state(raw: np.ndarray) -> None:
    name, keys, pos, has_gauss, cached = json.loads(bytes(raw.astype(np.uint8)).decode("utf-8"))
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def checkpoint_tensors(model: GPT, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor | np.ndarray]:
    """Flat tensor dict: ``model.NAME``, ``adam.NAME.{exp_avg,exp_avg_sq,step}``, ``rng.torch``,
    ``rng.numpy`` (JSON bytes of ``np.random.get_state()``), ``rng.cuda.I`` (uint8)."""
    out: dict[str, torch.Tensor | np.ndarray] = {f"model.{k}": v for k, v in model.state_dict().items()}
    for name, p in model.named_parameters():
        st = optimizer.state.get(p)
        if st:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                out[f"adam.{name}.{key}"] = torch.as_tensor(st[key])
    out["rng.torch"] = torch.get_rng_state()
    out["rng.numpy"] = _numpy_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def save_checkpoint(
    path: str | Path,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    step: int,
    config: NTPConfig,
    extra: dict[str, Any] | None = None,
    *,
    vocab_hash: str | None = None,
) -> Path:
    """Write a checkpoint (safetensors, atomic) holding weights, Adam state, step and RNG states;
    ``vocab_hash`` (:func:`originlens.storage.vocab_hash` of the training data's vocabulary) goes into the
    metadata when known."""
    meta = {"step": int(step), "ntp_config": config.to_dict(), "gpt_config": model.config.to_dict(), **(extra or {})}
    if vocab_hash is not None:
        meta["vocab_hash"] = str(vocab_hash)
    return save_tensors(path, checkpoint_tensors(model, optimizer), kind=CHECKPOINT_KIND, metadata=meta)


def check_checkpoint_vocab(path: str | Path, meta: dict[str, str], expect_vocab_hash: str | None) -> None:
    """:class:`CompatibilityError` when the checkpoint or model file ``path`` (metadata ``meta``) records a
    vocabulary hash other than ``expect_vocab_hash``, the hash of the data it is used with.  Files without
    a hash (written before it was recorded) and an unknown expected hash pass."""
    got = meta.get("vocab_hash")
    if expect_vocab_hash is None or got is None:
        return
    if got != str(expect_vocab_hash):
        raise CompatibilityError(
            f"{path} was trained on another vocabulary (hash {got}) than the data it is used with "
            f"(hash {expect_vocab_hash})",
            "use the corpus / task the model was trained on (a corpus rebuilt in place gets a new vocabulary), "
            "or pass --overwrite to train from scratch",
        )


def load_checkpoint(
    path: str | Path,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    *,
    restore_rng: bool = True,
    expect_vocab_hash: str | None = None,
) -> int:
    """Load weights, Adam state (and RNG states) of :func:`save_checkpoint` into ``model``/``optimizer``;
    returns the step.  ``expect_vocab_hash``: refuse (``CompatibilityError``) a checkpoint that records
    another vocabulary."""
    arrays, meta = load_tensors(path, kind=CHECKPOINT_KIND)
    check_checkpoint_vocab(path, meta, expect_vocab_hash)
    dev = next(model.parameters()).device
    state = {k[len("model.") :]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("model.")}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CompatibilityError(
            f"checkpoint {path} does not fit this model ({str(exc).splitlines()[0]})",
            "resume with the configuration the run was started with",
        ) from None
    names = [n for n, _ in model.named_parameters()]
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for i, name in enumerate(names):
        keys = [f"adam.{name}.{k}" for k in ("exp_avg", "exp_avg_sq", "step")]
        if all(k in arrays for k in keys):
            opt_state[i] = {
                "exp_avg": torch.from_numpy(arrays[keys[0]].copy()).to(dev),
                "exp_avg_sq": torch.from_numpy(arrays[keys[1]].copy()).to(dev),
                # save_tensors stores 0-d arrays as shape (1,)
                "step": torch.from_numpy(np.array(arrays[keys[2]]).reshape(())),
            }
    groups = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    if restore_rng:
        torch.set_rng_state(torch.from_numpy(arrays["rng.torch"].copy()))
        _set_numpy_rng_state(arrays["rng.numpy"])
        cuda = sorted(k for k in arrays if k.startswith("rng.cuda."))
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.from_numpy(arrays[k].copy()) for k in cuda])
    return int(json.loads(meta["step"]))


def checkpoint_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a checkpoint (without reading its tensors)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"{path} is not a readable safetensors file ({exc})", "remove the broken checkpoint") from None


def checkpoint_path(run: RunDir, step: int) -> Path:
    return run.file("checkpoints", f"step-{step:06d}.safetensors")


def list_checkpoints(run_path: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the run's checkpoints, ascending."""
    d = Path(run_path) / "checkpoints"
    out = []
    for p in d.glob("step-*.safetensors") if d.is_dir() else ():
        try:
            out.append((int(p.stem.split("-")[1]), p))
        except (IndexError, ValueError):
            continue
    return sorted(out)


# ----------------------------------------------------------------------------------------------------
# Probe bookkeeping


def save_probe_metrics(path: str | Path, metrics: ProbeMetrics) -> Path:
    """Write :class:`ProbeMetrics` as a plain ``.npz`` (no object arrays, readable without pickle)."""
    arrays = {
        "pearson": metrics.pearson,
        "r2": metrics.r2,
        "mse": metrics.mse,
        "accuracy": metrics.accuracy,
        "layers": np.asarray(metrics.layers, dtype=np.int64),
        "positions": np.asarray(metrics.positions, dtype=np.int64),
        "feature_names": np.asarray(metrics.feature_names, dtype=str),
    }
    for t, v in metrics.by_type.items():
        arrays[f"by_type_{int(t)}"] = v
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


def load_probe_metrics(path: str | Path) -> ProbeMetrics:
    """Read :func:`save_probe_metrics` output."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} not found", "train the run to the end (it writes probe_metrics.npz)")
    with np.load(path, allow_pickle=False) as z:
        by_type = {int(k.split("_")[-1]): z[k] for k in z.files if k.startswith("by_type_")}
        return ProbeMetrics(
            pearson=z["pearson"],
            r2=z["r2"],
            mse=z["mse"],
            accuracy=z["accuracy"],
            by_type=by_type,
            layers=z["layers"].tolist(),
            positions=z["positions"].tolist(),
            feature_names=[str(s) for s in z["feature_names"]],
        )


def tracked_quality(
    metrics: ProbeMetrics, layers: Sequence[int], positions: Sequence[int], features: Sequence[str]
) -> dict[str, float]:
    """Mean test Pearson r over the given sites and features: overall (``pearson``) and within feature
    type τ (``pearson_type{τ}``: NaN entries — empty or constant subsets — ignored; NaN if none)."""
    li = [metrics.layers.index(k) for k in layers if k in metrics.layers]
    pi = [metrics.positions.index(i) for i in positions if i in metrics.positions]
    fi = [metrics.feature_names.index(f) for f in features if f in metrics.feature_names]
    sel = np.ix_(li, pi, fi)

    def mean(a: np.ndarray) -> float:
        v = a[sel]
        return float(np.nanmean(v)) if v.size and np.isfinite(v).any() else float("nan")

    out = {"pearson": mean(metrics.pearson)}
    for t, arr in sorted(metrics.by_type.items()):
        if t != 0:
            out[f"pearson_type{t}"] = mean(arr)
    return out


def probe_summary(metrics: ProbeMetrics, tracked: Any) -> dict[str, float]:
    """Flat summary at the task's tracked layers/positions: per tracked feature and over all of them
    (``tracked/...``); ``pearson_type1`` is the NTP-useless part, ``pearson_type2`` the useful part."""
    out: dict[str, float] = {}
    for f in tracked.features:
        for k, v in tracked_quality(metrics, tracked.layers, tracked.positions, [f]).items():
            out[f"{f}/{k}"] = v
    for k, v in tracked_quality(metrics, tracked.layers, tracked.positions, tracked.features).items():
        out[f"tracked/{k}"] = v
    return out


# ----------------------------------------------------------------------------------------------------
# Trainer


@dataclass
class TrainResult:
    """What :meth:`Trainer.run` returns (also in ``RUN/summary.json``); ``seconds`` is the wall time of
    the whole run (earlier sessions counted up to their last checkpoint), evals and probes included."""

    run_dir: Path
    step: int
    final_eval: dict[str, float] = field(default_factory=dict)
    probe_summary: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    skipped: bool = False


def is_finished(run_path: str | Path, config: NTPConfig | None = None) -> bool:
    """True when ``RUN/summary.json`` says the run finished (with ``config``'s identity and steps)."""
    p = Path(run_path) / "summary.json"
    if not p.is_file():
        return False
    s = read_json(p)
    if not s.get("finished"):
        return False
    if config is None:
        return True
    return s.get("identity") == config.identity() and int(s.get("step", -1)) == config.steps


class Trainer:
    """Next-token-prediction trainer (minGPT-style callbacks: ``add_callback(event, fn)``, fn(trainer)).

    Events: ``on_step_end`` (after every update; ``trainer.step``, ``trainer.last_loss``),
    ``on_eval`` (``trainer.last_eval``), ``on_probe`` (``trainer.last_probe``), ``on_checkpoint``
    (``trainer.last_checkpoint``).
    """

    def __init__(
        self, config: NTPConfig, run_dir: str | Path, *, resume: bool = False, overwrite: bool = False
    ) -> None:
        self.config = config
        self.resume = resume
        self.overwrite = overwrite
        self.run_path = Path(run_dir)
        self.callbacks: dict[str, list[Callable[[Trainer], None]]] = {e: [] for e in EVENTS}
        self.step = 0
        self.last_loss = float("nan")
        self.last_eval: dict[str, float] = {}
        self.last_probe: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self.probes: ProbeSet | None = None
        self.probe_metrics: ProbeMetrics | None = None
        self._seconds_before = 0.0
        self._t_start = time.time()
        from ..devices import resolve_device

        self.device = resolve_device(config.device)
        self.task = None if config.task == LANGUAGE else config.make_task()
        self._writer = dist_.world()[0] == 0  # under torchrun only rank 0 writes (see run())
        if self._writer:
            self._check_run_dir()
        self.rundir = RunDir(self.run_path)
        self._corpus_info: dict[str, Any] = {}
        vocab_size, seq_len = self._vocab_and_len()
        self.vocab_hash = self._data_vocab_hash()
        if resume:
            self._check_checkpoint_vocab()
        self.gpt_config = config.gpt_config(vocab_size, seq_len)
        self.model = self.build_model()
        self.optimizer = torch.optim.Adam(
            self.model.parameters(), lr=config.lr, betas=config.betas, eps=config.eps, weight_decay=0.0
        )

    # -- public API ----------------------------------------------------------------------------------
    def add_callback(self, event: str, fn: Callable[[Trainer], None]) -> None:
        if event not in self.callbacks:
            raise ConfigError(f"unknown callback event {event!r}", f"use one of: {', '.join(EVENTS)}")
        self.callbacks[event].append(fn)

    def set_callback(self, event: str, fn: Callable[[Trainer], None]) -> None:
        """Replace all callbacks of ``event`` by ``fn`` (minGPT spelling)."""
        self.add_callback(event, fn)
        self.callbacks[event] = [fn]

    def build_model(self) -> GPT:
        """The initial model: ``torch.manual_seed(seed)`` then ``GPT(gpt_config)`` on the device."""
        torch.manual_seed(self.config.seed)
        return GPT(self.gpt_config).to(self.device)

    def run(self) -> TrainResult:
        """Train to ``config.steps`` (resuming if asked), evaluate, probe, save; returns the result.
        The run directory's lock (taken when the trainer was made) is given up when this returns."""
        from ..runs import release_lock

        try:
            return self._run()
        finally:
            if self._writer:
                release_lock(self.run_path)

    def _run(self) -> TrainResult:
        cfg = self.config
        self._t_start = time.time()
        dist_.barrier()  # rank 0 has checked (or cleared) the run directory
        if self.resume and is_finished(self.run_path, cfg):
            s = read_json(self.rundir.file("summary.json"))
            log(f"{self.run_path}: already finished at step {s['step']}; skipping", level=2)
            return TrainResult(
                self.run_path,
                int(s["step"]),
                s.get("final_eval", {}),
                s.get("probe_summary", {}),
                float(s.get("seconds", 0.0)),
                skipped=True,
            )
        dist_.barrier()  # every rank has read it; rank 0 may now change it
        start = self._restore()
        dist_.same_on_all_ranks(start, "step to resume from")
        if start == 0:
            # NumPy's legacy global RNG: the trainer never draws from it, but checkpoints record its state
            # (callbacks may use it); seeding it makes that state, like torch's, a function of the seed
            np.random.seed(numpy_global_seed(cfg.seed))
        if self._writer:
            self.rundir.write_config(cfg)
        with dist_.rank_zero_first():  # rank 0 writes the Othello pool, the others read it
            self.data = self._train_data()
        self.eval_data = self._eval_data()
        if self._writer:
            self._write_environment(resumed=start > 0)

        bar = progress(total=cfg.steps, initial=start, desc=f"{cfg.task}/{cfg.regime}/s{cfg.seed}", unit="step")
        window: list[float] = []
        self.model.train()
        with deferred() as stop, closing(bar):
            for b in range(start, cfg.steps):
                x = torch.from_numpy(self.data.batch(b)).to(self.device)
                loss = parallel.shard_loss(self.model, x)  # this rank's rows of the global batch
                value = parallel.global_value(loss)  # Σ over ranks: the global batch's loss
                if not math.isfinite(value):
                    last = str(self.last_checkpoint) if self.last_checkpoint else "none (no checkpoint yet)"
                    raise NumericalError(
                        f"training loss is {value} at update {b + 1} ({cfg.task}/{cfg.regime}, seed {cfg.seed}); "
                        f"last good checkpoint: {last}",
                        "lower --lr (or use --dtype float64); resume from the last checkpoint with --resume",
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                parallel.allreduce_gradients(self.model.parameters())
                _check_finite(self.model.named_parameters(), "gradient", b + 1, cfg, self.last_checkpoint)
                self.optimizer.step()
                self.step = b + 1
                self.last_loss = value
                window.append(value)
                bar.update(1)
                if (self.step % cfg.log_every == 0 or self.step == cfg.steps) and self._writer:
                    self.rundir.log_metrics(
                        {
                            "event": "train",
                            "step": self.step,
                            "loss": float(np.mean(window)),
                            "last_loss": value,
                            "time": self._elapsed(),
                        }
                    )
                    bar.set_postfix(loss=f"{np.mean(window):.4f}")
                    window = []
                self._fire("on_step_end")
                if self.step == cfg.steps:
                    break
                probe_now = _due(self.step, cfg.probe_every) and self._can_probe()
                if _due(self.step, cfg.eval_every) or probe_now:
                    dist_.rank_zero_only(self._evaluate, probe=probe_now)
                if _due(self.step, cfg.checkpoint_every):
                    self._checkpoint()
                if dist_.any_rank(stop.requested):
                    self._stop_on_signal(stop.signal or "SIGINT")
        self.step = cfg.steps
        dist_.rank_zero_only(self._evaluate, probe=self._can_probe())  # probes always at the end
        cks = list_checkpoints(self.run_path)
        if not cks or cks[-1][0] != cfg.steps:
            self._checkpoint()
        result = self._finish(self._elapsed())
        dist_.barrier()  # rank 0 has written the final files
        return result

    # -- setup ---------------------------------------------------------------------------------------
    def _check_run_dir(self) -> None:
        p = self.run_path
        if p.exists() and not p.is_dir():
            raise InputError(f"run directory {p} is a file", "choose another --out")
        from ..runs import hold_lock

        hold_lock(p)  # one writer per run, before anything is read or removed
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            return
        old = read_json(cfg_file)
        new = self.config.to_dict()
        old_id = config_identity(old)
        new_id = self.config.identity()
        if old_id != new_id:
            if not self.overwrite:
                diff = sorted(set(old_id) | set(new_id))
                parts = [
                    f"{k}: {old_id.get(k)!r} (there) vs {new_id.get(k)!r} (requested)"
                    for k in diff
                    if old_id.get(k) != new_id.get(k)
                ]
                raise CompatibilityError(
                    f"{p} holds a run with a different configuration "
                    f"(there: task={old.get('task')}, regime={old.get('regime')}, seed={old.get('seed')}; "
                    f"requested: task={new['task']}, regime={new['regime']}, seed={new['seed']}; differing: "
                    + "; ".join(parts)
                    + ")",
                    "choose another --out, or pass --overwrite to replace it",
                )
            self._clear()
            return
        has_progress = bool(list_checkpoints(p)) or (p / "model.safetensors").exists()
        if has_progress and not (self.resume or self.overwrite):
            raise CompatibilityError(
                f"{p} already holds this run (checkpoints or a final model)",
                "pass --resume to continue it, or --overwrite to start over",
            )
        if self.overwrite:
            self._clear()

    def _clear(self) -> None:
        """Remove the artefacts this trainer writes (only those) from the run directory."""
        p = self.run_path
        for name in (
            "metrics.jsonl",
            "model.safetensors",
            "probes.safetensors",
            "probe_metrics.npz",
            "summary.json",
            "config.json",
            "data/othello-pool.npy",
        ):
            (p / name).unlink(missing_ok=True)
        for _, ck in list_checkpoints(p):
            ck.unlink(missing_ok=True)

    def _vocab_and_len(self) -> tuple[int, int]:
        if self.task is not None:
            return self.task.vocab_size, self.task.seq_len
        from ..data import load_token_array

        tokens, vocab, manifest = load_token_array(self.config.corpus)
        n, t1 = tokens.shape
        if n <= self.config.eval_size:
            raise ConfigError(
                f"corpus {self.config.corpus} has {n} windows, not more than eval_size={self.config.eval_size}",
                "lower --eval-size (the rest are training windows)",
            )
        vs = len(vocab) if vocab is not None else int(tokens.max()) + 1
        self._corpus_tokens = tokens
        self._corpus_info = {
            "windows": n,
            "vocab_size": vs,
            "vocab_hash": (manifest or {}).get("vocab_hash")
            or (vocab_hash(vocab, len(vocab)) if vocab is not None else None),
            "tokens_sha256": (manifest or {}).get("tokens_sha256"),
        }
        return vs, t1

    def _data_vocab_hash(self) -> str | None:
        """:func:`originlens.storage.vocab_hash` of the training data's token strings (the task's vocabulary,
        or the corpus's); None for a bare ``.npy`` of windows (no token strings)."""
        if self.task is not None:
            vocab = list(getattr(self.task, "vocab", None) or [])
            return vocab_hash([str(t) for t in vocab], len(vocab)) if vocab else None
        vh = self._corpus_info.get("vocab_hash")
        return None if vh is None else str(vh)

    def _check_checkpoint_vocab(self) -> None:
        """Resuming (or replaying) a run: its latest checkpoint must record this data's vocabulary (header
        only; checkpoints written before the hash was recorded pass)."""
        cks = list_checkpoints(self.run_path)
        if cks and self.vocab_hash is not None:
            check_checkpoint_vocab(cks[-1][1], checkpoint_metadata(cks[-1][1]), self.vocab_hash)

    def _train_data(self) -> _SampledData | _PoolData:
        cfg = self.config
        if cfg.task == LANGUAGE:
            train = self._corpus_tokens[: len(self._corpus_tokens) - cfg.eval_size]
            return _PoolData(train, cfg.seed, cfg.batch_size, f"the first windows of {cfg.corpus}")
        if cfg.task == "othello":
            task = cfg.make_task(with_feature_types=False)
            if cfg.othello_pool == 0:
                return _SampledData(task, cfg.seed, cfg.batch_size)
            path = self.rundir.file("data", "othello-pool.npy")
            pool = None
            if path.is_file():
                pool = np.load(path, allow_pickle=False)
                if pool.shape != (cfg.othello_pool, task.seq_len):
                    pool = None
            if pool is None:
                t0 = time.time()
                pool = othello_pool(cfg.othello_pool, cfg.seed)
                atomic_save_npy(path, pool)
                log(f"generated {len(pool)} Othello games in {time.time() - t0:.0f} s ({path})", level=2)
            return _PoolData(
                pool,
                cfg.seed,
                cfg.batch_size,
                f"a pool of Othello games (chunk c of {POOL_CHUNK}: default_rng([seed, {POOL_STREAM}, c]))",
            )
        if cfg.train_size:
            pool = self.task.sample(cfg.train_size, np.random.default_rng([cfg.seed, POOL_STREAM])).tokens
            return _PoolData(
                pool.astype(np.uint8),
                cfg.seed,
                cfg.batch_size,
                f"a fixed training set {cfg.task}.sample({cfg.train_size}, numpy.random.default_rng("
                f"[seed, {POOL_STREAM}])).tokens",
            )
        return _SampledData(self.task, cfg.seed, cfg.batch_size)

    def _eval_data(self) -> EvalData:
        cfg = self.config
        if cfg.eval_size == 0:
            return EvalData(np.zeros((0, self.gpt_config.seq_len), dtype=np.int64), None)
        if cfg.task == LANGUAGE:
            tok = np.asarray(self._corpus_tokens[len(self._corpus_tokens) - cfg.eval_size :], dtype=np.int64)
            return EvalData(tok, None)
        rng = np.random.default_rng([cfg.effective_eval_seed, EVAL_STREAM])
        sample = getattr(self.task, "sample_eval", self.task.sample)  # held-out split (tinystories)
        batch = sample(cfg.eval_size, rng)
        return EvalData(batch.tokens, batch)

    def _write_environment(self, resumed: bool = False) -> None:
        """Write ``environment.json``; when ``resumed``, first refuse data whose hashes differ from those
        the run started with (a corpus rebuilt in place, another pool or eval set)."""
        hashes = self._data_hashes()
        env = self.rundir.file("environment.json")
        if resumed and env.is_file():
            before = read_json(env).get("data_hashes") or {}
            changed = sorted(k for k in set(before) & set(hashes) if before[k] != hashes[k])
            if changed:
                raise CompatibilityError(
                    f"{self.run_path} was started on other data (differs in: {', '.join(changed)})",
                    "resume on the data the run started with, or pass --overwrite to start over",
                )
        self._thread_history = self._threads_used(env if resumed else None)
        self._write_environment_file(hashes)

    def _threads_used(self, env: Path | None) -> list[int]:
        """The torch CPU thread counts of the run's start and each resume (this one last).  A CPU run resumed
        with another count than it started with gets a warning: matrix products reduce in a thread-dependent
        order, so its later weights differ in the last bits from an uninterrupted run (docs/reliability.md)."""
        now = torch.get_num_threads()
        if env is None or not env.is_file():
            return [now]
        before = read_json(env)
        history = [int(t) for t in before.get("torch_threads_history") or [before.get("torch_threads", now)]]
        if self.device.type == "cpu" and history[0] != now and self._writer:
            log(
                f"warning: {self.run_path} started with {history[0]} torch thread(s) and resumes with {now}; "
                f"on CPU the weights after this point differ in the last bits from an uninterrupted run "
                f"(pass --threads {history[0]} for a bit-identical resume)",
                level=0,
            )
        return history + [now]

    def _data_hashes(self) -> dict[str, str]:
        hashes: dict[str, str] = {}
        pool = self.rundir.file("data", "othello-pool.npy")
        if self.config.task == "othello" and self.config.othello_pool and pool.is_file():
            hashes["othello_pool_sha256"] = sha256_file(pool)
        for k in ("vocab_hash", "tokens_sha256"):
            if self._corpus_info.get(k):
                hashes[f"corpus_{k}"] = self._corpus_info[k]
        if isinstance(self.data, _PoolData) and self.config.task in COUNTING_TASKS:
            hashes["train_set_sha256"] = array_sha256(self.data.pool)
        if self.config.task == LANGUAGE and not self._corpus_info.get("tokens_sha256"):
            hashes["corpus_array_sha256"] = array_sha256(np.asarray(self._corpus_tokens))  # a bare .npy
        if len(self.eval_data.tokens):
            hashes["eval_tokens_sha256"] = array_sha256(self.eval_data.tokens.astype(np.int64))
        return hashes

    def _write_environment_file(self, hashes: dict[str, str]) -> None:
        self.rundir.write_environment(
            seeds={
                "seed": self.config.seed,
                "eval_seed": self.config.effective_eval_seed,
                "model_init": f"torch.manual_seed({self.config.seed})",
                "numpy_global": f"numpy.random.seed({numpy_global_seed(self.config.seed)})",
            },
            data_hashes=hashes,
            extra={
                "data_order": self.data.describe(),
                "eval_set": (
                    f"last {self.config.eval_size} windows of {self.config.corpus}"
                    if self.config.task == LANGUAGE
                    else f"{self.config.task}.sample({self.config.eval_size}, numpy.random.default_rng("
                    f"[eval_seed, {EVAL_STREAM}]))"
                ),
                "device": str(self.device),
                "torch_threads": torch.get_num_threads(),
                "torch_threads_history": getattr(self, "_thread_history", [torch.get_num_threads()]),
                "processes": dist_.world()[1],
                "gpt_config": self.gpt_config.to_dict(),
                "num_params": self.model.num_params(),
                "corpus": self._corpus_info or None,
            },
        )

    def _restore(self) -> int:
        """Load the latest checkpoint when resuming; trims metrics logged after it.  Returns its step."""
        cks = list_checkpoints(self.run_path)
        if not self.resume or not cks:
            for name in ("metrics.jsonl", "summary.json", "model.safetensors") if self._writer else ():
                self.rundir.file(name).unlink(missing_ok=True)
            self.step = 0
            return 0
        step, path = cks[-1]
        if step > self.config.steps:
            raise ConfigError(
                f"{self.run_path} is already at step {step} > steps={self.config.steps}",
                "pass --steps ≥ the trained steps, or --overwrite to start over",
            )
        loaded = load_checkpoint(path, self.model, self.optimizer, expect_vocab_hash=self.vocab_hash)
        if loaded != step:
            raise CompatibilityError(f"{path} says step {loaded}", "the checkpoint was renamed; remove it")
        bad = [
            n
            for n, t in [
                *self.model.named_parameters(),
                *(
                    (f"adam.{i}.{k}", v)
                    for i, st in enumerate(self.optimizer.state.values())
                    for k, v in st.items()
                    if torch.is_tensor(v)
                ),
            ]
            if not bool(torch.isfinite(t).all())
        ]
        if bad:
            earlier = [str(p) for s_, p in cks if s_ < step]
            raise NumericalError(
                f"checkpoint {path} holds non-finite values (in {', '.join(bad[:3])}"
                + (" …" if len(bad) > 3 else "")
                + "); it is not a good checkpoint to resume from",
                f"delete it to resume from {earlier[-1]}"
                if earlier
                else "delete it, or pass --overwrite to start over",
            )
        if self._writer:
            # Records after the checkpoint are dropped (they are logged again).  The final checkpoint is
            # written after the final eval/probe records of the same step, and run() always evaluates at
            # the end: resuming from it (a kill before the final model/summary) re-logs them, so they go too.
            final = step == self.config.steps
            kept = [
                r
                for r in self.rundir.read_metrics()
                if int(r.get("step", 0)) < step
                or (int(r.get("step", 0)) == step and not (final and r.get("event") in ("eval", "probe")))
            ]
            atomic_write_bytes(
                self.rundir.file("metrics.jsonl"), "".join(json.dumps(r) + "\n" for r in kept).encode("utf-8")
            )
            self.rundir.file("summary.json").unlink(missing_ok=True)
        self.last_checkpoint = path
        self.step = step
        meta = checkpoint_metadata(path)
        self._seconds_before = float(json.loads(meta.get("train_seconds", "0")))
        if int(json.loads(meta.get("processes", "1"))) != dist_.world()[1]:
            log(
                f"note: {path} was written by a run with {json.loads(meta.get('processes', '1'))} process(es), "
                f"resuming with {dist_.world()[1]}: the continuation equals an uninterrupted run to round-off "
                "only (bit-exact resume needs the same number of processes)",
                level=1,
            )
        log(f"resuming {self.run_path} from step {step}", level=2)
        return step

    # -- periodic actions ----------------------------------------------------------------------------
    def _elapsed(self) -> float:
        """Wall seconds of this run so far, including earlier sessions up to their last checkpoint."""
        return self._seconds_before + time.time() - self._t_start

    def _fire(self, event: str) -> None:
        for fn in self.callbacks[event]:
            fn(self)

    def _can_probe(self) -> bool:
        b = self.eval_data.batch if hasattr(self, "eval_data") else None
        return b is not None and self.config.probe_size >= 10

    def _probe_positions(self) -> list[int]:
        pp = self.config.probe_positions
        T = self.gpt_config.seq_len
        if pp == "all":
            return list(range(1, T))
        if pp == "tracked":
            return sorted(set(self.task.tracked.positions))
        bad = [i for i in pp if not 1 <= i < T]
        if bad:
            raise ConfigError(f"probe positions {bad} outside 1..{T - 1}", "choose positions of the sequence")
        return list(pp)

    @torch.no_grad()
    def _evaluate(self, probe: bool) -> None:
        """Eval loss and task metrics on the eval set; with ``probe``, fit probes on its residuals."""
        cfg = self.config
        tokens = self.eval_data.tokens
        n = len(tokens)
        if n == 0:
            return
        was_training = self.model.training
        self.model.eval()
        positions = self._probe_positions() if probe else []
        K = self.gpt_config.n_layer + 1
        n_probe = cfg.probe_size if probe else 0
        resid = (
            [np.empty((n_probe, len(positions), self.gpt_config.d_model), dtype=np.float32) for _ in range(K)]
            if probe
            else []
        )
        preds = np.empty((n, tokens.shape[1]), dtype=np.int64)
        total, count = 0.0, 0
        width = max(self.gpt_config.vocab_size, 4 * self.gpt_config.d_model)
        chunk = max(1, min(n, (1 << 26) // (tokens.shape[1] * width)))  # ≈ 256 MB of logits/activations
        pos_idx = torch.tensor(positions, dtype=torch.long, device=self.device)
        for a in range(0, n, chunk):
            b = min(n, a + chunk)
            x = torch.from_numpy(tokens[a:b]).to(self.device)
            want = probe and a < n_probe
            if want:
                logits, res = self.model(x, return_residuals=True)
            else:
                logits = self.model(x)
            V = logits.shape[-1]
            ce = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, V).double(), x[:, 1:].reshape(-1), reduction="sum"
            )
            total += float(ce)
            count += (b - a) * (x.shape[1] - 1)
            preds[a:b] = logits.argmax(-1).cpu().numpy()
            if want:
                e = min(b, n_probe)
                for k in range(K):
                    resid[k][a:e] = res[k][: e - a].index_select(1, pos_idx).float().cpu().numpy()
        if was_training:
            self.model.train()
        record: dict[str, Any] = {"eval_loss": total / count}
        if self.eval_data.batch is not None:
            record.update(task_metrics(preds, self.eval_data.batch))
        if not math.isfinite(record["eval_loss"]):
            raise NumericalError(
                f"eval loss is {record['eval_loss']} at step {self.step}", "lower --lr; resume from the last checkpoint"
            )
        self.last_eval = record
        self.rundir.log_metrics({"event": "eval", "step": self.step, **record})
        self._fire("on_eval")
        if probe:
            self._fit_probes(resid, positions)

    def _fit_probes(self, resid: list[np.ndarray], positions: list[int]) -> None:
        cfg = self.config
        batch = self.eval_data.batch
        n = cfg.probe_size
        Y = batch.features[:n][:, positions]
        FT = None if batch.feature_types is None else batch.feature_types[:n][:, positions]
        ws, bs, per_layer = [], [], []
        for r in resid:
            ps, pm = fit_probes(
                r[:, None],
                Y,
                feature_names=batch.feature_names,
                feature_types=FT,
                layers=[0],
                positions=list(range(len(positions))),
                alpha=cfg.probe_alpha,
                train_frac=cfg.probe_train_frac,
            )
            ws.append(ps.weights)
            bs.append(ps.intercepts)
            per_layer.append(pm)
        layers = list(range(len(resid)))
        types = sorted({t for pm in per_layer for t in pm.by_type})
        shape = per_layer[0].pearson.shape[1:]

        def stack(get: Callable[[ProbeMetrics], np.ndarray | None]) -> np.ndarray:
            return np.concatenate(
                [get(pm) if get(pm) is not None else np.full((1, *shape), np.nan) for pm in per_layer]
            )

        metrics = ProbeMetrics(
            pearson=stack(lambda m: m.pearson),
            r2=stack(lambda m: m.r2),
            mse=stack(lambda m: m.mse),
            accuracy=stack(lambda m: m.accuracy),
            by_type={t: stack(lambda m, t=t: m.by_type.get(t)) for t in types},
            layers=layers,
            positions=list(positions),
            feature_names=list(batch.feature_names),
        )
        self.probes = ProbeSet(
            weights=np.concatenate(ws),
            intercepts=np.concatenate(bs),
            layers=layers,
            positions=list(positions),
            feature_names=list(batch.feature_names),
            alpha=float(cfg.probe_alpha),
        )
        self.probe_metrics = metrics
        self.last_probe = probe_summary(metrics, self.task.tracked)
        self.rundir.log_metrics({"event": "probe", "step": self.step, **self.last_probe})
        self._fire("on_probe")

    def _stop_on_signal(self, name: str) -> None:
        """SIGINT/SIGTERM arrived during training: checkpoint the current update (unless it just was) and
        raise :class:`~originlens.interrupts.Interrupted` naming it."""
        cks = list_checkpoints(self.run_path)
        if not cks or cks[-1][0] != self.step:
            self._checkpoint()
        where = self.last_checkpoint or checkpoint_path(self.rundir, self.step)
        raise Interrupted(
            f"{name} at update {self.step}/{self.config.steps}: checkpoint {where} written; continue with --resume",
            name,
        )

    def _checkpoint(self) -> None:
        parallel.check_in_sync(self.model.parameters(), f"update {self.step}")
        if not self._writer:
            return
        path = checkpoint_path(self.rundir, self.step)
        save_checkpoint(
            path,
            self.model,
            self.optimizer,
            self.step,
            self.config,
            extra={"data_order": self.data.describe(), "train_seconds": self._elapsed(), "processes": dist_.world()[1]},
            vocab_hash=self.vocab_hash,
        )
        self.last_checkpoint = path
        keep = self.config.keep_checkpoints
        if keep:
            for _, old in list_checkpoints(self.run_path)[:-keep]:
                old.unlink(missing_ok=True)
        self._fire("on_checkpoint")

    def _finish(self, seconds: float) -> TrainResult:
        cfg = self.config
        if not self._writer:
            return TrainResult(self.run_path, self.step, {}, {}, seconds)
        meta: dict[str, Any] = {"task": cfg.task, "regime": cfg.regime, "seed": cfg.seed, "step": self.step}
        if self.vocab_hash is not None:
            meta["vocab_hash"] = self.vocab_hash
        self.model.save(self.rundir.file("model.safetensors"), metadata=meta)
        if self.probes is not None and self.probe_metrics is not None:
            self.probes.save(self.rundir.file("probes.safetensors"))
            save_probe_metrics(self.rundir.file("probe_metrics.npz"), self.probe_metrics)
        summary = {
            "finished": True,
            "step": self.step,
            "task": cfg.task,
            "regime": cfg.regime,
            "seed": cfg.seed,
            "identity": cfg.identity(),
            "final_eval": self.last_eval,
            "probe_summary": self.last_probe,
            "seconds": seconds,
            "num_params": self.model.num_params(),
        }
        atomic_write_json(self.rundir.file("summary.json"), summary)
        return TrainResult(self.run_path, self.step, dict(self.last_eval), dict(self.last_probe), seconds)


def _check_finite(named: Any, what: str, update: int, cfg: NTPConfig, last: Path | None) -> None:
    """Raise NumericalError naming the first parameter whose ``what`` ("gradient") is NaN/Inf (one sync)."""
    items = [(n, p.grad) for n, p in named if p.grad is not None]
    if not items or bool(torch.stack([torch.isfinite(g).all() for _, g in items]).all()):
        return
    name = next(n for n, g in items if not bool(torch.isfinite(g).all()))
    raise NumericalError(
        f"non-finite {what} of parameter {name!r} at update {update} ({cfg.task}/{cfg.regime}, seed {cfg.seed}); "
        f"last good checkpoint: {last if last else 'none (no checkpoint yet)'}",
        "lower --lr (or use --dtype float64); resume from the last checkpoint with --resume",
    )


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def train(
    config: NTPConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: dict[str, Callable[[Trainer], None]] | None = None,
) -> TrainResult:
    """Convenience wrapper: build a :class:`Trainer`, register ``callbacks``, run it."""
    trainer = Trainer(config, run_dir, resume=resume, overwrite=overwrite)
    for event, fn in (callbacks or {}).items():
        trainer.add_callback(event, fn)
    return trainer.run()
