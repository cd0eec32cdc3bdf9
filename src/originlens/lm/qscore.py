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
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import ConfigError, InputError
from ..progress import progress
from ..sites import site_name

ABLATIONS = ("error_preserving", "faithful")
POSITION_RULES = ("restrict", "drop")
ABLATION_METHODS = ("auto", "cached", "run_from", "hooks")


@dataclass
class QScoreConfig:
    """Settings of the Q(w) protocol (defaults: the paper's reference values where they exist)."""

    n_contexts: int = 8  # top-activating contexts kept per feature
    max_offset: int = 10  # K: offsets d = 1..K
    ablation: str = "error_preserving"  # or "faithful" (reference)
    position_rule: str = "restrict"  # "restrict" | "drop" (reference)
    dedup_distance: int = 10  # token edit distance for duplicates; -1 disables
    pool_factor: int = 4  # candidates kept per feature before de-duplication
    min_total_kl: float = 0.05  # drop rule on the mean Σ_d KL_d
    eps: float = 1e-8  # floor of the KL_1 denominator
    prepend_bos: bool = True
    scan_batch_size: int = 32  # windows per forward while finding contexts
    batch_size: int = 128  # rows per ablation forward
    max_clean_bytes: int = 256 << 20  # memory for stored clean logits / clean states per block
    clean_tokens: int = 1024  # tokens per clean forward of the cached method (raise on a GPU)
    max_stream_bytes: int = 256 << 20  # memory for site streams kept by the context search (0: none)

    def validate(self) -> None:
        for name in ("n_contexts", "max_offset", "pool_factor", "scan_batch_size", "batch_size", "clean_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be a positive integer, got {v!r}", f"set {name} ≥ 1")
        if self.ablation not in ABLATIONS:
            raise ConfigError(f"unknown ablation {self.ablation!r}", f"use one of: {', '.join(ABLATIONS)}")
        if self.position_rule not in POSITION_RULES:
            raise ConfigError(
                f"unknown position_rule {self.position_rule!r}", f"use one of: {', '.join(POSITION_RULES)}"
            )
        if (
            isinstance(self.max_stream_bytes, bool)
            or not isinstance(self.max_stream_bytes, int)
            or self.max_stream_bytes < 0
        ):
            raise ConfigError(
                f"max_stream_bytes must be an integer ≥ 0, got {self.max_stream_bytes!r}",
                "e.g. 256 << 20, or 0 to keep no streams",
            )
        if not self.eps > 0 or self.min_total_kl < 0:
            raise ConfigError("eps must be > 0 and min_total_kl ≥ 0", "e.g. eps=1e-8, min_total_kl=0.05")


@dataclass
class Examples:
    """Selected (feature, context) pairs; arrays of length E.  ``position`` indexes the model sequence
    (BOS included), ``activation`` is the latent's value there."""

    feature: np.ndarray
    seq_index: np.ndarray
    position: np.ndarray
    activation: np.ndarray
    skipped: dict[int, str] = field(default_factory=dict)  # feature -> reason ("dead", "no eligible context")

    def __len__(self) -> int:
        return int(self.feature.shape[0])


@dataclass
class SiteStreams:
    """Clean residual streams at site ``site`` kept by the context search for the windows it selected
    (``find_top_contexts(..., return_streams=True)``): ``streams[w]`` is window w's stream ``(T_w, d)``
    over its first ``T_w`` positions, ``T_w`` ≥ the prefix its examples need (max p + K).  Passed to
    :func:`ablation_kl` (``"cached"``), whose clean runs then only run the blocks above the site.  Valid
    only for the same model weights, sequences and site."""

    site: int
    streams: dict[int, Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.streams.values())


@dataclass
class FeatureQ:
    """Q(w) of one feature."""

    feature: int
    n_examples: int
    q: float  # mean of ratios (paper)
    q_ratio_of_means: float
    q_median: float
    total_kl: float  # mean over examples of Σ_{d=1..K} KL_d
    kl_by_offset: list[float]  # mean over examples of KL_d, d = 1..K
    max_activation: float
    kept: bool
    reason: str | None = None


@dataclass
class QScoreResult:
    """Per-feature Q values and the per-example KL table of one ablation mode."""

    config: QScoreConfig
    site: int
    hook_name: str
    features: list[FeatureQ]
    examples: Examples
    kl: np.ndarray  # (E, K) float64
    ratio: np.ndarray  # (E,)
    ablated_activation: np.ndarray  # (E,) the latent's value recomputed inside the ablation hook

    def kept(self) -> list[FeatureQ]:
        return [f for f in self.features if f.kept]

    def summary(self) -> dict[str, Any]:
        """Counts, median Q, std(ln Q) and the tails (Q < 0.1, Q > 10) over kept features, per aggregate."""
        out: dict[str, Any] = {
            "n_features": len(self.features),
            "n_kept": len(self.kept()),
            "n_examples": len(self.examples),
            "dropped": Counter(f.reason for f in self.features if not f.kept),
        }
        for key in ("q", "q_ratio_of_means", "q_median"):
            v = np.array([getattr(f, key) for f in self.kept()], dtype=np.float64)
            v = v[np.isfinite(v) & (v > 0)]
            out[key] = {
                "median": float(np.median(v)) if v.size else math.nan,
                "std_log": float(np.std(np.log(v), ddof=1)) if v.size > 1 else math.nan,
                "frac_below_0.1": float((v < 0.1).mean()) if v.size else math.nan,
                "frac_above_10": float((v > 10).mean()) if v.size else math.nan,
                "n_positive": int(v.size),
            }
        out["dropped"] = dict(out["dropped"])
        return out

    def example_arrays(self) -> dict[str, np.ndarray]:
        """The per-example table: feature, seq_index, position, activation, ablated_activation (E,),
        kl (E, K), ratio (E,)."""
        ex = self.examples
        return {
            "feature": ex.feature,
            "seq_index": ex.seq_index,
            "position": ex.position,
            "activation": ex.activation,
            "ablated_activation": self.ablated_activation,
            "kl": self.kl,
            "ratio": self.ratio,
        }

    @classmethod
    def from_saved(cls, entry: dict[str, Any], arrays: dict[str, np.ndarray]) -> QScoreResult:
        """The result written by a run: ``entry`` = :meth:`to_json` without examples (a run's
        ``results.json`` ablation entry), ``arrays`` = :meth:`example_arrays` (its examples file)."""
        missing = [k for k in ("feature", "seq_index", "position", "activation", "ablated_activation", "kl", "ratio")
                   if k not in arrays]  # fmt: skip
        if missing:
            raise InputError(f"the examples table lacks {', '.join(missing)}", "pass the examples file of a Q(w) run")
        m = re.fullmatch(r"resid\.(\d+)", str(entry.get("site", "")))
        if m is None:
            raise InputError(f"unreadable site {entry.get('site')!r} in a Q(w) result", "pass a Q(w) run's results")
        ex = Examples(
            np.asarray(arrays["feature"], dtype=np.int64),
            np.asarray(arrays["seq_index"], dtype=np.int64),
            np.asarray(arrays["position"], dtype=np.int64),
            np.asarray(arrays["activation"], dtype=np.float64),
            {int(k): v for k, v in entry.get("skipped_features", {}).items()},
        )
        return cls(
            config=QScoreConfig(**entry["config"]),
            site=int(m.group(1)),
            hook_name=entry["hook_name"],
            features=[FeatureQ(**f) for f in entry["features"]],
            examples=ex,
            kl=np.asarray(arrays["kl"], dtype=np.float64),
            ratio=np.asarray(arrays["ratio"], dtype=np.float64),
            ablated_activation=np.asarray(arrays["ablated_activation"], dtype=np.float64),
        )

    def to_json(self, include_examples: bool = True) -> dict[str, Any]:
        out = {
            "config": asdict(self.config),
            "site": site_name(self.site),
            "hook_name": self.hook_name,
            "summary": self.summary(),
            "features": [asdict(f) for f in self.features],
            "skipped_features": {str(k): v for k, v in self.examples.skipped.items()},
        }
        if include_examples:
            out["examples"] = {k: v.tolist() for k, v in self.example_arrays().items()}
        return out


def merge_results(parts: Sequence[QScoreResult]) -> QScoreResult:
    """One result from those of contiguous feature shards, in shard order (the features of part j follow
    those of part j − 1, as :func:`originlens.distributed.shard_bounds` cuts them): features, examples,
    KL table and ratios are concatenated, so the result is ordered as if all features had been scored at
    once.  Each example's KLs depend only on that example, so it equals the unsharded result up to the
    round-off of different batch compositions.  The protocol, site and hook must agree; a feature may
    appear in one part only."""
    if not parts:
        raise InputError("no Q(w) results to merge", "pass the results of every shard")
    first = parts[0]
    for p in parts[1:]:
        if (asdict(p.config), p.site, p.hook_name) != (asdict(first.config), first.site, first.hook_name):
            raise InputError(
                "the Q(w) results to merge differ in protocol, site or hook",
                "merge shards of one run (the same model, SAE, corpus and settings)",
            )
    feats = [f.feature for p in parts for f in p.features]
    if len(set(feats)) != len(feats):
        raise InputError("a feature appears in more than one of the results to merge", "merge disjoint shards")
    cat = lambda name: np.concatenate([getattr(p.examples, name) for p in parts])
    skipped = {k: v for p in parts for k, v in p.examples.skipped.items()}
    return QScoreResult(
        config=first.config,
        site=first.site,
        hook_name=first.hook_name,
        features=[f for p in parts for f in p.features],
        examples=Examples(cat("feature"), cat("seq_index"), cat("position"), cat("activation"), skipped),
        kl=np.concatenate([p.kl.reshape(-1, first.config.max_offset) for p in parts]),
        ratio=np.concatenate([p.ratio for p in parts]),
        ablated_activation=np.concatenate([p.ablated_activation for p in parts]),
    )


# ----------------------------------------------------------------------------------------------------
# edit distance (for de-duplication)


def within_edit_distance(a: Sequence[int], b: Sequence[int], threshold: int) -> bool:
    """True when the Levenshtein distance of token lists ``a`` and ``b`` is ≤ ``threshold``.

    Cheap rejections first (length difference, multiset difference: every edit changes the token multiset
    by at most two), then a banded dynamic programme with early exit.
    """
    if threshold < 0:
        return False
    la, lb = len(a), len(b)
    if abs(la - lb) > threshold:
        return False
    ca, cb = Counter(a), Counter(b)
    sym = sum(((ca - cb) + (cb - ca)).values())
    if (sym + 1) // 2 > threshold:
        return False
    return _banded_within(a, b, threshold)


def _banded_within(a: Sequence[int], b: Sequence[int], threshold: int) -> bool:
    """The banded dynamic programme of :func:`within_edit_distance` (no cheap rejections)."""
    la, lb = len(a), len(b)
    if abs(la - lb) > threshold:
        return False
    big = threshold + 1
    prev = [j if j <= threshold else big for j in range(lb + 1)]
    for i in range(1, la + 1):
        lo, hi = max(1, i - threshold), min(lb, i + threshold)
        cur = [big] * (lb + 1)
        cur[0] = i if i <= threshold else big
        ai = a[i - 1]
        best = cur[0] if lo == 1 else big
        for j in range(lo, hi + 1):
            v = prev[j - 1] + (ai != b[j - 1])
            if prev[j] + 1 < v:
                v = prev[j] + 1
            if cur[j - 1] + 1 < v:
                v = cur[j - 1] + 1
            cur[j] = v if v < big else big
            if cur[j] < best:
                best = cur[j]
        if best > threshold:
            return False
        prev = cur
    return prev[lb] <= threshold


# ----------------------------------------------------------------------------------------------------
# context selection


def _eligible_mask(L: int, first: int, K: int, device: torch.device) -> Tensor:
    pos = torch.arange(L, device=device)
    return (pos >= first) & (pos + K <= L - 1)


def find_top_contexts(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    features: Sequence[int],
    config: QScoreConfig,
    *,
    first: int = 1,
    return_streams: bool = False,
) -> Examples | tuple[Examples, SiteStreams]:
    """Top-activating contexts of ``features`` (rules in the module docstring).

    ``sequences (N, L)`` are model inputs (BOS included when used); ``first`` is the first position a
    feature may be ablated at (1 after a BOS).  Returns the selected examples, ordered by feature then by
    descending activation; with ``return_streams`` also the :class:`SiteStreams` of the selected windows
    (for :func:`ablation_kl`).  While scanning, streams are kept only for windows that are candidates of
    some feature (truncated to the longest prefix those candidates need) and only while they fit
    ``config.max_stream_bytes``; windows left out are simply re-run by :func:`ablation_kl`.

    The stream at site k comes from ``adapter.run_to(tokens, k)`` when the adapter has it (llama2.c: the
    fused block code), else from :func:`originlens.sae.activations.site_residuals`.
    """
    from ..sae.activations import site_residuals

    config.validate()
    K = config.max_offset
    N, L = sequences.shape
    if first > L - 1 - K:
        raise InputError(
            f"windows of {L} tokens (BOS included) leave no position with {K} following tokens",
            f"use longer windows (≥ {first + K + 1} tokens) or a smaller --max-offset",
        )
    feats = torch.as_tensor(list(features), dtype=torch.long)
    F = feats.shape[0]
    P = config.n_contexts * config.pool_factor
    dev = adapter.device
    feats_dev = feats.to(sae.W_enc.device)
    pool_v = torch.full((F, 0), -math.inf, dtype=torch.float64)
    pool_i = torch.zeros((F, 0), dtype=torch.long)
    pool_p = torch.zeros((F, 0), dtype=torch.long)
    max_any = torch.full((F,), -math.inf, dtype=torch.float64)
    elig = _eligible_mask(L, first, K, torch.device("cpu"))
    allowed = elig if config.position_rule == "restrict" else (torch.arange(L) >= first)
    run_to = getattr(adapter, "run_to", None)
    kept_streams: dict[int, Tensor] = {}
    kept_bytes = 0
    with torch.no_grad():
        for s in progress(range(0, N, config.scan_batch_size), desc="finding contexts", unit="batch"):
            tok = sequences[s : s + config.scan_batch_size]
            x = run_to(tok.to(dev), k) if run_to is not None else site_residuals(adapter, tok.to(dev), k)
            a = sae.encode_subset(x.to(sae.W_enc.device), feats_dev).cpu()  # (B, L, F)
            # maxima in the SAE's dtype, then float64: the same values (widening is exact and monotone)
            max_any = torch.maximum(max_any, a[:, first:].amax(dim=(0, 1)).double())
            a = a.masked_fill(~allowed[None, :, None], -math.inf)
            v, p = a.max(dim=1)  # (B, F)
            v = v.double()
            if config.position_rule == "drop":
                v = v.masked_fill(~elig[p], -math.inf)
            idx = torch.arange(s, s + tok.shape[0]).expand(F, -1)
            cv = torch.cat([pool_v, v.T], dim=1)
            order = torch.sort(cv, dim=1, descending=True, stable=True).indices[:, :P]
            pool_v = cv.gather(1, order)
            pool_i = torch.cat([pool_i, idx], dim=1).gather(1, order)
            pool_p = torch.cat([pool_p, p.T], dim=1).gather(1, order)
            if return_streams:
                kept_bytes = _keep_streams(
                    kept_streams, kept_bytes, x, s, pool_v, pool_i, pool_p, K, config.max_stream_bytes
                )
    out_f, out_i, out_p, out_a = [], [], [], []
    skipped: dict[int, str] = {}
    seq_np = sequences.numpy()
    for j, f in enumerate(feats.tolist()):
        if not max_any[j] > 0:
            skipped[f] = "dead"
            continue
        vs, ids, ps = pool_v[j].tolist(), pool_i[j].tolist(), pool_p[j].tolist()
        n_cand = sum(v > 0 for v in vs)  # the pool is sorted: candidates come first
        for c in _dedup_greedy(seq_np, ids[:n_cand], ps[:n_cand], first, K, config.dedup_distance, config.n_contexts):
            out_f.append(f), out_i.append(ids[c]), out_p.append(ps[c]), out_a.append(vs[c])
        if n_cand == 0:
            skipped[f] = "no eligible context"
    ex = Examples(
        np.array(out_f, dtype=np.int64),
        np.array(out_i, dtype=np.int64),
        np.array(out_p, dtype=np.int64),
        np.array(out_a, dtype=np.float64),
        skipped,
    )
    if not return_streams:
        return ex
    return ex, SiteStreams(k, {w: kept_streams[w] for w in sorted(set(out_i)) if w in kept_streams})


def _dedup_greedy(
    seq_np: np.ndarray, ids: list[int], ps: list[int], first: int, K: int, threshold: int, n_keep: int
) -> list[int]:
    """Greedy de-duplication of one feature's candidates (in order): candidate c (text = window
    ``ids[c]`` from ``first`` through token ``ps[c] + K``) is kept unless within token edit distance
    ``threshold`` of a kept one; stops after ``n_keep``.  Same result as calling
    :func:`within_edit_distance` on every pair, but its cheap lower bounds (length difference,
    multiset difference) are computed with numpy for all kept texts at once."""
    if threshold < 0 or len(ids) <= 1:
        return list(range(min(n_keep, len(ids))))
    texts = [seq_np[i, first : p + K + 1] for i, p in zip(ids, ps)]
    lens = np.array([t.shape[0] for t in texts], dtype=np.int64)
    vocab, inv = np.unique(np.concatenate(texts), return_inverse=True)
    U = len(vocab)
    counts = np.bincount(
        np.repeat(np.arange(len(texts)) * U, lens) + inv.reshape(-1), minlength=len(texts) * U
    ).reshape(len(texts), U)
    kept = [0]
    for c in range(1, len(texts)):
        if len(kept) >= n_keep:
            break
        ks = np.array(kept)
        bound = np.maximum(np.abs(lens[ks] - lens[c]), (np.abs(counts[ks] - counts[c]).sum(1) + 1) // 2)
        near = ks[bound <= threshold]
        if near.size and any(_banded_within(texts[c].tolist(), texts[q].tolist(), threshold) for q in near):
            continue
        kept.append(c)
    return kept


def _keep_streams(
    kept: dict[int, Tensor],
    nbytes: int,
    x: Tensor,
    s: int,
    pool_v: Tensor,
    pool_i: Tensor,
    pool_p: Tensor,
    K: int,
    budget: int,
) -> int:
    """Update the streams kept during the context search: drop windows that left every feature's pool of
    candidates, add the windows of this batch (rows of ``x``, first window ``s``) still in some pool,
    truncated to the longest prefix their candidates need, while the total stays ≤ ``budget`` bytes."""
    live = pool_v > 0
    wins, inv = np.unique(pool_i[live].numpy(), return_inverse=True)
    longest = np.zeros(len(wins), dtype=np.int64)
    np.maximum.at(longest, inv, pool_p[live].numpy() + K)
    need = dict(zip(wins.tolist(), longest.tolist()))
    for w in [w for w in kept if w not in need]:
        t = kept.pop(w)
        nbytes -= t.numel() * t.element_size()
    for w in sorted(w for w in need if w >= s):
        t = x[w - s, : need[w]]
        b = t.numel() * t.element_size()
        if nbytes + b <= budget:
            kept[w] = t.clone()
            nbytes += b
    return nbytes


# ----------------------------------------------------------------------------------------------------
# ablation


def ablate_rows(sae: Any, x: Tensor, positions: Tensor, features: Tensor, ablation: str) -> tuple[Tensor, Tensor]:
    """Ablate latent ``features[r]`` at ``positions[r]`` of row r of ``x (R, T, d)``.

    Returns the new stream and the latent activations found there ``(R,)``.  Rows past ``len(features)``
    (clean rows) are left untouched.
    """
    R = features.shape[0]
    rows = torch.arange(R, device=x.device)
    xs = x[rows, positions]
    acts, state = sae.encode_with_state(xs.to(sae.W_enc.device))
    f = features.to(acts.device)
    r = torch.arange(R, device=acts.device)
    a_f = acts[r, f]
    if ablation == "faithful":
        acts = acts.clone()
        acts[r, f] = 0
        new = sae.decode(acts, state)
    else:
        new = xs.to(sae.dtype) - sae.feature_contribution(a_f, f, state)
    x = x.clone()
    x[rows, positions] = new.to(device=x.device, dtype=x.dtype)
    return x, a_f


def _pad_rows(rows: list[Tensor], pad: int = 0) -> Tensor:
    T = max(r.shape[0] for r in rows)
    out = torch.full((len(rows), T), pad, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def kl_divergence(clean_logits: Tensor, ablated_logits: Tensor) -> Tensor:
    """``KL(softmax(clean) ‖ softmax(ablated))`` over the last axis, in float64.

    Large inputs are processed in blocks of about 2¹⁷ values: float64 temporaries of many megabytes are
    mapped and unmapped by the allocator at every call, and those page faults cost more than the
    arithmetic (4× slower for (1280, 512) on our CPU)."""
    shape = clean_logits.shape[:-1]
    V = clean_logits.shape[-1]
    a, b = clean_logits.reshape(-1, V), ablated_logits.reshape(-1, V)
    step = max(1, (1 << 17) // max(1, V))
    out = torch.empty(a.shape[0], dtype=torch.float64, device=a.device)
    for i in range(0, a.shape[0], step):
        lp = torch.log_softmax(a[i : i + step].double(), dim=-1)
        lq = torch.log_softmax(b[i : i + step].double(), dim=-1)
        out[i : i + step] = (lp.exp() * (lp - lq)).sum(-1)
    return out.reshape(shape)


def ablation_kl(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    examples: Examples,
    config: QScoreConfig,
    *,
    method: str = "auto",
    streams: SiteStreams | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``KL_d`` for every example ``(E, K)`` (float64) and the ablated latent's value ``(E,)``.

    ``method`` (see "Batching" in the module docstring): ``"cached"`` (clean keys/values cached, ablated
    copies re-run K positions above the site; needs ``adapter.supports_cached_ablation``),
    ``"run_from"`` (ablated copies re-run their whole prefix above the site), ``"hooks"`` (whole prefix,
    every block), or ``"auto"``: the first one the adapter supports (the cached one only when window
    length + K is within the adapter's ``cached_ablation_max_len``, e.g. a sliding attention window).  All give the same numbers up to
    round-off.  ``streams`` (from ``find_top_contexts(..., return_streams=True)`` on the same model and
    sequences): the cached method's clean runs start from these site-k streams, running only the blocks
    above k, for the windows they hold (the others run in full); ignored by the other methods and by
    adapters without ``run_cached_from``.
    """
    config.validate()
    if method not in ABLATION_METHODS:
        raise ConfigError(f"unknown ablation method {method!r}", f"use one of: {', '.join(ABLATION_METHODS)}")
    cached = bool(getattr(adapter, "supports_cached_ablation", False))
    run_from = bool(getattr(adapter, "supports_run_from", False))
    limit = getattr(adapter, "cached_ablation_max_len", None)  # e.g. a sliding attention window
    fits = limit is None or sequences.shape[1] + config.max_offset <= limit
    if method == "auto":
        method = "cached" if cached and fits else "run_from" if run_from else "hooks"
    if (method == "cached" and not cached) or (method == "run_from" and not run_from):
        raise ConfigError(
            f"this model ({getattr(adapter, 'family', type(adapter).__name__)}) does not support "
            f"the {method!r} ablation method",
            "use method='auto' or 'hooks'",
        )
    if method == "cached" and not fits:
        raise ConfigError(
            f"windows of {sequences.shape[1]} tokens + K = {config.max_offset} exceed this model's limit of "
            f"{limit} positions for the cached ablation",
            "use method='auto' (it falls back to re-running prefixes) or shorter windows",
        )
    K, E = config.max_offset, len(examples)
    kl = np.zeros((E, K), dtype=np.float64)
    act = np.zeros(E, dtype=np.float64)
    if E == 0:
        return kl, act
    if streams is not None and streams.site != k:
        raise ConfigError(
            f"streams kept at resid.{streams.site} passed for an ablation at resid.{k}",
            "pass the streams found by find_top_contexts at the same site, or none",
        )
    bar = progress(total=E, desc=f"ablation ({config.ablation})", unit="ex")
    with torch.no_grad():
        if method == "cached":
            _ablation_kl_cached(adapter, sae, k, sequences, examples, config, kl, act, bar, streams)
        else:
            _ablation_kl_prefix(adapter, sae, k, sequences, examples, config, kl, act, bar, method == "run_from")
    if hasattr(bar, "close"):
        bar.close()
    return kl, act


def _ablation_kl_cached(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    examples: Examples,
    config: QScoreConfig,
    kl: np.ndarray,
    act: np.ndarray,
    bar: Any,
    streams: SiteStreams | None = None,
) -> None:
    """The ``"cached"`` method: one clean run per window keeps the keys/values of the blocks above site k;
    each ablated copy re-runs only its K positions p..p+K−1 above the site over that clean prefix.

    Windows (sorted by the prefix length they need) form groups whose clean state fits
    ``max_clean_bytes``; a group's clean runs (``clean_tokens`` tokens per forward) fill one padded
    buffer, then its examples, sorted by p, go ``batch_size`` rows per partial forward.  Windows whose
    site-k stream is in ``streams`` (covering the prefix they need) run only the blocks above k
    (``adapter.run_cached_from``); they are ordered after the others so that forwards rarely mix both."""
    K, dev = config.max_offset, adapter.device
    pos, feat = examples.position, examples.feature
    wins, inv = np.unique(examples.seq_index, return_inverse=True)
    need = np.zeros(len(wins), dtype=np.int64)  # clean prefix length per window
    np.maximum.at(need, inv, pos + K)
    held = streams.streams if streams is not None and hasattr(adapter, "run_cached_from") else {}
    has = np.array([w in held and held[w].shape[0] >= n for w, n in zip(wins.tolist(), need.tolist())], dtype=bool)
    order = np.lexsort((need, has))  # similar lengths share a forward
    itemsize = torch.empty((), dtype=next(iter(adapter.parameters())).dtype).element_size()
    per_window = int(need.max()) * (2 * (adapter.n_layers - k) + 2) * adapter.d_model * itemsize
    n_group = max(1, config.max_clean_bytes // max(1, per_window))
    offs = torch.arange(K, device=dev)
    for g0 in range(0, len(wins), n_group):
        gw = order[g0 : g0 + n_group]  # window ids (into wins) of this group
        row_of = np.full(len(wins), -1, dtype=np.int64)
        row_of[gw] = np.arange(len(gw))
        T = int(need[gw].max())
        buf: list[Tensor] = []
        c0 = 0
        while c0 < len(gw):  # clean runs, ~clean_tokens tokens each
            n = max(1, config.clean_tokens // int(need[gw[c0]]))
            while n > 1 and n * int(need[gw[min(len(gw), c0 + n) - 1]]) > config.clean_tokens:
                n -= 1
            cw = gw[c0 : c0 + n]
            Tc = int(need[cw].max())
            parts = _clean_parts(adapter, k, sequences, wins[cw], has[cw], held, Tc, dev)
            if len(cw) == len(gw):  # one forward holds the whole group
                buf = parts
                break
            if not buf:  # batch axis 0, position axis 1 or 2
                buf = [
                    t.new_zeros((len(gw), T, *t.shape[2:]))
                    if i < 2
                    else t.new_zeros((len(gw), t.shape[1], T, *t.shape[3:]))
                    for i, t in enumerate(parts)
                ]
            for i, t in enumerate(parts):
                if i < 2:
                    buf[i][c0 : c0 + len(cw), :Tc] = t
                else:
                    buf[i][c0 : c0 + len(cw), :, :Tc] = t
            c0 += len(cw)
        resid_L, resid_k = buf[0], buf[1]
        past = list(zip(buf[2::2], buf[3::2]))
        es = np.nonzero(row_of[inv] >= 0)[0]
        es = es[np.argsort(pos[es], kind="stable")]  # similar past lengths share a forward
        for b0 in range(0, len(es), config.batch_size):
            sub = es[b0 : b0 + config.batch_size]
            rows = torch.from_numpy(row_of[inv[sub]]).to(dev)
            p = torch.from_numpy(pos[sub]).to(dev)
            idx = (rows[:, None], p[:, None] + offs)
            clean = adapter.unembed(resid_L[idx])  # (R, K, V)
            x, a_f = ablate_rows(sae, resid_k[idx], torch.zeros_like(p), torch.from_numpy(feat[sub]), config.ablation)
            P = int(pos[sub].max())
            abl = adapter.run_positions_from(k, x, p, [(kk[rows, :, :P], vv[rows, :, :P]) for kk, vv in past])
            kl[sub] = kl_divergence(clean, abl).cpu().numpy()
            act[sub] = a_f.double().cpu().numpy()
            if hasattr(bar, "update"):
                bar.update(len(sub))


def _clean_parts(
    adapter: Any,
    k: int,
    sequences: Tensor,
    ws: np.ndarray,
    has: np.ndarray,
    held: dict[int, Tensor],
    T: int,
    dev: torch.device,
) -> list[Tensor]:
    """Clean state of windows ``ws`` over their first T positions: ``[resid_L, resid_k, k_1, v_1, ...]``
    (keys/values of the blocks above k); windows with ``has`` start from their held site-k stream."""
    out: list[list[Tensor]] = []
    if (~has).any():
        resid_L, resid_k, past = adapter.run_cached(sequences[torch.from_numpy(ws[~has]), :T].to(dev), k)
        out.append([resid_L, resid_k] + [t for kv in past for t in kv])
    if has.any():
        rows = [held[w][:T] for w in ws[has].tolist()]  # each covers its own need; zero-padded to T
        x = rows[0].new_zeros((len(rows), T, rows[0].shape[-1]))
        for i, r in enumerate(rows):
            x[i, : r.shape[0]] = r
        x = x.to(dev)
        resid_L, past = adapter.run_cached_from(k, x)
        out.append([resid_L, x] + [t for kv in past for t in kv])
    if len(out) == 1:
        return out[0]
    back = torch.from_numpy(np.argsort(np.concatenate([np.nonzero(~has)[0], np.nonzero(has)[0]]), kind="stable"))
    return [torch.cat(ts)[back.to(ts[0].device)] for ts in zip(*out)]


def _ablation_kl_prefix(
    adapter: Any,
    sae: Any,
    k: int,
    sequences: Tensor,
    examples: Examples,
    config: QScoreConfig,
    kl: np.ndarray,
    act: np.ndarray,
    bar: Any,
    fast: bool,
) -> None:
    """The ``"run_from"`` (``fast``) and ``"hooks"`` methods: clean runs once per window, each ablated copy
    re-runs its whole prefix (above the site when ``fast``)."""
    K, E = config.max_offset, len(examples)
    dev = adapter.device
    V = adapter.vocab_size
    itemsize = torch.empty((), dtype=next(iter(adapter.parameters())).dtype).element_size()
    block = max(config.batch_size, int(config.max_clean_bytes // max(1, K * V * itemsize)))
    pos_all = torch.from_numpy(examples.position)
    seq_all = torch.from_numpy(examples.seq_index)
    feat_all = torch.from_numpy(examples.feature)
    offs = torch.arange(K)
    for b0 in range(0, E, block):
        ids = torch.arange(b0, min(E, b0 + block))
        # clean: once per window, truncated to the longest prefix its examples need
        need: dict[int, int] = {}
        for e in ids.tolist():
            w = int(seq_all[e])
            need[w] = max(need.get(w, 0), int(pos_all[e]) + K)
        wins = sorted(need, key=lambda w: need[w])
        clean = torch.empty((len(ids), K, V), dtype=torch.float64 if itemsize == 8 else torch.float32)
        by_win: dict[int, list[int]] = {}
        for j, e in enumerate(ids.tolist()):
            by_win.setdefault(int(seq_all[e]), []).append(j)
        site: dict[int, Tensor] = {}  # clean stream at site k per window (fast path)
        for c0 in range(0, len(wins), config.batch_size):
            chunk = wins[c0 : c0 + config.batch_size]
            tok = _pad_rows([sequences[w, : need[w]] for w in chunk]).to(dev)
            if fast:
                logits, res = adapter.run(tok, return_residuals=True)
            else:
                logits = adapter.run(tok)
            for r, w in enumerate(chunk):
                if fast:
                    site[w] = res[k][r, : need[w]]
                for j in by_win[w]:
                    p = int(pos_all[ids[j]])
                    clean[j] = logits[r, p + offs].to(clean.dtype).cpu()
        # ablated copies: sorted by length, many (feature, context) pairs per forward
        order = sorted(range(len(ids)), key=lambda j: int(pos_all[ids[j]]))
        for c0 in range(0, len(order), config.batch_size):
            js = order[c0 : c0 + config.batch_size]
            es = ids[js]
            tok = _pad_rows([sequences[int(seq_all[e]), : int(pos_all[e]) + K] for e in es]).to(dev)
            p = pos_all[es].to(dev)
            f = feat_all[es]
            found: list[Tensor] = []

            def hook(x: Tensor, _k: int, p=p, f=f, found=found) -> Tensor:
                new, a_f = ablate_rows(sae, x, p, f, config.ablation)
                found.append(a_f)
                return new

            if fast:  # only the blocks above the site run; causal, so a clean prefix is exact
                L = max(int(pos_all[e]) + K for e in es)
                x = torch.zeros((len(js), L, adapter.d_model), dtype=site[int(seq_all[es[0]])].dtype, device=dev)
                for r, e in enumerate(es.tolist()):
                    n = int(pos_all[e]) + K
                    x[r, :n] = site[int(seq_all[e])][:n]
                logits = adapter.run_from(k, hook(x, k))
            else:
                logits = adapter.run(tok, hooks={k: hook})
            rows = torch.arange(len(js), device=logits.device)[:, None]
            abl = logits[rows, p[:, None] + offs.to(dev)].cpu()
            kl[es.numpy()] = kl_divergence(clean[js], abl).numpy()
            act[es.numpy()] = found[0].double().cpu().numpy()
            if hasattr(bar, "update"):
                bar.update(len(js))


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
    streams = None
    if examples is None:  # keep the selected windows' site-k streams for the cached clean runs
        keep = bool(getattr(adapter, "supports_cached_ablation", False)) and hasattr(adapter, "run_cached_from")
        found = find_top_contexts(adapter, sae, k, seqs, feats, config, first=first, return_streams=keep)
        examples, streams = found if keep else (found, None)
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
