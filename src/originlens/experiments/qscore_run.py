"""A Q(w) run (arXiv 2603.14087 §9): the pre-caching degree of an SAE's features on a language model,
written as a run directory with its results and report (``originlens lm qscore``).

``run_qscore(QScoreRunConfig(ModelSource(M), SAE_DIR, CorpusSource(C)), OUT)`` finds each feature's
top-activating contexts in the corpus, ablates the feature at the activating position and measures
KL_d = KL(P_clean ‖ P_ablated) at offsets d = 1..K (:func:`originlens.lm.qscore.qscore`), one pass per
ablation mode (``error_preserving``, ``faithful`` or ``both``, sharing the contexts). It writes
``OUT/config.json``, ``environment.json``, ``metrics.jsonl`` (one record per feature and mode),
``examples-<mode>.safetensors`` (the per-example table: feature, window, position, activation,
KL_1..KL_K, ratio), ``results.json`` (per-feature Q, summaries) and ``report.html``.  When no feature
can be scored in a mode, it raises :class:`~originlens.errors.InputError` before any results are
written (the per-feature records stay in ``metrics.jsonl``).

Scale: ``shard=(i, N)`` scores only the i-th of N contiguous blocks of the features (0-based;
:func:`originlens.distributed.shard_bounds`), a run directory per shard, and
:func:`merge_qscore_runs` combines the N shard directories into one run (``originlens lm qscore-merge``),
ordered as an unsharded run.  Under ``torchrun`` the features are sharded over the ranks automatically,
rank 0 gathers the parts and writes the one run directory (the others write nothing).  Each example's
KLs depend only on that example: sharded and unsharded runs agree to the round-off of different batch
compositions (tested).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, InputError
from .lm_inputs import (
    CorpusSource,
    ModelSource,
    decode_ids,
    load_corpus,
    load_model_and_codec,
    load_sae_at,
    model_dtype,
    open_lm_run,
    select_features,
)

ABLATIONS = ("error_preserving", "faithful", "both")


@dataclass
class QScoreRunConfig:
    """Model, SAE and corpus, and the protocol (:class:`originlens.lm.qscore.QScoreConfig`'s fields)."""

    model: ModelSource
    sae: str
    corpus: CorpusSource
    features: list[int] | None = None  # None: every feature of the SAE
    max_features: int | None = None  # only the first N of ``features``
    contexts: int = 8
    max_offset: int = 10
    ablation: str = "error_preserving"  # or "faithful" or "both"
    position_rule: str = "restrict"
    dedup_distance: int = 10
    min_total_kl: float = 0.05
    batch_size: int = 128
    shard: tuple[int, int] | None = None  # (i, N): the i-th of N contiguous feature blocks, 0-based

    def __post_init__(self) -> None:
        if self.ablation not in ABLATIONS:
            raise ConfigError(f"unknown ablation {self.ablation!r}", f"use one of: {', '.join(ABLATIONS)}")
        if self.shard is not None:
            i, n = (int(v) for v in self.shard)
            if n < 1 or not 0 <= i < n:
                raise ConfigError(f"shard {i}/{n} is not one of 0/{n} … {n - 1}/{n}", "pass --shard I/N with 0 ≤ I < N")
            self.shard = (i, n)

    @property
    def modes(self) -> list[str]:
        return ["error_preserving", "faithful"] if self.ablation == "both" else [self.ablation]


@dataclass
class QScoreRun:
    """What a Q(w) run produced: the results per ablation mode, the site, and the report."""

    path: Path
    results: dict[str, Any]  # mode -> originlens.lm.qscore.QScoreResult
    site: int
    report: Path | None  # None on the ranks > 0 of a torchrun run (rank 0 writes)


def _shard_of(feats: list[int], shard: tuple[int, int]) -> tuple[list[int], dict[str, Any]]:
    from ..distributed import shard_bounds

    i, n = shard
    if n > len(feats):
        raise ConfigError(f"{n} shards for {len(feats)} features", f"use at most {len(feats)} shards")
    a, b = shard_bounds(len(feats), i, n)
    return feats[a:b], {"index": i, "count": n, "features": [a, b], "n_features_total": len(feats)}


def run_qscore(cfg: QScoreRunConfig, out: str | Path, *, overwrite: bool = False) -> QScoreRun:
    """Score the features, write the run directory, return the results (see the module docstring)."""
    from .. import distributed
    from ..lm.qscore import qscore
    from ..lm.qscore_config import QScoreConfig, merge_results

    _, world = distributed.env_world()
    if world > 1:
        if cfg.shard is not None:
            raise ConfigError("--shard under torchrun", "under torchrun the ranks share the features: drop --shard")
        distributed.init()
    rank, world = distributed.world()
    run, failed = None, None
    if rank == 0:
        try:
            run = open_lm_run(out, overwrite)
        except Exception as exc:  # every rank stops, rank 0 with the reason
            failed = exc
    if distributed.any_rank(failed is not None):
        raise failed or ConfigError(f"rank 0 could not open {out}", "see rank 0's error")
    adapter, codec = load_model_and_codec(cfg.model)
    sae, k = load_sae_at(cfg.sae, adapter, cfg.model.device)
    tokens, corpus_desc = load_corpus(cfg.corpus, adapter, codec)
    feats = select_features(cfg.features, sae, cfg.max_features)
    shard = cfg.shard or ((rank, world) if world > 1 else None)
    shard_info = None
    if shard is not None:
        feats, shard_info = _shard_of(feats, shard)
    base: dict[str, Any] = dict(
        n_contexts=cfg.contexts,
        max_offset=cfg.max_offset,
        position_rule=cfg.position_rule,
        dedup_distance=cfg.dedup_distance,
        min_total_kl=cfg.min_total_kl,
        prepend_bos=cfg.corpus.prepend_bos,
        batch_size=cfg.batch_size,
    )
    info = {
        "model": cfg.model.model,
        "model_dtype": model_dtype(adapter),
        "sae": str(cfg.sae),
        "hook_name": sae.cfg.hook_name,
        "site": f"resid.{k}",
        "corpus": corpus_desc,
        "n_features": len(feats),
        "ablations": cfg.modes,
        **base,
    }
    if cfg.shard is not None:
        info["shard"] = shard_info
    results: dict[str, Any] = {}
    failed = None
    try:
        examples = None
        for mode in cfg.modes:
            res = qscore(adapter, sae, tokens, feats, QScoreConfig(ablation=mode, **base), examples=examples)
            examples = res.examples
            results[mode] = res
    except Exception as exc:
        failed = exc
    if distributed.any_rank(failed is not None):
        raise failed or InputError("another rank failed", "see that rank's error")
    if world > 1:  # rank 0 gathers the parts, in rank order = feature order
        parts = distributed.gather_to_rank_zero(results)
        if rank != 0 or parts is None:
            return QScoreRun(path=Path(out), results=results, site=k, report=None)
        results = {m: merge_results([p[m] for p in parts]) for m in cfg.modes}
        info["n_features"] = len(results[cfg.modes[0]].features)
        info["ranks"] = world
    assert run is not None
    return _write_run(run, cfg, info, results, k, adapter, codec, tokens, require_kept=cfg.shard is None)


def _write_run(
    run: Any, cfg: QScoreRunConfig, info: dict[str, Any], results: dict[str, Any], k: int, adapter: Any, codec: Any,
    tokens: Any, *, require_kept: bool = True,
) -> QScoreRun:  # fmt: skip
    """Records, examples files, results.json and the report of a finished run (``adapter`` None: a merge,
    whose report shows no context texts)."""
    from ..storage import atomic_write_json, save_tensors

    run.write_config(info)
    run.write_environment(seeds={})
    for mode, res in results.items():
        for f in res.features:
            run.log_metrics({"ablation": mode, **{kk: v for kk, v in f.__dict__.items() if kk != "kl_by_offset"}})
        if require_kept and not res.kept():  # a shard may hold no scorable feature; the merge checks
            s = res.summary()
            why = ", ".join(f"{r} {n}" for r, n in s["dropped"].items()) or "no reason recorded"
            raise InputError(
                f"none of the {len(res.features)} features could be scored ({mode} ablation; dropped: "
                f"{why}); no results or report were written (per-feature records: "
                f"{run.file('metrics.jsonl')})",
                "use a trained SAE of this model, more corpus text, other --features, or a lower --min-total-kl",
            )
    for mode, res in results.items():
        save_tensors(
            run.file(f"examples-{mode}.safetensors"),
            res.example_arrays(),
            kind="qscore-examples",
            metadata={"ablation": mode, "site": f"resid.{k}"},
        )
    atomic_write_json(
        run.file("results.json"),
        {
            "info": info,
            "ablations": {
                m: {**r.to_json(include_examples=False), "examples_file": f"examples-{m}.safetensors"}
                for m, r in results.items()
            },
        },
    )
    html = _report(run, cfg.max_offset, cfg.corpus.prepend_bos, info, results, adapter, codec, tokens)
    return QScoreRun(path=run.path, results=results, site=k, report=Path(html))


def merge_qscore_runs(shards: list[str | Path], out: str | Path, *, overwrite: bool = False) -> QScoreRun:
    """One Q(w) run from the N run directories of ``shard=(i, N)`` runs (every i once, the same model,
    SAE, corpus and settings): written to ``out`` as an unsharded run would be, its report without
    context texts (the merge loads no model); ``results.json`` lists the shard directories."""
    from ..lm.qscore_config import QScoreResult, merge_results
    from ..storage import load_tensors, read_json

    loaded = []
    for d in shards:
        d = Path(d)
        if not (d / "results.json").is_file():
            raise InputError(f"{d} holds no Q(w) results", "pass finished `lm qscore --shard I/N` run directories")
        r = read_json(d / "results.json")
        sh = r.get("info", {}).get("shard")
        if not sh:
            raise InputError(f"{d} is not a shard (it was run without --shard)", "pass the runs of --shard I/N")
        loaded.append((d, r, sh))
    n = loaded[0][2]["count"]
    idx = sorted(sh["index"] for _, _, sh in loaded)
    if any(sh["count"] != n for _, _, sh in loaded) or idx != list(range(n)):
        raise InputError(
            f"shards {idx} of {sorted({sh['count'] for _, _, sh in loaded})} given",
            f"pass every shard 0/{n} … {n - 1}/{n} exactly once",
        )
    loaded.sort(key=lambda t: t[2]["index"])
    strip = lambda info: {k: v for k, v in info.items() if k not in ("shard", "n_features")}
    if any(strip(r["info"]) != strip(loaded[0][1]["info"]) for _, r, _ in loaded):
        raise InputError("the shards differ in model, SAE, corpus or settings", "merge the shards of one run")
    info = {**strip(loaded[0][1]["info"]), "n_features": loaded[0][2]["n_features_total"]}
    info["merged_from"] = [str(d) for d, _, _ in loaded]
    results: dict[str, Any] = {}
    for mode in info["ablations"]:
        parts = []
        for d, r, _ in loaded:
            entry = r["ablations"][mode]
            arrays, _ = load_tensors(d / entry["examples_file"], kind="qscore-examples")
            parts.append(QScoreResult.from_saved(entry, arrays))
        results[mode] = merge_results(parts)
    cfg = QScoreRunConfig(
        model=ModelSource(model=str(info["model"])),
        sae=str(info["sae"]),
        corpus=CorpusSource(corpus="", prepend_bos=bool(info["prepend_bos"])),
        max_offset=int(info["max_offset"]),
    )
    run = open_lm_run(out, overwrite)
    return _write_run(run, cfg, info, results, results[info["ablations"][0]].site, None, None, None)


def _context_text(codec: Any, seqs: Any, ex: Any, e: int, first: int, K: int) -> str:
    i, p = int(ex.seq_index[e]), int(ex.position[e])
    row = seqs[i].tolist()
    return (
        decode_ids(codec, row[first:p])
        + " [["
        + decode_ids(codec, row[p : p + 1])
        + "]] "
        + decode_ids(codec, row[p + 1 : p + K + 1])
    )


def _report(
    run: Any, K: int, bos: bool, info: dict[str, Any], results: dict[str, Any], adapter: Any, codec: Any, tokens: Any
) -> Any:
    from ..report.html import Report, setup_matplotlib
    from ..sae.activations import as_sequences

    plt = setup_matplotlib()
    rep = Report("Q(w): pre-caching degree of SAE features")
    rep.section("Settings")
    rep.table(["setting", "value"], [[kk, v] for kk, v in info.items()])
    rep.text(
        "Q = Σ_{d≥2} KL_d / (KL_1 + 1e-8) per example, KL_d = KL(P_clean ‖ P_ablated) of the prediction "
        "d − 1 positions after the ablated one. Features whose mean Σ_d KL_d ≤ min_total_kl are dropped. "
        "error_preserving subtracts a_f·W_dec[f]; faithful replaces the activation by the SAE "
        "reconstruction without the latent (the reference; also removes the reconstruction error)."
    )
    seqs = as_sequences(tokens, adapter, prepend_bos=bos) if adapter is not None else None
    first = 1 if bos and adapter is not None and adapter.bos_id is not None else 0
    for mode, res in results.items():
        s = res.summary()
        rep.section(f"Summary ({mode})")
        rows = [["features", s["n_features"]], ["kept", s["n_kept"]], ["examples", s["n_examples"]]]
        rows += [[f"dropped: {r}", n] for r, n in s["dropped"].items()]
        for key in ("q", "q_ratio_of_means", "q_median"):
            rows += [
                [f"{key}: median", s[key]["median"]],
                [f"{key}: std ln", s[key]["std_log"]],
                [f"{key}: fraction < 0.1", s[key]["frac_below_0.1"]],
                [f"{key}: fraction > 10", s[key]["frac_above_10"]],
            ]
        rep.table(["quantity", "value"], rows)
        kept = sorted(res.kept(), key=lambda f: f.q)
        header = ["feature", "Q (mean ratio)", "ratio of means", "median", "total KL", "n", "top context"]

        def row(f: Any) -> list[Any]:
            sel = np.nonzero(res.examples.feature == f.feature)[0]  # noqa: B023 (called at once)
            if not sel.size or seqs is None:
                return [f.feature, f.q, f.q_ratio_of_means, f.q_median, f.total_kl, f.n_examples, ""]
            ctx = _context_text(codec, seqs, res.examples, int(sel[0]), first, K)  # noqa: B023
            return [f.feature, f.q, f.q_ratio_of_means, f.q_median, f.total_kl, f.n_examples, ctx[-160:]]

        rep.table(header, [row(f) for f in kept[::-1][:10]], caption="highest Q (most pre-caching)")
        rep.table(header, [row(f) for f in kept[:10]], caption="lowest Q (most immediate)")
    rep.section("Figures")
    _q_figures(rep, results, plt)
    return rep.write(run.path)


def _q_figures(report: Any, results: dict[str, Any], plt: Any) -> None:
    for mode, res in results.items():
        kept = res.kept()
        fig, axes = plt.subplots(1, 3, figsize=(11, 3))
        for ax, key, name in zip(
            axes, ("q", "q_ratio_of_means", "q_median"), ("mean of ratios (paper)", "ratio of means", "median ratio")
        ):
            v = np.array([getattr(f, key) for f in kept], dtype=float)
            v = v[np.isfinite(v) & (v > 0)]
            if v.size:
                lo, hi = np.log10(v.min()), np.log10(v.max())
                bins = np.logspace(lo - 0.1, hi + 0.1, max(5, min(40, v.size // 2 + 2)))
                ax.hist(v, bins=bins)
            ax.set_xscale("log")
            ax.set_xlabel("Pre-Caching Degree Q")
            ax.set_title(name)
        axes[0].set_ylabel("features")
        report.figure(
            fig,
            f"Histogram of Q over the {len(kept)} kept features ({mode} ablation), log x-axis; "
            "left: the paper's mean of per-example ratios, middle and right: robust aggregates.",
            name=f"q-hist-{mode}.png",
        )
        fig, ax = plt.subplots(figsize=(6, 3.5))
        if kept:
            K = len(kept[0].kl_by_offset)
            d = np.arange(1, K + 1)
            M = np.array([f.kl_by_offset for f in kept])
            ax.plot(d, np.median(M, 0), "k-", lw=2, label="median over features")
            ax.plot(d, M.mean(0), "k--", lw=1, label="mean over features")
            order = sorted(kept, key=lambda f: f.q_median)
            for f in order[:3] + order[-3:]:
                ax.plot(d, np.maximum(f.kl_by_offset, 1e-12), alpha=0.7, label=f"#{f.feature} (Q med {f.q_median:.2g})")
            ax.set_yscale("log")
            ax.legend(fontsize=6)
        ax.set_xlabel("offset d")
        ax.set_ylabel("KL(P_clean ‖ P_ablated)")
        report.figure(
            fig,
            f"Mean KL_d by offset d ({mode} ablation): median/mean over kept features and the "
            "three features with the lowest and highest median Q.",
            name=f"kl-by-offset-{mode}.png",
        )
    if len(results) == 2:
        a, b = results["error_preserving"], results["faithful"]
        qa = {f.feature: f.q_median for f in a.features if f.kept}
        pairs = [(qa[f.feature], f.q_median) for f in b.features if f.kept and f.feature in qa]
        pairs = [(x, y) for x, y in pairs if x > 0 and y > 0 and math.isfinite(x) and math.isfinite(y)]
        if pairs:
            fig, ax = plt.subplots(figsize=(4, 4))
            x, y = np.array(pairs).T
            ax.scatter(x, y, s=8)
            ax.set_xscale("log")
            ax.set_yscale("log")
            lim = [min(x.min(), y.min()), max(x.max(), y.max())]
            ax.plot(lim, lim, "k:", lw=1)
            ax.set_xlabel("median Q, error-preserving")
            ax.set_ylabel("median Q, faithful (reference)")
            report.figure(
                fig,
                "Median Q per feature under the two ablations; the faithful ablation also "
                "removes the SAE reconstruction error, a feature-independent change in every KL.",
                name="q-ablations.png",
            )
