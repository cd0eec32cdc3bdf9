"""The Othello attribution experiment of arXiv 2603.14087 (the Othello task, influence, results) over
training seeds, with nulls and the paper's comparison tested as hypotheses.

``run_othello(OthelloConfig(scale="cpu", seeds=[0, 1, 2]), OUT)`` does, per seed ``s``:

1. **train** a GPT on synthetic Othello (``OUT/seed-<s>/run``; resumable), probes of the board from
   the player-to-move's perspective at the attributed positions;
2. **null probes**: the same probes fitted on the untrained model of the same seed
   (``OUT/seed-<s>/initial``), so "the board is decodable" is measured against "decodable before any
   learning";
3. **attribute** updates 1..``attribute_steps`` (Adam variant, the paper's; exact replay) at sites
   ``layers × positions`` for the 16 central cells, per feature type (1 = NTP-useless, 2 = NTP-useful: the
   colour-flip definition), with ``random_directions`` null directions of each probe's norm beside every
   probe (``OUT/seed-<s>/run/attribution``);
4. **snapshots** (beside the paper): at each checkpoint c = 0, 10 %, …, 90 % of training, the SGD-variant
   influence (Δ_c = lr·G_c, no moment history needed) of updates c+1..c+K on the same sites and features
   (``OUT/seed-<s>/run/attribution-snapshots``), as a rate per update next to the model's eval at c: how
   the pathways feed the features as the model learns, where the Adam integral covers only a prefix.

Then, with the **seed** as the unit of replication:

* per seed and (component, type), the mean integrated influence over items (layer k, position i,
  cell); items at k = L are reported apart (``last_layer``), because there G_pre ≡ 0 (nothing reads r^L_i
  but λ_i) and pooling them would dilute the pre-cached mean;
* across seeds: Student-t intervals of those seed means; the paper's pattern as one-sided tests over
  seeds (paired by seed for useful vs useless, against 0 otherwise; Holm over the family), with power;
  the real probes against their random directions; per seed, a Wilcoxon test of useful vs useless
  paired by item;
* the same analysis on the influence integrated over the first 25 %, 50 % of the attributed updates
  (``fractions``), to show how the pattern builds up as the model learns;
* the models' own quality next to all of it: held-out eval loss, legal-move top-1 accuracy, probe
  Pearson r (overall / useless / useful cells) per layer against the initial-model null.

Writes ``OUT/experiment.json``, ``OUT/report.html`` and ``results/othello/othello-<scale>.json``.

Scales (:data:`SCALES`): ``paper`` (6 layers × 256, batch 1024, 5,000 steps, eval 20,480 games, positions
4, 8, …, 56: a GPU job), ``cpu`` (4 layers × 128, batch 64, 12,000 steps ≈ 50 min of training per seed on
two cores — the Adam learning rate of the paper, 1e-3: 3e-3 learned slower (legal-move accuracy 0.39 vs
0.60 at step 400 in a one-seed pilot); at a constant rate 4,000 steps reached only 0.89 and 12,000 plateaued at
0.934 (0.932 at 80 %, 0.933 at 90 %, seed 0), so the last 20 % of updates cool the rate down linearly
(``lr_decay`` [9600, 12000], a deviation from the paper's constant rate): resumed from that seed's 80 %
checkpoint, the cool-down reached 0.958; evaluation every 10 % of training for the learning curve; updates 1..200 attributed, influences recorded at every 5th), ``ci`` (seconds; a plumbing check, not a result).
Caveat: the Adam variant needs the decomposition at every attributed update (≈ 5–8 training steps each)
even where no influence is recorded, so at CPU scale only a prefix of training can be attributed
(``attribute_steps``), and the influence JVPs (the larger cost) run only at every ``record_every``-th
update, the integral estimated by the rectangle rule; both are listed as deviations in the results file.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..progress import log
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from . import inference
from .formatting import ci as fmt_ci
from .formatting import sig as _f
from .records import commits_of, read_unit_record, record_path, write_unit_record
from .results import default_results_path, write_results

EXPERIMENT = "othello"
COMPONENTS = ("direct", "precached", "shared", "full")
TYPES = {1: "useless", 2: "useful"}
SCALES: dict[str, dict[str, Any]] = {
    "paper": dict(
        n_layer=6,
        d_model=256,
        n_head=4,
        batch_size=1024,
        steps=5000,
        eval_size=20480,
        othello_pool=500_000,
        positions=list(range(4, 57, 4)),
        attribute_steps=None,
        record_every=1,
        snapshot_updates=10,
        snapshot_record_every=1,
        lr_decay=None,
    ),
    "cpu": dict(
        n_layer=4,
        d_model=128,
        n_head=4,
        batch_size=64,
        steps=12000,
        eval_size=4096,
        othello_pool=500_000,
        positions=[12, 24, 36],
        attribute_steps=200,
        record_every=5,
        snapshot_updates=10,
        snapshot_record_every=2,
        lr_decay=[9600, 12000],
    ),
    "ci": dict(
        n_layer=2,
        d_model=32,
        n_head=2,
        batch_size=16,
        steps=30,
        eval_size=200,
        othello_pool=2000,
        positions=[8, 20],
        attribute_steps=None,
        record_every=1,
        snapshot_updates=2,
        snapshot_record_every=1,
    ),
}
SNAPSHOTS = 10  # snapshots at the checkpoints 0, 10 %, …, 90 % of training
ALPHA = 0.05
# (name, component, type a, type b or None (= against 0), alternative): the paper's Othello pattern
HYPOTHESES = [
    ("direct: useful > useless", "direct", 2, 1, "greater"),
    ("direct: useful > 0", "direct", 2, None, "greater"),
    ("pre-cached: useless > 0", "precached", 1, None, "greater"),
    ("pre-cached: useless > useful", "precached", 1, 2, "greater"),
    ("shared: useful > 0", "shared", 2, None, "greater"),
    ("shared: useless > 0", "shared", 1, None, "greater"),
    ("combined: useful > useless", "full", 2, 1, "greater"),
]


@dataclass
class OthelloConfig:
    """Seeds × the scale's model; ``overrides`` replace scale fields (each recorded as a deviation)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    layers: list[int] | None = None  # attributed layers (default 1..L)
    random_directions: int = 2
    fractions: list[float] = field(default_factory=lambda: [0.25, 0.5, 1.0])
    overrides: dict[str, Any] = field(default_factory=dict)
    lr: float = 1e-3
    device: str = "cpu"
    confidence: float = 0.95
    jobs: int = 1  # seeds trained and attributed in parallel processes

    def __post_init__(self) -> None:
        if isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1:
            raise ConfigError(f"jobs must be an integer ≥ 1, got {self.jobs!r}", "e.g. --jobs 2")
        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r}", f"use one of: {', '.join(SCALES)}")
        bad = set(self.overrides) - set(SCALES["paper"])
        if bad:
            raise ConfigError(f"unknown override(s) {sorted(bad)}", f"use: {', '.join(SCALES['paper'])}")
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds)
        ):
            raise ConfigError(f"seeds must be distinct non-negative integers, got {self.seeds!r}", "e.g. --seeds 0-2")
        if not self.fractions or any(not 0 < f <= 1 for f in self.fractions):
            raise ConfigError(f"fractions {self.fractions} must lie in (0, 1]", "e.g. 0.25,0.5,1")
        s = self.settings
        L = s["n_layer"]
        if any(not 1 <= k <= L for k in self.attr_layers):
            raise ConfigError(f"attributed layers {self.attr_layers} outside 1..{L}", f"use layers in 1..{L}")
        if any(not 1 <= i <= 59 for i in s["positions"]):
            raise ConfigError(f"positions {s['positions']} must lie in 1..59", "e.g. 12,24,36")
        if isinstance(s["record_every"], bool) or not isinstance(s["record_every"], int) or s["record_every"] < 1:
            raise ConfigError(
                f"record_every={s['record_every']!r} must be an integer ≥ 1",
                "use 1 to record the influence at every attributed update",
            )
        for key in ("snapshot_updates", "snapshot_record_every"):
            v = s[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "snapshot_updates" else 1):
                raise ConfigError(
                    f"{key}={v!r} must be an integer ≥ {0 if key == 'snapshot_updates' else 1}",
                    "snapshot_updates 0 switches the snapshots off",
                )
        if s["attribute_steps"] is not None and not 1 <= s["attribute_steps"] <= s["steps"]:
            raise ConfigError(
                f"attribute_steps={s['attribute_steps']} outside 1..{s['steps']}",
                "attribute a prefix of the training run",
            )
        self.ntp_config(self.seeds[0], initial=False)  # the trainer's own validation

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def attr_layers(self) -> list[int]:
        return list(range(1, self.settings["n_layer"] + 1)) if self.layers is None else list(self.layers)

    @property
    def attributed_updates(self) -> int:
        s = self.settings
        return int(s["attribute_steps"] or s["steps"])

    def ntp_config(self, seed: int, *, initial: bool) -> Any:
        from ..train.ntp import NTPConfig

        s = self.settings
        return NTPConfig(
            task="othello",
            regime="standard",
            seed=int(seed),
            n_layer=s["n_layer"],
            d_model=s["d_model"],
            n_head=s["n_head"],
            batch_size=s["batch_size"],
            steps=0 if initial else s["steps"],
            lr=self.lr,
            eval_size=s["eval_size"],
            othello_pool=s["othello_pool"],
            probe_positions=sorted(s["positions"]),
            probe_every=0,
            lr_decay=None if initial else s.get("lr_decay"),
            eval_every=0 if initial else self.checkpoint_every,
            checkpoint_every=0 if initial else self.checkpoint_every,
            keep_checkpoints=0,
            device=self.device,
        )

    def deviations(self) -> list[str]:
        paper, used = SCALES["paper"], self.settings
        out = [
            f"{k} {used[k]} (paper {paper[k]})"
            for k in ("n_layer", "d_model", "n_head", "batch_size", "steps", "eval_size")
            if used[k] != paper[k]
        ]
        if used["positions"] != paper["positions"]:
            out.append(f"attributed positions {used['positions']} (paper 4, 8, …, 56)")
        if used.get("lr_decay"):
            a, b = used["lr_decay"]
            out.append(f"learning rate cooled down linearly over updates {a}..{b} (paper: constant)")
        if used["record_every"] > 1:
            out.append(
                f"influences recorded at every {used['record_every']}th attributed update, integrated by the "
                "rectangle rule (paper: every update)"
            )
        if used["attribute_steps"] is not None and used["attribute_steps"] < used["steps"]:
            out.append(
                f"influence integrated over updates 1..{used['attribute_steps']} of {used['steps']} (paper: all)"
            )
        if self.snapshot_starts:
            out.append(
                f"beside it (not in the paper): the SGD-variant influence (Δ_c = lr·G_c) of updates c+1..c+"
                f"{self.snapshot_window} at the checkpoints c = 0, 10 %, …, 90 % of training, how the pathways "
                "feed the features as the model learns"
            )
        if len(self.seeds) != 1:
            out.append(f"{len(self.seeds)} seeds (paper 1)")
        return out

    @property
    def checkpoint_every(self) -> int:
        return max(1, self.settings["steps"] // 10)

    @property
    def snapshot_window(self) -> int:
        """Updates attributed from each snapshot checkpoint (≤ the checkpoint interval)."""
        return min(int(self.settings["snapshot_updates"]), self.checkpoint_every)

    @property
    def snapshot_starts(self) -> list[int]:
        """Checkpoint steps c whose updates c+1..c+``snapshot_window`` the snapshots attribute."""
        K, every, steps = self.snapshot_window, self.checkpoint_every, self.settings["steps"]
        if K == 0:
            return []
        return [j * every for j in range(SNAPSHOTS) if j * every + K <= steps]

    def snapshot_recorded(self, start: int) -> list[int]:
        """Updates of the snapshot at ``start`` whose influences are recorded."""
        return list(range(start + 1, start + self.snapshot_window + 1, self.settings["snapshot_record_every"]))

    @property
    def name(self) -> str:
        return f"othello-{self.scale}"


# ----------------------------------------------------------------------------------------------------
# per seed


def _train(cfg: OthelloConfig, seed: int, out: Path) -> dict[str, Any]:
    from ..train.ntp import Trainer

    res = {}
    for initial, d in ((False, out / "run"), (True, out / "initial")):
        t = time.time()
        r = Trainer(cfg.ntp_config(seed, initial=initial), d, resume=True).run()
        res["initial" if initial else "trained"] = {
            "final_eval": r.final_eval,
            "seconds": r.seconds,
            "wall_this_call": time.time() - t,
        }
    return res


def _probe_quality(run: Path, positions: list[int]) -> dict[str, Any]:
    from ..tasks.othello import CENTRAL_CELLS
    from ..train.ntp import load_probe_metrics, tracked_quality

    pm = load_probe_metrics(run / "probe_metrics.npz")
    return {str(k): tracked_quality(pm, [k], positions, CENTRAL_CELLS) for k in pm.layers if k > 0}


def _attribute(cfg: OthelloConfig, run: Path) -> Path:
    from ..attribution.replay import attribute_run
    from ..attribution.store import read_segment_infos

    store = run / "attribution"
    end = cfg.attributed_updates
    done = store.is_dir() and any(int(s["start"]) == 0 and int(s["end"]) == end for s in read_segment_infos(store))
    if not done:
        sites = [(k, i) for k in cfg.attr_layers for i in cfg.settings["positions"]]
        attribute_run(
            run,
            sites=sites,
            features="tracked",
            optimizer="adam",
            segment=(0, end),
            types=True,
            half=False,
            out=store,
            random_directions=cfg.random_directions,
            overwrite=True,
            steps=recorded_updates(end, cfg.settings["record_every"]),
        )
    return store


def _attribute_snapshots(cfg: OthelloConfig, run: Path) -> Path | None:
    """SGD-variant influences of updates c+1..c+K at every snapshot checkpoint c (``RUN/attribution-snapshots``);
    snapshots already stored are kept.  Each replays K updates from its checkpoint (the logged training loss
    at c+K is checked bit-exactly)."""
    from ..attribution.replay import attribute_run
    from ..attribution.store import read_segment_infos

    if not cfg.snapshot_starts:
        return None
    store = run / "attribution-snapshots"
    K = cfg.snapshot_window
    done = {(int(i["start"]), int(i["end"])) for i in read_segment_infos(store)} if store.is_dir() else set()
    sites = [(k, i) for k in cfg.attr_layers for i in cfg.settings["positions"]]
    for c in cfg.snapshot_starts:
        if (c, c + K) not in done:
            attribute_run(
                run,
                sites=sites,
                features="tracked",
                optimizer="sgd",
                segment=(c, c + K),
                types=True,
                half=False,
                out=store,
                random_directions=cfg.random_directions,
                overwrite=True,
                steps=cfg.snapshot_recorded(c),
                verify="segment",
            )
    return store


def recorded_updates(end: int, every: int) -> list[int]:
    """Updates whose influences are recorded: every ``every``-th of 1..end, centred in its block of
    ``every`` updates (so the rectangle rule ``every × Σ recorded`` estimates the sum over all updates)."""
    if every < 1:
        raise ConfigError(f"record_every={every} must be ≥ 1", "use 1 to record every update")
    return list(range(1 + (every - 1) // 2, end + 1, every))


def _prepare_seed(args: tuple[OthelloConfig, int, str, int | None]) -> dict[str, Any]:
    """Train (and the null) and attribute one seed; a worker of :func:`_prepare_all`."""
    config, seed, d, threads = args
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    trained = _train(config, seed, Path(d))
    t = time.time()
    _attribute(config, Path(d) / "run")
    t_snap = time.time()
    _attribute_snapshots(config, Path(d) / "run")
    return {
        "train": trained,
        "attribution_seconds_this_call": t_snap - t,
        "snapshot_seconds_this_call": time.time() - t_snap,
    }


def _prepare_all(config: OthelloConfig, out: Path) -> dict[int, dict[str, Any]]:
    """Every seed trained and attributed (resuming what exists): in this process for ``jobs`` = 1, else in
    ``jobs`` spawned processes of one torch thread each."""
    todo = [(config, seed, str(out / f"seed-{seed}"), None if config.jobs == 1 else 1) for seed in config.seeds]
    if config.jobs == 1:
        res = {}
        for item in todo:
            log(
                f"[othello] seed {item[1]}: training (and the untrained-model null), then attributing updates "
                f"1..{config.attributed_updates} ..."
            )
            res[item[1]] = _prepare_seed(item)
        return res
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    log(f"[othello] seeds {config.seeds}: training and attributing in {config.jobs} processes ...")
    with ProcessPoolExecutor(max_workers=config.jobs, mp_context=mp.get_context("spawn")) as pool:
        return dict(zip(config.seeds, pool.map(_prepare_seed, todo)))


def seed_aggregates(
    store: Path, n_layer: int, updates: int, fractions: list[float], record_every: int = 1
) -> dict[str, Any]:
    """Per-seed means of integrated influence over items, by fraction of the attributed updates, part
    (``main``: k < L; ``last_layer``: k = L), probe kind (``real`` / ``random``), component and type;
    plus the item-paired Wilcoxon test of useful vs useless per component (main part, real probes).
    With ``record_every`` > 1 only every ``record_every``-th update was recorded and the integrated
    influence is estimated as ``record_every`` × the sum over recorded updates (rectangle rule)."""
    import pyarrow.compute as pc
    from scipy import stats

    from ..attribution.store import integrate, load_observables

    table = load_observables(store)
    out: dict[str, Any] = {}
    for frac in fractions:
        cutoff = max(1, int(round(frac * updates)))
        integ = integrate(table.filter(pc.less_equal(table["step"], cutoff))).to_pylist()
        means, items = _item_means(integ, n_layer, lambda r: record_every * float(r["integrated"]))
        wil = {}
        for c in COMPONENTS:
            pairs = [(d[2], d[1]) for (cc, *_), d in items.items() if cc == c and 1 in d and 2 in d]
            diff = np.array([a - b for a, b in pairs])
            wil[c] = {
                "n_items": len(pairs),
                "p_useful_gt_useless": (
                    float(stats.wilcoxon(diff, alternative="greater").pvalue)
                    if len(pairs) > 1 and np.any(diff)
                    else None
                ),
            }
        out[f"{frac:g}"] = {"updates": cutoff, "means": means, "wilcoxon_items": wil}
    return out


def _item_means(integ: list[dict[str, Any]], n_layer: int, value_of: Any) -> tuple[dict[str, Any], dict[tuple, dict]]:
    """Mean over items (layer, position, cell) per part (``main``: k < L, ``last_layer``: k = L), probe kind
    (``real`` / ``random``), component and type of ``value_of(row)`` for integrated rows; and the main-part
    real-probe values per item (component, layer, position, feature) → {type: value} for paired tests."""
    from ..attribution.store import RANDOM_TAG

    agg: dict[str, Any] = {}
    items: dict[tuple, dict[int, float]] = {}
    for r in integ:
        if r["type"] not in TYPES or r["integrated"] is None or not math.isfinite(r["integrated"]):
            continue
        part = "last_layer" if r["site_layer"] == n_layer else "main"
        kind = "random" if RANDOM_TAG in r["feature"] else "real"
        value = value_of(r)
        agg.setdefault(part, {}).setdefault(kind, {}).setdefault(r["component"], {}).setdefault(
            TYPES[r["type"]], []
        ).append(value)
        if part == "main" and kind == "real":
            items.setdefault((r["component"], r["site_layer"], r["site_position"], r["feature"]), {})[r["type"]] = value
    means = {
        part: {
            kind: {
                c: {t: {"mean": float(np.mean(v)), "n_items": len(v)} for t, v in ts.items()} for c, ts in comps.items()
            }
            for kind, comps in kinds.items()
        }
        for part, kinds in agg.items()
    }
    return means, items


def snapshot_aggregates(store: Path | None, n_layer: int, starts: list[int], window: int) -> dict[str, Any]:
    """Per snapshot c (key ``str(c)``): mean over items of the influence *per recorded update* of updates
    c+1..c+``window`` (SGD variant), by part, probe kind, component and type — a rate, comparable across
    snapshots, where the fractions of :func:`seed_aggregates` are integrals."""
    import pyarrow.compute as pc

    from ..attribution.store import integrate, load_observables

    if store is None or not starts:
        return {}
    table = load_observables(store)
    out: dict[str, Any] = {}
    for c in starts:
        sel = table.filter(pc.and_(pc.greater(table["step"], c), pc.less_equal(table["step"], c + window)))
        means, _ = _item_means(
            integrate(sel).to_pylist(), n_layer, lambda r: float(r["integrated"]) / max(1, int(r["n_steps"]))
        )
        out[str(c)] = {"updates": [c + 1, c + window], "means": means}
    return out


def eval_at(run: Path, initial: Path, step: int) -> dict[str, float | None]:
    """Held-out eval (loss, legal-move accuracy) of the model after ``step`` updates: the run's eval record
    at that step, or for step 0 the untrained model's (``initial``, same seed)."""
    if step == 0:
        path, want = initial / "metrics.jsonl", None
    else:
        path, want = run / "metrics.jsonl", step
    found: dict[str, float | None] = {"eval_loss": None, "legal_acc": None}
    if not path.is_file():
        return found
    import json

    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("event") == "eval" and (want is None or int(rec.get("step", -1)) == want):
            found = {k: rec.get(k) for k in found}
    return found


# ----------------------------------------------------------------------------------------------------
# across seeds


def _get(agg: dict[str, Any], frac: str, part: str, kind: str, comp: str, typ: str) -> float | None:
    try:
        return agg[frac]["means"][part][kind][comp][typ]["mean"]
    except KeyError:
        return None


def across_seeds(
    per_seed: dict[int, dict[str, Any]],
    fractions: list[float],
    confidence: float,
    *,
    field: str = "aggregates",
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Seed-level intervals per (fraction, part, kind, component, type) and the hypothesis tests;
    ``field="snapshots"`` with ``labels`` (snapshot steps) does the same for the snapshot rates."""
    seeds = sorted(per_seed)
    out: dict[str, Any] = {}
    for frac in labels if labels is not None else [f"{f:g}" for f in fractions]:
        table: dict[str, Any] = {}
        for part in ("main", "last_layer"):
            for kind in ("real", "random"):
                for c in COMPONENTS:
                    for t in TYPES.values():
                        vals = [_get(per_seed[s][field], frac, part, kind, c, t) for s in seeds]
                        if any(v is not None for v in vals):
                            table.setdefault(part, {}).setdefault(kind, {}).setdefault(c, {})[t] = inference.mean_ci(
                                vals, confidence
                            )
        tests: dict[str, Any] = {}
        for name, comp, a, b, alt in HYPOTHESES:
            va = [_get(per_seed[s][field], frac, "main", "real", comp, TYPES[a]) for s in seeds]
            vb = (
                [0.0] * len(seeds)
                if b is None
                else [_get(per_seed[s][field], frac, "main", "real", comp, TYPES[b]) for s in seeds]
            )
            tests[name] = inference.paired_test(va, vb, alternative=alt, correlation=False, alpha=ALPHA)
        adj = inference.holm({k: v["p_t"] for k, v in tests.items()})
        for k, v in tests.items():
            v["p_holm"] = adj[k]
            v["holds"] = v["p_holm"] is not None and v["p_holm"] < ALPHA
        null_tests = {}
        for t in TYPES.values():
            va = [_get(per_seed[s][field], frac, "main", "real", "full", t) for s in seeds]
            vb = [_get(per_seed[s][field], frac, "main", "random", "full", t) for s in seeds]
            nt = inference.paired_test(va, vb, alternative="greater", correlation=False, alpha=ALPHA)
            nt["holds"] = nt["p_t"] is not None and nt["p_t"] < ALPHA
            null_tests[f"combined, {t}: real probe > random directions"] = nt
        out[frac] = {"influence": table, "tests": tests, "null_tests": null_tests}
    return out


MIN_SEEDS = 3  # a combined results file at the default path needs at least this many seeds


def seed_record_path(results_path: str | Path, seed: int) -> Path:
    """Where the record of ``seed`` lives beside a results file: ``results/othello/othello-cpu.json``
    → ``results/othello/othello-cpu/seed-<seed>.json`` (:mod:`originlens.experiments.records`)."""
    return record_path(results_path, f"seed-{int(seed)}")


# settings added after records existed: left out of the key at their defaults, so older records still combine
LATER_SETTINGS: dict[str, Any] = {"lr_decay": None}


def config_key(config: OthelloConfig) -> dict[str, Any]:
    """What must agree between seed records for them to be combined: the experiment's settings and the
    trainer's configuration, without the seed list, the parallelism, the device (and settings added later
    at their defaults, :data:`LATER_SETTINGS`)."""

    def later_default(k: str, v: Any) -> bool:
        return k in LATER_SETTINGS and v == LATER_SETTINGS[k]

    exp = {k: v for k, v in to_jsonable(config).items() if k not in ("seeds", "jobs", "device")}
    exp["overrides"] = {k: v for k, v in exp.get("overrides", {}).items() if not later_default(k, v)}
    settings = {k: v for k, v in to_jsonable(config.settings).items() if not later_default(k, v)}
    ntp = {
        k: v
        for k, v in config.ntp_config(config.seeds[0], initial=False).to_dict().items()
        if k not in ("seed", "device") and not later_default(k, v)
    }
    return {"experiment": exp, "settings": settings, "ntp": to_jsonable(ntp)}


def read_seed_record(path: str | Path, config: OthelloConfig, seed: int) -> dict[str, Any]:
    """A seed's record checked against ``config`` (:func:`originlens.experiments.records.read_unit_record`)."""
    return read_unit_record(path, experiment=EXPERIMENT, unit=f"seed-{int(seed)}", config_key=config_key(config))


def _seed_values(config: OthelloConfig, d: Path, prepared: dict[str, Any]) -> dict[str, Any]:
    """The per-seed values of a finished seed directory ``d`` (``d/run``, ``d/initial``)."""
    L = config.settings["n_layer"]
    positions = sorted(config.settings["positions"])
    store = d / "run" / "attribution"
    return {
        "train": prepared["train"],
        "probes": _probe_quality(d / "run", positions),
        "initial_probes": _probe_quality(d / "initial", positions),
        "attribution_seconds_this_call": prepared["attribution_seconds_this_call"],
        "aggregates": seed_aggregates(
            store, L, config.attributed_updates, config.fractions, config.settings["record_every"]
        ),
        "snapshot_seconds_this_call": prepared.get("snapshot_seconds_this_call"),
        "snapshots": snapshot_aggregates(
            d / "run" / "attribution-snapshots" if config.snapshot_starts else None,
            L,
            config.snapshot_starts,
            config.snapshot_window,
        ),
        "snapshot_eval": {str(c): eval_at(d / "run", d / "initial", c) for c in config.snapshot_starts},
        "data_hashes": read_json(d / "run" / "environment.json").get("data_hashes", {}),
    }


def run_othello(
    config: OthelloConfig,
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
    from_records: bool = False,
) -> dict[str, Any]:
    """Train, probe, attribute every seed (resuming what exists), aggregate over seeds, write the
    experiment record, the report and the results file; returns the record.

    Every seed's values are also written as a *seed record* beside the results file
    (:func:`seed_record_path`).  ``from_records=True`` trains nothing: every seed is read from its record
    (checked against ``config``), so seeds run at different times combine into one results file.  With
    fewer than :data:`MIN_SEEDS` seeds and no explicit ``results`` path the combined file is not written
    (the seed records are): a results file at the default path is evidence, and evidence needs seeds."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    L = config.settings["n_layer"]
    positions = sorted(config.settings["positions"])
    res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
    command = command or f"python: run_othello({config!r}, {str(out)!r})"
    with exclusive(out):
        per_seed: dict[int, dict[str, Any]] = {}
        seed_commits: dict[int, Any] = {}
        if from_records:
            for seed in config.seeds:
                rec = read_seed_record(seed_record_path(res_path, seed), config, seed)
                per_seed[seed] = rec["values"]
                seed_commits[seed] = commits_of(rec)
        else:
            prepared = _prepare_all(config, out)
            for seed in config.seeds:
                d = out / f"seed-{seed}"
                per_seed[seed] = _seed_values(config, d, prepared[seed])
                path = write_unit_record(
                    seed_record_path(res_path, seed),
                    experiment=EXPERIMENT,
                    name=config.name,
                    unit=f"seed-{seed}",
                    config_key=config_key(config),
                    values=per_seed[seed],
                    command=command,
                    run_dir=d / "run",
                )
                seed_commits[seed] = commits_of(read_json(path))
        per_seed = {s: per_seed[s] for s in config.seeds}
        layers = sorted({k for s in per_seed.values() for k in s["probes"]}, key=int)
        quality = {
            "eval_loss": inference.mean_ci(
                [s["train"]["trained"]["final_eval"].get("eval_loss") for s in per_seed.values()], config.confidence
            ),
            "legal_acc": inference.mean_ci(
                [s["train"]["trained"]["final_eval"].get("legal_acc") for s in per_seed.values()],
                config.confidence,
                bounds=(0, 1),
            ),
            "initial_legal_acc": inference.mean_ci(
                [s["train"]["initial"]["final_eval"].get("legal_acc") for s in per_seed.values()],
                config.confidence,
                bounds=(0, 1),
            ),
            "train_seconds": inference.mean_ci(
                [s["train"]["trained"]["seconds"] for s in per_seed.values()], config.confidence
            ),
            "probes": {
                k: {
                    m: {
                        "trained": inference.correlation_ci(
                            [s["probes"][k].get(m) for s in per_seed.values()], config.confidence
                        ),
                        "initial": inference.correlation_ci(
                            [s["initial_probes"][k].get(m) for s in per_seed.values()], config.confidence
                        ),
                    }
                    for m in ("pearson", "pearson_type1", "pearson_type2")
                }
                for k in layers
            },
        }
        summary = {
            "scale": {
                "name": config.scale,
                "summary": {
                    "paper": "the paper's configuration",
                    "cpu": "a CPU-sized OthelloGPT",
                    "ci": "a plumbing check, not a result",
                }[config.scale],
                "model": f"{L} layers, d = {config.settings['d_model']}, {config.settings['n_head']} heads",
                "training": f"Adam lr {config.lr}, batch {config.settings['batch_size']}, "
                f"{config.settings['steps']} steps, a pool of {config.settings['othello_pool']} "
                "synthetic games",
                "eval": f"{config.settings['eval_size']} held-out synthetic games",
                "attribution": f"Adam variant, updates 1..{config.attributed_updates}, layers "
                f"{config.attr_layers} × positions {positions}, 16 central cells, "
                f"{config.random_directions} random directions per probe",
                "deviations": config.deviations(),
            },
            "quality": quality,
            "by_fraction": across_seeds(per_seed, config.fractions, config.confidence),
            "snapshots": _snapshots_across_seeds(config, per_seed),
            "per_seed": per_seed,
        }
        if config.snapshot_starts:
            summary["scale"]["snapshots"] = (
                f"SGD variant, updates c+1..c+{config.snapshot_window} from the checkpoints c = "
                f"{', '.join(map(str, config.snapshot_starts))} (influences recorded at every "
                f"{config.settings['snapshot_record_every']}th; mean per recorded update)"
            )
        atomic_write_json(out / "experiment.json", to_jsonable(summary))
        write_report(summary, out)
        summary["seed_commits"] = seed_commits
        if results is None and len(config.seeds) < MIN_SEEDS:
            log(
                f"[othello] {len(config.seeds)} seed(s) < {MIN_SEEDS}: the seed records are written "
                f"({seed_record_path(res_path, config.seeds[0]).parent}), the combined results file is not; "
                f"combine ≥ {MIN_SEEDS} seeds with --from-records"
            )
            summary["results_file"] = None
            return summary
        full = f"{1.0:g}" if "1" in summary["by_fraction"] else sorted(summary["by_fraction"])[-1]
        write_results(
            res_path,
            experiment=EXPERIMENT,
            name=config.name,
            command=command,
            config={
                "experiment": to_jsonable(config),
                "ntp": config.ntp_config(config.seeds[0], initial=False).to_dict(),
            },
            seeds=config.seeds,
            scale=summary["scale"],
            quality=quality,
            numbers={
                "influence": summary["by_fraction"][full]["influence"],
                "by_fraction": {f: v["influence"] for f, v in summary["by_fraction"].items()},
                "snapshots": {
                    c: {"eval": v["eval"], "influence": v["influence"]} for c, v in summary["snapshots"].items()
                },
            },
            tests={
                "hypotheses": summary["by_fraction"][full]["tests"],
                "null": summary["by_fraction"][full]["null_tests"],
                "by_fraction": {f: v["tests"] for f, v in summary["by_fraction"].items()},
                "snapshots": {c: v["tests"] for c, v in summary["snapshots"].items()},
                "alpha": ALPHA,
            },
            data_hashes={f"seed-{s}": v["data_hashes"] for s, v in per_seed.items()},
            runs=[
                {
                    "seed": s,
                    "commits": seed_commits.get(s),
                    "final_eval": v["train"]["trained"]["final_eval"],
                    "train_seconds": v["train"]["trained"]["seconds"],
                    "probes": v["probes"],
                    "initial_probes": v["initial_probes"],
                    "wilcoxon_items": v["aggregates"][full]["wilcoxon_items"],
                }
                for s, v in per_seed.items()
            ],
            extra={
                "sign": "positive influence moves the feature toward its final value; mismatch "
                "without a ½ (the paper's convention)",
                "pooling": "per seed: mean of integrated influence over items (layer k < L, "
                "position, cell); k = L apart; CIs and tests over seeds",
            },
        )
        summary["results_file"] = str(res_path)
    return summary


def _snapshots_across_seeds(config: OthelloConfig, per_seed: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per snapshot step: the models' quality there (eval loss, legal-move accuracy over seeds), the
    influence rates and the paper's pattern tested over seeds (Holm within each snapshot)."""
    labels = [str(c) for c in config.snapshot_starts]
    if not labels:
        return {}
    rates = across_seeds(per_seed, [], config.confidence, field="snapshots", labels=labels)
    out = {}
    for c in labels:
        ev = [per_seed[s]["snapshot_eval"][c] for s in sorted(per_seed)]
        out[c] = {
            "updates": [int(c) + 1, int(c) + config.snapshot_window],
            "eval": {
                "legal_acc": inference.mean_ci([e.get("legal_acc") for e in ev], config.confidence, bounds=(0, 1)),
                "eval_loss": inference.mean_ci([e.get("eval_loss") for e in ev], config.confidence),
            },
            **rates[c],
        }
    return out


def _snapshot_rows(snapshots: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c, v in snapshots.items():
        real = v["influence"].get("main", {}).get("real", {})
        cells = [
            _ci(real.get(comp, {}).get(t)) for comp in ("direct", "precached", "shared") for t in ("useful", "useless")
        ]
        held = [k for k, t in v["tests"].items() if t.get("holds")]
        rows.append(
            [c, _ci(v["eval"]["legal_acc"]), *cells, f"{len(held)}/{len(v['tests'])}: " + ("; ".join(held) or "none")]
        )
    return rows


SNAPSHOT_HEADER = [
    "checkpoint c",
    "legal-move acc. at c",
    "direct useful",
    "direct useless",
    "pre-cached useful",
    "pre-cached useless",
    "shared useful",
    "shared useless",
    "paper's pattern (tests that hold)",
]


def _ci(c: dict[str, Any] | None) -> str:
    return fmt_ci(c, fmt=_f)


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``)."""
    from ..report import Report

    rep = Report(f"OthelloGPT gradient pathways over seeds ({summary['scale']['name']} scale)")
    sc = summary["scale"]
    rep.text(
        f"{sc['summary']}: {sc['model']}; {sc['training']}; eval {sc['eval']}; attribution: "
        f"{sc['attribution']}. Deviations: {', '.join(sc['deviations']) or 'none'}."
    )
    q = summary["quality"]
    rep.section("Model quality")
    rep.text(
        f"legal-move top-1 accuracy {_ci(q['legal_acc'])} (untrained {_ci(q['initial_legal_acc'])}); "
        f"eval loss {_ci(q['eval_loss'])}; training seconds per seed {_ci(q['train_seconds'])}."
    )
    rep.table(
        ["layer", "probe r (trained)", "untrained null", "useless cells", "useful cells"],
        [
            [
                k,
                _ci(v["pearson"]["trained"]),
                _ci(v["pearson"]["initial"]),
                _ci(v["pearson_type1"]["trained"]),
                _ci(v["pearson_type2"]["trained"]),
            ]
            for k, v in q["probes"].items()
        ],
        caption="16 central cells at the attributed positions; Fisher-z intervals over seeds",
    )
    for frac, v in summary["by_fraction"].items():
        rep.section(f"Integrated influence, first {float(frac):.0%} of the attributed updates")
        infl = v["influence"]
        rows = []
        for part in ("main", "last_layer"):
            for c in COMPONENTS:
                real = infl.get(part, {}).get("real", {}).get(c, {})
                rnd = infl.get(part, {}).get("random", {}).get(c, {})
                rows.append(
                    [
                        part,
                        c,
                        _ci(real.get("useful")),
                        _ci(real.get("useless")),
                        _ci(rnd.get("useful")),
                        _ci(rnd.get("useless")),
                    ]
                )
        rep.table(
            ["sites", "component", "useful", "useless", "random dir., useful", "random dir., useless"],
            rows,
            caption="mean over items per seed, then Student-t over seeds; main: layers k < L; "
            "last_layer: k = L (pre-cached ≡ 0)",
        )
        rep.table(
            ["hypothesis", "mean diff", "p (t)", "p (Holm)", "p (Wilcoxon)", "power", "holds"],
            [
                [
                    k,
                    _f(t["mean_diff"]),
                    _f(t["p_t"], 2),
                    _f(t.get("p_holm"), 2),
                    _f(t["p_wilcoxon"], 2),
                    _f(t["power"], 2),
                    t.get("holds", (t["p_t"] or 1) < ALPHA),
                ]
                for k, t in {**v["tests"], **v["null_tests"]}.items()
            ],
            caption="one-sided tests over seeds (the paper's pattern, Holm over its family; then the nulls)",
        )
    if summary.get("snapshots"):
        rep.section("How the pathways feed the features as the model learns (snapshots)")
        rep.text(sc.get("snapshots", ""))
        rep.table(
            SNAPSHOT_HEADER,
            _snapshot_rows(summary["snapshots"]),
            caption="influence per update (SGD variant), mean over items (layers k < L) per seed, Student-t "
            "over seeds; tests as above, Holm within each snapshot",
        )
    return rep.write(out)


# ----------------------------------------------------------------------------------------------------
# docs: the results-page section and the verdict

PAPER_MIDPOINTS = {
    ("direct", "useful"): 7.61,
    ("direct", "useless"): -0.97,
    ("precached", "useful"): -0.66,
    ("precached", "useless"): 1.80,
    ("shared", "useful"): 8.64,
    ("shared", "useless"): 6.42,
}
PLAYS = 0.95  # legal-move accuracy below which the model has not learned the game


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown of one Othello results file for ``docs/results.md``."""
    from .render import _header

    q = rec["quality"]
    out = [
        f"### {rec['name']} (`results/{key}.json`)",
        "",
        *_header(rec),
        f"- attribution: {rec['scale']['attribution']}",
        f"- sign: {rec.get('sign', '')}",
        f"- pooling: {rec.get('pooling', '')}",
        "",
        f"Model quality: legal-move top-1 accuracy {_ci(q['legal_acc'])} (untrained {_ci(q['initial_legal_acc'])}; "
        f"the analysis needs ≥ {PLAYS}), eval loss {_ci(q['eval_loss'])}, training {_ci(q['train_seconds'])} s "
        "per seed.",
        "",
        "| layer | probe r, trained | untrained-model null | useless cells | useful cells |",
        "|---|---|---|---|---|",
    ]
    for k, v in q["probes"].items():
        out.append(
            f"| {k} | {_ci(v['pearson']['trained'])} | {_ci(v['pearson']['initial'])} | "
            f"{_ci(v['pearson_type1']['trained'])} | {_ci(v['pearson_type2']['trained'])} |"
        )
    infl = rec["numbers"]["influence"]
    out += [
        "",
        "Integrated influence (mean over items per seed, Student-t over seeds; layers k < L; k = L apart):",
        "",
        "| component | useful (ours) | useless (ours) | random dir., useful | random dir., useless | "
        "k = L useful | k = L useless | paper useful / useless |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in COMPONENTS:
        real = infl.get("main", {}).get("real", {}).get(c, {})
        rnd = infl.get("main", {}).get("random", {}).get(c, {})
        last = infl.get("last_layer", {}).get("real", {}).get(c, {})
        paper = (
            f"{PAPER_MIDPOINTS[(c, 'useful')]} / {PAPER_MIDPOINTS[(c, 'useless')]}"
            if (c, "useful") in PAPER_MIDPOINTS
            else "—"
        )
        out.append(
            f"| {c} | {_ci(real.get('useful'))} | {_ci(real.get('useless'))} | {_ci(rnd.get('useful'))} | "
            f"{_ci(rnd.get('useless'))} | {_ci(last.get('useful'))} | {_ci(last.get('useless'))} | {paper} |"
        )
    out += [
        "",
        "The paper's pattern as one-sided tests over seeds (Holm over the family), and the random-direction null:",
        "",
        "| hypothesis | mean | p (t) | p (Holm) | p (Wilcoxon) | power | detectable d_z | holds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, t in {**rec["tests"]["hypotheses"], **rec["tests"]["null"]}.items():
        out.append(
            f"| {k} | {_f(t['mean_diff'])} | {_f(t['p_t'], 2)} | {_f(t.get('p_holm'), 2)} | "
            f"{_f(t['p_wilcoxon'], 2)} | {_f(t['power'], 2)} | {_f(t['detectable_dz'], 2)} | "
            f"{'yes' if t.get('holds') else 'no'} |"
        )
    out += [
        "",
        "How the pattern builds up (hypotheses that hold, by fraction of the attributed updates): "
        + "; ".join(
            f"{float(f):.0%}: {sum(1 for t in ts.values() if t['holds'])}/{len(ts)}"
            for f, ts in rec["tests"]["by_fraction"].items()
        ),
        "",
    ]
    snaps = rec["numbers"].get("snapshots")
    if snaps:
        merged = {c: {**v, "tests": rec["tests"]["snapshots"][c]} for c, v in snaps.items()}
        out += [
            f"Snapshots across training — {rec['scale'].get('snapshots', '')}; influence per update, mean over "
            "items (k < L) per seed, Student-t over seeds; tests Holm within each snapshot:",
            "",
            "| " + " | ".join(SNAPSHOT_HEADER) + " |",
            "|" + "---|" * len(SNAPSHOT_HEADER),
        ]
        out += ["| " + " | ".join(r) + " |" for r in _snapshot_rows(merged)]
        out.append("")
    return out


def judge(rec: dict[str, Any]) -> Any:
    """Reproduced: every hypothesis holds and the models play (legal-move accuracy ≥ 0.95); partial: some
    hold, or all hold on models that do not play; not reproduced: none."""
    from .claims import Verdict

    tests = rec["tests"]["hypotheses"]
    held = [k for k, t in tests.items() if t["holds"]]
    acc = rec["quality"]["legal_acc"]["mean"]
    infl = rec["numbers"]["influence"].get("main", {}).get("real", {})
    ours = (
        f"direct {_ci(infl.get('direct', {}).get('useful'))} / {_ci(infl.get('direct', {}).get('useless'))}, "
        f"pre-cached {_ci(infl.get('precached', {}).get('useful'))} / "
        f"{_ci(infl.get('precached', {}).get('useless'))}, shared {_ci(infl.get('shared', {}).get('useful'))} / "
        f"{_ci(infl.get('shared', {}).get('useless'))} (useful / useless); {len(held)}/{len(tests)} tests hold; "
        f"legal-move accuracy {_f(acc)}"
    )
    scale = f"{rec['scale']['model']}; {rec['scale']['attribution']}; {len(rec['seeds'])} seeds; deviations: " + (
        ", ".join(rec["scale"]["deviations"]) or "none"
    )
    if not held:
        return Verdict("not reproduced", ours, scale)
    if len(held) < len(tests) or acc is None or acc < PLAYS:
        return Verdict(
            "partial",
            ours + ("" if acc is not None and acc >= PLAYS else f"; the models do not play (accuracy < {PLAYS})"),
            scale,
        )
    return Verdict("reproduced", ours, scale)
