"""A finished ``originlens ntp train`` run opened for exact replay (:class:`RunReplay`: configuration,
checkpoints, trainer, data order, final model θ* and probes, feature types), and the resolution of
attribution arguments against it (sites, features, attributed updates).

:mod:`.replay` runs the attribution over such a run; see its docstring for the exactness checks.
Caveats: the run must be finished (the final model and probes define θ* and the probe directions);
bit-exact replay needs the torch version, device and thread count of training (``environment.json``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import CompatibilityError, ConfigError, InputError, NumericalError
from ..models.gpt import GPT
from ..probes import ProbeSet
from ..progress import log
from ..runs import RunDir
from ..storage import array_sha256, load_tensors, read_json, sha256_file
from . import store as ostore
from .influence import Probe
from .stopgrad import Site

if TYPE_CHECKING:
    pass

# ----------------------------------------------------------------------------------------------------
# the run


def _feature_types_fn(task_name: str, task: Any):
    """tokens (B, T) int → feature types (B, T, F) uint8 for the task's features."""
    if task_name == "othello":
        from ..tasks.othello import replay as othello_replay
        from ..tasks.othello import tokens_to_moves

        def othello_types(tokens: np.ndarray) -> np.ndarray:
            games = othello_replay(tokens_to_moves(tokens[:, 1:]), feature_types=True)
            out = np.zeros((tokens.shape[0], tokens.shape[1], 64), dtype=np.uint8)
            assert games.feature_types is not None  # asked for with feature_types=True
            out[:, 1:] = games.feature_types
            return out

        return othello_types
    # counting tasks (Majority, Conditioned Majority of arXiv 2603.14087): types depend on the position
    # only; tasks without a useful/useless typing (tinystories) have none
    row = task.sample(1, np.random.default_rng(0)).feature_types
    if row is None:
        return None
    row = row[0]

    def positional_types(tokens: np.ndarray) -> np.ndarray:
        return np.broadcast_to(row[None], (tokens.shape[0], *row.shape)).copy()

    return positional_types


class RunReplay:
    """A finished ``originlens ntp train`` run opened for exact replay (model, optimizer, data, θ*, probes)."""

    def __init__(self, run_dir: str | Path, *, device: str | None = None) -> None:
        from ..tasks import get_task
        from ..train.ntp import LANGUAGE, NTPConfig, Trainer, checkpoint_metadata, list_checkpoints

        p = Path(run_dir)
        if not p.is_dir():
            raise InputError(f"run directory {p} not found", "pass the --out directory of `originlens ntp train`")
        if not (p / "config.json").is_file():
            raise InputError(
                f"{p} is not a run directory (no config.json)", "pass the --out directory of `originlens ntp train`"
            )
        raw = read_json(p / "config.json")
        try:
            cfg = NTPConfig.from_dict(raw)
        except (ConfigError, TypeError) as exc:
            what = getattr(exc, "what", str(exc))
            raise CompatibilityError(
                f"{p} does not hold a next-token-prediction run ({what})",
                "attribute a run written by `originlens ntp train`",
            ) from None
        if cfg.task == LANGUAGE:
            raise ConfigError(
                f"{p} is a language-task run: it has no per-token features or probes to attribute",
                "attribute a majority, cond-majority or othello run",
            )
        if cfg.model.dropout > 0:
            raise ConfigError(
                f"{p} was trained with dropout {cfg.model.dropout}: its updates depend on dropout masks the "
                "exact replay does not reproduce",
                "attribute a run trained without dropout (--dropout 0, the default)",
            )
        for name, what in (("model.safetensors", "final model (θ*)"), ("probes.safetensors", "final probes")):
            if not (p / name).is_file():
                raise InputError(
                    f"{p} has no {what} ({name}): the run is unfinished",
                    "finish it with `originlens ntp train ... --resume`",
                )
        if device is not None:
            cfg = cfg.replace(device=device)
        self.path, self.config = p, cfg
        self.final_step = int(json.loads(checkpoint_metadata(p / "model.safetensors").get("step", str(cfg.steps))))
        self.checkpoints = {s: path for s, path in list_checkpoints(p)}
        if not self.checkpoints:
            raise InputError(
                f"{p} has no checkpoints: the replay could not be verified against the training run",
                "retrain with checkpoints (`ntp train --checkpoint-every N`; the last one is always kept)",
            )
        rng_state = torch.get_rng_state()
        try:
            self.trainer = Trainer(cfg, p, resume=True)  # the trainer's own init, optimizer, data rule
        finally:
            torch.set_rng_state(rng_state)
        self.model, self.optimizer = self.trainer.model, self.trainer.optimizer
        # the initialisation θ₀ (and the fresh optimizer), for restore() before the first checkpoint
        self._initial = (
            {k: v.detach().clone() for k, v in self.model.state_dict().items()},
            copy.deepcopy(self.optimizer.state_dict()),
        )
        self.device = self.trainer.device
        self.data = self.trainer._train_data()
        self._check_environment()
        self.task = self.trainer.task if self.trainer.task is not None else get_task(cfg.task)
        self.feature_names = list(self.task.feature_names)
        self._types = _feature_types_fn(cfg.task, self.task)
        self.probes = ProbeSet.load(p / "probes.safetensors")
        self.final_model = GPT.load(p / "model.safetensors").to(self.device).eval()
        if self.final_model.config.to_dict() != self.model.config.to_dict():
            raise CompatibilityError(
                f"{p}/model.safetensors has another architecture than config.json",
                "re-train the run (its files do not belong together)",
            )
        self.logged_loss: dict[int, float] = {}
        for r in RunDir(p, create=False).read_metrics():
            if r.get("event") == "train" and "last_loss" in r:
                self.logged_loss[int(r["step"])] = float(r["last_loss"])

    def _check_environment(self) -> None:
        env_file = self.path / "environment.json"
        env = read_json(env_file) if env_file.is_file() else {}
        threads = env.get("torch_threads")
        if int(env.get("processes", 1)) > 1:
            log(
                f"note: {self.path} was trained data-parallel by {env['processes']} processes; the one-process "
                "replay (whole batches) equals it to round-off only: pass --replay-rtol (e.g. 1e-9 in float64, "
                "1e-4 in float32)",
                level=1,
            )
        if threads is not None and int(threads) != torch.get_num_threads() and self.device.type == "cpu":
            log(
                f"note: {self.path} was trained with {threads} torch threads, replaying with "
                f"{torch.get_num_threads()}; if the replay checks fail, pass --threads {threads}",
                level=1,
            )
        self._check_pool()

    def _check_pool(self) -> None:
        """The Othello games replayed are those the run trained on: the whole pool's file, or the games a
        run drawing under half of its pool holds in memory (recorded with its number of updates)."""
        env_file = self.path / "environment.json"
        pool = self.path / "data" / "othello-pool.npy"
        hashes = read_json(env_file).get("data_hashes", {}) if env_file.is_file() else {}
        if pool.is_file():
            want = hashes.get("othello_pool_sha256")
            if want and sha256_file(pool) != want:
                raise CompatibilityError(
                    f"{pool} differs from the pool the run was trained on (sha256)",
                    "delete it: it is regenerated deterministically from the seed",
                )
        held = getattr(self.data, "pool", None) if getattr(self.data, "rows", None) is not None else None
        want = hashes.get("othello_pool_drawn_sha256")
        if held is not None and want and hashes.get("othello_pool_drawn_updates") == str(self.config.steps):
            if array_sha256(held) != want:
                raise CompatibilityError(
                    f"the Othello games regenerated for {self.path} differ from those it was trained on (sha256)",
                    "replay with the originlens version that trained the run",
                )

    # -- pieces ----------------------------------------------------------------------------------------
    def batch(self, b: int) -> torch.Tensor:
        """Tokens (B, T) of training batch b (update b + 1), by the trainer's data-order rule."""
        return torch.from_numpy(self.data.batch(b)).to(self.device)

    @property
    def has_types(self) -> bool:
        """Whether the task types its features (useful / useless); tinystories does not."""
        return self._types is not None

    def feature_types(self, tokens: torch.Tensor) -> np.ndarray:
        """(B, T, F) uint8 feature types of the batch (0 none/empty, 1 NTP-useless, 2 NTP-useful)."""
        return self._types(tokens.cpu().numpy())

    def restore(self, at_most: int) -> int:
        """Model and optimizer at the latest checkpoint ≤ ``at_most`` (or the initialisation); returns its step."""
        from ..train.ntp import load_checkpoint

        usable = [s for s in self.checkpoints if s <= at_most]
        if not usable:  # the initialisation, whatever was restored before
            self.model.load_state_dict(self._initial[0])
            self.optimizer.load_state_dict(copy.deepcopy(self._initial[1]))
            return 0
        s = max(usable)
        got = load_checkpoint(
            self.checkpoints[s],
            self.model,
            self.optimizer,
            restore_rng=False,
            expect_vocab_hash=getattr(self.trainer, "vocab_hash", None),
        )
        if got != s:
            raise CompatibilityError(f"{self.checkpoints[s]} says step {got}", "the checkpoint was renamed; remove it")
        return s

    def verify_checkpoint(self, step: int, rtol: float = 0.0) -> None:
        """Replayed weights and Adam state == the saved checkpoint at ``step`` (``NumericalError`` if not)."""
        from ..train.ntp import CHECKPOINT_KIND

        arrays, _ = load_tensors(self.checkpoints[step], kind=CHECKPOINT_KIND)
        pairs = [(f"model.{k}", v) for k, v in self.model.state_dict().items()]
        for name, p in self.model.named_parameters():
            st = self.optimizer.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                pairs.append((f"adam.{name}.{key}", st.get(key)))
            pairs.append((f"adam.{name}.step", st.get("step")))
        bad, worst = [], 0.0
        for key, mine in pairs:
            saved = arrays.get(key)
            if saved is None or mine is None:
                bad.append(key)
                continue
            a = torch.as_tensor(mine).detach().cpu().double().reshape(-1)
            b = torch.from_numpy(np.array(saved, dtype=np.float64).reshape(-1))
            if a.shape != b.shape:
                bad.append(key)
                continue
            diff = float((a - b).abs().max()) if a.numel() else 0.0
            scale = float(b.abs().max()) if b.numel() else 0.0
            if diff > rtol * scale:
                bad.append(key)
                worst = max(worst, diff)
        if bad:
            raise NumericalError(
                f"replay diverged from checkpoint step {step} of {self.path}: {len(bad)} tensors differ "
                f"(first {bad[0]}, max |Δ| {worst:.3g})",
                "replay with the torch version, device and thread count of training (environment.json); "
                "bit-exact replay is guaranteed on CPU only (pass replay_rtol / --replay-rtol on GPUs)",
            )

    def check_loss(self, step: int, value: float, rtol: float = 0.0) -> bool:
        """Replayed loss == the logged ``last_loss`` of ``step`` (if logged); returns whether it was checked."""
        logged = self.logged_loss.get(step)
        if logged is None:
            return False
        if not abs(value - logged) <= rtol * abs(logged):
            raise NumericalError(
                f"replayed loss {value!r} differs from the logged loss {logged!r} at update {step} of {self.path}",
                "replay with the torch version, device and thread count of training "
                "(environment.json); check that the data files were not changed",
            )
        return True

    def make_probes(
        self, sites: Sequence[Site], features: Sequence[str], *, random_directions: int = 0
    ) -> tuple[list[Probe], dict[str, str], dict[str, str]]:
        """Probes at ``sites`` × ``features`` and, per (site, feature), ``random_directions`` null
        directions: uniformly random unit vectors (``default_rng([seed, 17, k, i, f_index, j])``) scaled to
        the norm of the feature's probe at that site, named ``f~random{j}``.  Returns (probes, probe name →
        recorded feature name, probe name → the feature whose types its rows use)."""
        dtype = next(self.model.parameters()).dtype
        out, feature_of, base_of = [], {}, {}
        for k, i in sites:
            for f in features:
                w = np.asarray(self.probes.direction(k, i, f), dtype=np.float64)
                variants = [(f, w)]
                for j in range(random_directions):
                    u = np.random.default_rng(
                        [int(self.config.seed), 17, k, i, self.probes.feature_names.index(f), j]
                    ).standard_normal(w.shape)
                    variants.append((f"{f}{ostore.RANDOM_TAG}{j}", u * (np.linalg.norm(w) / np.linalg.norm(u))))
                for name, vec in variants:
                    probe = Probe(f"L{k}.P{i}.{name}", k, i, torch.as_tensor(vec, dtype=dtype, device=self.device))
                    out.append(probe)
                    feature_of[probe.name], base_of[probe.name] = name, f
        return out, feature_of, base_of


# ----------------------------------------------------------------------------------------------------
# argument resolution


def parse_sites(sites: Any) -> list[Site]:
    """``"1:4,2:8"`` or [(k, i), ...] → [(k, i), ...] (duplicates dropped, order kept)."""
    if isinstance(sites, str):
        try:
            pairs = [tuple(int(v) for v in s.split(":")) for s in sites.split(",") if s.strip()]
        except ValueError:
            raise ConfigError(
                f"sites {sites!r} are not understood", "write LAYER:POSITION pairs, e.g. 1:4,2:8"
            ) from None
    else:
        pairs = [tuple(int(v) for v in s) for s in (sites or [])]
    if not pairs or any(len(s) != 2 for s in pairs):
        raise ConfigError(f"sites {sites!r} are not (layer, position) pairs", "e.g. sites=[(1, 4), (2, 8)]")
    return list(dict.fromkeys((int(k), int(i)) for k, i in pairs))


def resolve_features(run: RunReplay, features: Any) -> list[str]:
    """``"all"`` (every probed feature), ``"tracked"`` (the task's tracked ones), names or a comma list."""
    names = list(run.probes.feature_names)
    if isinstance(features, str):
        if features == "all":
            return names
        if features == "tracked":
            return [f for f in run.task.tracked.features if f in names]
        features = [f.strip() for f in features.split(",") if f.strip()]
    feats = list(dict.fromkeys(str(f) for f in (features or [])))
    if not feats:
        raise ConfigError("no features to attribute", "pass features='all', 'tracked' or feature names")
    unknown = [f for f in feats if f not in names]
    if unknown:
        raise ConfigError(
            f"unknown feature name(s) {unknown} for task {run.config.task}",
            f"valid: all, tracked, or names such as {', '.join(names[:6])}" + (", ..." if len(names) > 6 else ""),
        )
    return feats


def check_sites(run: RunReplay, sites: Sequence[Site]) -> None:
    L = run.model.config.n_layer
    for k, i in sites:
        if not 0 <= k <= L:
            raise ConfigError(f"site layer {k} outside 0..{L}", "k counts blocks applied (0 = embeddings)")
        if k not in run.probes.layers or i not in run.probes.positions:
            ps = run.probes.positions
            raise InputError(
                f"the run has no probe at layer {k}, position {i} (probed positions "
                f"{ps[:8]}{' ...' if len(ps) > 8 else ''})",
                "choose probed sites, or retrain with --probe-positions covering them",
            )


def resolve_steps(steps: Iterable[int] | None, start: int, end: int) -> list[int]:
    if steps is None:
        return list(range(start + 1, end + 1))
    chosen = sorted({int(s) for s in steps})
    bad = [s for s in chosen if not start < s <= end]
    if bad:
        raise ConfigError(
            f"steps {bad[:5]} lie outside the segment's updates {start + 1}..{end}",
            "choose steps inside the segment (updates are 1-based)",
        )
    if not chosen:
        raise ConfigError("no steps selected", "select at least one update")
    return chosen
