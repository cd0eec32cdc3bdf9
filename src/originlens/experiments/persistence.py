"""Do the weights stay at their leading terms far beyond the theorem's window? (arXiv 2601.19208 §5.1,
Table 1 and Fig. 4), tested over data seeds with nulls.

``run_persistence(PersistenceConfig(scale="cpu"), OUT)`` builds one word-level corpus (the paper's
tokeniser) and, for every learning rate η and seed, trains the one-hot attention model of Def. 3.1 from
zero init with plain SGD (``OUT/lr-<η>/seed-<s>``, resumable), its targets computed from the run's own
first shuffled batch (the paper's protocol), and records at **every** step the cosine of each learned
matrix with its leading term (W^(l) vs Q̄, V^(l) vs Φ̄ᵀB̄ᵀ, W_O vs B̄; min over layers per type) and with
two nulls computed the same way from

* **permuted tokens**: the same windows with the tokens shuffled inside each window — unigram and
  bag-of-context statistics kept, order destroyed (how much of the agreement is word frequency);
* a **disjoint batch**: the next ``batch`` windows of the same permutation — a weak null, expected
  high (SGD trains on those windows too): how specific the agreement is to the target sample.

It reports, per η and weight type, over seeds (Fisher-z intervals; cosines live in [−1, 1]):

* the minimum cosine over the paper's logging points (every 2 paper epochs = 64 steps, the paper's
  32 steps per epoch) and over **all** steps where the weight is non-zero;
* the cosine at the paper's epoch 30 and at the end (epoch 100 = step 3,200 in the paper's units);
* the horizon: the first step (and t = sη) at which the cosine drops below 0.99 / 0.9 / 0.7;
* the leading term against each null, paired by seed (one-sided t-test on Fisher z);
* the loss at the start and end, and the end's relative slope (is the loss at its plateau?);
* t = sη, the theorem's window s_max and how many windows the run covers; wall time per run.

Writes ``OUT/experiment.json``, ``OUT/report.html`` and ``results/leading-terms/persistence-<scale>.json``.

Scales (:data:`SCALES`; ``paper-bpe`` / ``cpu-bpe`` are Table 2's BPE protocol: a corpus-trained BPE
tokenizer, each story's first T + 1 tokens, η = 0.005, 500 steps, logging every 5): ``paper`` (|V| = 3,000, T = 200, first window of stories of ≥ 201 in-vocabulary
tokens, 65,536 windows, batch 2,048, 3,200 steps: a GPU job), ``cpu`` (|V| = 500, T = 32, every story
packed into windows with an end-of-text token and out-of-vocabulary words as ``<unk>`` — the data root's
TinyStories subset has too few long in-vocabulary stories for the paper's filter — batch 512, 3,200
steps: the residual stream of this model is |V|-dimensional, so a step costs ≈ 75 |V|³ + O(B T |V|²)
operations and |V| = 1,000, T = 64 at batch 2,048 takes ≈ 3.5 s per step on two cores, three hours a
run), ``ci`` (a generated story corpus, seconds; a plumbing check, not a result).
Caveat: zero init and plain SGD make a run a deterministic function of the data order, so a seed is a
data-order seed (``data_seed`` = 42 + seed; 42 is the paper's) and its first batch, which sets the targets.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from ..progress import log
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from . import inference
from .formatting import ci as fmt_ci
from .formatting import sig as _f
from .records import commits_of, read_unit_record, record_path, write_unit_record
from .results import default_results_path, write_results

EXPERIMENT = "leading-terms"
KINDS = ("W", "V", "W_O")
THRESHOLDS = (0.99, 0.9, 0.7)
NULLS = ("permuted", "disjoint")
PAPER_STEPS_PER_EPOCH = 32
PAPER = {
    "min_cos_small_lr": {"W": 0.999496, "V": 0.999169, "W_O": 0.998486},
    "epoch30_min": 0.9,
    "epoch100_min": 0.7,
    "t_small_lr": 16.0,
    "bpe": {"min_cos": {"W": 0.999914, "V": 0.998800, "W_O": 0.997891}, "t": 2.5},
}
SCALES: dict[str, dict[str, Any]] = {
    "paper": dict(
        vocab_size=3000,
        seq_len=200,
        windows="first",
        oov="drop",
        max_windows=65536,
        layers=3,
        batch_size=2048,
        steps=3200,
        log_every=64,
        corpus="tinystories",
        tokenizer="words",
        lrs=[0.005, 0.05],
    ),
    "cpu": dict(
        vocab_size=500,
        seq_len=32,
        windows="pack",
        oov="unk",
        max_windows=None,
        layers=3,
        batch_size=512,
        steps=3200,
        log_every=64,
        corpus="tinystories",
        tokenizer="words",
        lrs=[0.005, 0.05],
    ),
    # Table 2: BPE (HF tokenizers, specials <unk> <pad> <s> </s>, each text wrapped in <s> … </s>), the
    # first T + 1 tokens of each story, 10 epochs capped at 50 steps, logging every 0.1 epoch, η = 0.005
    "paper-bpe": dict(
        vocab_size=10000,
        seq_len=200,
        windows="first",
        oov="drop",
        max_windows=102400,
        layers=3,
        batch_size=2048,
        steps=500,
        log_every=5,
        corpus="tinystories",
        tokenizer="bpe",
        lrs=[0.005],
    ),
    "cpu-bpe": dict(
        vocab_size=500,
        seq_len=32,
        windows="first",
        oov="drop",
        max_windows=None,
        layers=3,
        batch_size=512,
        steps=500,
        log_every=5,
        corpus="tinystories",
        tokenizer="bpe",
        lrs=[0.005],
    ),
    "ci": dict(
        vocab_size=80,
        seq_len=16,
        windows="pack",
        oov="unk",
        max_windows=None,
        layers=2,
        batch_size=32,
        steps=24,
        log_every=4,
        corpus="storyworld",
        tokenizer="words",
        lrs=[0.005, 0.05],
    ),
}
SUMMARIES = {
    "paper": "the paper's configuration (Table 1, Fig. 4)",
    "cpu": "a CPU-sized corpus (Table 1, Fig. 4)",
    "paper-bpe": "the paper's BPE configuration (Table 2)",
    "cpu-bpe": "a CPU-sized BPE corpus (Table 2's protocol)",
    "ci": "a plumbing check, not a result",
}
PAPER_OF = {"paper": "paper", "cpu": "paper", "ci": "paper", "paper-bpe": "paper-bpe", "cpu-bpe": "paper-bpe"}
ALPHA = 0.05


@dataclass
class PersistenceConfig:
    """Learning rates × seeds at one scale; ``overrides`` replace scale fields (recorded as deviations)."""

    scale: str = "cpu"
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    lrs: list[float] | None = None  # default: the scale's
    overrides: dict[str, Any] = field(default_factory=dict)
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r}", f"use one of: {', '.join(SCALES)}")
        allowed = set(SCALES["paper"]) - {"lrs"}
        bad = set(self.overrides) - allowed
        if bad:
            raise ConfigError(f"unknown override(s) {sorted(bad)}", f"use: {', '.join(sorted(allowed))} (and lrs=)")
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds)
        ):
            raise ConfigError(f"seeds must be distinct non-negative integers, got {self.seeds!r}", "e.g. --seeds 0-2")
        if self.lrs is None:
            self.lrs = list(SCALES[self.scale]["lrs"])
        if not self.lrs or any(not (isinstance(x, (int, float)) and x > 0 and math.isfinite(x)) for x in self.lrs):
            raise ConfigError(f"learning rates must be positive numbers, got {self.lrs!r}", "e.g. --lrs 0.005,0.05")
        s = self.settings
        for key in ("steps", "log_every", "batch_size", "layers", "vocab_size", "seq_len"):
            v = s[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{key}={v!r} must be an integer ≥ 1", f"pass a positive {key}")
        if s["tokenizer"] not in ("words", "bpe"):
            raise ConfigError(f"tokenizer {s['tokenizer']!r} unknown", "use words or bpe")
        if s["corpus"] not in ("tinystories", "storyworld"):
            raise ConfigError(f"corpus {s['corpus']!r} unknown", "use tinystories or storyworld")

    @property
    def settings(self) -> dict[str, Any]:
        return {**SCALES[self.scale], **self.overrides}

    @property
    def name(self) -> str:
        return f"persistence-{self.scale}"

    @property
    def logging_points(self) -> list[int]:
        s = self.settings
        return sorted({*range(s["log_every"], s["steps"] + 1, s["log_every"]), s["steps"]})

    @property
    def epoch30_step(self) -> int:
        """The paper's epoch 30 in steps (32 steps per paper epoch), capped at the run's length."""
        return min(30 * PAPER_STEPS_PER_EPOCH, self.settings["steps"])

    @property
    def paper_scale(self) -> str:
        """The paper's protocol this scale stands for: ``paper`` (Table 1, Fig. 4) or ``paper-bpe`` (Table 2)."""
        return PAPER_OF[self.scale]

    def deviations(self) -> list[str]:
        paper, used = SCALES[self.paper_scale], self.settings
        out = [
            f"{k} {used[k]} (paper {paper[k]})"
            for k in (
                "vocab_size",
                "seq_len",
                "windows",
                "oov",
                "max_windows",
                "layers",
                "batch_size",
                "steps",
                "log_every",
                "corpus",
                "tokenizer",
            )
            if used[k] != paper[k]
        ]
        if len(self.seeds) != 1:
            out.append(f"{len(self.seeds)} data-order seeds (paper 1, seed 42)")
        return out

    def train_config(self, lr: float, seed: int, out: Path) -> Any:
        from ..train.assoc import AssocTrainConfig

        s = self.settings
        return AssocTrainConfig(
            n_layers=s["layers"],
            lr=float(lr),
            steps=s["steps"],
            batch_size=s["batch_size"],
            init="zero",
            dtype="float32",
            data_seed=42 + int(seed),
            checkpoint_every=s["log_every"],
            keep_checkpoints=2,
            log_every=1,
            stats_source="first_batch",
            out=str(out),
        )


# ----------------------------------------------------------------------------------------------------
# corpus and nulls


def build_experiment_corpus(config: PersistenceConfig, out: Path) -> Any:
    """The scale's corpus under ``OUT/corpus`` (reused when it exists with the same settings)."""
    return corpus_for(config.settings, out / "corpus")


def corpus_for(s: dict[str, Any], d: Path) -> Any:
    """A word-level corpus in directory ``d`` from settings ``s`` (``vocab_size``, ``seq_len``, ``windows``,
    ``oov``, ``max_windows``, ``corpus`` = tinystories | storyworld), reused when ``d`` holds one built
    with the same settings (``d.json`` beside it)."""
    from ..data import TokenStore, build_corpus
    from ..paths import data_root, tinystories_files

    want = {k: s.get(k) for k in ("vocab_size", "seq_len", "windows", "oov", "max_windows", "corpus")}
    want["tokenizer"] = s.get("tokenizer", "words")
    marker = d.with_name(d.name + ".json")
    if d.is_dir() and marker.is_file() and read_json(marker) == want:
        return TokenStore.open(d)
    if s["corpus"] == "tinystories":
        files = tinystories_files()
        if not files:
            raise InputError(
                f"no TinyStories files under {data_root() / 'tinystories'}",
                "set ORIGINLENS_DATA to the directory holding tinystories/",
            )
        sources: Any = files
        extra: dict[str, Any] = {}
    else:
        sources, extra = None, {"storyworld_stories": 400, "seed": 0}
    d.parent.mkdir(parents=True, exist_ok=True)
    store = build_corpus(
        sources,
        d,
        tokenizer=want["tokenizer"],
        vocab_size=s["vocab_size"],
        seq_len=s["seq_len"],
        windows=s["windows"],
        oov=s["oov"],
        max_windows=s.get("max_windows"),
        overwrite=True,
        **extra,
    )
    atomic_write_json(marker, want)
    return store


def permuted_windows(tokens: np.ndarray, seed: int) -> np.ndarray:
    """Each window's tokens shuffled (numpy ``default_rng(seed)``): unigram counts per window kept."""
    rng = np.random.default_rng(seed)
    out = np.array(tokens, copy=True)
    for row in out:
        rng.shuffle(row)
    return out


def null_statistics(tokens: np.ndarray, vocab_size: int, batch: int, data_seed: int) -> dict[str, Any]:
    """Statistics of the permuted-token and disjoint-batch nulls for a run with ``data_seed``."""
    import torch

    from ..stats import corpus_statistics

    n = tokens.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(data_seed))).numpy()
    first = tokens[perm[:batch]]
    out = {"permuted": corpus_statistics(permuted_windows(first, data_seed), vocab_size, dtype=np.float64)}
    rest = perm[batch : 2 * batch]
    if len(rest):
        out["disjoint"] = corpus_statistics(tokens[rest], vocab_size, dtype=np.float64)
    return out


# ----------------------------------------------------------------------------------------------------
# the per-step cosines


def _unit_targets(stats: Any) -> dict[str, np.ndarray]:
    from ..theory.leading_terms import leading_terms

    out = {}
    for k, M in leading_terms(stats).items():
        if k in KINDS:
            v = np.asarray(M, dtype=np.float64).ravel()
            nv = float(np.linalg.norm(v))
            out[k] = v / nv if nv > 0 else v * np.nan
    return out


class StepCosines:
    """Trainer callback: at every step, the min over layers per weight type of the cosine with the leading
    terms (``lt``, the trainer's own statistics) and with each null, logged as ``{"event": "cosines"}``
    records of ``RUN/metrics.jsonl`` (truncated with the other records on resume)."""

    def __init__(self, nulls: dict[str, Any]) -> None:
        self.nulls = nulls
        self.targets: dict[str, dict[str, np.ndarray]] | None = None
        self.last: dict[str, Any] | None = None  # the latest record (read by other callbacks)

    def _cosines(self, weights: dict[str, Any]) -> dict[str, dict[str, float | None]]:
        assert self.targets is not None
        out: dict[str, dict[str, float | None]] = {}
        flat = {}
        for name, w in weights.items():
            kind = name.split(".")[0]
            if kind in KINDS:
                v = w.detach().cpu().numpy().astype(np.float64).ravel()
                nv = float(np.linalg.norm(v))
                flat.setdefault(kind, []).append(v / nv if nv > 0 else None)
        for which, tg in self.targets.items():
            rec: dict[str, float | None] = {}
            for kind, vs in flat.items():
                cs = [float(np.dot(v, tg[kind])) for v in vs if v is not None]
                rec[kind] = min(cs) if cs and all(math.isfinite(c) for c in cs) and len(cs) == len(vs) else None
            out[which] = rec
        return out

    def on_step_end(self, trainer: Any) -> None:
        if trainer.run_dir is None or trainer.stats is None:
            return
        if self.targets is None:
            self.targets = {"lt": _unit_targets(trainer.stats), **{k: _unit_targets(v) for k, v in self.nulls.items()}}
        self.last = {"event": "cosines", "step": int(trainer.step), **self._cosines(trainer.model.weights())}
        trainer.run_dir.log_metrics(self.last)


# ----------------------------------------------------------------------------------------------------
# per run


def horizon(series: list[tuple[int, float | None]], threshold: float) -> int | None:
    """First step whose cosine is defined and below ``threshold`` (None: never)."""
    for s, c in series:
        if c is not None and c < threshold:
            return s
    return None


def sustained_horizon(series: list[tuple[int, float | None]], threshold: float) -> int | None:
    """First step from which every later defined cosine stays below ``threshold`` (None: the last defined
    one is not below it).  Unlike :func:`horizon`, a transient dip that recovers does not count."""
    out = None
    for s, c in series:
        if c is None:
            continue
        if c < threshold:
            out = s if out is None else out
        else:
            out = None
    return out


def run_summary(run_dir: Path, config: PersistenceConfig, lr: float) -> dict[str, Any]:
    """Everything one run contributes, read back from its metrics."""
    import json

    from ..theory.leading_terms import validity_window

    recs = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    cos = {int(r["step"]): r for r in recs if r.get("event") == "cosines"}
    losses = {int(r["step"]): float(r["loss"]) for r in recs if r.get("event") == "step"}
    s = config.settings
    steps = s["steps"]
    if len(cos) != steps:
        raise InputError(f"{run_dir} has cosines for {len(cos)} of {steps} steps", "rerun the experiment (it resumes)")
    points = config.logging_points
    out: dict[str, Any] = {"lr": lr, "steps": steps, "t": steps * lr}
    for which in ("lt", *NULLS):
        per: dict[str, Any] = {}
        for k in KINDS:
            series = [(st, cos[st].get(which, {}).get(k)) for st in sorted(cos)]
            defined = [c for _, c in series if c is not None]
            logged = [cos[p].get(which, {}).get(k) for p in points]
            logged = [c for c in logged if c is not None]
            per[k] = {
                "min_logged": min(logged) if logged else None,
                "min_all": min(defined) if defined else None,
                "argmin_all": min(((c, st) for st, c in series if c is not None), default=(None, None))[1],
                "epoch30": cos[config.epoch30_step].get(which, {}).get(k),
                "final": cos[steps].get(which, {}).get(k),
            }
            if which == "lt":
                per[k]["horizon"] = {f"{th:g}": horizon(series, th) for th in THRESHOLDS}
                per[k]["first_defined"] = next((st for st, c in series if c is not None), None)
        out[which] = per
    out["curve"] = {
        "steps": points,
        **{k: [cos[p]["lt"].get(k) for p in points] for k in KINDS},
        "loss": [losses.get(p) for p in points],
    }
    first, last = losses.get(1), losses.get(steps)
    tail = [losses[st] for st in sorted(losses) if st > 0.9 * steps]
    out["loss"] = {
        "first": first,
        "final": last,
        "tail_rel_slope": (tail[0] - tail[-1]) / tail[0] if len(tail) > 1 and tail[0] else None,
    }
    w = validity_window(s["seq_len"], s["layers"], lr, s["vocab_size"])
    out["window_s_max"] = float(w.s_max)
    out["windows_covered"] = steps / float(w.s_max) if w.s_max > 0 else None
    env = read_json(run_dir / "environment.json") if (run_dir / "environment.json").is_file() else {}
    out["data_hashes"] = env.get("data_hashes", {})
    return out


def _train_one(config: PersistenceConfig, store: Any, lr: float, seed: int, out: Path) -> tuple[float, int, bool]:
    """Train (or resume, or find finished) one run; returns (wall seconds, steps trained by this call,
    whether it started from scratch)."""
    from ..train.assoc import AssocTrainer

    tokens = np.asarray(store.tokens, dtype=np.int64)
    V = int(store.vocab_size)
    cfg = config.train_config(lr, seed, out)
    nulls = null_statistics(tokens, V, min(cfg.batch_size, tokens.shape[0]), cfg.data_seed)
    t = time.time()
    r = AssocTrainer(tokens, V, cfg, [StepCosines(nulls)], vocab=list(store.vocab)).run(resume=True)
    return time.time() - t, len(r.losses), r.resumed_from is None


def run_dir_of(out: Path, lr: float, seed: int) -> Path:
    return out / f"lr-{lr:g}" / f"seed-{seed}"


# ----------------------------------------------------------------------------------------------------
# across seeds


def _corr(vals: list[Any], confidence: float) -> dict[str, Any]:
    return inference.correlation_ci([v for v in vals if v is not None], confidence)


def across_seeds(runs: dict[float, dict[int, dict[str, Any]]], config: PersistenceConfig) -> dict[str, Any]:
    """Per η and weight type: Fisher-z intervals over seeds, the horizons, the nulls and their tests."""
    out: dict[str, Any] = {}
    conf = config.confidence
    for lr, by_seed in runs.items():
        seeds = sorted(by_seed)
        rec: dict[str, Any] = {
            "t": by_seed[seeds[0]]["t"],
            "steps": by_seed[seeds[0]]["steps"],
            "windows_covered": by_seed[seeds[0]]["windows_covered"],
        }
        for k in KINDS:
            g = lambda which, key: [by_seed[s][which][k][key] for s in seeds]  # noqa: B023 (used in this iteration)
            kr: dict[str, Any] = {m: _corr(g("lt", m), conf) for m in ("min_logged", "min_all", "epoch30", "final")}
            kr["horizon"] = {
                th: inference.mean_ci([by_seed[s]["lt"][k]["horizon"][th] for s in seeds], conf)
                for th in (f"{x:g}" for x in THRESHOLDS)
            }
            kr["horizon_never"] = {
                th: sum(by_seed[s]["lt"][k]["horizon"][th] is None for s in seeds)
                for th in (f"{x:g}" for x in THRESHOLDS)
            }
            kr["nulls"] = {}
            for null in NULLS:
                if any(by_seed[s].get(null, {}).get(k, {}).get("final") is None for s in seeds):
                    continue
                kr["nulls"][null] = {
                    "final": _corr(g(null, "final"), conf),
                    "min_logged": _corr(g(null, "min_logged"), conf),
                    "test_final": inference.paired_test(
                        g("lt", "final"), g(null, "final"), alternative="greater", alpha=ALPHA
                    ),
                }
            rec[k] = kr
        rec["loss"] = {
            m: inference.mean_ci([by_seed[s]["loss"][m] for s in seeds], conf)
            for m in ("first", "final", "tail_rel_slope")
        }
        rec["seconds"] = inference.mean_ci([by_seed[s]["seconds"] for s in seeds], conf)
        out[f"{lr:g}"] = rec
    return out


def unit_name(lr: float, seed: int) -> str:
    """The record name of one (η, seed) run: ``lr-0.005-seed-0``."""
    return f"lr-{lr:g}-seed-{int(seed)}"


def config_key(config: PersistenceConfig) -> dict[str, Any]:
    """What must agree between unit records for them to be combined (no seed list, no η list)."""
    exp = {k: v for k, v in to_jsonable(config).items() if k not in ("seeds", "lrs")}
    return {"experiment": exp, "settings": to_jsonable(config.settings)}


MIN_SEEDS = 3  # a combined results file at the default path needs at least this many seeds


def run_persistence(
    config: PersistenceConfig,
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
    from_records: bool = False,
) -> dict[str, Any]:
    """Build the corpus, train every (η, seed) (resuming what exists), aggregate over seeds, write the
    experiment record, the report and the results file; returns the record.

    Every (η, seed) run also writes a unit record beside the results file (``results/leading-terms/
    persistence-<scale>/lr-<η>-seed-<s>.json``, :mod:`originlens.experiments.records`); ``from_records=True``
    trains nothing and combines the records (runs of about an hour each need not share one process).  With
    fewer than :data:`MIN_SEEDS` seeds and no explicit ``results`` path only the records are written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
    command = command or f"python: run_persistence({config!r}, {str(out)!r})"
    commits: dict[str, Any] = {}
    with exclusive(out):
        runs: dict[float, dict[int, dict[str, Any]]] = {}
        corpus: dict[str, Any] = {}
        if from_records:
            for lr in config.lrs:
                for seed in config.seeds:
                    unit = unit_name(lr, seed)
                    rec = read_unit_record(
                        record_path(res_path, unit), experiment=EXPERIMENT, unit=unit, config_key=config_key(config)
                    )
                    values = dict(rec["values"])
                    corpus.setdefault("sha", values.get("corpus_manifest_sha256"))
                    corpus.setdefault("windows", values.get("corpus_windows"))
                    corpus.setdefault("vocab_size", values.get("corpus_vocab_size"))
                    if values.get("corpus_manifest_sha256") != corpus["sha"]:
                        raise InputError(
                            f"{record_path(res_path, unit)} was trained on another corpus than the other records",
                            "combine only runs of one corpus build, or rerun that unit",
                        )
                    runs.setdefault(lr, {})[seed] = values
                    commits[unit] = commits_of(rec)
        else:
            store = build_experiment_corpus(config, out)
            corpus = {
                "sha": _sha(out / "corpus" / "manifest.json"),
                "windows": read_json(out / "corpus" / "manifest.json").get("counts", {}).get("windows"),
                "vocab_size": int(store.vocab_size),
            }
            for lr in config.lrs:
                for seed in config.seeds:
                    d = run_dir_of(out, lr, seed)
                    log(f"[persistence] η = {lr:g}, seed {seed}: training {config.settings['steps']} steps ...")
                    secs, trained, fresh = _train_one(config, store, lr, seed, d)
                    rec = run_summary(d, config, lr)
                    timing = out / "timing.json"  # training wall time per run, summed over (re)starts
                    times = read_json(timing) if timing.is_file() else {}
                    key = f"{lr:g}/{seed}"
                    if trained:
                        times[key] = secs if fresh else times.get(key, 0.0) + secs
                        atomic_write_json(timing, times)
                    rec["seconds"] = times.get(key)
                    rec["corpus_manifest_sha256"] = corpus["sha"]
                    rec["corpus_windows"] = corpus["windows"]
                    rec["corpus_vocab_size"] = corpus["vocab_size"]
                    runs.setdefault(lr, {})[seed] = rec
                    unit = unit_name(lr, seed)
                    path = write_unit_record(
                        record_path(res_path, unit),
                        experiment=EXPERIMENT,
                        name=config.name,
                        unit=unit,
                        config_key=config_key(config),
                        values=rec,
                        command=command,
                        run_dir=d,
                    )
                    commits[unit] = commits_of(read_json(path))
        s = config.settings
        summary = {
            "scale": {
                "name": config.scale,
                "summary": SUMMARIES[config.scale],
                "model": f"one-hot attention-only, L = {s['layers']}, |V| = {corpus['vocab_size']}, "
                f"T = {s['seq_len']}, zero init",
                "training": f"plain SGD, batch {s['batch_size']}, {s['steps']} steps, η ∈ "
                f"{', '.join(f'{x:g}' for x in config.lrs)} (t = sη up to "
                f"{max(config.lrs) * s['steps']:g})",
                "corpus": f"{s['corpus']}: {corpus['windows']} windows ({s['windows']}, out-of-vocabulary: {s['oov']})",
                "logging": f"cosines at every step; the paper's logging points every {s['log_every']} "
                "steps ("
                + ("0.1 paper epoch of 50 steps" if config.paper_scale == "paper-bpe" else "2 paper epochs of 32 steps")
                + ")",
                "deviations": config.deviations(),
            },
            "by_lr": across_seeds(runs, config),
            "runs": {f"{lr:g}": {str(sd): r for sd, r in by.items()} for lr, by in runs.items()},
        }
        atomic_write_json(out / "experiment.json", to_jsonable(summary))
        write_report(summary, out)
        if results is None and len(config.seeds) < MIN_SEEDS:
            log(
                f"[persistence] {len(config.seeds)} seed(s) < {MIN_SEEDS}: the unit records are written "
                f"({record_path(res_path, 'x').parent}), the combined results file is not; combine ≥ {MIN_SEEDS} "
                "seeds with --from-records"
            )
            summary["results_file"] = None
            return summary
        write_results(
            res_path,
            experiment=EXPERIMENT,
            name=config.name,
            command=command,
            config={"experiment": to_jsonable(config), "settings": s},
            seeds=config.seeds,
            scale=summary["scale"],
            numbers={"by_lr": summary["by_lr"]},
            quality={f"{lr}": v["loss"] for lr, v in summary["by_lr"].items()},
            tests={
                f"{lr}/{k}/{null}": v[k]["nulls"][null]["test_final"]
                for lr, v in summary["by_lr"].items()
                for k in KINDS
                for null in v[k]["nulls"]
            },
            data_hashes={
                "corpus_manifest_sha256": corpus["sha"],
                **{f"{lr}/{sd}": r["data_hashes"] for lr, by in summary["runs"].items() for sd, r in by.items()},
            },
            runs=[
                {
                    "lr": float(lr),
                    "seed": int(sd),
                    "commits": commits.get(unit_name(float(lr), int(sd))),
                    **{k: r[k] for k in ("lt", *NULLS, "loss", "seconds", "t", "windows_covered", "curve") if k in r},
                }
                for lr, by in summary["runs"].items()
                for sd, r in by.items()
            ],
            extra={
                "paper": PAPER,
                "protocol": config.paper_scale,
                "paper_t": PAPER["bpe"]["t"] if config.paper_scale == "paper-bpe" else PAPER["t_small_lr"],
            },
        )
        summary["results_file"] = str(res_path)
    return summary


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


# ----------------------------------------------------------------------------------------------------
# report, docs section, verdict


def _ci(c: dict[str, Any] | None, d: int = 4) -> str:
    return fmt_ci(c, d=d)


def _rows(by_lr: dict[str, Any]) -> list[list[str]]:
    rows = []
    for lr, v in by_lr.items():
        for k in KINDS:
            kr = v[k]
            hz = ", ".join(f"{th}: {_horizon_text(kr, th, float(lr))}" for th in (f"{x:g}" for x in THRESHOLDS))
            nulls = "; ".join(
                f"{n} {_ci(x['final'])} (p {_f(x['test_final']['p_t'], 2)})" for n, x in kr["nulls"].items()
            )
            rows.append(
                [
                    lr,
                    f"{v['steps']} (t = {v['t']:g}, {_f(v['windows_covered'])} windows)",
                    k,
                    _ci(kr["min_logged"]),
                    _ci(kr["min_all"]),
                    _ci(kr["epoch30"]),
                    _ci(kr["final"]),
                    hz,
                    nulls or "—",
                ]
            )
    return rows


def _horizon_text(kr: dict[str, Any], th: str, lr: float) -> str:
    h = kr["horizon"][th]
    never = kr["horizon_never"][th]
    if h["n"] == 0:
        return "never"
    txt = f"step {_f(h['mean'])} (t = {_f(h['mean'] * lr)})"
    return txt + (f", never in {never} seed(s)" if never else "")


HEADER = [
    "η",
    "steps",
    "weight",
    "min cos, logging points",
    "min cos, all steps",
    "cos at paper epoch 30 (step ≤ 960)",
    "cos at the end",
    "horizon (first step below)",
    "nulls at the end (p: leading term > null)",
]


def figure(rec: dict[str, Any], plt: Any) -> Any:
    """Cosine with the leading term vs t = sη at the logging points, one panel per η, one line per weight
    type (mean over seeds, band: min–max over seeds) — the analogue of the paper's Fig. 4.  ``rec``: a
    results record or the experiment summary (both carry ``runs`` with their ``curve``)."""
    runs = (
        rec["runs"]
        if isinstance(rec["runs"], list)
        else [{"lr": float(lr), **r} for lr, by in rec["runs"].items() for r in by.values()]
    )
    lrs = sorted({float(r["lr"]) for r in runs})
    fig, axes = plt.subplots(1, len(lrs), figsize=(4.2 * len(lrs), 3.2), squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        rs = [r for r in runs if float(r["lr"]) == lr and r.get("curve")]
        if not rs:
            continue
        t = np.asarray(rs[0]["curve"]["steps"], dtype=float) * lr
        for k, colour in zip(KINDS, ("tab:red", "tab:blue", "tab:green")):
            ys = np.array([[np.nan if v is None else v for v in r["curve"][k]] for r in rs], dtype=float)
            ax.plot(t, np.nanmean(ys, axis=0), color=colour, label=k)
            ax.fill_between(t, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), color=colour, alpha=0.2)
        ax.set_xlabel("t = sη")
        ax.set_ylabel("cosine with the leading term")
        ax.set_title(f"η = {lr:g}")
        lo = float(np.nanmin([v for r in rs for k in KINDS for v in r["curve"][k] if v is not None] or [0.0]))
        if lo > 0.9:  # all close to 1: zoom in, the detail is the story
            ax.set_ylim(lo - 0.5 * (1 - lo), 1 + 0.1 * (1 - lo))
        else:
            ax.set_ylim(min(0.0, lo), 1.01)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def write_report(summary: dict[str, Any], out: str | Path) -> Path:
    """``OUT/report.html`` (+ ``report.md``)."""
    from ..report import Report

    sc = summary["scale"]
    rep = Report(f"Leading terms beyond the theorem's window ({sc['name']} scale)")
    rep.text(
        f"{sc['summary']}: {sc['model']}; {sc['training']}; corpus {sc['corpus']}; {sc['logging']}. "
        f"Deviations: {', '.join(sc['deviations']) or 'none'}."
    )
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = figure(summary, plt)
    rep.figure(
        fig, "cosine with the leading term at the logging points (mean over seeds; band: min–max)", name="cosines.png"
    )
    plt.close(fig)
    rep.table(HEADER, _rows(summary["by_lr"]), caption="Fisher-z intervals over seeds; min over layers per type")
    rep.table(
        ["η", "loss at step 1", "loss at the end", "relative drop over the last 10 %", "seconds per run"],
        [
            [
                lr,
                _ci(v["loss"]["first"]),
                _ci(v["loss"]["final"]),
                _ci(v["loss"]["tail_rel_slope"]),
                _ci(v["seconds"], 0),
            ]
            for lr, v in summary["by_lr"].items()
        ],
        caption="Student-t over seeds",
    )
    return rep.write(out)


def render_section(key: str, rec: dict[str, Any]) -> list[str]:
    """Markdown of one persistence results file for ``docs/results.md``."""
    from .render import _header

    by = rec["numbers"]["by_lr"]
    out = [
        f"### {rec['name']} (`results/{key}.json`)",
        "",
        *_header(rec),
        f"- corpus: {rec['scale']['corpus']}",
        f"- logging: {rec['scale']['logging']}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    out += ["| " + " | ".join(r) + " |" for r in _rows(by)]
    out += [
        "",
        "| η | loss at step 1 | loss at the end | relative drop over the last 10 % | seconds per run |",
        "|---|---|---|---|---|",
    ]
    out += [
        f"| {lr} | {_ci(v['loss']['first'])} | {_ci(v['loss']['final'])} | {_ci(v['loss']['tail_rel_slope'])} | "
        f"{_ci(v['seconds'], 0)} |"
        for lr, v in by.items()
    ]
    if rec.get("protocol") == "paper-bpe":
        b = PAPER["bpe"]["min_cos"]
        out += [
            "",
            f"Paper, Table 2 (BPE, |V| = 10,000, T = 200, η = 0.005, 500 steps, t = 2.5): min cosine W {b['W']}, "
            f"V {b['V']}, W_O {b['W_O']}.",
            "",
        ]
    else:
        out += [
            "",
            f"Paper (|V| = 3,000, T = 200): min cosine over 100 epochs at η = 0.005: W "
            f"{PAPER['min_cos_small_lr']['W']}, V {PAPER['min_cos_small_lr']['V']}, W_O "
            f"{PAPER['min_cos_small_lr']['W_O']}; at η = 0.05 every cosine ≥ 0.9 at epoch 30 and > 0.7 at epoch 100.",
            "",
        ]
    return out


def judge(rec: dict[str, Any]) -> Any:
    """Reproduced: at the small η every type's minimum over the logging points has its lower bound ≥ 0.99
    and the run covers the paper's t (16 for Table 1, 2.5 for Table 2's BPE); at the large η every type is ≥ 0.9 at epoch 30 and > 0.7 at the end (lower
    bounds); and the leading term beats the permuted-token null for every type (p < 0.05).  Partial: some
    of these hold.  Not reproduced: none."""
    from .claims import Verdict

    by = rec["numbers"]["by_lr"]
    lrs = sorted(by, key=float)
    small, large = by[lrs[0]], by[lrs[-1]]
    checks = {}
    paper_t = float(rec.get("paper_t", PAPER["t_small_lr"]))
    checks[f"small η: min cos ≥ 0.99, t ≥ {paper_t:g}"] = small["t"] >= paper_t and all(
        (small[k]["min_logged"].get("low") or -1) >= 0.99 for k in KINDS
    )
    if len(lrs) > 1:
        checks["large η: ≥ 0.9 at epoch 30"] = all((large[k]["epoch30"].get("low") or -1) >= 0.9 for k in KINDS)
        checks["large η: > 0.7 at the end"] = all((large[k]["final"].get("low") or -1) > 0.7 for k in KINDS)
    checks["beats the permuted-token null"] = all(
        (v[k]["nulls"].get("permuted", {}).get("test_final", {}).get("p_t") or 1) < ALPHA
        for v in by.values()
        for k in KINDS
    )
    held = [c for c, ok in checks.items() if ok]
    ours = (
        f"η = {lrs[0]} (t = {small['t']:g}): min cos over logging points W {_ci(small['W']['min_logged'])}, "
        f"V {_ci(small['V']['min_logged'])}, W_O {_ci(small['W_O']['min_logged'])}"
    )
    if len(lrs) > 1:
        ours += (
            f"; η = {lrs[-1]} (t = {large['t']:g}): epoch 30 min over types "
            f"{_f(min(large[k]['epoch30']['mean'] for k in KINDS))}, end "
            f"{_f(min(large[k]['final']['mean'] for k in KINDS))}"
        )
    ours += f"; {len(held)}/{len(checks)} checks hold"
    scale = f"{rec['scale']['model']}; {rec['scale']['training']}; {len(rec['seeds'])} seeds; deviations: " + (
        ", ".join(rec["scale"]["deviations"]) or "none"
    )
    verdict = "reproduced" if len(held) == len(checks) else "partial" if held else "not reproduced"
    return Verdict(verdict, ours, scale)
