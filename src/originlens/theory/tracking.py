"""Leading-term analysis of a training run over its checkpoints (arXiv 2601.19208 §5.1).

Given a run directory written by :func:`originlens.train.train_assoc` (``RUN/checkpoints/step-*.safetensors``,
``RUN/metrics.jsonl``, ``RUN/config.json``) and the statistics used as targets, this module computes:

* **tracking** (:func:`track_checkpoints`): per checkpoint and layer, the cosine and norm ratio of each
  learned matrix with its leading term (W_O vs B̄, V vs Φ̄ᵀB̄ᵀ, W vs Q̄, P vs Δ) and the Frobenius error
  against the theorem's scaled targets (coefficients use the checkpoint's step count s and the run's
  learning rate η);
* **null baselines** (:func:`baseline_cosines`): the same cosines against (a) leading terms of an
  unrelated corpus, restricted to the tokens both vocabularies share (:func:`shared_token_index`), (b)
  leading terms of a disjoint sample of the same corpus, (c) raw PMI matrices (:func:`pmi_matrix`) and
  (d) a random Gaussian matrix;
* the **causal intervention** of Table 3 (:func:`intervention_losses`, :func:`project_out`);
* **held-out losses** (:func:`heldout_losses`): trained model, the leading-term model of Eq. 12, a
  bigram-path and an add-1 conditional bigram baseline;
* **top associations** of example words under each basis and under the learned matrices.

:func:`analyse_run` runs everything and returns one JSON-able dict; :func:`write_report` renders it
(``RUN/report.html``, ``report.md``, ``report.json``).  Computation and plotting are separate.

Definitions of the baselines (documented choices, not from the paper):

* PMI of a pair distribution with counts c(a, b): ``PMI[a, b] = log(c(a,b) · n / (c(a,·) c(·,b)))``
  with n the total count and the marginals of the same pair distribution; pairs never observed (and
  tokens never seen) get 0.  Kinds: ``"bigram"`` (current x_t, next x_{t+1}) compared with W_O;
  ``"context"`` (prefix token x_m, target x_{t+1}) for all m ≤ t — rows = prefix (key) token, columns =
  target — compared with V (rows = key token); ``"query_key"`` (query x_t, key x_m, m ≤ t) compared with
  W.  Unlike Φ̄ the context counts are unweighted (no 1/(t+1)).
* Unrelated-corpus baseline: both the learned matrix and the null leading term are restricted to the
  shared tokens (by string; special tokens such as ``<unk>`` excluded) and the *true* cosine on the same
  restriction is reported next to it.  Without vocabularies the alignment is by id (same size only).
* Same-corpus baseline: statistics of windows disjoint from the ones the targets were computed on
  (held-out windows first, then training windows outside the statistics sample), same count.  Because SGD
  trains on all windows this baseline is expected to be *high*: it shows how much of the agreement is
  generic to the corpus rather than specific to the target sample (a weak null).
* Random baseline: cosine with one i.i.d. N(0, 1) matrix of the same shape (≈ N(0, 1/numel)).

Caveats: the theorem is for full-batch GD from zero init inside its validity window
(:func:`~originlens.theory.leading_terms.validity_window`); for SGD runs, first-batch statistics or steps
beyond the window the comparison is empirical, and the Frobenius bounds are reported only as a reference.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import CompatibilityError, ConfigError, InputError
from ..runs import list_checkpoints
from .leading_terms import (
    LeadingTermModel,
    _stat,
    compare_to_theory,
    conditional_bigram_loss,
    cosine,
    min_cosines,
    validity_window,
)

# weight kind -> name of its leading-term statistic
LEADING_TERM = {"W_O": "bigram", "V": "value_target", "W": "query_key", "P": "positional"}
KIND_LABEL = {"W": "attention W", "V": "value V", "W_O": "output W_O", "P": "position P"}
TARGET_LABEL = {"W_O": "B̄", "V": "Φ̄ᵀB̄ᵀ", "W": "Q̄", "P": "Δ"}
# colours of the paper's Figure 4 (attention red, value blue, output green) + P
KIND_COLOR = {"W": "#D55E00", "V": "#0072B2", "W_O": "#009E73", "P": "#CC79A7"}
PMI_KIND = {"W_O": "bigram", "V": "context", "W": "query_key"}
SPECIAL_TOKENS = ("<unk>", "<eot>", "<pad>", "<s>", "</s>")
EXAMPLE_WORDS = ("red", "to", "they", "happy", "wanted", "fish", "flower", "birds")


def _kind(name: str) -> str:
    return name.split(".")[0]


def _finite_or_none(x: Any) -> Any:
    """JSON-able copy with NaN/Inf replaced by None and numpy scalars by Python numbers."""
    if isinstance(x, Mapping):
        return {str(k): _finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_or_none(v) for v in x]
    if isinstance(x, np.ndarray):
        return _finite_or_none(x.tolist())
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


# ----------------------------------------------------------------------------------------------
# leading terms, checkpoints


def leading_terms(stats: Any) -> dict[str, np.ndarray]:
    """The four targets by weight kind: ``W_O`` → B̄, ``V`` → Φ̄ᵀB̄ᵀ, ``W`` → Q̄, ``P`` → Δ (float64)."""
    return {k: _stat(stats, s) for k, s in LEADING_TERM.items()}


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


def _check_shapes(weights: Mapping[str, np.ndarray], stats: Any) -> None:
    B, D = _stat(stats, "bigram"), _stat(stats, "positional")
    V, T = weights["W_O"].shape[0], weights["P.1"].shape[0]
    if B.shape != (V, V) or D.shape != (T,):
        raise CompatibilityError(
            f"statistics are {B.shape[0]}×{B.shape[1]} with T = {D.shape[0]}; the model has |V| = {V}, T = {T}",
            "use statistics of the run's own corpus (RUN/statistics) without a restricted token set",
        )


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
        _check_shapes(w, stats)
        cmp = compare_to_theory(w, stats, int(s), lr, variant=variant)
        mx: dict[str, float] = {}
        for name, rec in cmp.items():
            k = _kind(name)
            mx[k] = rec["cos"] if k not in mx else max(mx[k], rec["cos"])
        T = seq_len or w["P.1"].shape[0]
        Vs = vocab_size or w["W_O"].shape[0]
        win = validity_window(T, _n_layers(w), lr, Vs, variant=variant)
        rec = {
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
# baselines


def shared_token_index(
    vocab_a: Sequence[str] | None,
    vocab_b: Sequence[str] | None,
    *,
    size_a: int | None = None,
    size_b: int | None = None,
    exclude: Iterable[str] = SPECIAL_TOKENS,
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Indices ``(ia, ib, tokens)`` with ``vocab_a[ia[k]] == vocab_b[ib[k]] == tokens[k]`` for the tokens
    both vocabularies hold (order of ``vocab_a``), special tokens excluded.

    Without vocabularies (both None) the alignment is by id and needs ``size_a == size_b``.
    """
    if vocab_a is None or vocab_b is None:
        if vocab_a is None and vocab_b is None and size_a is not None and size_a == size_b:
            idx = np.arange(int(size_a))
            return idx, idx.copy(), [str(i) for i in idx]
        raise CompatibilityError(
            "cannot align the null statistics with the run: "
            + (
                "one side has no vocabulary"
                if (vocab_a is None) != (vocab_b is None)
                else f"sizes differ ({size_a} vs {size_b}) and there are no vocabularies"
            ),
            "use statistics computed from a corpus directory (they carry vocab.json)",
        )
    skip = set(exclude)
    pos_b = {t: i for i, t in enumerate(vocab_b)}
    ia, ib, toks = [], [], []
    for i, t in enumerate(vocab_a):
        if t in skip or t not in pos_b:
            continue
        ia.append(i)
        ib.append(pos_b[t])
        toks.append(t)
    return np.asarray(ia, dtype=np.int64), np.asarray(ib, dtype=np.int64), toks


def cooccurrence_counts(tokens: Any, vocab_size: int, kind: str, *, chunk: int = 256) -> np.ndarray:
    """Dense (|V|, |V|) int64 pair counts over windows ``tokens`` (N, T+1).

    ``kind``: ``"bigram"`` (x_t, x_{t+1}); ``"context"`` (x_m, x_{t+1}) for m ≤ t (rows = prefix token);
    ``"query_key"`` (x_t, x_m) for m ≤ t (rows = query token).
    """
    if kind not in ("bigram", "context", "query_key"):
        raise ConfigError(f"unknown co-occurrence kind '{kind}'", "use bigram, context or query_key")
    arr = np.asarray(tokens)
    if arr.ndim != 2 or arr.shape[1] < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise InputError(f"tokens must be an (N, T+1) integer array, got {arr.dtype} {arr.shape}", "pass windows")
    V = int(vocab_size)
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= V):
        raise InputError(f"token ids outside 0..{V - 1}", "pass the right vocab_size")
    T = arr.shape[1] - 1
    t_idx, m_idx = np.tril_indices(T)  # pairs (t, m) with m ≤ t
    counts = np.zeros(V * V, dtype=np.int64)
    for s in range(0, arr.shape[0], chunk):
        c = np.asarray(arr[s : s + chunk], dtype=np.int64)
        x, y = c[:, :-1], c[:, 1:]
        if kind == "bigram":
            flat = x * V + y
        elif kind == "context":
            flat = x[:, m_idx] * V + y[:, t_idx]
        else:
            flat = x[:, t_idx] * V + x[:, m_idx]
        counts += np.bincount(flat.ravel(), minlength=V * V)
    return counts.reshape(V, V)


def pmi_from_counts(counts: np.ndarray) -> np.ndarray:
    """PMI[a, b] = log(c(a,b)·n / (c(a,·)·c(·,b))) where c(a,b) > 0, else 0 (float64)."""
    c = np.asarray(counts, dtype=np.float64)
    n = c.sum()
    out = np.zeros_like(c)
    if n <= 0:
        return out
    row, col = c.sum(1), c.sum(0)
    nz = c > 0
    a, b = np.nonzero(nz)
    out[a, b] = np.log(c[a, b]) + math.log(n) - np.log(row[a]) - np.log(col[b])
    return out


def pmi_matrix(tokens: Any, vocab_size: int, kind: str) -> np.ndarray:
    """Raw PMI of a co-occurrence kind (see :func:`cooccurrence_counts` and the module docstring)."""
    return pmi_from_counts(cooccurrence_counts(tokens, vocab_size, kind))


def random_cosine(shape: tuple[int, ...], other: np.ndarray, seed: int = 0) -> float:
    """Cosine of ``other`` with one i.i.d. N(0, 1) matrix (float64, numpy seed ``seed``)."""
    g = np.random.default_rng(seed).standard_normal(shape)
    return cosine(g, other)


def baseline_cosines(
    weights: Mapping[str, Any],
    stats: Any,
    *,
    vocab: Sequence[str] | None = None,
    null_stats: Any = None,
    null_vocab: Sequence[str] | None = None,
    same_corpus_stats: Any = None,
    pmi: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
) -> dict[str, dict[str, Any]]:
    """Per weight: cosine with its leading term next to the null baselines (see module docstring).

    Keys per weight name: ``leading_term``; ``null_corpus`` and ``leading_term_shared`` (both on the shared
    tokens) and ``n_shared``; ``same_corpus``; ``pmi``; ``random``.  Missing inputs give no key.
    """
    w = {
        k: (v.detach().cpu().numpy() if torch.is_tensor(v) else np.asarray(v, dtype=np.float64))
        for k, v in weights.items()
    }
    _check_shapes(w, stats)
    lt = leading_terms(stats)
    null_lt = leading_terms(null_stats) if null_stats is not None else None
    same_lt = leading_terms(same_corpus_stats) if same_corpus_stats is not None else None
    ia = ib = None
    if null_lt is not None:
        ia, ib, _ = shared_token_index(vocab, null_vocab, size_a=lt["W_O"].shape[0], size_b=null_lt["W_O"].shape[0])
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(sorted(w, key=_order_key)):
        k = _kind(name)
        M = np.asarray(w[name], dtype=np.float64)
        rec: dict[str, Any] = {"leading_term": cosine(M, lt[k])}
        if null_lt is not None:
            if k == "P":
                if null_lt["P"].shape == M.shape:
                    rec["null_corpus"] = cosine(M, null_lt["P"])
                    rec["leading_term_shared"] = rec["leading_term"]
                    rec["n_shared"] = int(M.shape[0])
            elif len(ia):
                sub = M[np.ix_(ia, ia)]
                rec["null_corpus"] = cosine(sub, null_lt[k][np.ix_(ib, ib)])
                rec["leading_term_shared"] = cosine(sub, lt[k][np.ix_(ia, ia)])
                rec["n_shared"] = len(ia)
        if same_lt is not None:
            rec["same_corpus"] = cosine(M, same_lt[k])
        if pmi is not None and k in PMI_KIND and PMI_KIND[k] in pmi:
            rec["pmi"] = cosine(M, pmi[PMI_KIND[k]])
        rec["random"] = random_cosine(M.shape, M, seed + i)
        out[name] = rec
    return out


def _order_key(name: str) -> tuple[int, int]:
    if name == "W_O":
        return (0, 0)
    k, _, l = name.partition(".")
    return ({"W": 1, "V": 2, "P": 3}.get(k, 9), int(l) if l.isdigit() else 0)


# ----------------------------------------------------------------------------------------------
# losses and the causal intervention


def mean_loss(model: Any, tokens: Any, *, batch_size: int = 256) -> float:
    """Mean cross-entropy of an :class:`~originlens.models.assoc.AssocModel` over all positions of
    ``tokens`` (N, T+1), in batches, without gradients (sums accumulated in float64)."""
    arr = np.asarray(tokens)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 2:
        raise InputError(f"tokens must be (N, T+1) with N ≥ 1, got {arr.shape}", "pass token windows")
    total, count = 0.0, 0
    dev = next(model.parameters()).device
    with torch.no_grad():
        for s in range(0, arr.shape[0], int(batch_size)):
            b = torch.from_numpy(np.asarray(arr[s : s + batch_size], dtype=np.int64)).to(dev)
            logits = model(b[:, :-1])
            ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), b[:, 1:].reshape(-1), reduction="sum")
            total += float(ce)
            count += b[:, 1:].numel()
    return total / count


def project_out(M: Any, T: Any) -> np.ndarray:
    """``M − (⟨M, T⟩ / ‖T‖²) T`` in float64 (M unchanged when T = 0): removes M's component along T."""
    M = np.asarray(M.detach().cpu().numpy() if torch.is_tensor(M) else M, dtype=np.float64)
    T = np.asarray(T, dtype=np.float64)
    if M.shape != T.shape:
        raise InputError(f"cannot project a {M.shape} matrix onto a {T.shape} target", "pass matching shapes")
    tt = float(np.vdot(T, T))
    return M.copy() if tt == 0 else M - (float(np.vdot(M, T)) / tt) * T


def intervention_losses(
    model: Any, stats: Any, tokens: Any, *, names: Sequence[str] | None = None, batch_size: int = 256
) -> dict[str, Any]:
    """Table 3: for one weight at a time, remove its projection onto its leading term and recompute the
    mean cross-entropy on ``tokens`` (the model is restored afterwards).

    Returns ``{"original": loss, "losses": {name: {"loss", "delta", "coef", "residual_cos"}}}`` where
    ``coef`` = ⟨M,T⟩/‖T‖² (the removed multiple of T) and ``residual_cos`` = cos(M', T) of the weight as
    loaded into the model (≈ 0; float32 models round).
    """
    lt = leading_terms(stats)
    _check_shapes({n: p.detach().cpu().numpy() for n, p in model.named_weights()}, stats)
    base = mean_loss(model, tokens, batch_size=batch_size)
    out: dict[str, Any] = {"original": base, "losses": {}}
    names = list(names) if names is not None else [n for n, _ in model.named_weights()]
    for name in names:
        p = model.param(name)
        T = lt[_kind(name)]
        keep = p.detach().clone()
        M = keep.cpu().numpy().astype(np.float64)
        tt = float(np.vdot(T, T))
        coef = float(np.vdot(M, T)) / tt if tt > 0 else float("nan")
        with torch.no_grad():
            p.copy_(torch.from_numpy(project_out(M, T)).to(p.dtype))
        try:
            loss = mean_loss(model, tokens, batch_size=batch_size)
            resid = p.detach().cpu().numpy().astype(np.float64)
            rcos = (
                float(np.vdot(resid, T) / (np.linalg.norm(resid) * math.sqrt(tt)))
                if tt > 0 and np.linalg.norm(resid) > 0
                else float("nan")
            )
        finally:
            with torch.no_grad():
                p.copy_(keep)
        out["losses"][name] = {"loss": loss, "delta": loss - base, "coef": coef, "residual_cos": rcos}
    return out


def heldout_losses(
    model: Any, stats: Any, s: int, lr: float, eval_tokens: Any, train_tokens: Any, *, batch_size: int = 256
) -> dict[str, float]:
    """Mean cross-entropy on ``eval_tokens`` of: the trained model; the leading-term model of Eq. 12 with
    the scalars of step s (``leading_term_eq12``, L_eff = 1 as printed) and with the predicted weights in a
    full L-layer model (``leading_term_full``); its residual-only bigram path c_O·X B̄ (``bigram_path``);
    an add-1 conditional bigram fitted on ``train_tokens`` (``conditional_bigram``); uniform (ln |V|)."""
    V = int(model.vocab_size)
    lt = LeadingTermModel(stats, int(s), float(lr))
    ev = np.asarray(eval_tokens, dtype=np.int64)
    return {
        "trained": mean_loss(model, ev, batch_size=batch_size),
        "leading_term_eq12": lt.loss(ev, batch_size=batch_size),
        "leading_term_full": mean_loss(
            lt.as_model(model.n_layers).to(next(model.parameters()).device), ev, batch_size=batch_size
        ),
        "bigram_path": lt.bigram_loss(ev, batch_size=batch_size),
        "conditional_bigram": conditional_bigram_loss(np.asarray(train_tokens), ev, V, k=1.0),
        "uniform": math.log(V),
    }


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
        "bigram B̄": _stat(stats, "bigram"),
        "interchangeability Σ_B̄": _stat(stats, "interchangeability"),
        "context Φ̄": _stat(stats, "context"),
        "value target Φ̄ᵀB̄ᵀ": _stat(stats, "value_target"),
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


# ----------------------------------------------------------------------------------------------
# a whole run


@dataclass
class AnalysisConfig:
    """Options of :func:`analyse_run`.

    * ``eval_windows``: training windows (first n, unshuffled) for the intervention; 0 = all (paper).
    * ``null_windows``: cap on windows used for null / same-corpus statistics.
    * ``examples``: words whose top associations are listed; ``top_k`` how many.
    * ``intervention`` / ``heldout``: switch those parts off (they run the model over many windows).
    * ``full_stats``: when the targets come from a sample (first batch), also track the cosines with the
      leading terms of all training windows (what SGD over every batch follows).
    * ``device``: where the model runs for the intervention and held-out losses ("cpu", "cuda", "auto").
    """

    eval_windows: int = 2048
    null_windows: int = 2048
    examples: tuple[str, ...] = EXAMPLE_WORDS
    top_k: int = 10
    seed: int = 0
    intervention: bool = True
    heldout: bool = True
    batch_size: int = 256
    full_stats: bool = True
    device: str = "cpu"


@dataclass
class RunData:
    """What :func:`analyse_run` needs from a run directory (see :func:`load_run`)."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    stats: Any
    stats_manifest: dict[str, Any] = field(default_factory=dict)
    train_tokens: np.ndarray | None = None
    heldout_tokens: np.ndarray | None = None
    vocab: list[str] | None = None
    data_note: str = ""

    @property
    def lr(self) -> float:
        return float(self.config["config"]["lr"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["identity"]["vocab_size"])

    @property
    def seq_len(self) -> int:
        return int(self.config["identity"]["seq_len"])

    @property
    def n_layers(self) -> int:
        return int(self.config["config"]["n_layers"])

    @property
    def steps_per_epoch(self) -> int:
        return int(self.config.get("steps_per_epoch", 1))


def _load_npy(p: Path) -> np.ndarray:
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{p} is not a readable .npy file ({exc})", "re-run `originlens assoc train`") from None


def load_run(run_dir: str | Path, *, stats: Any = None, data: str | Path | None = None) -> RunData:
    """Read ``config.json``, ``metrics.jsonl``, the target statistics (``RUN/statistics`` unless ``stats``)
    and the token windows (``RUN/data/train.npy``, ``heldout.npy``, ``vocab.json`` as written by
    ``originlens assoc train``, or ``data``: a corpus directory or .npy file, all windows = training)."""
    from ..runs import RunDir
    from ..stats import load_statistics
    from ..storage import read_json

    p = Path(run_dir)
    if not (p / "config.json").is_file():
        raise InputError(
            f"{p} is not a training run (no config.json)",
            "pass a directory written by `originlens assoc train --out RUN`",
        )
    cfg = read_json(p / "config.json")
    if not isinstance(cfg, dict) or "identity" not in cfg or "config" not in cfg:
        raise InputError(f"{p / 'config.json'} is not an assoc training config", "pass an assoc run directory")
    metrics = RunDir(p, create=False).read_metrics()
    manifest: dict[str, Any] = {}
    if stats is None and (p / "statistics").is_dir():
        stats = load_statistics(p / "statistics")
        if (p / "statistics" / "manifest.json").is_file():
            manifest = read_json(p / "statistics" / "manifest.json")
    elif stats is None and not (p / "data" / "train.npy").is_file() and data is None:
        raise InputError(
            f"{p} has no statistics/ and no data/ (trained with --stats none or from Python)",
            "pass --stats DIR with statistics of this run's corpus, or --data CORPUS",
        )
    elif isinstance(stats, (str, Path)):
        stats = load_statistics(stats)
        manifest = {"source": "given (report --stats)", "windows": "given"}
    train = held = vocab = None
    note = ""
    if data is not None:
        from ..data import load_token_array

        toks, vocab, _ = load_token_array(data, int(cfg["identity"]["vocab_size"]))
        train = np.asarray(toks)
        note = f"windows from {data} (all treated as training windows)"
    elif (p / "data" / "train.npy").is_file():
        train = _load_npy(p / "data" / "train.npy")
        if (p / "data" / "heldout.npy").is_file():
            held = _load_npy(p / "data" / "heldout.npy")
            held = held if held.shape[0] else None
        if (p / "data" / "vocab.json").is_file():
            vocab = read_json(p / "data" / "vocab.json")
        note = "windows saved by `originlens assoc train` (RUN/data)"
    if stats is None:  # --stats none at training time: full statistics of the training windows
        from ..stats import corpus_statistics

        if train is None:
            raise InputError(f"{p} has no statistics/", "pass --stats DIR or --data CORPUS")
        stats = corpus_statistics(train, int(cfg["identity"]["vocab_size"]), vocab=vocab)
        manifest = {
            "source": "full (computed by the report: the run has no statistics/)",
            "windows": "all",
            "n_windows": int(train.shape[0]),
        }
    _check_run_statistics(p, stats, cfg, vocab)
    if vocab is None and getattr(stats, "vocab", None) is not None and stats.size == stats.vocab_size:
        vocab = list(stats.vocab)
    if train is not None:
        h = _tokens_hash(train)
        want = cfg["identity"].get("data_sha256")
        if want and h != want:
            note += " — WARNING: these windows are not the ones the run was trained on (hash differs)"
    return RunData(p, cfg, metrics, stats, manifest, train, held, vocab, note)


def _check_run_statistics(path: Path, stats: Any, cfg: Mapping[str, Any], vocab: Sequence[str] | None) -> None:
    """Statistics must match the run's |V|, T and (when both are known) token strings, unrestricted."""
    V, T = int(cfg["identity"]["vocab_size"]), int(cfg["identity"]["seq_len"])
    B, D = _stat(stats, "bigram"), _stat(stats, "positional")
    fix = "pass statistics of this run's own corpus (RUN/statistics), computed without --top-k"
    if B.shape != (V, V) or D.shape != (T,):
        raise CompatibilityError(
            f"statistics are {B.shape[0]}×{B.shape[1]} with T = {D.shape[0]}; the run {path} has |V| = {V}, T = {T}",
            fix,
        )
    if getattr(stats, "token_ids", None) is not None:
        raise CompatibilityError("the statistics are restricted to a token subset", fix)
    sv = getattr(stats, "vocab", None)
    if vocab is not None and sv is not None and list(sv) != list(vocab):
        raise CompatibilityError(f"the statistics were computed with another vocabulary than the run {path}", fix)


def _tokens_hash(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr, dtype=np.int64)
    h = hashlib.sha256(f"{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _stats_windows(run: RunData) -> np.ndarray | None:
    """Indices (into the training windows) the target statistics were computed on, if known."""
    w = run.stats_manifest.get("windows")
    if run.train_tokens is None:
        return None
    if w is None or isinstance(w, str):  # "all", or "given" statistics (source unknown: use all)
        return np.arange(run.train_tokens.shape[0])
    return np.asarray(w, dtype=np.int64)


def same_corpus_sample(run: RunData, n_max: int) -> tuple[np.ndarray | None, str]:
    """Windows disjoint from the statistics sample (held-out first), as many as that sample (≤ n_max)."""
    if run.train_tokens is None:
        return None, "no token windows available"
    used = _stats_windows(run)
    n_want = min(int(n_max), len(used)) if used is not None else int(n_max)
    parts, src = [], []
    if run.heldout_tokens is not None:
        parts.append(run.heldout_tokens[:n_want])
        src.append(f"{min(n_want, run.heldout_tokens.shape[0])} held-out")
    have = sum(p.shape[0] for p in parts)
    if have < n_want:
        mask = np.ones(run.train_tokens.shape[0], dtype=bool)
        if used is not None:
            mask[used] = False
        rest = np.nonzero(mask)[0][: n_want - have]
        if len(rest):
            parts.append(run.train_tokens[rest])
            src.append(f"{len(rest)} training windows outside the statistics sample")
    if not parts or sum(p.shape[0] for p in parts) == 0:
        return None, "no windows disjoint from the statistics sample"
    return np.concatenate(parts), " + ".join(src)


def resolve_null_statistics(
    spec: str | Path, seq_len: int, *, windows: int = 2048, seed: int = 0
) -> tuple[Any, list[str] | None, str]:
    """Null-corpus statistics from ``spec``: ``"storyworld"`` (a generated corpus, |V| = 500), a statistics
    directory / ``statistics.safetensors``, a corpus directory or an .npy token file (first ``windows``
    windows; longer windows are cut to T+1 tokens).  Returns ``(stats, vocab, description)``."""
    import tempfile

    from ..data import build_corpus, is_corpus_dir, load_token_array
    from ..stats import corpus_statistics, load_statistics

    spec_s = str(spec)
    if spec_s == "storyworld":
        with tempfile.TemporaryDirectory() as tmp:
            store = build_corpus(
                None, Path(tmp) / "c", storyworld_stories=2000, seed=seed, vocab_size=500, seq_len=seq_len
            )
            toks = np.asarray(store.tokens[:windows])
            vocab = list(store.vocab)
        st = corpus_statistics(toks, len(vocab), vocab=vocab)
        return (
            st,
            vocab,
            f"storyworld (2000 generated stories, seed {seed}, |V| = {len(vocab)}, {toks.shape[0]} windows)",
        )
    p = Path(spec_s)
    if (p.is_dir() and (p / "statistics.safetensors").is_file()) or p.suffix == ".safetensors":
        st = load_statistics(p)
        return st, (list(st.vocab) if st.vocab is not None else None), f"statistics {p}"
    if p.is_dir() and not is_corpus_dir(p):
        raise InputError(
            f"{p} is neither a statistics nor a corpus directory",
            "pass --null-corpus storyworld, a corpus directory or a statistics directory",
        )
    toks, vocab, manifest = load_token_array(p)
    toks = np.asarray(toks[:windows])
    if toks.shape[1] > seq_len + 1:
        toks = toks[:, : seq_len + 1]
    V = len(vocab) if vocab is not None else int(toks.max()) + 1
    st = corpus_statistics(toks, V, vocab=vocab)
    return st, (list(vocab) if vocab is not None else None), f"corpus {p} ({toks.shape[0]} windows, |V| = {V})"


def _final_weights(run: RunData) -> tuple[int, dict[str, np.ndarray], Path]:
    ck = checkpoint_files(run.path)
    final = run.path / "model.safetensors"
    if final.is_file():
        from ..storage import load_tensors

        _, meta = load_tensors(final)
        s = int(json.loads(meta.get("step", "0"))) if meta.get("step") else (ck[-1][0] if ck else 0)
        return s, load_weights(final), final
    if not ck:
        raise InputError(f"{run.path} holds no checkpoint and no model.safetensors", "train the run first")
    return ck[-1][0], load_weights(ck[-1][1]), ck[-1][1]


def analyse_run(
    run: RunData, cfg: AnalysisConfig | None = None, *, null: tuple[Any, Any, str] | None = None
) -> dict[str, Any]:
    """Everything the report shows, as one JSON-able dict (NaN → None).  ``null`` = the output of
    :func:`resolve_null_statistics` (optional)."""
    from ..models.assoc import AssocConfig, AssocModel
    from ..stats import corpus_statistics

    cfg = cfg or AnalysisConfig()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    warnings: list[str] = []
    c = run.config["config"]
    optimizer = run.config.get("optimizer", "sgd" if c.get("batch_size") else "gd")
    win = validity_window(run.seq_len, run.n_layers, run.lr, run.vocab_size)
    info = {
        "path": str(run.path),
        "optimizer": optimizer,
        "lr": run.lr,
        "n_layers": run.n_layers,
        "vocab_size": run.vocab_size,
        "seq_len": run.seq_len,
        "batch_size": c.get("batch_size"),
        "init": c.get("init"),
        "init_std": c.get("init_std"),
        "dtype": c.get("dtype"),
        "n_sequences": run.config["identity"].get("n_sequences"),
        "steps_per_epoch": run.steps_per_epoch,
        "total_steps": run.config.get("total_steps"),
        "stats_source": run.stats_manifest.get("source", "given"),
        "stats_windows": (run.stats_manifest.get("n_windows")),
        "data": run.data_note,
        "theory_note": (
            "theory: full-batch GD from zero init; this run uses "
            + ("full-batch GD" if optimizer == "gd" else "minibatch SGD (empirical comparison)")
            + ("" if c.get("init") == "zero" else f", {c.get('init')} init")
        ),
    }
    window = {
        "conditions": win.conditions,
        "holds": win.holds,
        "s_max": win.s_max,
        "steps": win.steps,
        "theorem": win.theorem,
    }

    losses = [
        [int(r["step"]), float(r.get("epoch", r["step"] / run.steps_per_epoch)), r.get("loss")]
        for r in run.metrics
        if r.get("event") == "step"
    ]

    # -- tracking over checkpoints
    ck = checkpoint_files(run.path)
    if not ck:
        raise InputError(f"{run.path} holds no checkpoint", "train the run first (checkpoints/ is empty)")

    def gen() -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        for s, f in ck:
            yield s, load_weights(f)

    other = None
    used = _stats_windows(run)
    if cfg.full_stats and run.train_tokens is not None and used is not None and len(used) < run.train_tokens.shape[0]:
        other = {"full_train": corpus_statistics(run.train_tokens, run.vocab_size)}
    records = track_checkpoints(
        gen(),
        run.stats,
        run.lr,
        steps_per_epoch=run.steps_per_epoch,
        seq_len=run.seq_len,
        vocab_size=run.vocab_size,
        other_stats=other,
    )
    dups = [[a["step"], b["step"]] for a, b in zip(records, records[1:]) if a["hash"] == b["hash"]]
    if dups:
        warnings.append(f"consecutive checkpoints with identical weights: {dups} (mislabelled or duplicated?)")
    timings["tracking_s"] = time.perf_counter() - t0

    s_final, w_final, final_path = _final_weights(run)
    from ..devices import resolve_device

    model = AssocModel(
        AssocConfig(
            vocab_size=run.vocab_size, seq_len=run.seq_len, n_layers=run.n_layers, dtype=c.get("dtype", "float32")
        )
    ).to(resolve_device(cfg.device))
    model.load_weights(w_final)

    # -- baselines on the final weights
    t1 = time.perf_counter()
    pmi = None
    base_notes = []
    if run.train_tokens is not None:
        used = _stats_windows(run)
        sample = run.train_tokens[used] if used is not None else run.train_tokens
        pmi = {k: pmi_matrix(sample, run.vocab_size, k) for k in ("bigram", "context", "query_key")}
        base_notes.append(f"PMI from the {sample.shape[0]} windows of the target statistics")
    same_st = None
    if run.train_tokens is not None:
        same, src = same_corpus_sample(run, cfg.null_windows)
        if same is not None:
            same_st = corpus_statistics(same, run.vocab_size)
            base_notes.append(f"same-corpus statistics from {src}")
        else:
            base_notes.append(f"no same-corpus baseline: {src}")
    null_st = null_vocab = None
    if null is not None:
        null_st, null_vocab, desc = null
        base_notes.append(f"null corpus: {desc}")
    baselines = baseline_cosines(
        w_final,
        run.stats,
        vocab=run.vocab,
        null_stats=null_st,
        null_vocab=null_vocab,
        same_corpus_stats=same_st,
        pmi=pmi,
        seed=cfg.seed,
    )
    timings["baselines_s"] = time.perf_counter() - t1

    # -- causal intervention
    interv = None
    if cfg.intervention and run.train_tokens is not None:
        t1 = time.perf_counter()
        n = (
            run.train_tokens.shape[0]
            if cfg.eval_windows in (0, None)
            else min(cfg.eval_windows, run.train_tokens.shape[0])
        )
        interv = intervention_losses(model, run.stats, run.train_tokens[:n], batch_size=cfg.batch_size)
        interv["windows"] = int(n)
        interv["source"] = (
            f"first {n} of {run.train_tokens.shape[0]} training windows (unshuffled)"
            if n < run.train_tokens.shape[0]
            else "all training windows (unshuffled)"
        )
        timings["intervention_s"] = time.perf_counter() - t1
    elif cfg.intervention:
        warnings.append("no token windows: intervention skipped (pass --data)")

    # -- held-out losses
    held = None
    if cfg.heldout and run.train_tokens is not None:
        t1 = time.perf_counter()
        if run.heldout_tokens is not None:
            ev, src = run.heldout_tokens, f"{run.heldout_tokens.shape[0]} held-out windows (never trained on)"
        else:
            n = min(cfg.eval_windows or run.train_tokens.shape[0], run.train_tokens.shape[0])
            ev, src = run.train_tokens[-n:], f"last {n} TRAINING windows (the run has no held-out set)"
        held = heldout_losses(model, run.stats, s_final, run.lr, ev, run.train_tokens, batch_size=cfg.batch_size)
        held["source"] = src
        held["step"] = s_final
        timings["heldout_s"] = time.perf_counter() - t1

    examples = example_associations(run.stats, w_final, run.vocab, cfg.examples, cfg.top_k)
    missing = [w for w in cfg.examples if run.vocab is not None and w not in examples]
    if missing:
        warnings.append(f"example words not in the vocabulary: {', '.join(missing)}")
    timings["total_s"] = time.perf_counter() - t0
    return _finite_or_none(
        {
            "run": info,
            "validity_window": window,
            "loss_curve": losses,
            "checkpoints": records,
            "min_cosine_over_training": min_over_training(records),
            "min_cosine_over_training_full_train": min_over_training(records, "full_train") if other else None,
            "final": {
                "step": s_final,
                "path": str(final_path),
                "theory": records[-1]["theory"]
                if records[-1]["step"] == s_final
                else compare_to_theory(w_final, run.stats, s_final, run.lr),
            },
            "baselines": {"step": s_final, "per_weight": baselines, "notes": base_notes},
            "intervention": interv,
            "heldout": held,
            "examples": examples,
            "warnings": warnings,
            "timings": timings,
        }
    )


# ----------------------------------------------------------------------------------------------
# rendering


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
