"""The next-token-prediction :class:`Trainer` (train, evaluate, probe, checkpoint, resume) and :func:`train`.
Part of :mod:`originlens.train.ntp` (its docstring describes the run directory and resume).

Size: one class, :class:`Trainer`, whose step, evaluation, probing, checkpoint and resume paths share its
state and must change together to keep resumption and the attribution replay bit-identical; the
configuration, data, checkpoints and probing helpers are already separate modules of the package.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import torch

from ... import distributed as dist_
from ...errors import BudgetExceeded, CompatibilityError, ConfigError, InputError, NumericalError
from ...interrupts import Interrupted, deferred
from ...models.gpt import GPT
from ...probes import ProbeMetrics, ProbeSet, fit_probes
from ...progress import log, progress
from ...runs import RunDir, list_checkpoints
from ...storage import (
    array_sha256,
    atomic_save_npy,
    atomic_write_bytes,
    atomic_write_json,
    read_json,
    sha256_file,
    vocab_hash,
)
from ...tasks import task_metrics
from .. import parallel
from .checkpoints import (
    check_checkpoint_vocab,
    checkpoint_metadata,
    checkpoint_path,
    load_checkpoint,
    numpy_global_seed,
    save_checkpoint,
)
from .config import COUNTING_TASKS, EVAL_STREAM, EVENTS, LANGUAGE, POOL_CHUNK, POOL_STREAM, NTPConfig, config_identity
from .data import EvalData, PoolData, SampledData, othello_pool, pool_rows
from .probing import probe_summary, save_probe_metrics


class _Bar(Protocol):
    """A progress bar without an iterable: tqdm or :class:`~originlens.progress.Heartbeat`."""

    def update(self, n: int = 1) -> object: ...
    def set_postfix(self, **kw: Any) -> object: ...
    def close(self) -> None: ...


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


# data hashes that are a function of the run's number of updates (an operational field a resume may change):
# compared only when the recorded number of updates is unchanged
DRAWN_UPDATES = "othello_pool_drawn_updates"
STEP_DEPENDENT_HASHES = frozenset({"othello_pool_drawn_sha256"})


class Trainer:
    """Next-token-prediction trainer (minGPT-style callbacks: ``add_callback(event, fn)``, fn(trainer)).

    Events: ``on_step_end`` (after every update; ``trainer.step``, ``trainer.last_loss``),
    ``on_eval`` (``trainer.last_eval``), ``on_probe`` (``trainer.last_probe``), ``on_checkpoint``
    (``trainer.last_checkpoint``).  On the fast path (:attr:`host_sync` ``"log"``) reading
    ``trainer.last_loss`` copies that loss to the host: a callback that reads it every update brings back
    one synchronisation per step.
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
        self._last_loss = float("nan")
        self._last_loss_t: torch.Tensor | None = None
        # "step": read the loss and check the gradients after every update (the CPU default, and always
        # under torchrun); "log": the fast path — batches gathered on the device, losses and finiteness
        # read at log / eval / checkpoint points only (the default on GPUs; the same updates, bit for bit)
        self.host_sync = "step"
        # wall-clock time (time.time()) after which the run checkpoints and raises BudgetExceeded
        self.deadline: float | None = None
        self.last_eval: dict[str, float] = {}
        self.last_probe: dict[str, float] = {}
        self.last_checkpoint: Path | None = None
        self.probes: ProbeSet | None = None
        self.probe_metrics: ProbeMetrics | None = None
        self._seconds_before = 0.0
        self._t_start = time.time()
        from ...devices import configure_device, resolve_device

        self.device = resolve_device(config.device)
        self._device_settings = configure_device(self.device, config.matmul_precision)
        if self.device.type != "cpu":
            self.host_sync = "log"
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
        from ...runs import release_lock

        try:
            return self._run()
        finally:
            if self._writer:
                release_lock(self.run_path)

    def _run(self) -> TrainResult:
        cfg = self.config
        # filled by NTPConfig.__post_init__ (the task's defaults)
        assert cfg.steps is not None and cfg.eval_every is not None and cfg.probe_every is not None
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

        bar = cast(
            _Bar, progress(total=cfg.steps, initial=start, desc=f"{cfg.task}/{cfg.regime}/s{cfg.seed}", unit="step")
        )
        window: list[float] = []
        pending: list[torch.Tensor] = []  # fast path: losses of updates not yet read from the device
        first_pending = start + 1
        fast = self._fast_path()
        self.model.train()
        with deferred() as stop, closing(bar):
            for b in range(start, cfg.steps):
                if fast:
                    x = self.data.device_batch(b, self.device, self.gpt_config.vocab_size)
                    with self.model.trusted_tokens():
                        loss = self.model.loss(x)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                else:
                    x = torch.from_numpy(self.data.batch(b)).to(self.device)
                    loss = parallel.shard_loss(self.model, x)  # this rank's rows of the global batch
                    value = parallel.global_value(loss)  # Σ over ranks: the global batch's loss
                    if not math.isfinite(value):
                        self._raise_nonfinite_loss(value, b + 1)
                    self.optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    parallel.allreduce_gradients(self.model.parameters())
                    _check_finite(self.model.named_parameters(), "gradient", b + 1, cfg, self.last_checkpoint)
                set_lr(self.optimizer, cfg.lr_at(b + 1))
                self.optimizer.step()
                self.step = b + 1
                if fast:
                    pending.append(loss.detach())
                    self._last_loss_t = pending[-1]
                else:
                    self.last_loss = value
                    window.append(value)
                bar.update(1)
                log_now = self.step % cfg.log_every == 0 or self.step == cfg.steps
                probe_now = _due(self.step, cfg.probe_every) and self._can_probe()
                eval_now = _due(self.step, cfg.eval_every) or probe_now
                checkpoint_now = _due(self.step, cfg.checkpoint_every)
                late = self.deadline is not None and time.time() > self.deadline
                if fast and (log_now or eval_now or checkpoint_now or stop.requested or late):
                    window += self._read_pending(pending, first_pending)
                    pending, first_pending = [], self.step + 1
                if log_now and self._writer:
                    self.rundir.log_metrics(
                        {
                            "event": "train",
                            "step": self.step,
                            "loss": float(np.mean(window)),
                            "last_loss": self.last_loss,
                            "time": self._elapsed(),
                        }
                    )
                    bar.set_postfix(loss=f"{np.mean(window):.4f}")
                    window = []
                self._fire("on_step_end")
                if self.step == cfg.steps:
                    break
                if eval_now:
                    dist_.rank_zero_only(self._evaluate, probe=probe_now)
                if checkpoint_now:
                    self._checkpoint()
                if dist_.any_rank(stop.requested):
                    if fast:  # a signal that arrived after the read above: no checkpoint of unread losses
                        window += self._read_pending(pending, first_pending)
                        pending, first_pending = [], self.step + 1
                    self._stop_on_signal(stop.signal or "SIGINT")
                if self.deadline is not None and dist_.any_rank(late):
                    self._stop_at_deadline()
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
        from ...runs import hold_lock

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
        from ...data import TokenWindows

        assert self.config.corpus is not None  # NTPConfig requires a corpus for task 'language'
        windows = TokenWindows.load(self.config.corpus)
        tokens = windows.tokens
        n, t1 = tokens.shape
        if n <= self.config.eval_size:
            raise ConfigError(
                f"corpus {self.config.corpus} has {n} windows, not more than eval_size={self.config.eval_size}",
                "lower --eval-size (the rest are training windows)",
            )
        vs = windows.vocab_size
        self._corpus_tokens = tokens
        self._corpus_info = {
            "windows": n,
            "vocab_size": vs,
            "vocab_hash": windows.vocab_hash,
            "tokens_sha256": windows.tokens_sha256,
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

    def _train_data(self) -> SampledData | PoolData:
        cfg = self.config
        # filled by NTPConfig.__post_init__ (the task's defaults)
        assert cfg.eval_size is not None and cfg.batch_size is not None
        if cfg.task == LANGUAGE:
            train = self._corpus_tokens[: len(self._corpus_tokens) - cfg.eval_size]
            return PoolData(train, cfg.seed, cfg.batch_size, f"the first windows of {cfg.corpus}")
        assert self.task is not None  # every task but 'language' has one
        if cfg.task == "othello":
            task = cfg.make_task(with_feature_types=False)
            if cfg.othello_pool == 0:
                return SampledData(task, cfg.seed, cfg.batch_size)
            n = cfg.othello_pool
            assert cfg.steps is not None  # filled by NTPConfig.__post_init__
            rows = pool_rows(n, cfg.seed, cfg.batch_size, cfg.steps)
            what = f"a pool of Othello games (chunk c of {POOL_CHUNK}: default_rng([seed, {POOL_STREAM}, c]))"
            path = self.rundir.file("data", "othello-pool.npy")
            env_file = self.run_path / "environment.json"
            recorded = read_json(env_file).get("data_hashes", {}) if env_file.is_file() else {}
            kept = path.is_file() and np.load(path, mmap_mode="r", allow_pickle=False).shape == (n, task.seq_len)
            if 2 * len(rows) < n and not kept and "othello_pool_sha256" not in recorded:
                # the run draws under half of the pool: only those games are played, held in memory
                # (regenerated, identical, on resume or replay; no file: the games' hash is recorded with the
                # number of updates they serve, and compared while that number is unchanged)
                t0 = time.time()
                pool = othello_pool(n, cfg.seed, rows)
                log(
                    f"played the {len(rows)} of {n} Othello pool games the run draws in {time.time() - t0:.1f} s",
                    level=2,
                )
                return PoolData(pool, cfg.seed, cfg.batch_size, what, rows=rows, n=n)
            # the whole pool, kept in the run directory (its sha256 recorded; checked on resume and replay)
            if kept:
                whole = np.load(path, allow_pickle=False)
            else:
                t0 = time.time()
                whole = othello_pool(n, cfg.seed)
                atomic_save_npy(path, whole)
                log(f"generated {len(whole)} Othello games in {time.time() - t0:.0f} s ({path})", level=2)
            return PoolData(whole, cfg.seed, cfg.batch_size, what)
        if cfg.train_size:
            pool = self.task.sample(cfg.train_size, np.random.default_rng([cfg.seed, POOL_STREAM])).tokens
            return PoolData(
                pool.astype(np.uint8),
                cfg.seed,
                cfg.batch_size,
                f"a fixed training set {cfg.task}.sample({cfg.train_size}, numpy.random.default_rng("
                f"[seed, {POOL_STREAM}])).tokens",
            )
        return SampledData(self.task, cfg.seed, cfg.batch_size)

    def _eval_data(self) -> EvalData:
        cfg = self.config
        assert cfg.eval_size is not None  # filled by NTPConfig.__post_init__ (the task's defaults)
        if cfg.eval_size == 0:
            return EvalData(np.zeros((0, self.gpt_config.seq_len), dtype=np.int64), None)
        if cfg.task == LANGUAGE:
            tok = np.asarray(self._corpus_tokens[len(self._corpus_tokens) - cfg.eval_size :], dtype=np.int64)
            return EvalData(tok, None)
        assert self.task is not None  # every task but 'language' has one
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
            # the games a run draws from its pool grow with its number of updates, which a resume may raise
            same_updates = before.get(DRAWN_UPDATES) == hashes.get(DRAWN_UPDATES)
            changed = sorted(
                k
                for k in set(before) & set(hashes) - {DRAWN_UPDATES}
                if before[k] != hashes[k] and (same_updates or k not in STEP_DEPENDENT_HASHES)
            )
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
        elif isinstance(self.data, PoolData) and self.data.rows is not None:  # only the games drawn, in memory
            hashes["othello_pool_drawn_sha256"] = array_sha256(self.data.pool)
            hashes[DRAWN_UPDATES] = str(self.config.steps)
        for k in ("vocab_hash", "tokens_sha256"):
            if self._corpus_info.get(k):
                hashes[f"corpus_{k}"] = self._corpus_info[k]
        if isinstance(self.data, PoolData) and self.config.task in COUNTING_TASKS:
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
                **({"device_settings": self._device_settings} if self._device_settings else {}),
                "host_sync": self.host_sync,
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
        assert self.config.steps is not None  # filled by NTPConfig.__post_init__ (the task's defaults)
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
        assert self.config.probe_size is not None  # filled by NTPConfig.__post_init__ (the task's defaults)
        return b is not None and self.config.probe_size >= 10

    def _probe_positions(self) -> list[int]:
        pp = self.config.probe_positions
        T = self.gpt_config.seq_len
        if pp == "all":
            return list(range(1, T))
        if pp == "tracked":
            assert self.task is not None  # probes need a task's eval batch (_can_probe)
            return sorted(set(self.task.tracked.positions))
        assert isinstance(pp, list)  # NTPConfig._validate: "all", "tracked" or a list of positions
        bad = [i for i in pp if not 1 <= i < T]
        if bad:
            raise ConfigError(f"probe positions {bad} outside 1..{T - 1}", "choose positions of the sequence")
        return list(pp)

    @torch.no_grad()
    def _evaluate(self, probe: bool) -> None:
        """Eval loss and task metrics on the eval set, logged; with ``probe``, probes fitted on its residuals."""
        if len(self.eval_data.tokens) == 0:
            return
        record, fitted = self._measure(probe)
        if not math.isfinite(record["eval_loss"]):
            raise NumericalError(
                f"eval loss is {record['eval_loss']} at step {self.step}", "lower --lr; resume from the last checkpoint"
            )
        self.last_eval = record
        self.rundir.log_metrics({"event": "eval", "step": self.step, **record})
        self._fire("on_eval")
        if fitted is not None:
            self.probes, self.probe_metrics = fitted
            assert self.task is not None  # probes need a task (_can_probe)
            self.last_probe = probe_summary(self.probe_metrics, self.task.tracked)
            self.rundir.log_metrics({"event": "probe", "step": self.step, **self.last_probe})
            self._fire("on_probe")

    def measure(self, probe: bool = True) -> tuple[dict[str, float], ProbeMetrics | None]:
        """Held-out eval (loss, task metrics) of the model as it stands and, with ``probe``, the metrics of
        probes fitted on its residuals — as the run's own evaluations compute them, but neither logged nor
        kept (a learning curve read off checkpoints loaded into :attr:`model`)."""
        if not hasattr(self, "eval_data"):  # a trainer opened for replay, not run: its eval set, as run() builds it
            self.eval_data = self._eval_data()
        record, fitted = self._measure(probe and self._can_probe())
        return record, None if fitted is None else fitted[1]

    @torch.no_grad()
    def _measure(self, probe: bool) -> tuple[dict[str, float], tuple[ProbeSet, ProbeMetrics] | None]:
        """Eval record and, with ``probe``, (probes, their metrics) fitted on the eval set's residuals."""
        cfg = self.config
        assert cfg.probe_size is not None  # filled by NTPConfig.__post_init__ (the task's defaults)
        tokens = self.eval_data.tokens
        n = len(tokens)
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
        return record, (self._fit_probes(resid, positions) if probe else None)

    def _fit_probes(self, resid: list[np.ndarray], positions: list[int]) -> tuple[ProbeSet, ProbeMetrics]:
        cfg = self.config
        batch = self.eval_data.batch
        assert batch is not None and self.task is not None  # probes need a task's eval batch (_can_probe)
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

        def of_type(t: int) -> Callable[[ProbeMetrics], np.ndarray | None]:
            return lambda m: m.by_type.get(t)

        metrics = ProbeMetrics(
            pearson=stack(lambda m: m.pearson),
            r2=stack(lambda m: m.r2),
            mse=stack(lambda m: m.mse),
            accuracy=stack(lambda m: m.accuracy),
            by_type={t: stack(of_type(t)) for t in types},
            layers=layers,
            positions=list(positions),
            feature_names=list(batch.feature_names),
        )
        probes = ProbeSet(
            weights=np.concatenate(ws),
            intercepts=np.concatenate(bs),
            layers=layers,
            positions=list(positions),
            feature_names=list(batch.feature_names),
            alpha=float(cfg.probe_alpha),
        )
        return probes, metrics

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

    def _stop_at_deadline(self) -> None:
        """The deadline passed during training: checkpoint the current update, raise BudgetExceeded."""
        cks = list_checkpoints(self.run_path)
        if not cks or cks[-1][0] != self.step:
            self._checkpoint()
        raise BudgetExceeded(
            f"{self.run_path}: deadline reached at update {self.step}/{self.config.steps}; checkpoint written",
            "continue with --resume (or give the run more time)",
        )

    # -- the fast path (no host synchronisation inside the step loop) ---------------------------------
    def _fast_path(self) -> bool:
        """Whether the step loop runs without host synchronisations (:attr:`host_sync` ``"log"``)."""
        if self.host_sync not in ("step", "log"):
            raise ConfigError(f"host_sync must be 'step' or 'log', got {self.host_sync!r}", "use 'step' or 'log'")
        return self.host_sync == "log" and not dist_.is_distributed()

    @property
    def last_loss(self) -> float:
        """The loss of the last update (on the fast path read from the device when asked for)."""
        if self._last_loss_t is not None:
            self._last_loss, self._last_loss_t = float(self._last_loss_t), None
        return self._last_loss

    @last_loss.setter
    def last_loss(self, value: float) -> None:
        self._last_loss, self._last_loss_t = float(value), None

    def _read_pending(self, pending: list[torch.Tensor], first: int) -> list[float]:
        """The fast path's losses of updates ``first``, ``first`` + 1, … as floats (one copy to the host);
        raises :class:`NumericalError` at the first non-finite loss, or when a parameter became non-finite
        (a non-finite gradient with a finite loss) somewhere in these updates."""
        if not pending:
            return []
        values = torch.stack(pending).cpu().tolist()
        for j, v in enumerate(values):
            if not math.isfinite(v):
                # the gradients are not read per update here: a non-finite gradient with a finite loss at
                # update k shows as a non-finite loss at update k + 1
                # (j = 0: the parameters after update first − 1 were checked at the previous read)
                self._raise_nonfinite_loss(v, first + j, gradient_unchecked=j > 0)
        params = list(self.model.named_parameters())
        if not bool(torch.stack([torch.isfinite(p.detach()).all() for _, p in params]).all()):
            name = next(n for n, p in params if not bool(torch.isfinite(p.detach()).all()))
            last = str(self.last_checkpoint) if self.last_checkpoint else "none (no checkpoint yet)"
            raise NumericalError(
                f"parameter {name!r} became non-finite in updates {first}..{self.step} ({self.config.task}/"
                f"{self.config.regime}, seed {self.config.seed}; a non-finite gradient); last good checkpoint: {last}",
                "lower --lr (or use --dtype float64); resume from the last checkpoint with --resume",
            )
        self._last_loss, self._last_loss_t = float(values[-1]), None
        return [float(v) for v in values]

    def _raise_nonfinite_loss(self, value: float, update: int, *, gradient_unchecked: bool = False) -> None:
        cfg = self.config
        last = str(self.last_checkpoint) if self.last_checkpoint else "none (no checkpoint yet)"
        cause = f" (or a non-finite gradient at update {update - 1})" if gradient_unchecked else ""
        raise NumericalError(
            f"training loss is {value} at update {update}{cause} ({cfg.task}/{cfg.regime}, seed {cfg.seed}); "
            f"last good checkpoint: {last}",
            "lower --lr (or use --dtype float64); resume from the last checkpoint with --resume",
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


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group (the update's value of :meth:`NTPConfig.lr_at`; the
    trainer and the attribution replay call it before every ``optimizer.step()``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def _due(step: int, every: int) -> bool:
    return every > 0 and step % every == 0


def train(
    config: NTPConfig,
    run_dir: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    callbacks: dict[str, Callable[[Trainer], None]] | None = None,
    deadline: float | None = None,
) -> TrainResult:
    """Convenience wrapper: build a :class:`Trainer`, register ``callbacks``, run it (``deadline``: a
    ``time.time()`` after which it checkpoints and raises :class:`~originlens.errors.BudgetExceeded`)."""
    trainer = Trainer(config, run_dir, resume=resume, overwrite=overwrite)
    trainer.deadline = deadline
    for event, fn in (callbacks or {}).items():
        trainer.add_callback(event, fn)
    return trainer.run()
