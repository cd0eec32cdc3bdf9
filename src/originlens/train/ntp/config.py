"""The configuration of a next-token-prediction run (:class:`NTPConfig`, with the model's architecture
options nested as :class:`ModelOptions`), the paper's per-task defaults (:data:`TASK_DEFAULTS`), the task
lookup and the fields that define a trained model (:func:`config_identity`).  Part of
:mod:`originlens.train.ntp`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...models.gpt import REGIMES, GPTConfig
from ...runs import to_jsonable
from ...tasks import get_task as registry_task
from ...tasks import task_names

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
# Fields that may change between a run and its resumption (they do not change the trained weights).
OPERATIONAL_FIELDS = ("steps", "checkpoint_every", "keep_checkpoints", "device", "log_every")
# Fields added after runs were first recorded, with the value every earlier run implicitly had: at that
# value they are left out of a run's identity, so earlier runs stay finished / resumable.
LATER_FIELDS: dict[str, Any] = {
    "task_options": {},
    "lr_decay": None,
    "matmul_precision": "highest",
    "model": {"mlp_ratio": 4, "tie_embeddings": True, "untie_init": "independent", "dropout": 0.0},
}


def config_identity(d: dict[str, Any]) -> dict[str, Any]:
    """A configuration mapping without :data:`OPERATIONAL_FIELDS` and without :data:`LATER_FIELDS` at their
    default values: what defines the trained model."""
    return {
        k: v for k, v in d.items() if k not in OPERATIONAL_FIELDS and not (k in LATER_FIELDS and v == LATER_FIELDS[k])
    }


def all_task_names() -> list[str]:
    """Tasks the trainer accepts: the registry's (:func:`originlens.tasks.task_names`) and ``language``
    (a token store)."""
    return [*task_names(), LANGUAGE]


def get_task(name: str, **kw: Any) -> Any:
    """The task object of a registry name (:func:`originlens.tasks.get_task`)."""
    return registry_task(name, **kw)


@dataclass(frozen=True)
class ModelOptions:
    """The :class:`~originlens.models.gpt.GPTConfig` choices a run makes beyond the fields :class:`NTPConfig`
    owns (its shape, regime, dtype and attention kernel) and those the task fixes (|V|, T): nested in
    ``NTPConfig.model``. Defaults are GPTConfig's (the papers' architecture), validated by GPTConfig.

    ``dropout > 0`` makes training stochastic beyond the data order (the torch RNG state is checkpointed,
    so resumption stays exact), but the gradient-pathway attribution replays updates without it and
    refuses such runs.
    """

    mlp_ratio: int = 4
    tie_embeddings: bool = True
    untie_init: str = "independent"
    dropout: float = 0.0


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
    for ``tinystories``); part of the run's identity.  ``lr_decay``: ``None`` (the paper: a constant
    learning rate) or ``[a, b]`` (updates, 0 ≤ a < b): constant ``lr`` up to update a, then a linear
    cool-down to ``lr / (b − a)`` at update b, held after b (:meth:`lr_at`); a pure function of the update
    number, so resume and the attribution replay take exactly the trained steps.  ``model``: the
    architecture options beyond the shape (:class:`ModelOptions`: MLP ratio, tied embeddings, the untied
    copies' initialisation, dropout), a mapping accepted; at their defaults they are left out of the run's
    identity.
    """

    task: str = "cond-majority"
    regime: str = "standard"
    seed: int = 0
    n_layer: int | None = None
    d_model: int | None = None
    n_head: int | None = None
    batch_size: int | None = None
    lr: float = 1e-3
    lr_decay: list[int] | None = None
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
    # "tf32": CUDA float32 products in TF32 (devices.configure_device); no effect on the CPU
    matmul_precision: str = "highest"
    attn_impl: str = "sdpa"
    othello_pool: int = 500_000
    corpus: str | None = None
    eval_seed: int | None = None
    model: ModelOptions = field(default_factory=ModelOptions)

    def __post_init__(self) -> None:
        if isinstance(self.model, dict):
            unknown = sorted(set(self.model) - set(ModelOptions.__dataclass_fields__))
            if unknown:
                raise ConfigError(
                    f"unknown model option(s) {unknown}",
                    f"use: {', '.join(ModelOptions.__dataclass_fields__)}",
                )
            self.model = ModelOptions(**self.model)
        elif not isinstance(self.model, ModelOptions):
            raise ConfigError(
                f"model must be ModelOptions or a mapping, got {self.model!r}", "e.g. model={'mlp_ratio': 2}"
            )
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
        if self.lr_decay is not None:
            d = self.lr_decay
            if (
                not isinstance(d, (list, tuple))
                or len(d) != 2
                or any(isinstance(v, bool) or not isinstance(v, int) for v in d)
                or not 0 <= d[0] < d[1]
            ):
                raise ConfigError(
                    f"lr_decay must be two update numbers 0 ≤ a < b, got {d!r}",
                    "e.g. lr_decay=[9600, 12000] (cool down over the last 20 % of 12,000 updates), or None",
                )
            self.lr_decay = [int(d[0]), int(d[1])]
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
        from ...devices import check_device_spec, check_matmul_precision

        check_device_spec(self.device)
        self.matmul_precision = check_matmul_precision(self.matmul_precision)
        assert self.probe_size is not None and self.eval_size is not None  # need_int above
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
        assert self.n_layer is not None and self.d_model is not None and self.n_head is not None  # task defaults
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
            **asdict(self.model),
        )

    def lr_at(self, update: int) -> float:
        """The learning rate of update ``update`` (1-based): ``lr``, or under ``lr_decay = [a, b]``
        ``lr · min(1, (b − s + 1) / (b − a))`` for s > a, never below ``lr / (b − a)``."""
        if self.lr_decay is None or update <= self.lr_decay[0]:
            return float(self.lr)
        a, b = self.lr_decay
        return float(self.lr) * max(1, b - int(update) + 1) / (b - a)

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
        from ...config import from_mapping

        return from_mapping(cls, d, where=where)

    def replace(self, **changes: Any) -> NTPConfig:
        return NTPConfig.from_dict({**self.to_dict(), **changes})


# ----------------------------------------------------------------------------------------------------
# Data
