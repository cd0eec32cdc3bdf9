"""How long do the weights stay at their leading terms, as a function of |V| and T? (beyond arXiv
2601.19208: its theorem bounds the window by T and L only, its experiments show agreement far past it).

Hypothesis under test: the weights leave their leading terms when the logits stop being small; with
max |B̄| shrinking like 1/|V| the horizon should grow with |V| (and with T through Φ̄).  The null is no
dependence (exponents 0).

``run_horizon(HorizonConfig(scale="cpu"), OUT)`` builds one word-level corpus per (|V|, T) and, for every
cell and seed, trains the one-hot attention model of Def. 3.1 from zero init with plain SGD at one
learning rate (``OUT/V<|V|>-T<T>/seed-<s>``), recording every step's cosine with the leading terms (the
same callback as :mod:`originlens.experiments.persistence`); a run stops once every weight type is
below the lowest threshold, or at ``max_steps``.  The horizon of a weight type at threshold θ is the first
step s (reported as t = sη) at which its minimum-over-layers cosine drops below θ; a run that never
drops is *censored* at ``max_steps`` and left out of the fit (their count is reported).  The *sustained*
horizon is the first step from which the cosine stays below θ to the end of the run: with targets from
the first batch (the paper's protocol), small batches make the cosine dip below 0.99 for a few steps at
the start (the second batch's statistics differ from the first's) and recover; the first-drop horizon
then measures that sampling transient, the sustained one the departure.

Fit per (type, θ): ordinary least squares of ln t_θ on [1, ln |V|, ln T] over the uncensored runs,
exponents with Student-t intervals, R², and the same fit per seed with the exponents' Student-t interval
over seeds (seeds are the unit of replication: the verdict uses this one), and the prediction at the paper's
|V| = 3,000, T = 200 with its 95 % prediction interval — an extrapolation, next to what the paper
observed there (η = 0.05: every cosine ≥ 0.9 at epoch 30 = t 48 and > 0.7 at epoch 100 = t 160, i.e.
lower bounds on its horizons).

Writes ``OUT/experiment.json``, ``OUT/report.html`` (with the horizon plot) and
``results/leading-terms/horizon-<scale>.json``.

:mod:`.horizon_analysis` holds the fit and the per-cell summaries, :mod:`.horizon_report` the report, the
``docs/results.md`` section and the verdict; their public names are importable from here as well.
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
from .horizon_analysis import PAPER_POINT, summarise
from .horizon_config import EXPERIMENT, HorizonConfig
from .horizon_report import write_report
from .persistence_cosines import KINDS, THRESHOLDS, StepCosines, corpus_for, horizon, null_statistics, sustained_horizon
from .records import commits_of, read_unit_record, record_path, write_unit_record
from .results import default_results_path, write_results


class StopBelow:
    """Trainer callback: stop once every weight type's leading-term cosine is below ``threshold`` (read from
    the :class:`StepCosines` callback's last record)."""

    def __init__(self, cosines: StepCosines, threshold: float) -> None:
        self.cosines, self.threshold = cosines, threshold
        self.stopped_at: int | None = None

    def on_step_end(self, trainer: Any) -> None:
        last = self.cosines.last
        if last and all(last["lt"].get(k) is not None and last["lt"][k] < self.threshold for k in KINDS):
            self.stopped_at = int(trainer.step)
            trainer.request_stop()


def _run_cell(config: HorizonConfig, V: int, T: int, seed: int, out: Path) -> dict[str, Any]:
    """Train one (|V|, T, seed) run until it drops below every threshold (or ``max_steps``), unless its
    ``done.json`` says it is finished; returns that record."""
    from ..theory.leading_terms import statistic_of
    from ..train.assoc import AssocTrainer

    d = out / f"V{V}-T{T}" / f"seed-{seed}"
    done = d / "done.json"
    if done.is_file():
        rec = read_json(done)
        if "sustained" not in rec:  # a run finished before the sustained horizon was recorded
            rec["sustained"] = _sustained(_series(d))
            atomic_write_json(done, rec)
        return rec
    s = config.settings
    store = corpus_for({**s, "vocab_size": V, "seq_len": T, "max_windows": None}, out / "corpora" / f"V{V}-T{T}")
    tokens = np.asarray(store.tokens, dtype=np.int64)
    Vs = int(store.vocab_size)
    cfg = config.train_config(seed, d)
    cos = StepCosines(null_statistics(tokens, Vs, min(cfg.batch_size, tokens.shape[0]), cfg.data_seed))
    stop = StopBelow(cos, min(THRESHOLDS))
    t0 = time.time()
    r = AssocTrainer(tokens, Vs, cfg, [cos, stop], vocab=list(store.vocab)).run(resume=True)
    timing = d / "seconds.json"  # training wall time summed over (re)starts
    secs = time.time() - t0 + (read_json(timing)["seconds"] if timing.is_file() else 0.0)
    atomic_write_json(timing, {"seconds": secs})
    series = _series(d)
    steps_run = int(r.step)
    rec = {
        "vocab_size": Vs,
        "seq_len": T,
        "seed": seed,
        "lr": float(s["lr"]),
        "steps_run": steps_run,
        "stopped_below_all": stop.stopped_at is not None or steps_run < s["max_steps"],
        "seconds": secs,
        "horizon": {k: {f"{th:g}": horizon(series[k], th) for th in THRESHOLDS} for k in KINDS},
        "sustained": _sustained(series),
        "max_abs_bigram": float(np.abs(statistic_of(r.stats, "bigram")).max()) if r.stats is not None else None,
        "data_hashes": read_json(d / "environment.json").get("data_hashes", {}),
    }
    atomic_write_json(done, rec)
    return rec


def _series(d: Path) -> dict[str, list[tuple[int, float | None]]]:
    """Per weight type, the (step, leading-term cosine) records of the run directory ``d``."""
    import json

    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]
    return {k: [(int(q["step"]), q["lt"][k]) for q in recs if q.get("event") == "cosines"] for k in KINDS}


def _sustained(series: dict[str, list[tuple[int, float | None]]]) -> dict[str, dict[str, int | None]]:
    return {k: {f"{th:g}": sustained_horizon(series[k], th) for th in THRESHOLDS} for k in KINDS}


def unit_name(V: int, T: int, seed: int) -> str:
    """The record name of one grid cell and seed: ``V100-T16-seed-0``."""
    return f"V{int(V)}-T{int(T)}-seed-{int(seed)}"


def config_key(config: HorizonConfig) -> dict[str, Any]:
    """What must agree between unit records for them to be combined: everything but the seed list and the
    grid itself (a unit's name carries its |V| and T), so a grid can be filled a few cells at a time."""
    exp = {k: v for k, v in to_jsonable(config).items() if k not in ("seeds", "overrides")}
    settings = {k: v for k, v in to_jsonable(config.settings).items() if k not in ("vocab_sizes", "seq_lens")}
    return {"experiment": exp, "settings": settings}


def run_horizon(
    config: HorizonConfig,
    out: str | Path,
    *,
    results: str | Path | None = None,
    command: str | None = None,
    from_records: bool = False,
) -> dict[str, Any]:
    """Train every (|V|, T, seed) run (finished runs are kept), fit, write the experiment record, the report
    and the results file; returns the record.

    Every run also writes a unit record beside the results file (``results/leading-terms/horizon-<scale>/
    V<|V|>-T<T>-seed-<s>.json``); ``from_records=True`` trains nothing and fits the grid from the records, so
    the cells can be run a few at a time (``--vocab-sizes``/``--seq-lens``/``--seeds`` subsets).  With fewer
    than 3 seeds and no explicit ``results`` path only the records are written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    s = config.settings
    res_path = Path(results) if results is not None else default_results_path(EXPERIMENT, config.name)
    command = command or f"python: run_horizon({config!r}, {str(out)!r})"
    with exclusive(out):
        runs = []
        commits: dict[str, Any] = {}
        for V, T in config.cells:
            for seed in config.seeds:
                unit = unit_name(V, T, seed)
                path = record_path(res_path, unit)
                if from_records:
                    rec = read_unit_record(path, experiment=EXPERIMENT, unit=unit, config_key=config_key(config))
                    vals = rec["values"]
                    if "sustained" not in vals:  # a record written before the sustained horizon existed
                        d = out / f"V{V}-T{T}" / f"seed-{seed}"
                        if not (d / "metrics.jsonl").is_file():
                            raise InputError(
                                f"the record {path} has no sustained horizon and its run {d} is not here",
                                "pass the --out directory the runs were trained in",
                            )
                        vals["sustained"] = _sustained(_series(d))
                    runs.append(vals)
                    commits[unit] = commits_of(rec)
                    continue
                log(f"[horizon] |V| = {V}, T = {T}, seed {seed} ...")
                rec = {**_run_cell(config, V, T, seed, out), "requested_vocab": V}
                write_unit_record(
                    path,
                    experiment=EXPERIMENT,
                    name=config.name,
                    unit=unit,
                    config_key=config_key(config),
                    values=rec,
                    command=command,
                )
                runs.append(rec)
                commits[unit] = commits_of(read_json(path))
        summary = {
            "scale": {
                "name": config.scale,
                "summary": {"cpu": "a CPU-sized grid", "ci": "a plumbing check, not a result"}[config.scale],
                "model": f"one-hot attention-only, L = {s['layers']}, zero init",
                "training": f"plain SGD, η = {s['lr']:g}, batch {s['batch_size']}, until every cosine is "
                f"below {min(THRESHOLDS)} or {s['max_steps']} steps",
                "grid": f"|V| ∈ {s['vocab_sizes']}, T ∈ {s['seq_lens']}, {len(config.seeds)} seeds "
                f"({s['corpus']}, windows {s['windows']}, out-of-vocabulary {s['oov']})",
                "deviations": [
                    f"{len(config.seeds)} data-order seeds per cell",
                    "beyond the paper: the paper has one (|V|, T) per tokenizer",
                ],
            },
            **summarise(config, runs),
            "runs": runs,
        }
        atomic_write_json(out / "experiment.json", to_jsonable(summary))
        write_report(summary, out)
        if results is None and len(config.seeds) < 3:
            log(
                f"[horizon] {len(config.seeds)} seed(s) < 3: the unit records are written "
                f"({record_path(res_path, 'x').parent}), the combined results file is not; combine with --from-records"
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
            numbers={"cells": summary["cells"], "fits": summary["fits"], "fits_sustained": summary["fits_sustained"]},
            tests={
                f"{k}/{th}/{c}": v["coef"][c]
                for k, ths in summary["fits"].items()
                for th, v in ths.items()
                if v.get("coef")
                for c in v["coef"]
                if c != "intercept"
            },
            data_hashes={f"V{r['requested_vocab']}-T{r['seq_len']}/{r['seed']}": r["data_hashes"] for r in runs},
            runs=[
                {
                    **{k: v for k, v in r.items() if k != "data_hashes"},
                    "commits": commits.get(unit_name(r["requested_vocab"], r["seq_len"], r["seed"])),
                }
                for r in runs
            ],
            extra={"paper_point": PAPER_POINT},
        )
        summary["results_file"] = str(res_path)
    return summary
