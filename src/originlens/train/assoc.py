"""Training the Def. 3.1 attention-only model of arXiv 2601.19208: full-batch GD or plain minibatch SGD.

``train_assoc(tokens, vocab_size, cfg)`` trains an :class:`~originlens.models.assoc.AssocModel` on an
(N, T+1) token array and writes a run directory (``originlens.runs.RunDir``)::

    RUN/config.json                              configuration, data hash and run id
    RUN/environment.json                         versions, seeds, data hash, resolved settings
    RUN/metrics.jsonl                            {"event": "step", "step", "epoch", "loss"} per logged step;
                                                 {"event": "checkpoint", "step", "path", "theory", ...}
    RUN/checkpoints/step-NNNNNN.safetensors      weights + data-order RNG state (exact resume)
    RUN/model.safetensors                        final weights (kind "assoc-model")

Optimiser: ``batch_size=None`` is full-batch gradient descent Θ(s) = Θ(s−1) − η∇L(Θ(s−1)) (the theory);
otherwise plain SGD (no momentum, weight decay or schedule) on minibatches drawn from a permutation of
the N sequences that is redrawn every epoch from a ``torch.Generator`` seeded with ``data_seed`` (the
paper's seed, 42; the order itself is originlens's, not the authors' code's: docs/protocol.md); a last
partial batch is kept.  Neither has optimiser state; checkpoints record this.
The loss at step s (logged as ``loss``) is the batch loss at Θ(s−1), i.e. before the s-th update.

Large batches are processed in chunks of ``grad_chunk`` sequences whose gradients are accumulated with
weights n_chunk/n_batch (equal to the unchunked gradient up to round-off; the chunking is part of the
run's identity so resumed runs stay bit-identical).

Statistics for the per-checkpoint theory comparison come from ``stats=`` or are computed by the trainer
(:meth:`AssocTrainer.target_windows`, :func:`originlens.stats.corpus_statistics`) on the first shuffled
batch (the windows of the first SGD step, ``torch.randperm(N, Generator(data_seed))[:batch]``: the paper's
"first batch"; the authors' code draws it from a separate first pass of its DataLoader) or on
all windows (``stats_source="full"``; full-batch GD always uses all windows).  They are computed with the
model's vocabulary size |V| — so the centring constant 1/|V| is that of the model's softmax — and with the
token strings when ``vocab=`` is given, and written to ``RUN/statistics/`` (manifest: source, data seed,
window indices) before the first step; the source is recorded with every comparison.

Device: ``device="cpu"`` (default), ``"cuda"`` / ``"cuda:N"`` or ``"auto"`` (CUDA when available).  Asking
for CUDA where torch sees none is a :class:`~originlens.errors.ConfigError`.  The device is not part of
the run's identity (the trajectory is the same up to round-off); exact resume is guaranteed on CPU only.

Resume: ``resume=True`` continues from the last checkpoint (weights, step, data-order RNG state), drops
metrics logged after it, and on CPU ends with bit-identical weights to an uninterrupted run.  A
checkpoint's ``checkpoint`` record is appended only after its file is in place (so a record always names
a complete file); when a kill came in between, the resumed run logs the lost record (before its
``resume`` record), so metrics end as an uninterrupted run's plus ``resume`` records.  A run
directory holding a run with another configuration or other data is never overwritten unless
``overwrite=True``; a directory holding anything else (another kind of run, foreign files) is never
overwritten.  A checkpoint that cannot be read, belongs to another run or lacks tensors is an error
naming the file.  Non-finite losses, gradients or weights raise
:class:`~originlens.errors.NumericalError` naming the step, the tensor and the last good checkpoint (no
file is written for the failed step; an ``error`` event is appended to ``metrics.jsonl``).

Data-parallel: under ``torchrun --nproc_per_node W`` (process group from :func:`originlens.distributed.init`)
every rank draws the same global batch and takes its contiguous rows; the slices' gradients, scaled by
their share of the batch, are all-reduced (:mod:`originlens.train.parallel`), so the trajectory equals
one process's to round-off.  Only rank 0 writes (run directory, statistics, metrics, checkpoints) and
compares with the theory; the other ranks load the same checkpoint on resume.  A stop requested on any
rank stops all of them.

Callbacks (minGPT style): objects with any of ``on_step_end(trainer)``, ``on_checkpoint(trainer, path)``,
``on_train_end(trainer)``; ``trainer.request_stop()`` ends training cleanly after the current step
(a checkpoint is written so the run can be resumed).

Size: the trainer is one class whose step, data order, checkpoint and resume logic must change together to
keep resumption bit-identical; its configuration and run-directory helpers sit beside it.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Iterable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch

from .. import distributed as dist_
from ..data.store import check_window_array
from ..devices import resolve_device
from ..errors import CompatibilityError, ConfigError, InputError, NumericalError
from ..interrupts import Interrupted, deferred
from ..models.assoc import CHECKPOINT_KIND, MODEL_KIND, AssocConfig, AssocModel
from ..progress import log, progress
from ..runs import CHECKPOINT_DIR, RunDir, checkpoint_name, list_checkpoints, to_jsonable
from ..storage import atomic_write_text, load_tensors, read_json, save_tensors, vocab_hash
from . import parallel

RNG_KEY = "trainer.data_rng_state"
STATS_DIR = "statistics"
# fields that may change when a run is resumed/extended (they do not change the trajectory).  The
# statistics source is not among them: it changes every recorded theory comparison, so a resume with
# another one would mix two sources in one run's records
_EXTENDABLE = (
    "steps",
    "epochs",
    "checkpoint_every",
    "checkpoint_every_epochs",
    "checkpoint_at",
    "keep_checkpoints",
    "log_every",
    "out",
    "device",
)
GRAD_CHUNK_BUDGET_BYTES = {"cpu": 2 * 1024**3, "cuda": 8 * 1024**3}
RUN_KIND = "assoc-train-run"
DEVICES = ("cpu", "cuda", "auto")


@dataclass
class AssocTrainConfig:
    """Everything that defines a training run of the Def. 3.1 model.

    * ``steps`` or ``epochs`` (exactly one): length of training; an epoch is ⌈N / batch_size⌉ steps
      (1 step for full-batch GD).
    * ``batch_size``: None = full-batch GD (theory); an integer = minibatch SGD (paper: 2048).
    * ``init``: "zero" (paper) or "gaussian" with ``init_std``; ``seed`` seeds the init draw,
      ``data_seed`` the data order (paper: 42).
    * ``checkpoint_every`` (steps) / ``checkpoint_every_epochs`` / ``checkpoint_at`` (explicit steps):
      checkpoint schedule; the final step is always checkpointed.  ``keep_checkpoints``: keep only the
      newest k checkpoint files (metrics of all checkpoints are kept).
    * ``stats_source``: "first_batch" (paper), "full" or "none" — statistics for the per-checkpoint
      theory comparison when ``train_assoc`` is not given ``stats``.
    * ``grad_chunk``: sequences per forward pass (gradients accumulated); None = automatic from a
      2 GiB activation estimate.
    * ``impl``: forward implementation of :class:`AssocModel` ("auto", "paths", "gather", "dense").
    * ``device``: "cpu" (default), "cuda", "cuda:N" or "auto" (see :func:`resolve_device`).
    """

    n_layers: int = 3
    lr: float = 0.005
    steps: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    init: str = "zero"
    init_std: float = 0.0
    dtype: str = "float32"
    seed: int = 0
    data_seed: int = 42
    checkpoint_every: int = 0
    checkpoint_every_epochs: float | None = None
    checkpoint_at: tuple[int, ...] = ()
    keep_checkpoints: int | None = None
    log_every: int = 1
    stats_source: str = "first_batch"
    grad_chunk: int | None = None
    impl: str = "auto"
    out: str | None = None
    device: str = "cpu"

    @property
    def optimizer(self) -> str:
        """ "gd" (full batch) or "sgd" (minibatches)."""
        return "gd" if self.batch_size is None else "sgd"

    def validate(self) -> None:
        if (self.steps is None) == (self.epochs is None):
            raise ConfigError("give exactly one of steps and epochs", "set steps=S or epochs=E")
        for name in ("steps", "epochs"):
            v = getattr(self, name)
            if v is not None and (int(v) != v or v < 1):
                raise ConfigError(f"{name} must be a positive integer (got {v})", f"pass {name} ≥ 1")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError(f"learning rate must be a positive number (got {self.lr})", "pass lr > 0")
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ConfigError(
                f"batch_size must be ≥ 1 or None (got {self.batch_size})",
                "pass a positive batch size, or None for full-batch GD",
            )
        if self.grad_chunk is not None and int(self.grad_chunk) < 1:
            raise ConfigError(f"grad_chunk must be ≥ 1 or None (got {self.grad_chunk})", "pass a positive chunk")
        if self.stats_source not in ("first_batch", "full", "none"):
            raise ConfigError(f"unknown stats_source '{self.stats_source}'", "use first_batch, full or none")
        if self.checkpoint_every < 0 or self.log_every < 1:
            raise ConfigError("checkpoint_every must be ≥ 0 and log_every ≥ 1", "fix the schedule")
        if self.checkpoint_every_epochs is not None and not self.checkpoint_every_epochs > 0:
            raise ConfigError("checkpoint_every_epochs must be > 0", "pass e.g. 2 (every two epochs)")
        if self.keep_checkpoints is not None and self.keep_checkpoints < 1:
            raise ConfigError("keep_checkpoints must be ≥ 1 or None", "pass None to keep all")
        if any(int(s) < 1 for s in self.checkpoint_at):
            raise ConfigError("checkpoint_at steps must be ≥ 1", "list positive step numbers")
        self.model_config(2, 1).validate()
        resolve_device(self.device)

    def model_config(self, vocab_size: int, seq_len: int) -> AssocConfig:
        return AssocConfig(
            vocab_size=vocab_size,
            seq_len=seq_len,
            n_layers=self.n_layers,
            init=self.init,
            init_std=self.init_std,
            dtype=self.dtype,
            seed=self.seed,
            impl=self.impl,
        )


def run_dir_kind(path: str | Path) -> str:
    """What ``path`` holds: ``"missing"``, ``"empty"``, ``"assoc"`` (a run written by this trainer),
    ``"unreadable"`` (a config.json that is not valid JSON) or ``"foreign"`` (anything else)."""
    p = Path(path)
    if not p.exists():
        return "missing"
    if not p.is_dir():
        return "foreign"
    cfg = p / "config.json"
    if not cfg.exists():
        # RunDir() creates empty checkpoints/ and figures/ before config.json is written: a run killed in
        # between left only that skeleton, which counts as empty (resumable), anything else as foreign
        skeleton = all(
            (q.is_dir() and q.name in ("checkpoints", "figures") and not any(q.iterdir()))
            or (q.name == ".lock" and q.is_file())
            for q in p.iterdir()
        )
        return "empty" if skeleton else "foreign"
    try:
        old = read_json(cfg)
    except InputError:
        return "unreadable"
    if (
        isinstance(old, dict)
        and old.get("kind", RUN_KIND) == RUN_KIND
        and "run_id" in old
        and isinstance(old.get("identity"), dict)
    ):
        return "assoc"
    return "foreign"


@dataclass
class AssocRun:
    """Result of :func:`train_assoc`."""

    path: Path | None
    model: AssocModel
    config: AssocTrainConfig
    step: int
    total_steps: int
    optimizer: str
    losses: dict[int, float] = field(default_factory=dict)  # step -> loss at Θ(step−1), this call
    checkpoints: list[Path] = field(default_factory=list)  # written by this call
    comparisons: dict[int, dict] = field(default_factory=dict)  # step -> compare_to_theory(...)
    stats: Any = None
    stats_windows: Any = None  # window indices of the statistics (None = all)
    resumed_from: int | None = None
    stopped_early: bool = False

    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps


def steps_per_epoch(n_sequences: int, batch_size: int | None) -> int:
    """Optimiser steps per epoch: ⌈N / batch_size⌉ (1 for full-batch GD)."""
    return 1 if batch_size is None else -(-int(n_sequences) // int(batch_size))


def _check_tokens(tokens: Any, vocab_size: int) -> np.ndarray:
    if int(vocab_size) < 1:
        raise ConfigError(f"vocab_size must be ≥ 1 (got {vocab_size})", "pass the vocabulary size")
    arr = check_window_array(tokens.detach().cpu().numpy() if torch.is_tensor(tokens) else tokens, "tokens")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise InputError(
            f"token ids span {lo}..{hi}, outside 0..{vocab_size - 1}", "pass the right vocab_size or remap the ids"
        )
    return np.ascontiguousarray(arr, dtype=np.int64)


def _data_hash(arr: np.ndarray) -> str:
    h = hashlib.sha256(f"{arr.shape}".encode())
    h.update(arr.tobytes())
    return h.hexdigest()


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


class _Bar(Protocol):
    """A progress bar without an iterable: tqdm or :class:`~originlens.progress.Heartbeat`."""

    def update(self, n: int = 1) -> object: ...
    def set_postfix(self, **kw: Any) -> object: ...
    def close(self) -> None: ...


class AssocTrainer:
    """The training loop; callbacks see this object (``step``, ``epoch``, ``loss``, ``model``, ``cfg``,
    ``stats``, ``stats_windows``, ``vocab``, ``device``, ``run_dir``, ``last_checkpoint``, ``total_steps``).

    ``vocab``: optional token strings (length |V|) attached to the statistics the trainer computes.
    """

    def __init__(
        self,
        tokens: Any,
        vocab_size: int,
        cfg: AssocTrainConfig,
        callbacks: Iterable[Any] = (),
        *,
        stats: Any = None,
        vocab: Sequence[str] | None = None,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.tokens = _check_tokens(tokens, vocab_size)
        self.vocab_size = int(vocab_size)
        if vocab is not None and len(vocab) != self.vocab_size:
            raise CompatibilityError(
                f"the vocabulary has {len(vocab)} tokens but vocab_size is {self.vocab_size}",
                "pass the corpus's own vocabulary (or vocab=None)",
            )
        self.vocab = None if vocab is None else [str(t) for t in vocab]
        self.n_sequences, self.seq_len = self.tokens.shape[0], self.tokens.shape[1] - 1
        self.callbacks = list(callbacks)
        self.stats = stats
        self.stats_source = "given" if stats is not None else cfg.stats_source
        self.stats_windows: np.ndarray | None = None  # indices of the windows of computed statistics
        if stats is not None:
            self._check_stats(stats)
        self.spe = steps_per_epoch(self.n_sequences, cfg.batch_size)
        if cfg.steps is not None:
            self.total_steps = int(cfg.steps)
        else:
            assert cfg.epochs is not None  # AssocTrainConfig: exactly one of steps and epochs
            self.total_steps = int(cfg.epochs) * self.spe
        self.batch = self.n_sequences if cfg.batch_size is None else min(int(cfg.batch_size), self.n_sequences)
        self.grad_chunk = int(cfg.grad_chunk) if cfg.grad_chunk is not None else self._auto_chunk()
        self.data_hash = _data_hash(self.tokens)
        self.model = AssocModel(cfg.model_config(self.vocab_size, self.seq_len)).to(self.device)
        self.step = 0
        self.loss: float | None = None
        self.run_dir: RunDir | None = None
        self.last_checkpoint: Path | None = None
        self._stop = False
        self._writer = dist_.world()[0] == 0  # under torchrun only rank 0 writes and compares
        self._gen = torch.Generator().manual_seed(int(cfg.data_seed))
        self._perm: torch.Tensor | None = None
        self._epoch_state: torch.Tensor = self._gen.get_state()
        self._tokens_t = torch.from_numpy(self.tokens).to(self.device)

    def _check_stats(self, stats: Any) -> None:
        from ..theory.leading_terms import statistic_of

        B, D = statistic_of(stats, "bigram"), statistic_of(stats, "positional")
        if B.shape != (self.vocab_size, self.vocab_size) or D.shape != (self.seq_len,):
            raise CompatibilityError(
                f"statistics are {B.shape[0]}×{B.shape[1]} with T = {D.shape[0]}; the model needs "
                f"{self.vocab_size}×{self.vocab_size} with T = {self.seq_len}",
                "compute the statistics on this corpus without a restricted token set",
            )
        if getattr(stats, "token_ids", None) is not None:
            raise CompatibilityError(
                "the statistics are restricted to a token subset (top-K)",
                "compute them over the whole vocabulary of the model",
            )
        svocab = getattr(stats, "vocab", None)
        if self.vocab is not None and svocab is not None and list(svocab) != self.vocab:
            raise CompatibilityError(
                "the statistics were computed with another vocabulary (token strings differ)",
                "compute them on this corpus, or let the trainer compute them",
            )
        vs = getattr(stats, "vocab_size", None)
        if vs is not None and int(vs) != self.vocab_size:
            raise CompatibilityError(
                f"the statistics were centred for |V| = {vs}, the model has |V| = {self.vocab_size}",
                "compute them with the model's vocabulary size",
            )

    # ------------------------------------------------------------------ identity and schedule
    def _auto_chunk(self) -> int:
        bytes_per = 8 if self.cfg.dtype == "float64" else 4
        T, L = self.seq_len, self.cfg.n_layers
        per_seq = (T * self.vocab_size * 4 + 3 * (2 ** (L - 1) * T) ** 2 + 4 * (2**L) * T * T) * bytes_per
        budget = GRAD_CHUNK_BUDGET_BYTES["cuda" if self.device.type == "cuda" else "cpu"]
        return max(1, min(self.batch, budget // max(per_seq, 1)))

    @property
    def epoch(self) -> float:
        """Completed epochs (fractional)."""
        return self.step / self.spe

    def identity(self) -> dict[str, Any]:
        cfg = {k: v for k, v in to_jsonable(self.cfg).items() if k not in _EXTENDABLE}
        cfg["grad_chunk"] = self.grad_chunk
        return {
            "train": cfg,
            "vocab_size": self.vocab_size,
            "n_sequences": self.n_sequences,
            "seq_len": self.seq_len,
            "data_sha256": self.data_hash,
        }

    def run_id(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()[:16]

    def _is_checkpoint_step(self, s: int) -> bool:
        c = self.cfg
        if s == self.total_steps or s in {int(v) for v in c.checkpoint_at}:
            return True
        if c.checkpoint_every and s % int(c.checkpoint_every) == 0:
            return True
        if c.checkpoint_every_epochs:
            every = max(1, int(round(c.checkpoint_every_epochs * self.spe)))
            return s % every == 0
        return False

    def request_stop(self) -> None:
        """Stop after the current step (a checkpoint is written)."""
        self._stop = True

    # ------------------------------------------------------------------ run directory
    def _prepare_dir(self, resume: bool, overwrite: bool) -> int:
        """Create / validate the run directory; returns the step to start from (loads a checkpoint)."""
        assert self.cfg.out is not None  # run() prepares a directory only when out is given
        path = Path(self.cfg.out)
        kind = run_dir_kind(path)
        if kind == "foreign" and not path.is_dir():
            raise ConfigError(f"{path} exists and is not a directory", "choose another out directory")
        if kind == "foreign" and not (path / "config.json").exists():
            raise ConfigError(f"{path} is not empty and holds no originlens run", "choose a new or empty out directory")
        if kind == "unreadable":
            raise ConfigError(
                f"{path} holds an unreadable config.json (not an originlens assoc run?)",
                "choose another out directory; originlens does not delete what it cannot identify",
            )
        if kind == "foreign":
            raise ConfigError(
                f"{path} holds another kind of run (its config.json is not an assoc training config)",
                "choose another out directory (overwrite only replaces assoc runs)",
            )
        from ..runs import hold_lock

        hold_lock(path)  # one writer per run, before anything is removed
        start = 0
        if kind == "assoc":
            old = read_json(path / "config.json")
            same = old.get("run_id") == self.run_id()
            if overwrite:
                self._wipe(path)
            elif not same:
                diff = sorted(
                    k
                    for k in set(old.get("identity", {}).get("train", {})) | set(self.identity()["train"])
                    if old.get("identity", {}).get("train", {}).get(k) != self.identity()["train"].get(k)
                )
                if old.get("identity", {}).get("data_sha256") != self.data_hash:
                    diff.append("data")
                raise ConfigError(
                    f"{path} holds another run (differs in: {', '.join(diff) or 'identity'})",
                    "choose another out directory, or pass overwrite=True to replace it",
                )
            elif not resume:
                raise ConfigError(
                    f"{path} already holds this run", "pass resume=True to continue it, or overwrite=True to start over"
                )
            else:
                start = self._load_latest(path)
        self.run_dir = RunDir(path)
        self.run_dir.write_config(
            {
                "kind": RUN_KIND,
                "run_id": self.run_id(),
                "identity": self.identity(),
                "config": to_jsonable(self.cfg),
                "optimizer": self.cfg.optimizer,
                "steps_per_epoch": self.spe,
                "total_steps": self.total_steps,
            }
        )
        if start == 0:
            self.run_dir.write_environment(
                seeds={"init": self.cfg.seed, "data_order": self.cfg.data_seed},
                data_hashes={"tokens": self.data_hash},
                extra={
                    "optimizer": self.cfg.optimizer,
                    "optimizer_state": "none (plain GD/SGD)",
                    "grad_chunk": self.grad_chunk,
                    "torch_threads": torch.get_num_threads(),
                    "processes": dist_.world()[1],
                    "stats_source": self.stats_source,
                    "device": str(self.device),
                    "device_name": (torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"),
                },
            )
        else:
            self._warn_thread_change()
        return start

    def _warn_thread_change(self) -> None:
        """A CPU run resumed with another torch thread count than it started with (``environment.json``)
        warns: matrix products reduce in a thread-dependent order, so later weights differ in the last bits
        from an uninterrupted run."""
        assert self.run_dir is not None
        env = self.run_dir.file("environment.json")
        if self.device.type != "cpu" or not env.is_file() or dist_.world()[0] != 0:
            return
        was, now = read_json(env).get("torch_threads"), torch.get_num_threads()
        if was is not None and int(was) != now:
            log(
                f"warning: {self.run_dir.path} started with {was} torch thread(s) and resumes with {now}; on "
                f"CPU the weights after this point differ in the last bits from an uninterrupted run "
                f"(pass --threads {was} for a bit-identical resume)",
                level=0,
            )

    @staticmethod
    def _wipe(path: Path) -> None:
        for name in ("config.json", "environment.json", "metrics.jsonl", "model.safetensors"):
            (path / name).unlink(missing_ok=True)
        shutil.rmtree(path / "checkpoints", ignore_errors=True)
        shutil.rmtree(path / STATS_DIR, ignore_errors=True)

    def _checkpoint_files(self, path: Path) -> list[tuple[int, Path]]:
        return list_checkpoints(path)

    def _load_latest(self, path: Path) -> int:
        ckpts = self._checkpoint_files(path)
        if not ckpts:
            log(f"resume: no checkpoint in {path}, starting from step 0")
            if self._writer:
                self._truncate_metrics(path, 0)
            return 0
        step, f = ckpts[-1]
        if step > self.total_steps:
            raise ConfigError(
                f"{path} has a checkpoint at step {step}, beyond the requested {self.total_steps} steps",
                "ask for at least as many steps as already trained",
            )
        arrays, meta = load_tensors(f, kind=CHECKPOINT_KIND)
        if meta.get("run_id") != self.run_id():
            raise CompatibilityError(f"{f} belongs to another run", "remove it or pass overwrite=True")
        fix = "remove the damaged checkpoint to resume from the one before it, or pass overwrite=True"
        if RNG_KEY not in arrays:
            raise CompatibilityError(f"{f} lacks the data-order state '{RNG_KEY}'", fix)
        try:
            self.model.load_weights(arrays)
        except CompatibilityError as exc:
            raise CompatibilityError(f"{f}: {exc.what}", fix) from None
        bad = [n for n, _ in self.model.named_weights() if not np.isfinite(np.asarray(arrays[n])).all()]
        if bad:
            raise InputError(f"{f} holds non-finite values in {', '.join(bad)}", fix)
        try:
            self._gen.set_state(torch.from_numpy(np.array(arrays[RNG_KEY], dtype=np.uint8)))
        except (RuntimeError, ValueError, TypeError):
            raise CompatibilityError(f"{f} holds an invalid data-order state", fix) from None
        self._epoch_state = self._gen.get_state()
        self._perm = None
        self.step = step
        self.last_checkpoint = f
        if self._writer:
            self._truncate_metrics(path, step)
        log(f"resume: continuing {path} from step {step}")
        return step

    @staticmethod
    def _truncate_metrics(path: Path, step: int) -> None:
        f = path / "metrics.jsonl"
        if not f.exists():
            return
        keep = []
        for line in f.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                break
            if int(rec.get("step", 0)) <= step:
                keep.append(line)
        atomic_write_text(f, "".join(k + "\n" for k in keep))

    # ------------------------------------------------------------------ statistics
    def target_windows(self) -> np.ndarray | None:
        """Indices of the windows the target statistics are computed on (None = all windows).

        "first_batch": the windows of the first SGD step, i.e. the first ``batch`` entries of
        ``torch.randperm(N, Generator().manual_seed(data_seed))`` — the permutation :meth:`_next_batch`
        draws for epoch 1.  "full", full-batch GD, or a batch covering all windows: None.
        """
        if self.cfg.stats_source == "full" or self.cfg.optimizer == "gd" or self.batch >= self.n_sequences:
            return None
        g = torch.Generator().manual_seed(int(self.cfg.data_seed))
        return torch.randperm(self.n_sequences, generator=g)[: self.batch].numpy()

    def _ensure_stats(self) -> None:
        """Compute the target statistics (float64, the model's |V| and centring 1/|V|, token strings if
        known) on :meth:`target_windows` unless given or ``stats_source="none"``."""
        if self.stats is not None or self.cfg.stats_source == "none" or not self._writer:
            return
        from ..stats import corpus_statistics

        idx = self.target_windows()
        sel = self.tokens if idx is None else self.tokens[idx]
        self.stats = corpus_statistics(sel, self.vocab_size, dtype=np.float64, vocab=self.vocab)
        self.stats_windows = idx
        self.stats.meta.update(
            {"source": self.stats_source, "data_seed": int(self.cfg.data_seed), "n_windows": int(sel.shape[0])}
        )

    def _save_stats(self) -> None:
        """Write the target statistics to ``RUN/statistics/`` once (kept on resume)."""
        from ..stats import CorpusStatistics, save_statistics

        if self.run_dir is None or not isinstance(self.stats, CorpusStatistics):
            return
        d = self.run_dir.path / STATS_DIR
        if (d / "statistics.safetensors").exists():
            return
        idx = self.stats_windows
        given = self.stats_source == "given"
        save_statistics(
            self.stats,
            d,
            manifest={
                "source": self.stats_source,
                "data_seed": int(self.cfg.data_seed),
                "n_windows": None if given else int(self.n_sequences if idx is None else len(idx)),
                "windows": "given" if given else ("all" if idx is None else [int(i) for i in idx]),
                "vocab_size": self.vocab_size,
                "centering": float(self.stats.centering),
                "note": "indices into the training windows; first_batch = torch.randperm(N, Generator(data_seed))[:batch]",
            },
        )

    # ------------------------------------------------------------------ checkpoints
    def _save_checkpoint(self) -> Path:
        assert self.run_dir is not None
        tensors: dict[str, torch.Tensor | np.ndarray] = dict(self.model.weights())
        # state at the start of the epoch that contains step+1: after the last step of an epoch the next
        # permutation has not been drawn yet, so that is the generator's current state
        state = self._gen.get_state() if self.step % self.spe == 0 else self._epoch_state
        tensors[RNG_KEY] = state.numpy().copy()
        meta = {
            "step": self.step,
            "epoch": self.epoch,
            "optimizer": self.cfg.optimizer,
            "optimizer_state": "none (plain GD/SGD has no state)",
            "lr": self.cfg.lr,
            "run_id": self.run_id(),
            "vocab_hash": vocab_hash(None, self.vocab_size),
            "rng": "torch.Generator state at the start of the epoch containing step+1",
        }
        f = self.run_dir.file(CHECKPOINT_DIR, checkpoint_name(self.step))
        save_tensors(f, tensors, kind=CHECKPOINT_KIND, metadata=meta)
        self.last_checkpoint = f
        if self.cfg.keep_checkpoints is not None:
            for _, old in self._checkpoint_files(self.run_dir.path)[: -int(self.cfg.keep_checkpoints)]:
                old.unlink(missing_ok=True)
        return f

    def _save_final(self) -> Path:
        assert self.run_dir is not None
        meta = {
            "step": self.step,
            "optimizer": self.cfg.optimizer,
            "lr": self.cfg.lr,
            "run_id": self.run_id(),
            "n_layers": self.cfg.n_layers,
            "vocab_hash": vocab_hash(None, self.vocab_size),
        }
        return save_tensors(
            self.run_dir.file("model.safetensors"), self.model.weights(), kind=MODEL_KIND, metadata=meta
        )

    # ------------------------------------------------------------------ one step
    def _next_batch(self) -> torch.Tensor:
        if self.cfg.optimizer == "gd":
            return self._tokens_t
        pos = self.step % self.spe
        if self._perm is None or pos == 0:
            self._epoch_state = self._gen.get_state()
            self._perm = torch.randperm(self.n_sequences, generator=self._gen)
        idx = self._perm[pos * self.batch : (pos + 1) * self.batch]
        return self._tokens_t.index_select(0, idx.to(self.device))

    def _fail(self, what: str, s: int) -> NumericalError:
        ck = str(self.last_checkpoint) if self.last_checkpoint else "none yet"
        if self.run_dir is not None:
            self.run_dir.log_metrics(
                {
                    "event": "error",
                    "step": s,
                    "error": f"non-finite {what}",
                    "last_checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
                }
            )
        return NumericalError(
            f"non-finite {what} at step {s} (lr={self.cfg.lr}, dtype={self.cfg.dtype})",
            f"lower the learning rate or use dtype='float64'; last good checkpoint: {ck}",
        )

    def _train_step(self, batch: torch.Tensor) -> float:
        s = self.step + 1
        model = self.model
        for p in model.parameters():
            p.grad = None
        impl = model.choose_impl(batch.shape[0], batch.shape[1] - 1)  # resolved for the global batch
        total = parallel.mean_over_shards(  # alone: accumulate_gradients(batch); torchrun: this rank's rows
            lambda rows: model.accumulate_gradients(rows, chunk=self.grad_chunk, impl=impl), batch, model.parameters()
        )
        if not math.isfinite(total):
            raise self._fail("loss", s)
        for name, p in model.named_weights():
            assert p.grad is not None  # accumulate_gradients (mean_over_shards) filled every weight's gradient
            if not torch.isfinite(p.grad).all():
                raise self._fail(f"gradient of {name}", s)
        with torch.no_grad():
            for name, p in model.named_weights():
                assert p.grad is not None
                p.add_(p.grad, alpha=-float(self.cfg.lr))
                if not torch.isfinite(p).all():
                    raise self._fail(f"weight {name} (after the update)", s)
        for p in model.parameters():
            p.grad = None
        return total

    def _compare(self) -> dict | None:
        if self.stats is None or not self._writer:
            return None
        from ..theory.leading_terms import compare_to_theory, min_cosines

        cmp = compare_to_theory(self.model, self.stats, self.step, self.cfg.lr)
        return {"theory": cmp, "min_cos": min_cosines(cmp)}

    def _checkpoint_record(self, path: Path, cmp: dict | None) -> dict[str, Any]:
        """The ``checkpoint`` metrics record of the checkpoint just written at ``self.step``."""
        assert self.run_dir is not None
        rec = {
            "event": "checkpoint",
            "step": self.step,
            "epoch": self.epoch,
            "path": str(path.relative_to(self.run_dir.path)),
            "stats_source": self.stats_source,
            "optimizer": self.cfg.optimizer,
        }
        if cmp is not None:
            rec.update(_nan_to_none(cmp))
        return rec

    def _log_lost_checkpoint_record(self, start: int) -> None:
        """Resuming from the checkpoint at ``start``: log its ``checkpoint`` record if a kill between the
        checkpoint write and the record lost it (the model is that checkpoint's, so the theory comparison
        is the one the interrupted run would have logged)."""
        assert self.run_dir is not None
        if not self._writer or self.last_checkpoint is None:
            return
        if any(r.get("event") == "checkpoint" and int(r.get("step", -1)) == start for r in self.run_dir.read_metrics()):
            return
        cmp = self._compare()
        self.run_dir.log_metrics(self._checkpoint_record(Path(self.last_checkpoint), cmp))

    def _call(self, event: str, *args: Any) -> None:
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self, *args)

    # ------------------------------------------------------------------ main loop
    def run(self, *, resume: bool = False, overwrite: bool = False) -> AssocRun:
        start = 0
        if self.cfg.out is not None:
            with dist_.rank_zero_first() as writer:  # rank 0 prepares RUN, then the others read it
                start = (
                    self._prepare_dir(resume, overwrite)
                    if writer
                    else (self._load_latest(Path(self.cfg.out)) if resume else 0)
                )
            dist_.same_on_all_ranks(start, "step to resume from")
        result = AssocRun(
            path=self.run_dir.path if self.run_dir else None,
            model=self.model,
            config=self.cfg,
            step=start,
            total_steps=self.total_steps,
            optimizer=self.cfg.optimizer,
            resumed_from=start if start else None,
        )
        self._ensure_stats()
        self._save_stats()
        result.stats, result.stats_windows = self.stats, self.stats_windows
        if self.run_dir is not None and start:
            self._log_lost_checkpoint_record(start)
            self.run_dir.log_metrics({"event": "resume", "step": start, "from": str(self.last_checkpoint)})
        bar = cast(_Bar, progress(total=self.total_steps, desc=f"assoc {self.cfg.optimizer}", unit="step"))
        bar.update(start)
        with deferred() as signalled, closing(bar):
            while self.step < self.total_steps:
                batch = self._next_batch()
                self.loss = self._train_step(batch)
                self.step += 1
                s = self.step
                result.losses[s] = self.loss
                if self.run_dir is not None and (s % self.cfg.log_every == 0 or s == self.total_steps):
                    self.run_dir.log_metrics({"event": "step", "step": s, "epoch": self.epoch, "loss": self.loss})
                bar.update(1)
                if s % 10 == 0 or s == self.total_steps:
                    bar.set_postfix(loss=f"{self.loss:.4f}")
                self._call("on_step_end")
                # a stop on one rank stops all of them; SIGINT/SIGTERM is a stop request (checkpoint, then raise)
                self._stop = dist_.any_rank(self._stop or signalled.requested)
                if self._is_checkpoint_step(s) or self._stop:
                    parallel.check_in_sync(self.model.parameters(), f"step {s}")
                    cmp = self._compare()
                    if cmp is not None:
                        result.comparisons[s] = cmp["theory"]
                    path = None
                    if self.run_dir is not None:
                        # the file first (atomic write), then its record: a record always names a
                        # complete checkpoint; a kill in between loses the record, which the resumed run
                        # logs again (_log_lost_checkpoint_record)
                        path = self._save_checkpoint()
                        result.checkpoints.append(path)
                        self.run_dir.log_metrics(self._checkpoint_record(path, cmp))
                    self._call("on_checkpoint", path)
                if self._stop and self.step < self.total_steps:
                    result.stopped_early = True
                    break
        if signalled.requested and result.stopped_early:
            where = self.last_checkpoint if self.run_dir is not None else "none (no run directory)"
            raise Interrupted(
                f"{signalled.signal} at step {self.step}/{self.total_steps}: checkpoint {where} "
                f"written; continue with --resume",
                signalled.signal or "SIGINT",
            )
        result.step = self.step
        if self.run_dir is not None and self.step >= self.total_steps:
            self._save_final()
        self._call("on_train_end")
        dist_.barrier()  # rank 0 has written the final files
        return result


def train_assoc(
    tokens: Any,
    vocab_size: int,
    cfg: AssocTrainConfig,
    callbacks: Iterable[Any] = (),
    *,
    stats: Any = None,
    vocab: Sequence[str] | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> AssocRun:
    """Train the Def. 3.1 model on ``tokens`` (N, T+1) int ids < ``vocab_size``.

    ``stats``: precomputed statistics for the per-checkpoint comparison with the theory (else computed
    per ``cfg.stats_source``; ``vocab`` — the token strings — is attached to them).  ``cfg.out=None``
    trains in memory (no files).  See the module docstring for the run directory, resume and overwrite
    rules.
    """
    return AssocTrainer(tokens, vocab_size, cfg, callbacks, stats=stats, vocab=vocab).run(
        resume=resume, overwrite=overwrite
    )
