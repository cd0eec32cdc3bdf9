"""A look-ahead run (arXiv 2603.14087 §9): one affine map per offset k, trained so that the unembedding
of the mapped residual at t predicts token t + k; the alignment of the SAE's encoder columns with the
top-r right singular subspace of each map; and, given a Q(w) run, the Spearman correlation of alignment
with Q (``originlens lm lookahead``; :func:`originlens.lm.steering.lookahead` does the work).

``run_lookahead(LookaheadRunConfig(ModelSource(M), SAE_DIR, CorpusSource(C), qscore=Q_RUN), OUT)``
writes ``OUT/config.json``, ``environment.json``, ``metrics.jsonl`` (training history of every map),
``results.json`` and ``report.html``.  :func:`read_q` reads the per-feature Q of a Q(w) run's
``results.json`` (the error-preserving ablation where both were run).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from .lm_inputs import (
    CorpusSource,
    ModelSource,
    load_corpus,
    load_model_and_codec,
    load_sae_at,
    open_lm_run,
    select_features,
)

Q_AGGREGATES = ("q", "q_ratio_of_means", "q_median")


@dataclass
class LookaheadRunConfig:
    """Model, SAE, corpus, the maps' training settings, and optionally a Q(w) run to correlate with."""

    model: ModelSource
    sae: str
    corpus: CorpusSource
    max_offset: int = 5
    epochs: int = 10
    lr: float = 1e-4
    batch_size: int = 32
    max_positions: int | None = None
    seed: int = 0
    features: list[int] | None = None  # None: the features of ``qscore``, else all
    qscore: str | None = None  # results.json (or run directory) of a Q(w) run
    q_aggregate: str = "q_median"

    def __post_init__(self) -> None:
        if self.q_aggregate not in Q_AGGREGATES:
            raise ConfigError(f"unknown Q aggregate {self.q_aggregate!r}", f"use one of: {', '.join(Q_AGGREGATES)}")


@dataclass
class LookaheadRun:
    path: Path
    result: Any  # originlens.lm.steering.LookaheadResult
    report: Path


def read_q(path: str | Path, aggregate: str = "q_median") -> dict[int, float]:
    """feature → Q (``aggregate``) of the kept features of a Q(w) run's ``results.json`` (or its directory)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise InputError(f"{p} does not exist", "pass the results.json (or run directory) of `lm qscore`")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
        abl = data["ablations"]
        res = abl.get("error_preserving") or next(iter(abl.values()))
        return {int(f["feature"]): float(f[aggregate]) for f in res["features"] if f["kept"]}
    except (json.JSONDecodeError, KeyError, StopIteration, TypeError, ValueError) as exc:
        raise InputError(
            f"{p} is not a results.json of `lm qscore` ({exc})", "pass the qscore run's results.json"
        ) from None


def run_lookahead(cfg: LookaheadRunConfig, out: str | Path, *, overwrite: bool = False) -> LookaheadRun:
    """Train the maps, measure the alignment, write the run directory (see the module docstring)."""
    from ..distributed import single_process

    single_process("lm lookahead")
    from ..lm.steering import LookaheadConfig, lookahead
    from ..storage import atomic_write_json

    run = open_lm_run(out, overwrite)
    adapter, codec = load_model_and_codec(cfg.model)
    sae, k = load_sae_at(cfg.sae, adapter, cfg.model.device)
    tokens, corpus_desc = load_corpus(cfg.corpus, adapter, codec)
    q = read_q(cfg.qscore, cfg.q_aggregate) if cfg.qscore else None
    feats = select_features(cfg.features, sae) if cfg.features is not None else (sorted(q) if q else None)
    la = LookaheadConfig(
        max_offset=cfg.max_offset,
        lr=cfg.lr,
        epochs=cfg.epochs,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        max_positions=cfg.max_positions,
        prepend_bos=cfg.corpus.prepend_bos,
    )
    info = {
        "model": cfg.model.model,
        "sae": str(cfg.sae),
        "hook_name": sae.cfg.hook_name,
        "site": f"resid.{k} (the SAE's own site)",
        "corpus": corpus_desc,
        "qscore": cfg.qscore,
        "q_aggregate": cfg.q_aggregate,
        **la.__dict__,
    }
    run.write_config(info)
    run.write_environment(seeds={"lookahead": cfg.seed})
    res = lookahead(adapter, sae, tokens, la, features=feats, q=q)
    for m in res.maps:
        for h in m.history:
            run.log_metrics(h)
    atomic_write_json(run.file("results.json"), {"info": info, **res.to_json()})
    html = _report(run, cfg, info, res, int(adapter.d_model))
    return LookaheadRun(path=run.path, result=res, report=Path(html))


def _report(run: Any, cfg: LookaheadRunConfig, info: dict[str, Any], res: Any, d: int) -> Any:
    from ..report.html import Report, setup_matplotlib

    plt = setup_matplotlib()
    rep = Report("Look-ahead maps and SAE encoder alignment")
    rep.section("Settings")
    rep.table(["setting", "value"], [[kk, v] for kk, v in info.items()])
    rep.section("Maps")
    rep.table(
        ["offset k", "val CE (map)", "val CE (identity)", "val accuracy"],
        [[m.offset, m.val_loss, m.val_loss_identity, m.val_acc] for m in res.maps],
        caption="cross entropy of predicting token t+k from the mapped residual at t (held-out 20%)",
    )
    r = np.arange(1, d + 1)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for off, al in res.alignment.items():
        ax.plot(r, al.mean(0), label=f"k = {off}")
    ax.plot(r, np.sqrt(r / d), "k:", label="random direction √(r/d)")
    ax.set_xlabel("rank r")
    ax.set_ylabel("mean cos(e_f, P_r e_f)")
    ax.legend(fontsize=7)
    rep.figure(
        fig,
        "Alignment of SAE encoder columns with the top-r right singular subspace of each look-ahead "
        "map, mean over features, against the random-direction baseline.",
        name="alignment.png",
    )
    if res.correlation:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for off, rows in res.correlation.items():
            ax.plot([x["rank"] for x in rows], [x["rho"] for x in rows], label=f"k = {off}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xlabel("rank r")
        ax.set_ylabel("Spearman ρ(alignment, Q)")
        ax.legend(fontsize=7)
        rep.figure(
            fig,
            f"Spearman correlation between encoder alignment at rank r and Q ({cfg.q_aggregate}) "
            "over the kept features of the Q run.",
            name="correlation.png",
        )
        best = []
        for off, rows in res.correlation.items():
            finite = [x for x in rows if math.isfinite(x["rho"])]
            if finite:
                b = max(finite, key=lambda x: abs(x["rho"]))
                best.append([off, b["rank"], b["rho"], b["p"]])
        rep.table(["offset k", "rank r (largest |ρ|)", "ρ", "p"], best, caption="uncorrected for the search over ranks")
    return rep.write(run.path)
