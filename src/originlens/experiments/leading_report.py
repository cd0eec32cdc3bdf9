"""The report of a leading-term analysis: figures, tables and the written files
(arXiv 2601.19208 §5.1).

Renders the dict returned by :func:`originlens.experiments.leading_analysis.analyse_run`:
:func:`cosine_figure` (the paper's Figure 4: cosine with the leading term over training, a min–max band
over layers per weight type), :func:`extra_figure` (positional P vs Δ and norm ratios),
:func:`loss_figure` (training loss with ln |V|), and :func:`build_report` (a
:class:`~originlens.report.Report` with the run settings, the theorem's window, Table 1 and Table 3
analogues, the null baselines, the held-out losses and the top associations).  :func:`write_report`
writes ``report.html``, ``report.md``, ``figures/`` and ``report.json``.  Missing values (None in the
results) are shown as "—"; matplotlib is imported only when a report is built.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..theory.nulls import _kind
from ..theory.tracking import KIND_LABEL, TARGET_LABEL

# colours of the paper's Figure 4 (attention red, value blue, output green) + P
KIND_COLOR = {"W": "#D55E00", "V": "#0072B2", "W_O": "#009E73", "P": "#CC79A7"}


def _band(records: Sequence[Mapping[str, Any]], kind: str, field_: str = "cos") -> tuple[np.ndarray, np.ndarray]:
    lo, hi = [], []
    for r in records:
        vals = [v[field_] for n, v in r["theory"].items() if _kind(n) == kind and v.get(field_) is not None]
        vals = [v for v in vals if math.isfinite(v)]
        lo.append(min(vals) if vals else np.nan)
        hi.append(max(vals) if vals else np.nan)
    return np.asarray(lo, dtype=float), np.asarray(hi, dtype=float)


def cosine_figure(results: Mapping[str, Any], plt: Any):
    """Figure 4 of the paper: cosine over training, min–max band over layers per weight type."""
    recs = results["checkpoints"]
    sgd = results["run"]["optimizer"] == "sgd"
    x = np.array([r["epoch"] if sgd else r["step"] for r in recs], dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for kind in ("W", "V", "W_O"):
        lo, hi = _band(recs, kind)
        col = KIND_COLOR[kind]
        ax.fill_between(x, lo, hi, color=col, alpha=0.3, lw=0)
        ax.plot(x, lo, color=col, lw=1.2, label=f"{KIND_LABEL[kind]} vs {TARGET_LABEL[kind]}")
        ax.plot(x, hi, color=col, lw=0.8)
    lows = [v for kind in ("W", "V", "W_O") for v in _band(recs, kind)[0] if np.isfinite(v)]
    ax.set_ylim(min(0.0, min(lows, default=0.0) - 0.05), 1.02)  # 0–1 as in the paper unless a cosine is < 0
    ax.set_xlabel("epoch" if sgd else "step")
    ax.set_ylabel("cosine similarity")
    ax.legend(loc="lower left")
    return fig


def extra_figure(results: Mapping[str, Any], plt: Any):
    """Positional P vs Δ (cosine) and norm ratios ‖M‖/‖predicted‖ over training."""
    recs = results["checkpoints"]
    sgd = results["run"]["optimizer"] == "sgd"
    x = np.array([r["epoch"] if sgd else r["step"] for r in recs], dtype=float)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    lo, hi = _band(recs, "P")
    a1.fill_between(x, lo, hi, color=KIND_COLOR["P"], alpha=0.3, lw=0)
    a1.plot(x, lo, color=KIND_COLOR["P"], label="position P vs Δ (min over layers)")
    a1.set_ylim(-1.02, 1.02)
    a1.set_xlabel("epoch" if sgd else "step")
    a1.set_ylabel("cosine")
    a1.legend(loc="lower left")
    spread = []
    for kind in ("W", "V", "W_O", "P"):
        lo, hi = _band(recs, kind, "norm_ratio")
        a2.fill_between(x, lo, hi, color=KIND_COLOR[kind], alpha=0.3, lw=0)
        a2.plot(x, lo, color=KIND_COLOR[kind], label=KIND_LABEL[kind])
        spread += [v for v in np.concatenate([lo, hi]) if np.isfinite(v) and v > 0]
    a2.axhline(1.0, color="k", lw=0.6)
    if spread and max(spread) / min(spread) > 10:
        a2.set_yscale("log")
    a2.set_xlabel("epoch" if sgd else "step")
    a2.set_ylabel("‖M‖ / ‖scaled leading term‖")
    a2.legend(loc="best", fontsize=7)
    return fig


def loss_figure(results: Mapping[str, Any], plt: Any):
    lc = [r for r in results["loss_curve"] if r[2] is not None]
    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    if lc:
        sgd = results["run"]["optimizer"] == "sgd"
        ax.plot([r[1] if sgd else r[0] for r in lc], [r[2] for r in lc], color="#000000", lw=1)
        ax.set_xlabel("epoch" if sgd else "step")
    ax.axhline(math.log(results["run"]["vocab_size"]), color="#E69F00", lw=0.8, ls="--", label="ln |V| (uniform)")
    ax.set_ylabel("training loss (batch, before the step)")
    ax.legend(loc="best")
    return fig


def _f(v: Any, nd: int = 6) -> Any:
    return "—" if v is None else (round(v, nd) if isinstance(v, float) else v)


def _s(v: Any, fmt: str = ".6f") -> str:
    return "—" if v is None else format(v, fmt)


def build_report(results: Mapping[str, Any]):
    """A :class:`~originlens.report.Report` of :func:`analyse_run`'s results."""
    from ..report import Report, setup_matplotlib

    plt = setup_matplotlib()
    r = results["run"]
    rep = Report(f"Leading terms over training — {Path(r['path']).name}")
    rep.section("Run")
    rep.table(["setting", "value"], [[k, _f(v)] for k, v in r.items()])
    w = results["validity_window"]
    rep.text(
        f"Theorem window ({w['theorem']}): conditions {'hold' if w['holds'] else 'do NOT hold'} "
        f"({', '.join(f'{k}: {v}' for k, v in w['conditions'].items())}); guarantees cover s ≤ "
        f"{w['s_max']:.2f} steps at η = {r['lr']}. Coefficients use the checkpoint's step count s. "
        + r["theory_note"]
        + "."
    )
    for msg in results.get("warnings", []):
        rep.text("Warning: " + msg)
    rep.section("Cosine with the leading terms over training (paper Figure 4)")
    rep.figure(
        cosine_figure(results, plt),
        "Cosine of each learned matrix with its leading term; bands span "
        "the layers (attention W vs Q̄ red, value V vs Φ̄ᵀB̄ᵀ blue, output W_O vs B̄ green).",
        "cosines.png",
    )
    m = results["min_cosine_over_training"]
    mf = results.get("min_cosine_over_training_full_train")
    rows = [[KIND_LABEL[k], _s(m.get(k))] + ([_s(mf.get(k))] if mf else []) for k in ("W", "V", "W_O", "P")]
    rep.table(
        ["weight", f"min cosine, targets: {r['stats_source']}"]
        + (["min cosine, targets: all training windows"] if mf else []),
        rows,
        caption="Table 1 analogue: minimum over checkpoints and layers (paper, η = 0.005, 100 epochs, "
        "first-batch targets: W 0.999496, V 0.999169, W_O 0.998486).",
    )
    rep.figure(
        extra_figure(results, plt),
        "Left: positional bias P vs Δ. Right: norm of each weight over the "
        "norm of its scaled leading term (1 = the theorem's scale).",
        "position-and-norms.png",
    )
    rep.section("Loss")
    rep.figure(loss_figure(results, plt), "Training loss (batch loss before each step) with ln|V|.", "loss.png")
    fin = results["final"]
    rows = [
        [
            n,
            _s(v["cos"]),
            _s(v["norm_ratio"], ".4f"),
            _s(v["frob_err"], ".3e"),
            _s(v["rel_err"], ".4f"),
            _s(v["bound"], ".3e"),
        ]
        for n, v in fin["theory"].items()
    ]
    rep.section(f"Final weights (step {fin['step']})")
    rep.table(
        ["weight", "cosine", "norm ratio", "‖M − predicted‖", "relative error", "theorem bound"],
        rows,
        caption="predicted = theorem's scaled target (sη B̄, C(s,2)η² Φ̄ᵀB̄ᵀ, (3C(s,4)+2C(s,3))η⁴ Q̄ / Δ).",
    )
    b = results["baselines"]
    cols = ["leading_term", "leading_term_shared", "null_corpus", "same_corpus", "pmi", "random"]
    rep.section("Null baselines (final weights)")
    rep.table(
        [
            "weight",
            "leading term",
            "leading term (shared tokens)",
            "unrelated corpus (shared tokens)",
            "same corpus, disjoint windows",
            "raw PMI",
            "random Gaussian",
        ],
        [[n] + [_s(v.get(cn), ".4f") for cn in cols] for n, v in b["per_weight"].items()],
        caption="; ".join(b["notes"]) + ". PMI: W_O vs PMI(x_t, x_{t+1}); V vs PMI(prefix x_m, target "
        "x_{t+1}); W vs PMI(query x_t, key x_m).",
    )
    it = results.get("intervention")
    if it:
        rep.section("Causal intervention (paper Table 3)")
        rows = [["original", _s(it["original"]), "", "", ""]]
        rows += [
            [n, _s(v["loss"]), _s(v["delta"], "+.3e"), _s(v["coef"], ".4g"), _s(v["residual_cos"], ".1e")]
            for n, v in it["losses"].items()
        ]
        rep.table(
            ["weights", "loss", "Δ loss", "removed ⟨M,T⟩/‖T‖²", "cos(M', T) after"],
            rows,
            caption=f"Projection onto the leading term removed, one weight at a time; loss on {it['source']}. "
            "Paper (η = 0.05): original 5.349, W 5.350/5.352/5.361, V 6.192/6.526/6.520, W_O 8.287.",
        )
    h = results.get("heldout")
    if h:
        rep.section("Leading-term model (Eq. 12) vs baselines")
        rep.table(
            ["model", "mean cross-entropy"],
            [
                [k, _s(h[k])]
                for k in (
                    "trained",
                    "leading_term_eq12",
                    "leading_term_full",
                    "bigram_path",
                    "conditional_bigram",
                    "uniform",
                )
            ],
            caption=f"On {h['source']}; leading-term scalars at step {h['step']}. eq12: Eq. 12 as printed "
            "(one attention term); full: predicted weights in the L-layer model; bigram_path: c_O X B̄; "
            "conditional_bigram: add-1 p(b|a) fitted on the training windows.",
        )
    ex = results.get("examples") or {}
    if ex:
        rep.section("Top associations of example words")
        rows = [[wd, basis, ", ".join(t for t, _ in lst)] for wd, d in ex.items() for basis, lst in d.items()]
        rep.table(
            ["word", "matrix (row)", "top associations"],
            rows,
            caption="Rows of the statistics (paper Figure 5) and of the learned W_O and V.1.",
        )
    rep.section("Timings")
    rep.table(["part", "seconds"], [[k, _f(v, 2)] for k, v in results["timings"].items()])
    return rep


def write_report(results: Mapping[str, Any], out_dir: str | Path) -> Path:
    """Write ``report.html``, ``report.md``, ``figures/`` and ``report.json`` into ``out_dir``."""
    from ..storage import atomic_write_json

    out = Path(out_dir)
    path = build_report(results).write(out)
    atomic_write_json(out / "report.json", results)
    return path
