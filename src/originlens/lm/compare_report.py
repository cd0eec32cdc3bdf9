"""The report of a checkpoint comparison (:mod:`originlens.lm.compare`): heatmaps, tables and the run
directory.

:func:`plot_mappings` draws three panels (attention, no-MLP embedding, embedding), layers × checkpoints,
and :func:`plot_heads` one panel per chosen layer, heads × checkpoints; colour range 0–1 for every
variant (a cosine below 0 or NaN shows as the bottom of the range or blank).  :func:`write_comparison`
writes the run directory: ``results.json`` (:meth:`~originlens.lm.compare.ComparisonResult.to_json`),
``config.json``, ``environment.json``, ``figures/*.png`` and ``report.html``/``report.md`` with the
cosine tables and each variant minus its token-permuted null.  :func:`check_out` refuses to overwrite a
directory that does not hold an earlier comparison.  matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from .compare import MAPPINGS, PANEL_TITLES, RESULTS_KIND, VARIANT_TITLES, ComparisonResult


def _heatmap(
    ax: Any, M: np.ndarray, xlabels: Sequence[str], ylabels: Sequence[Any], title: str, ylabel: str, cmap: str
) -> Any:
    im = ax.imshow(np.ma.masked_invalid(M), vmin=0.0, vmax=1.0, cmap=cmap, aspect="auto", interpolation="nearest")
    ax.set_title(title)
    ax.set_xticks(range(len(xlabels)), [str(x) for x in xlabels], rotation=60, ha="right")
    ax.set_yticks(range(len(ylabels)), [str(y) for y in ylabels])
    ax.set_ylabel(ylabel)
    ax.grid(False)
    if M.size <= 400:
        for (i, j), v in np.ndenumerate(M):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < 0.6 else "black")
    return im


def plot_mappings(result: ComparisonResult, variant: str = "spec", *, cmap: str = "viridis") -> Any:
    """Three panels (attention, no-MLP embedding, embedding): layers × checkpoints, range 0–1."""
    from ..report.html import setup_matplotlib

    if variant not in result.cosines:
        raise ConfigError(f"this result has no {variant!r} cosines", f"use one of {list(result.cosines)}")
    plt = setup_matplotlib()
    data = result.cosines[variant]
    n = len(result.labels)
    fig, axes = plt.subplots(
        1, 3, figsize=(2.5 + 3 * max(2.2, 0.42 * n), 2.0 + 0.4 * max(4, len(result.layers))), sharey=True
    )
    im = None
    for ax, key in zip(axes, MAPPINGS):
        im = _heatmap(
            ax, data[key], result.labels, result.layers, PANEL_TITLES[key], "layer" if key == MAPPINGS[0] else "", cmap
        )
        ax.set_xlabel("checkpoint")
    fig.colorbar(im, ax=list(axes), shrink=0.9, label=VARIANT_TITLES[variant].split(":")[0].split("(")[0].strip())
    fig.suptitle(VARIANT_TITLES[variant])
    return fig


def plot_heads(result: ComparisonResult, variant: str = "spec", *, cmap: str = "viridis") -> Any | None:
    """One panel per chosen layer: heads × checkpoints (attention mapping of each head), range 0–1."""
    heads = result.heads.get(variant) or {}
    if not heads:
        return None
    from ..report.html import setup_matplotlib

    plt = setup_matplotlib()
    n = len(result.labels)
    H = next(iter(heads.values())).shape[0]
    fig, axes = plt.subplots(
        1, len(heads), figsize=(2 + len(heads) * max(2.5, 0.42 * n), 2.0 + 0.4 * max(4, H)), squeeze=False
    )
    im = None
    for ax, (layer, M) in zip(axes[0], sorted(heads.items())):
        im = _heatmap(ax, M, result.labels, list(range(1, H + 1)), f"Layer {layer} heads", "head", cmap)
        ax.set_xlabel("checkpoint")
    fig.colorbar(im, ax=list(axes[0]), shrink=0.9, label="attention mapping vs Q̄")
    fig.suptitle(VARIANT_TITLES[variant])
    return fig


def _table_rows(result: ComparisonResult, data: Mapping[str, np.ndarray]) -> list[list[Any]]:
    rows = []
    for key in MAPPINGS:
        for i, l in enumerate(result.layers):
            rows.append([PANEL_TITLES[key], l] + [float(v) for v in data[key][i]])
    return rows


def check_out(out: str | Path, overwrite: bool = False) -> bool:
    """Refuse an existing non-empty ``out`` unless it holds an earlier comparison and ``overwrite``;
    returns True when an earlier comparison will be replaced."""
    from ..storage import read_json

    out = Path(out)
    if not (out.is_file() or (out.is_dir() and any(out.iterdir()))):
        return False
    prev = out / "results.json"
    ours = prev.is_file() and isinstance(read_json(prev), dict) and read_json(prev).get("kind") == RESULTS_KIND
    if not (overwrite and ours):
        raise ConfigError(
            f"--out {out} exists and is not empty" + ("" if ours else " (not a comparison run)"),
            "choose a new directory" + (", or pass --overwrite" if ours else ""),
        )
    return True


def write_comparison(
    result: ComparisonResult,
    out: str | Path,
    *,
    title: str = "Leading-term features across checkpoints",
    extra: Mapping[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the run directory ``out``: ``results.json``, ``config.json``, ``environment.json``,
    ``figures/*.png`` and ``report.html``/``report.md``.  Returns the report path.

    An existing non-empty ``out`` is replaced only when it holds an earlier comparison and ``overwrite``.
    """
    from ..report.html import Report, savefig_png
    from ..runs import RunDir
    from ..storage import atomic_write_bytes, atomic_write_json

    out = Path(out)
    if check_out(out, overwrite):
        for f in (out / "figures").glob("*.png"):
            f.unlink()
    run = RunDir(out)
    run.write_config({**result.config, **(dict(extra or {}))})
    run.write_environment(
        seeds={"null_seed": result.config.get("null_seed")},
        extra={"grid": result.grid, "statistics": result.statistics},
    )
    atomic_write_json(run.file("results.json"), result.to_json())
    rep = Report(title)
    rep.section("Setup")
    st = result.statistics
    rep.text(
        f"Model: {result.model.get('n_layers')} layers, d = {result.model.get('d_model')}, "
        f"{result.model.get('n_heads')} heads, |V| = {result.model.get('vocab_size')}. "
        f"Statistics: K = {st.get('K')} most frequent tokens, T = {st.get('seq_len')}, "
        f"{st.get('n_pairs')} counted pairs, centring constant {st.get('centering'):.3g}; "
        f"{st.get('meta', {}).get('source', '')}. Per-token states: each token alone (no BOS); "
        "biases, LayerNorm, rotary and 1/sqrt(d) ignored, as in the paper."
    )
    if extra:
        rep.code("\n".join(f"{k}: {v}" for k, v in extra.items()))
    rep.section("Heatmaps")
    for v in result.cosines:
        png = savefig_png(plot_mappings(result, v))
        name = f"mappings-{v}.png"
        atomic_write_bytes(run.file("figures", name), png)
        rep.figure(
            png,
            f"{VARIANT_TITLES[v].capitalize()} of each mapping with its leading term (attention: Q̄; "
            "embeddings: Φ̄ᵀB̄ᵀ), layers × checkpoints, colour range 0–1.",
            name,
        )
        hf = plot_heads(result, v)
        if hf is not None:
            png = savefig_png(hf)
            name = f"heads-{v}.png"
            atomic_write_bytes(run.file("figures", name), png)
            rep.figure(
                png,
                f"Per-head attention mapping vs Q̄ ({VARIANT_TITLES[v]}), heads × checkpoints, colour range 0–1.",
                name,
            )
    rep.section("Cosines")
    for v, data in result.cosines.items():
        rep.table(["mapping", "layer"] + result.labels, _table_rows(result, data), VARIANT_TITLES[v])
    for v, null in (("spec", "null"), ("token_centred", "token_centred_null")):
        if v in result.cosines and null in result.cosines:
            margin = {k: np.asarray(result.cosines[v][k]) - np.asarray(result.cosines[null][k]) for k in MAPPINGS}
            rep.table(
                ["mapping", "layer"] + result.labels,
                _table_rows(result, margin),
                f"{VARIANT_TITLES[v]} minus its token-permuted null (≈ 0: no evidence beyond chance)",
            )
    rep.section("Checkpoints")
    g = result.grid
    rep.table(
        ["checkpoint", "weights sha256", "load s", "compare s"],
        [
            [
                lab,
                (g.get("hashes", {}).get(lab) or "")[:16],
                result.timings["load_s"][i],
                result.timings["compare_s"][i],
            ]
            for i, lab in enumerate(result.labels)
        ],
    )
    if g.get("duplicates"):
        rep.text("Duplicated weights: " + "; ".join(f"{d['label']} = {d['same_as']}" for d in g["duplicates"]))
    if g.get("skipped"):
        rep.text("Skipped: " + "; ".join(f"{s['label']} ({s['reason']})" for s in g["skipped"]))
    if result.warnings:
        rep.section("Warnings")
        for w in result.warnings:
            rep.text(w)
    rep.text(
        f"Timings: statistics {result.timings['statistics_s']} s, theory preparation "
        f"{result.timings['theory_prepare_s']} s, total {result.timings['total_s']} s."
    )
    return rep.write(run.path)
