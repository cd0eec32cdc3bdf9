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

:mod:`.persistence_cosines` holds the corpus, the nulls, the per-step cosines and the horizons (shared with
:mod:`.horizon`), :mod:`.persistence_analysis` what a run contributes and the statistics over seeds, and
:mod:`.persistence_report` the report, the figure, the ``docs/results.md`` section and the verdict; their
public names are importable from here as well.

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

import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..progress import log
from ..runs import exclusive, to_jsonable
from ..storage import atomic_write_json, read_json
from .persistence_analysis import across_seeds, run_summary
from .persistence_config import EXPERIMENT, SUMMARIES, PersistenceConfig
from .persistence_cosines import KINDS, NULLS, StepCosines, corpus_for, null_statistics
from .persistence_report import PAPER, write_report
from .records import commits_of, read_unit_record, record_path, write_unit_record
from .results import default_results_path, write_results


def build_experiment_corpus(config: PersistenceConfig, out: Path) -> Any:
    """The scale's corpus under ``OUT/corpus`` (reused when it exists with the same settings)."""
    return corpus_for(config.settings, out / "corpus")


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
        assert config.lrs is not None  # set by PersistenceConfig.__post_init__
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
                    corpus.setdefault("identity", training_data_identity(values))
                    if training_data_identity(values) != corpus["identity"]:
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
        summary: dict[str, Any] = {
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


def training_data_identity(values: dict[str, Any]) -> Any:
    """What a unit record says it was trained on: the sha256 of its training windows (``data_hashes``), or,
    for a record without one, its corpus manifest's sha256. Corpus builds of the same data in different
    output directories have equal windows but manifests that differ in their build time."""
    tokens = (values.get("data_hashes") or {}).get("tokens")
    return ("tokens", tokens) if tokens else ("manifest", values.get("corpus_manifest_sha256"))
