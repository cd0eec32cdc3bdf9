"""Configuration and results of the Q(w) score (:mod:`.qscore`): :class:`QScoreConfig`, the selected
examples (:class:`Examples`), kept residual streams (:class:`SiteStreams`), per-feature values
(:class:`FeatureQ`), the result (:class:`QScoreResult`) and the merge of feature shards
(:func:`merge_results`)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from torch import Tensor

from ..errors import ConfigError, InputError
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
