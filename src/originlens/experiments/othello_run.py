"""One OthelloGPT gradient-pathway run end to end, the library behind ``originlens ntp experiment othello-run``
(the multi-seed experiment with nulls and tests is :mod:`originlens.experiments.othello`).

The Othello experiment of arXiv 2603.14087.  Under ``OUT``::

    OUT/run/            ``ntp train`` run (checkpoints, final model, ridge probes of the board from the
                        player-to-move's perspective at every layer and the probed positions)
    OUT/run/attribution/  per-update influences (Parquet), report.html (``ntp attribute`` store)
    OUT/experiment.json   every number below; OUT/report.md / report.html

1. **train** a GPT on synthetic Othello (``--paper``: the paper's 6 layers × 256, batch 1024, 5000 steps,
   eval 20,480 — a GPU job; the defaults are a CPU scale);
2. **probe** quality: mean test Pearson r over the 16 central cells, per layer, overall and within
   NTP-useful (type 2) and NTP-useless (type 1) cells;
3. **attribute** the updates 1..``attribute_steps`` (Adam variant: per-component moments, the real
   second moment; replayed from the checkpoints, bit-exact checks) at sites = ``layers`` ×
   ``positions`` for the 16 central cells, per feature type; integrated influence per component ×
   type, mean over items (layer, position, cell) with a 95 % t-interval, and the paper's sign pattern
   (direct > 0 for useful and ≤ 0 for useless cells, pre-cached > 0 for useless, shared > 0 for both);
4. **human games** (``--human-games FILE``: WTHOR ``.wtb`` or one transcript per line, see
   :mod:`originlens.tasks.othello_records`): the final probes and the model's legal-move accuracy on
   the replayed records next to as many fresh synthetic games.

Each stage is skipped when its output exists (re-running resumes).  Sign convention: positive
influence moves the probed feature toward its final value; mismatch R has no ½ (the paper's convention).

:func:`run_othello_experiment` is the entry point (``examples/othello_pathways.py`` calls it too); the
command line only parses into :class:`OthelloExperimentConfig` (``cli/ntp_experiment_cmd.py``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ..errors import ConfigError

PAPER = dict(
    n_layer=6,
    d_model=256,
    n_head=4,
    batch_size=1024,
    steps=5000,
    eval_size=20480,
    othello_pool=500_000,
    checkpoint_every=500,
    positions=list(range(4, 57, 4)),
)


@dataclass
class OthelloExperimentConfig:
    """Settings of :func:`run_othello_experiment` (CPU-scale defaults; :meth:`paper` for the paper's)."""

    n_layer: int = 3
    d_model: int = 64
    n_head: int = 4
    batch_size: int = 64
    steps: int = 400
    lr: float = 1e-3
    eval_size: int = 3000
    othello_pool: int = 20000
    checkpoint_every: int = 100
    seed: int = 0
    positions: list[int] = field(default_factory=lambda: [12, 24, 36])  # attributed positions
    layers: list[int] | None = None  # attributed layers (default 1..n_layer)
    attribute_steps: int | None = None  # updates 1..N attributed (default: all)
    optimizer: str = "adam"
    human_games: str | None = None
    compare_games: int = 2000  # synthetic games next to the human ones (at most)
    device: str = "cpu"

    @classmethod
    def paper(cls, **overrides: Any) -> OthelloExperimentConfig:
        """The paper's configuration (its hyper-parameter table; all 14 positions 4..56; a GPU job)."""
        return cls(**{**PAPER, **overrides})

    def validate(self) -> None:
        for name in ("n_layer", "d_model", "n_head", "batch_size", "steps", "eval_size", "checkpoint_every"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}", f"set --{name.replace('_', '-')}")
        if self.eval_size < 20:
            raise ConfigError(f"eval_size={self.eval_size} is too small to fit probes", "use --eval-size ≥ 20")
        bad = [i for i in self.positions if not 1 <= i <= 60]
        if not self.positions or bad:
            raise ConfigError(f"positions {self.positions} must be in 1..60", "e.g. --positions 12,24,36")
        layers = self.attr_layers
        if any(not 1 <= k <= self.n_layer for k in layers):
            raise ConfigError(f"attributed layers {layers} outside 1..{self.n_layer}", "e.g. --attr-layers 1-3")
        if self.attribute_steps is not None and not 1 <= self.attribute_steps <= self.steps:
            raise ConfigError(
                f"attribute_steps={self.attribute_steps} outside 1..{self.steps}",
                "attribute a prefix of the training run",
            )
        if self.optimizer not in ("adam", "sgd"):
            raise ConfigError(f"unknown optimizer variant {self.optimizer!r}", "use adam or sgd")

    @property
    def attr_layers(self) -> list[int]:
        return list(range(1, self.n_layer + 1)) if self.layers is None else list(self.layers)

    @property
    def probe_positions(self) -> list[int]:
        """Probed positions: the default tracked ones (4, 8, …, 56) plus the attributed ones."""
        return sorted(set(range(4, 57, 4)) | set(self.positions))


# ----------------------------------------------------------------------------------------------------
# pieces


def _train(cfg: OthelloExperimentConfig, run: Path) -> dict[str, Any]:
    from ..train.ntp import NTPConfig, Trainer

    ncfg = NTPConfig(
        task="othello",
        regime="standard",
        seed=cfg.seed,
        n_layer=cfg.n_layer,
        d_model=cfg.d_model,
        n_head=cfg.n_head,
        batch_size=cfg.batch_size,
        steps=cfg.steps,
        lr=cfg.lr,
        eval_size=cfg.eval_size,
        probe_positions=cfg.probe_positions,
        probe_every=0,
        eval_every=0,
        checkpoint_every=cfg.checkpoint_every,
        othello_pool=cfg.othello_pool,
        device=cfg.device,
    )
    res = Trainer(ncfg, run, resume=True).run()
    return {"steps": res.step, "final_eval": res.final_eval, "seconds": res.seconds, "skipped": res.skipped}


def probe_quality(run: Path, layers: Sequence[int], positions: Sequence[int]) -> dict[str, Any]:
    """Mean test Pearson r of the final probes over the 16 central cells, per layer and overall,
    within NTP-useless (type 1) and NTP-useful (type 2) cells."""
    from ..tasks.othello import CENTRAL_CELLS
    from ..train.ntp import load_probe_metrics, tracked_quality

    pm = load_probe_metrics(run / "probe_metrics.npz")
    per_layer = {int(k): tracked_quality(pm, [k], positions, CENTRAL_CELLS) for k in pm.layers}
    return {
        "positions": list(positions),
        "per_layer": per_layer,
        "attributed_layers": tracked_quality(pm, layers, positions, CENTRAL_CELLS),
    }


def _attribute(cfg: OthelloExperimentConfig, run: Path) -> dict[str, Any]:
    from ..attribution.replay import attribute_run
    from ..attribution.store import (
        integrate,
        load_observables,
        read_segment_infos,
        sign_pattern,
        summarize,
        summary_records,
    )
    from ..attribution.store_report import write_report

    store = run / "attribution"
    end = cfg.attribute_steps or cfg.steps
    sites = [(k, i) for k in cfg.attr_layers for i in cfg.positions]
    done = (
        [s for s in read_segment_infos(store) if int(s["start"]) == 0 and int(s["end"]) == end]
        if store.is_dir()
        else []
    )
    t0 = time.time()
    if not done:
        attribute_run(
            run,
            sites=sites,
            features="tracked",
            optimizer=cfg.optimizer,
            segment=(0, end),
            types=True,
            half=False,
            out=store,
        )
    table = load_observables(store)
    integ = integrate(table)
    summ = summarize(integ, ci="t")
    per_layer = summarize(integ, by=("site_layer", "type", "component"), ci="t")
    html = write_report(store, ci="t")
    info = read_segment_infos(store)[0]
    return {
        "sites": [list(s) for s in sites],
        "updates": [1, end],
        "optimizer": cfg.optimizer,
        "summary": summary_records(summ),
        "sign_pattern": sign_pattern(summ),
        "per_layer": summary_records(per_layer),
        "checks": info.get("checks"),
        "seconds_per_attributed_step": info.get("seconds_per_attributed_step"),
        "seconds": time.time() - t0 if not done else info.get("seconds"),
        "report": str(html),
    }


def _pearson(y, p, mask=None):
    """Pearson r over axis 0 (rows where ``mask``), NaN when the target is constant on the rows."""
    import numpy as np

    m = np.ones(y.shape, dtype=bool) if mask is None else mask
    w = m.astype(np.float64)
    cnt = w.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        my, mp = (y * w).sum(0) / cnt, (p * w).sum(0) / cnt
        dy, dp = (y - my) * w, (p - mp) * w
        r = (dy * dp).sum(0) / np.sqrt((dy * dy).sum(0) * (dp * dp).sum(0))
    ymax = np.where(m, y, -np.inf).max(0)
    ymin = np.where(m, y, np.inf).min(0)
    r[~(ymax > ymin)] = np.nan
    return r


def evaluate_games(model: Any, probes: Any, batch: Any, *, chunk: int = 256) -> dict[str, Any]:
    """Probe quality and legal-move accuracy of ``model``/``probes`` on a TaskBatch of Othello games.

    Pearson r per (layer, position, central cell) across games, averaged over positions and cells,
    per layer; also within useful/useless cells.  The same statistic for human and synthetic games.
    """
    import numpy as np
    import torch

    from ..tasks import task_metrics
    from ..tasks.othello import CENTRAL_CELLS

    tokens = batch.tokens
    n = len(tokens)
    fidx = [probes.feature_names.index(c) for c in CENTRAL_CELLS]
    preds, arg = [], np.empty(tokens.shape, dtype=np.int64)
    model.eval()
    with torch.no_grad():
        for a in range(0, n, chunk):
            x = torch.from_numpy(tokens[a : a + chunk]).to(next(model.parameters()).device)
            logits, res = model(x, return_residuals=True)
            arg[a : a + chunk] = logits.argmax(-1).cpu().numpy()
            R = torch.stack([res[k] for k in probes.layers], 1)[:, :, probes.positions].double()  # (b, K, P, d)
            W = torch.from_numpy(probes.weights[:, :, fidx]).to(R)  # (K, P, F, d)
            b = torch.from_numpy(probes.intercepts[:, :, fidx]).to(R)
            preds.append((torch.einsum("nkpd,kpfd->nkpf", R, W) + b).cpu().numpy())
    pred = np.concatenate(preds)  # (n, K, P, F)
    y = np.broadcast_to(batch.features[:, probes.positions][:, :, fidx][:, None], pred.shape)
    types = np.broadcast_to(batch.feature_types[:, probes.positions][:, :, fidx][:, None], pred.shape)
    out: dict[str, Any] = {"n_games": int(n), "legal_acc": task_metrics(arg, batch)["legal_acc"], "per_layer": {}}
    r_all, r_t1, r_t2 = _pearson(y, pred), _pearson(y, pred, types == 1), _pearson(y, pred, types == 2)

    def mean(a):
        return float(np.nanmean(a)) if np.isfinite(a).any() else float("nan")

    for j, k in enumerate(probes.layers):
        out["per_layer"][int(k)] = {
            "pearson": mean(r_all[j]),
            "pearson_type1": mean(r_t1[j]),
            "pearson_type2": mean(r_t2[j]),
        }
    return out


def _human(cfg: OthelloExperimentConfig, run: Path) -> dict[str, Any]:
    import numpy as np

    from ..models import GPT
    from ..probes import ProbeSet
    from ..tasks import get_task
    from ..tasks.othello import OthelloTask
    from ..tasks.othello_records import read_game_records

    assert cfg.human_games is not None  # called only when records are given
    recs = read_game_records(cfg.human_games)
    usable = recs.complete()
    if len(usable) == 0:
        raise ConfigError(
            f"{cfg.human_games}: none of the {len(recs)} games is complete",
            "pass records that reach the end of the game",
        )
    task = cast(OthelloTask, get_task("othello"))
    human = task.batch_from_games(usable.games(feature_types=True))
    n_syn = min(cfg.compare_games, len(usable)) if cfg.compare_games else len(usable)
    synthetic = task.sample(n_syn, np.random.default_rng([cfg.seed, 99]))
    from ..storage import vocab_hash

    model = GPT.load(
        run / "model.safetensors",  # refuses a model of another vocabulary than the games'
        expect_vocab_hash=vocab_hash([str(t) for t in task.vocab], task.vocab_size),
    ).to(cfg.device)
    probes = ProbeSet.load(run / "probes.safetensors")
    return {
        "file": str(cfg.human_games),
        "n_records": len(recs),
        "n_incomplete_dropped": recs.n_incomplete,
        "human": evaluate_games(model, probes, human),
        "synthetic": evaluate_games(model, probes, synthetic),
        "note": "same probes (fitted on synthetic eval games), same statistic on both sets",
    }


# ----------------------------------------------------------------------------------------------------
# the experiment


def run_othello_experiment(cfg: OthelloExperimentConfig, out: str | Path, *, log=print) -> dict[str, Any]:
    """Train → probe → attribute → (human games) → report; returns the experiment record (also written
    to ``OUT/experiment.json``)."""
    from ..storage import atomic_write_json

    cfg.validate()
    out = Path(out)
    run = out / "run"
    record: dict[str, Any] = {
        "config": dataclasses.asdict(cfg),
        "sign": "positive influence = toward the final feature value; mismatch without a ½ (the paper's convention)",
        "stages": {},
    }
    t = time.time()
    log(f"[1/4] training {cfg.n_layer}×{cfg.d_model} on synthetic Othello, {cfg.steps} steps of {cfg.batch_size} ...")
    record["train"] = _train(cfg, run)
    record["stages"]["train_s"] = time.time() - t
    record["probes"] = probe_quality(run, cfg.attr_layers, cfg.positions)
    log(
        "[2/4] probes (central cells): "
        + ", ".join(f"L{k} r={v['pearson']:.3f}" for k, v in record["probes"]["per_layer"].items())
    )
    t = time.time()
    log(
        f"[3/4] attributing updates 1..{cfg.attribute_steps or cfg.steps} at layers {cfg.attr_layers} × "
        f"positions {cfg.positions} ({cfg.optimizer}) ..."
    )
    record["attribution"] = _attribute(cfg, run)
    record["stages"]["attribute_s"] = time.time() - t
    if cfg.human_games:
        t = time.time()
        log(f"[4/4] probes on recorded games from {cfg.human_games} ...")
        record["human_games"] = _human(cfg, run)
        record["stages"]["human_s"] = time.time() - t
    atomic_write_json(out / "experiment.json", record)
    _report(record, out)
    return record


def _fmt(v: Any) -> str:
    return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.4g}"


TYPE_NAMES = {None: "all rows", 1: "NTP-useless", 2: "NTP-useful", 0: "empty"}


def summary_lines(record: dict[str, Any]) -> list[str]:
    """The headline numbers as text lines (also the body of report.md)."""
    lines = []
    tr = record["train"]
    ev = tr.get("final_eval", {})
    lines.append(
        f"training: {tr['steps']} steps; eval loss {_fmt(ev.get('eval_loss'))}, legal-move accuracy "
        f"{_fmt(ev.get('legal_acc'))}"
    )
    lines.append("probe Pearson r (16 central cells, attributed positions): layer: all / useless / useful")
    for k, v in record["probes"]["per_layer"].items():
        lines.append(f"  L{k}: {_fmt(v['pearson'])} / {_fmt(v.get('pearson_type1'))} / {_fmt(v.get('pearson_type2'))}")
    at = record["attribution"]
    lines.append(
        f"integrated influence, updates {at['updates'][0]}..{at['updates'][1]} ({at['optimizer']}), "
        f"mean over items [95 % t-interval]:"
    )
    lines.append(f"  {'component':11s} {'NTP-useful (type 2)':32s} {'NTP-useless (type 1)':32s}")
    by = {(s["component"], s["type"]): s for s in at["summary"]}
    for c in ("direct", "precached", "shared", "full"):
        cells = []
        for ty in (2, 1):
            s = by.get((c, ty))
            cells.append("—" if s is None else f"{_fmt(s['mean'])} [{_fmt(s['lo'])}, {_fmt(s['hi'])}]")
        lines.append(f"  {c:11s} {cells[0]:32s} {cells[1]:32s}")
    for p in at["sign_pattern"]:
        lines.append(
            f"  expected {p['component']} {p['expected']} for {TYPE_NAMES[p['type']]}: "
            f"{'holds' if p['holds'] else 'does NOT hold'}"
            f"{' (CI excludes 0)' if p['significant'] else ''}"
        )
    hg = record.get("human_games")
    if hg:
        lines.append(
            f"recorded games {hg['file']}: {hg['human']['n_games']} used ({hg['n_incomplete_dropped']} "
            f"incomplete dropped); legal-move acc recorded {_fmt(hg['human']['legal_acc'])} vs synthetic "
            f"{_fmt(hg['synthetic']['legal_acc'])}"
        )
        for k in hg["human"]["per_layer"]:
            h, s = hg["human"]["per_layer"][k], hg["synthetic"]["per_layer"][k]
            lines.append(
                f"  L{k} probe r: recorded {_fmt(h['pearson'])} vs synthetic {_fmt(s['pearson'])} "
                f"(useful {_fmt(h['pearson_type2'])} vs {_fmt(s['pearson_type2'])}, useless "
                f"{_fmt(h['pearson_type1'])} vs {_fmt(s['pearson_type1'])})"
            )
    return lines


def _report(record: dict[str, Any], out: Path) -> None:
    from ..storage import atomic_write_text

    body = "\n".join(summary_lines(record))
    atomic_write_text(
        out / "report.md",
        "# OthelloGPT gradient-pathway experiment\n\n```\n"
        + body
        + f"\n```\n\nAttribution report: {record['attribution']['report']}\n",
    )
