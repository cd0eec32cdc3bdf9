"""Leading-term analysis of a training run over its checkpoints (arXiv 2601.19208 §5.1).

Given the checkpoints of a run of :func:`originlens.train.train_assoc` (``RUN/checkpoints/step-*.safetensors``)
and the statistics used as targets, this module computes:

* **tracking** (:func:`track_checkpoints`): per checkpoint and layer, the cosine and norm ratio of each
  learned matrix with its leading term (W_O vs B̄, V vs Φ̄ᵀB̄ᵀ, W vs Q̄, P vs Δ) and the Frobenius error
  against the theorem's scaled targets (coefficients use the checkpoint's step count s and the run's
  learning rate η); :func:`min_over_training` is the paper's Table 1;
* **top associations** (:func:`example_associations`) of example words under each basis and under the
  learned matrices.

A whole run — reading its directory, the nulls, the intervention, the report — is the leading-terms
experiment's (:mod:`originlens.experiments.leading_analysis`, :mod:`originlens.experiments.leading_report`);
this module knows matrices and checkpoints, not the run directory's other files.

Caveats: the theorem is for full-batch GD from zero init inside its validity window
(:func:`~originlens.theory.leading_terms.validity_window`); for SGD runs, first-batch statistics or steps
beyond the window the comparison is empirical, and the Frobenius bounds are reported only as a reference.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import CompatibilityError
from ..runs import list_checkpoints
from .leading_terms import (
    LEADING_TERM,
    compare_to_theory,
    cosine,
    leading_terms,
    min_cosines,
    statistic_of,
    validity_window,
)
from .nulls import SPECIAL_TOKENS, _kind, check_shapes

KIND_LABEL = {"W": "attention W", "V": "value V", "W_O": "output W_O", "P": "position P"}
TARGET_LABEL = {"W_O": "B̄", "V": "Φ̄ᵀB̄ᵀ", "W": "Q̄", "P": "Δ"}
EXAMPLE_WORDS = ("red", "to", "they", "happy", "wanted", "fish", "flower", "birds")


def finite_or_none(x: Any) -> Any:
    """JSON-able copy with NaN/Inf replaced by None and numpy scalars by Python numbers."""
    if isinstance(x, Mapping):
        return {str(k): finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    if isinstance(x, np.ndarray):
        return finite_or_none(x.tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


# ----------------------------------------------------------------------------------------------
# checkpoints


def checkpoint_files(run_dir: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of ``RUN/checkpoints/step-NNNNNN.safetensors``, sorted by step
    (:func:`originlens.runs.list_checkpoints`)."""
    return list_checkpoints(run_dir)


def load_weights(path: str | Path) -> dict[str, np.ndarray]:
    """Weights (``W_O``, ``W.l``, ``V.l``, ``P.l``) of a checkpoint or ``model.safetensors``."""
    from ..models.assoc import CHECKPOINT_KIND, MODEL_KIND
    from ..storage import load_tensors

    arrays, meta = load_tensors(path)
    if meta.get("kind") not in (CHECKPOINT_KIND, MODEL_KIND):
        raise CompatibilityError(
            f"{path} holds '{meta.get('kind')}', not AssocModel weights",
            "pass a checkpoint or model.safetensors written by train_assoc",
        )
    w = {k: v for k, v in arrays.items() if k == "W_O" or re.fullmatch(r"[WVP]\.\d+", k)}
    if "W_O" not in w or "W.1" not in w:
        raise CompatibilityError(f"{path} lacks W_O or W.1", "pass a checkpoint written by train_assoc")
    return w


def _n_layers(weights: Mapping[str, Any]) -> int:
    return sum(1 for k in weights if k.startswith("W."))


def weight_hash(weights: Mapping[str, np.ndarray]) -> str:
    """Short hash of all weights (to detect duplicated checkpoints)."""
    h = hashlib.sha256()
    for k in sorted(weights):
        h.update(k.encode())
        h.update(np.ascontiguousarray(weights[k]).tobytes())
    return h.hexdigest()[:16]


def track_checkpoints(
    checkpoints: Iterable[tuple[int, Mapping[str, Any]]],
    stats: Any,
    lr: float,
    *,
    steps_per_epoch: int = 1,
    variant: str | None = None,
    seq_len: int | None = None,
    vocab_size: int | None = None,
    other_stats: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Compare every checkpoint with the leading terms.

    ``checkpoints``: ``(step s, weights)`` pairs (weights keyed ``W_O``, ``W.l``, ``V.l``, ``P.l``; numpy or
    torch).  Returns one record per checkpoint: ``step``, ``epoch`` (= s / steps_per_epoch),
    ``theory`` = :func:`~originlens.theory.leading_terms.compare_to_theory` (per weight: ``cos``,
    ``norm_ratio``, ``frob_err``, ``rel_err``, ``bound``), ``min_cos`` / ``max_cos`` over layers per kind,
    ``in_window`` (the theorem's conditions hold and s ≤ s_max) and ``hash`` (duplicate detection).
    ``other_stats`` (label → statistics, e.g. the full training set when the targets come from the first
    batch) adds ``cos_vs[label][name]`` and ``min_cos_vs[label][kind]``.
    """
    others = {lab: leading_terms(st) for lab, st in (other_stats or {}).items()}
    out = []
    for s, w in checkpoints:
        w = {k: (v.detach().cpu().numpy() if torch.is_tensor(v) else np.asarray(v)) for k, v in w.items()}
        check_shapes(w, stats)
        cmp = compare_to_theory(w, stats, int(s), lr, variant=variant)
        mx: dict[str, float] = {}
        for name, c in cmp.items():
            k = _kind(name)
            mx[k] = c["cos"] if k not in mx else max(mx[k], c["cos"])
        T = seq_len or w["P.1"].shape[0]
        Vs = vocab_size or w["W_O"].shape[0]
        win = validity_window(T, _n_layers(w), lr, Vs, variant=variant)
        rec: dict[str, Any] = {
            "step": int(s),
            "epoch": int(s) / max(1, int(steps_per_epoch)),
            "theory": cmp,
            "min_cos": min_cosines(cmp),
            "max_cos": mx,
            "in_window": bool(win.covers(int(s))),
            "hash": weight_hash(w),
        }
        if others:
            rec["cos_vs"] = {lab: {n: cosine(w[n], lt[_kind(n)]) for n in cmp} for lab, lt in others.items()}
            rec["min_cos_vs"] = {
                lab: min_cosines({n: {"cos": c} for n, c in cv.items()}) for lab, cv in rec["cos_vs"].items()
            }
        out.append(rec)
    return out


def min_over_training(records: Sequence[Mapping[str, Any]], other: str | None = None) -> dict[str, float]:
    """Table 1: minimum cosine over checkpoints and layers per kind (NaN entries — a weight still exactly
    zero at the first steps — are skipped; NaN if never defined).  ``other``: use ``min_cos_vs[other]``."""
    out: dict[str, float] = {}
    for kind in LEADING_TERM:
        vals = [(r["min_cos"] if other is None else r["min_cos_vs"][other]).get(kind, float("nan")) for r in records]
        vals = [v for v in vals if v is not None and math.isfinite(v)]
        out[kind] = min(vals) if vals else float("nan")
    return out


# ----------------------------------------------------------------------------------------------
# associations


def top_row(M: np.ndarray, i: int, vocab: Sequence[str], k: int, *, exclude: Iterable[int] = ()) -> list:
    """The k largest entries of row i of M as ``[token, value]`` (self and ``exclude`` ids skipped)."""
    v = np.array(M[i], dtype=np.float64)
    v[i] = -np.inf
    for j in exclude:
        v[j] = -np.inf
    k = int(min(k, np.isfinite(v).sum()))
    top = np.argsort(-v, kind="stable")[:k]
    return [[vocab[j], float(v[j])] for j in top]


def example_associations(
    stats: Any, weights: Mapping[str, Any], vocab: Sequence[str] | None, words: Sequence[str], k: int = 10
) -> dict[str, dict[str, list]]:
    """Top-k row entries of each example word under B̄, Σ_B̄, Φ̄ (statistics) and under the learned W_O and
    V.1 next to their leading terms B̄ and Φ̄ᵀB̄ᵀ.  Words outside the vocabulary are skipped."""
    if vocab is None:
        return {}
    pos = {t: i for i, t in enumerate(vocab)}
    specials = [pos[t] for t in SPECIAL_TOKENS if t in pos]
    mats = {
        "bigram B̄": statistic_of(stats, "bigram"),
        "interchangeability Σ_B̄": statistic_of(stats, "interchangeability"),
        "context Φ̄": statistic_of(stats, "context"),
        "value target Φ̄ᵀB̄ᵀ": statistic_of(stats, "value_target"),
        "learned W_O": np.asarray(weights["W_O"], dtype=np.float64),
    }
    if "V.1" in weights:
        mats["learned V.1"] = np.asarray(weights["V.1"], dtype=np.float64)
    out: dict[str, dict[str, list]] = {}
    for w in words:
        if w not in pos:
            continue
        out[w] = {name: top_row(M, pos[w], vocab, k, exclude=specials) for name, M in mats.items()}
    return out
