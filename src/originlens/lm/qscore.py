"""Q(w), the pre-caching degree of an SAE feature (arXiv 2603.14087 §9; our protocol choices in
``docs/protocol.md``).

For each feature f: its top-activating contexts in a token corpus; at the activating position p the
residual stream (the SAE's site) is ablated; ``KL_d = KL(P_clean ‖ P_ablated)`` of the next-token
distributions at positions ``p + d − 1``, d = 1..K (``KL_1`` is the prediction of the token right after
p).  Per example ``ratio = Σ_{d≥2} KL_d / (KL_1 + ε)`` (ε = 1e-8); per feature

* ``q`` = mean of ratios (the paper's Q), ``q_ratio_of_means`` = ``Σ_e Σ_{d≥2} KL_d / (Σ_e KL_1 + ε)``,
  ``q_median`` = median ratio (the mean of ratios is heavy-tailed);
* the drop rule: a feature whose mean ``Σ_{d=1..K} KL_d`` is ≤ ``min_total_kl`` (0.05) is marked
  ``kept = False`` (reason given) and left out of the summaries.

Ablations: ``error_preserving`` (default) subtracts the latent's decoder contribution only,
``x − a_f·W_dec[f]``; ``faithful`` is the reference's replacement of x by the SAE reconstruction with the
latent zeroed, which also removes the reconstruction error (a feature-independent confound in every KL).

Context selection (paper §9, adapted from Neuronpedia exports to a corpus of windows): every window is one
text; sequences are ``[BOS] + window`` (when the model has a BOS and ``prepend_bos``).  Per window and
feature the activation maximum over positions gives one candidate; positions must leave the K predicted
tokens inside the window (``p + K ≤ L − 1``, the reference's "drop examples with max index + 10 ≥ length").
``position_rule="restrict"`` (default) takes the maximum over those eligible positions,
``"drop"`` takes it over all positions and drops the window when it falls too late (the reference).
Features whose maximum is ≤ 0 are skipped ("dead"); candidates are de-duplicated greedily by descending
activation, dropping those within token edit distance ≤ ``dedup_distance`` of a kept one (text from the
window start through token p + K; cheap lower bounds of the distance, length and token-multiset
differences, are computed with numpy for all kept texts at once, the banded dynamic programme runs only
on the pairs they do not settle); the top ``n_contexts`` remain.  The stream at the site comes from
``adapter.run_to`` when the adapter has it (llama2.c: the fused block code below), else from a run
stopped by a hook; it equals the model's forward up to round-off, so in float32 two candidates whose
activations tie to ~1e-7 may be ordered differently than with the unfused forward.  Each example runs
on the sequence truncated after position p + K − 1 (causality makes this equal to the reference's
truncation at max index + 11 tokens).

Batching (:func:`ablation_kl`, ``method``): an ablation at site k and position p leaves every position
< p unchanged at every layer (causal model), so

* ``"cached"`` (default when the adapter has ``supports_cached_ablation``: our GPT without untied ranges,
  llama2.c, Hugging Face models through their own key/value cache): windows are sorted by the prefix length their examples need (max p + K) and run clean
  once, ``clean_tokens`` tokens per forward, through :meth:`LMAdapter.run_cached`, which keeps the
  stream at site k, the last block's output and the keys/values of the blocks above k.  A group of
  windows whose state fits ``max_clean_bytes`` shares one padded buffer; its examples, sorted by p,
  go ``batch_size`` at a time through :meth:`LMAdapter.run_positions_from`: each ablated copy is only
  its K positions p..p+K−1 (the stream at site k, ablated at p) through the blocks above k, attending
  to the cached clean keys/values of positions < p (per-row past lengths: one padded past plus a mask).
  The clean logits of those K positions are the unembedded last-block outputs of the clean run.  An
  ablated copy thus costs K positions × (L − k) blocks instead of (p + K) × L (or (p + K) × (L − k)).
  The context search already ran every window through the blocks below k: with
  ``find_top_contexts(..., return_streams=True)`` it keeps the site-k streams of the windows it selects
  (:class:`SiteStreams`; during the scan only windows that are still some feature's candidate, truncated
  to the prefix they need, within ``max_stream_bytes``), and ``ablation_kl(..., streams=...)`` starts
  those windows' clean runs at site k (``adapter.run_cached_from``), running only blocks above k.
  :func:`qscore` does this when it searches the contexts itself (not when given ``examples``).
* ``"run_from"`` (previous default): clean runs once per window, each ablated copy re-runs its whole
  prefix above the site (``adapter.run_from``), sorted by length to limit padding (right padding does
  not change earlier positions of a causal model); clean logits held as ``(E_block, K, V)``, ``E_block``
  sized from ``max_clean_bytes``.
* ``"hooks"``: as ``"run_from"`` but every block runs (adapters without ``run_from``, e.g. Hugging Face).

Cost (stories260K, 512 examples over 262 windows of 65 tokens out of 400, K = 10, site 3 of 5 blocks,
one CPU thread): the context search (every window through 3 blocks, ~0.2 s) now costs more than the
cached ablation step from its kept streams (clean runs through the 2 blocks above the site, ~0.08 s, plus
the ablated copies and KLs); without the streams the clean runs (all 5 blocks, ~0.15 s) bound the
ablation step's speed-up over a per-example loop at ~11×.

Caveats: the KL is computed in float64 from the model's logits; float32 models agree to ~1e-7 between
batch compositions of one method and to ~1e-5 (KL up to ~5) between methods or against a per-example
loop, since different kernels round differently; float64 models to ~1e-12.  The SAE is applied in its
own dtype.  The cached path's clean runs use the adapter's own block code (llama2.c:
:func:`originlens.lm.native._llama_block`, fused projections and folded norms), equal to the model's
forward up to round-off (tested in float64).  Speed-up over a per-example loop is bounded by loop time /
clean-run time (``benchmarks/qscore.py`` prints it): with few examples per window the clean runs are
most of the work.  Kept streams are only valid for the model weights, sequences and site they were
found with; :func:`ablation_kl` checks the site only.  Peak memory of :func:`qscore` on the cached path:
up to ``max_stream_bytes`` of kept streams plus ``max_clean_bytes`` of clean state.

Modules: the configuration and result types in :mod:`.qscore_config`, the context search in
:mod:`.qscore_contexts`, the ablation step in :mod:`.qscore_ablation`; this module aggregates and runs the
whole score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ..errors import ConfigError
from .qscore_ablation import (
    ablation_kl,
)
from .qscore_config import (
    Examples,
    FeatureQ,
    QScoreConfig,
    QScoreResult,
    SiteStreams,
)
from .qscore_contexts import (
    find_top_contexts,
)

__all__ = [
    "aggregate",
    "example_ratios",
    "qscore",
]


# ----------------------------------------------------------------------------------------------------
# aggregation and the whole pipeline


def example_ratios(kl: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Per-example ``Σ_{d≥2} KL_d / (KL_1 + eps)`` of ``kl (E, K)``."""
    return kl[:, 1:].sum(1) / (kl[:, 0] + eps)


def aggregate(
    examples: Examples, kl: np.ndarray, features: Sequence[int], config: QScoreConfig
) -> tuple[list[FeatureQ], np.ndarray]:
    """Per-feature :class:`FeatureQ` (mean of ratios, ratio of means, median, drop rule) and the ratios."""
    ratio = example_ratios(kl, config.eps)
    out: list[FeatureQ] = []
    K = config.max_offset
    for f in features:
        sel = examples.feature == f
        n = int(sel.sum())
        if n == 0:
            out.append(
                FeatureQ(
                    int(f),
                    0,
                    math.nan,
                    math.nan,
                    math.nan,
                    math.nan,
                    [math.nan] * K,
                    math.nan,
                    False,
                    examples.skipped.get(int(f), "no eligible context"),
                )
            )
            continue
        k_f, r_f = kl[sel], ratio[sel]
        total = float(k_f.sum(1).mean())
        kept = total > config.min_total_kl
        out.append(
            FeatureQ(
                feature=int(f),
                n_examples=n,
                q=float(r_f.mean()),
                q_ratio_of_means=float(k_f[:, 1:].sum() / (k_f[:, 0].sum() + config.eps)),
                q_median=float(np.median(r_f)),
                total_kl=total,
                kl_by_offset=k_f.mean(0).tolist(),
                max_activation=float(examples.activation[sel].max()),
                kept=kept,
                reason=None if kept else f"mean total KL ≤ {config.min_total_kl}",
            )
        )
    return out, ratio


def qscore(
    adapter: Any,
    sae: Any,
    tokens: Any,
    features: Sequence[int] | None = None,
    config: QScoreConfig | None = None,
    *,
    site: int | str | None = None,
    examples: Examples | None = None,
) -> QScoreResult:
    """Q(w) of ``features`` (default: all latents) of ``sae`` on ``adapter`` over ``tokens`` ``(N, T)``.

    ``examples`` (from a previous result) skips the context search, e.g. to run the other ablation on the
    same contexts.  The SAE must match the model (width, residual hook): see
    :func:`originlens.sae.model.sae_site`.  The ablation method is :func:`ablation_kl`'s ``"auto"``.
    """
    from ..sae.activations import as_sequences
    from ..sae.model import sae_site

    config = config or QScoreConfig()
    config.validate()
    k = sae_site(sae, adapter, site)
    feats = list(range(sae.d_sae)) if features is None else [int(f) for f in features]
    bad = [f for f in feats if not 0 <= f < sae.d_sae]
    if bad:
        raise ConfigError(f"feature ids {bad[:5]} outside 0..{sae.d_sae - 1}", "pick features of this SAE")
    seqs = as_sequences(tokens, adapter, prepend_bos=config.prepend_bos)
    first = 1 if config.prepend_bos and adapter.bos_id is not None else 0
    streams: SiteStreams | None = None
    if examples is None:  # keep the selected windows' site-k streams for the cached clean runs
        keep = bool(getattr(adapter, "supports_cached_ablation", False)) and hasattr(adapter, "run_cached_from")
        found = find_top_contexts(adapter, sae, k, seqs, feats, config, first=first, return_streams=keep)
        examples, streams = cast("tuple[Examples, SiteStreams]", found) if keep else (cast(Examples, found), None)
    kl, act = ablation_kl(adapter, sae, k, seqs, examples, config, streams=streams)
    del streams
    fq, ratio = aggregate(examples, kl, feats, config)
    return QScoreResult(
        config=config,
        site=k,
        hook_name=sae.cfg.hook_name,
        features=fq,
        examples=examples,
        kl=kl,
        ratio=ratio,
        ablated_activation=act,
    )
