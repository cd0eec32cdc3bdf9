"""Measurements of the formal-feature experiment (:mod:`originlens.experiments.formal`): feature labels from
activation mass per domain, σ(ln Q) by label with bootstrap and permutation nulls, rank correlations with a
permutation null, and the code / punctuation content of generated text.  NumPy and SciPy only; no model.

Feature labels (:func:`domain_masses`, :func:`label_features`).  For an SAE activation matrix ``acts``
``(n_tokens, F)`` (non-negative) over a labelling sample whose tokens carry a domain (``0`` = story,
``1`` = python) and in which both domains have the same number of tokens, the python share of feature f is
``s_f = Σ_{t∈python} a_tf / Σ_t a_tf``.  Rule: **dead** (label −1) when ``Σ_t a_tf = 0`` (excluded
everywhere); **formal** (1) when ``s_f ≥ θ``; **other** (0) when ``s_f < θ`` — a partition of the live
features, as in the paper's "formal vs other".  The features with ``s_f ≤ 1 − θ`` (story features) are a
subset of "other", reported beside it as a sensitivity check.

σ(ln Q) (:func:`sigma_log`, :func:`bootstrap_sigma`, :func:`permutation_sigma`): the sample standard
deviation (ddof = 1) of ``ln Q`` over the features of one label that have a finite positive Q; bootstrap
resamples features with replacement within each label (percentile interval of each σ and of the
difference formal − other); the permutation null shuffles the labels among the scored live features and
gives the one-sided p of "σ_formal − σ_other ≥ observed", ``(1 + #{Δ_perm ≥ Δ}) / (1 + n_perm)``.

Generated text (:func:`code_fraction`, :func:`punctuation_fraction`).  Our BPE splits text with the
Whitespace pre-tokenizer (pieces ``\\w+`` and ``[^\\w\\s]+``) and drops whitespace, so decoded samples have
no newlines or indentation and Python's parser cannot judge them; the code criterion is therefore lexical,
applied to those same pieces (so it gives the same value on a source text and on its decoding).  A piece
is **code** when

* it has no word character and contains one of ``= ( ) [ ] { } < > # * / + % @ | & ^ ~ \\ ` $``
  (brackets, operators, comment and decorator signs; ``. , ; : ! ? ' " -`` alone are prose punctuation), or
* it is a word that contains ``_``, has a lower-case letter directly followed by an upper-case one
  (camelCase), starts with a digit and contains a letter (``0x1f``), or is one of :data:`PY_WORDS`
  (Python keywords and built-ins that are not also common English words: ``def``, ``self``, ``None``,
  ``isinstance``, ``elif`` …; ``if``, ``for``, ``in``, ``return``, ``list`` … are left out).

``code_fraction(text)`` = characters in code pieces / characters in all pieces (NaN without pieces).
``punctuation_fraction(text)`` = characters of :data:`string.punctuation` / non-whitespace characters.
Caveat: the lexical rule undercounts code (identifiers without ``_`` and English-looking keywords are
prose) and a BPE fragment of a rare English word can match a listed name (``str`` in ``in str ument``);
:func:`python_token_share` is a corpus-based check beside it: a token's python share
``r_py / (r_py + r_story)`` (its add-one rate per token of each domain's training windows), and
:func:`python_token_fraction` the fraction of generated tokens whose share is ≥ the labelling threshold.

Per-seed statistics (:func:`feature_statistics`, :func:`steering_statistics`) are computed from the arrays
the experiment stores, so a results file can be recomputed from its run directory.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Sequence
from typing import Any

import numpy as np

STORY, PYTHON = 0, 1
DOMAINS = ("story", "python")
FORMAL, OTHER, DEAD = 1, 0, -1
RULE = (
    "python share s_f = activation mass on python tokens / all mass over the analysis windows (equal tokens "
    "per domain); formal: s_f ≥ threshold; other: the remaining live features; dead (no mass): excluded"
)
PIECE = re.compile(r"\w+|[^\w\s]+")  # the pieces of the Whitespace pre-tokenizer
CODE_SYMBOLS = frozenset("=()[]{}<>#*/+%@|&^~\\`$")
PY_WORDS = frozenset(
    [
        "def",
        "elif",
        "lambda",
        "None",
        "True",
        "False",
        "self",
        "cls",
        "nonlocal",
        "assert",
        "async",
        "await",
        "del",
        "except",
        "finally",
        "raise",
        "isinstance",
        "issubclass",
        "len",
        "str",
        "int",
        "dict",
        "tuple",
        "bool",
        "float",
        "bytes",
        "bytearray",
        "frozenset",
        "enumerate",
        "getattr",
        "setattr",
        "hasattr",
        "delattr",
        "callable",
        "repr",
        "staticmethod",
        "classmethod",
        "kwargs",
        "args",
        "sorted",
        "reversed",
        "divmod",
        "ord",
        "chr",
        "hex",
        "isdigit",
        "startswith",
        "endswith",
        "rstrip",
        "lstrip",
        "splitlines",
        "setdefault",
        "iteritems",
        "itervalues",
        "NotImplemented",
        "Exception",
        "BaseException",
        "ValueError",
        "TypeError",
        "KeyError",
        "IndexError",
        "AttributeError",
        "RuntimeError",
        "OSError",
        "ImportError",
        "StopIteration",
        "NotImplementedError",
        "AssertionError",
    ]
)
_CAMEL = re.compile(r"[a-z][A-Z]")
_DIGIT_WORD = re.compile(r"\d\w*[A-Za-z]")
_PUNCT = frozenset(string.punctuation)


# ----------------------------------------------------------------------------------------------------
# feature labels


def domain_masses(acts: np.ndarray, domain: np.ndarray) -> np.ndarray:
    """Activation mass per domain ``(2, F)``: row d = ``Σ_{t: domain_t = d} acts[t]``."""
    a = np.asarray(acts, dtype=np.float64)
    d = np.asarray(domain)
    if a.ndim != 2 or d.shape != (a.shape[0],):
        raise ValueError(f"acts (n, F) and domain (n,) needed, got {a.shape} and {d.shape}")
    return np.stack([a[d == STORY].sum(0), a[d == PYTHON].sum(0)])


def python_shares(masses: np.ndarray) -> np.ndarray:
    """``s_f`` = python mass / total mass ``(F,)``; NaN for a feature without mass (dead)."""
    m = np.asarray(masses, dtype=np.float64)
    total = m.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, m[PYTHON] / np.where(total > 0, total, 1.0), np.nan)


def label_features(share: np.ndarray, threshold: float) -> np.ndarray:
    """Labels ``(F,)`` int8: 1 formal (s ≥ θ), 0 other (s < θ), −1 dead (s NaN)."""
    if not 0.5 <= threshold <= 1:
        raise ValueError(f"threshold must lie in [0.5, 1], got {threshold}")
    s = np.asarray(share, dtype=np.float64)
    out = np.full(s.shape, DEAD, dtype=np.int8)
    live = np.isfinite(s)
    out[live & (s >= threshold)] = FORMAL
    out[live & (s < threshold)] = OTHER
    return out


def share_histogram(share: np.ndarray, bins: int = 10) -> dict[str, Any]:
    """Counts of the live features' python shares in ``bins`` equal bins of [0, 1]."""
    s = np.asarray(share, dtype=np.float64)
    counts, edges = np.histogram(s[np.isfinite(s)], bins=bins, range=(0.0, 1.0))
    return {"edges": edges.tolist(), "counts": counts.astype(int).tolist(), "dead": int((~np.isfinite(s)).sum())}


# ----------------------------------------------------------------------------------------------------
# σ(ln Q)


def log_q(q: np.ndarray) -> np.ndarray:
    """``ln q`` with NaN where q is not finite and positive."""
    q = np.asarray(q, dtype=np.float64)
    ok = np.isfinite(q) & (q > 0)
    return np.where(ok, np.log(np.where(ok, q, 1.0)), np.nan)


def sigma_log(q: np.ndarray) -> float:
    """Sample standard deviation (ddof = 1) of ln q over finite positive q (NaN for fewer than 2)."""
    v = log_q(q)
    v = v[np.isfinite(v)]
    return float(v.std(ddof=1)) if v.size >= 2 else math.nan


def _groups(q: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lq = log_q(q)
    lab = np.asarray(labels)
    ok = np.isfinite(lq)
    return lq[ok & (lab == FORMAL)], lq[ok & (lab == OTHER)]


def _boot_sd(v: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    if v.size < 2:
        return np.full(n_boot, np.nan)
    return v[rng.integers(0, v.size, (n_boot, v.size))].std(axis=1, ddof=1)


def bootstrap_sigma(
    q: np.ndarray, labels: np.ndarray, *, n_boot: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, Any]:
    """σ(ln Q) of the formal and the other features and their difference, each with a percentile bootstrap
    interval over features (resampled within each label, ``n_boot`` draws)."""
    f, o = _groups(q, labels)
    rng = np.random.default_rng(seed)
    bf, bo = _boot_sd(f, n_boot, rng), _boot_sd(o, n_boot, rng)
    lo, hi = 0.5 - confidence / 2, 0.5 + confidence / 2

    def ci(est: float, draws: np.ndarray) -> dict[str, Any]:
        ok = np.isfinite(draws)
        if not math.isfinite(est) or not ok.any():
            return {"estimate": est, "low": None, "high": None}
        a, b = np.quantile(draws[ok], [lo, hi])
        return {"estimate": est, "low": float(a), "high": float(b)}

    sf = float(f.std(ddof=1)) if f.size >= 2 else math.nan
    so = float(o.std(ddof=1)) if o.size >= 2 else math.nan
    return {
        "n_formal": int(f.size),
        "n_other": int(o.size),
        "formal": ci(sf, bf),
        "other": ci(so, bo),
        "difference": ci(sf - so, bf - bo),
        "interval": f"percentile bootstrap over features within each label, {n_boot} resamples, {confidence:g}",
    }


def permutation_sigma(q: np.ndarray, labels: np.ndarray, *, n_perm: int = 2000, seed: int = 0) -> dict[str, Any]:
    """One-sided permutation p of "σ_formal − σ_other ≥ observed" with the labels shuffled among the
    scored live features."""
    f, o = _groups(q, labels)
    if f.size < 2 or o.size < 2:
        return {"observed": math.nan, "p": None, "n_perm": n_perm}
    obs = float(f.std(ddof=1) - o.std(ddof=1))
    pooled = np.concatenate([f, o])
    rng = np.random.default_rng(seed)
    perm = np.argsort(rng.random((n_perm, pooled.size)), axis=1)
    x = pooled[perm]
    d = x[:, : f.size].std(axis=1, ddof=1) - x[:, f.size :].std(axis=1, ddof=1)
    return {"observed": obs, "p": float((1 + np.sum(d >= obs - 1e-12)) / (1 + n_perm)), "n_perm": n_perm}


def extreme_enrichment(q: np.ndarray, labels: np.ndarray, tail: float = 0.1) -> dict[str, Any]:
    """Share of formal features among the extreme-Q features (ln Q below its ``tail`` quantile or above
    its 1 − ``tail`` quantile over the scored live features) against the share among all of them."""
    f, o = _groups(q, labels)
    lq = np.concatenate([f, o])
    is_f = np.concatenate([np.ones(f.size, bool), np.zeros(o.size, bool)])
    if lq.size < 4:
        return {"extreme_formal_share": math.nan, "formal_share": math.nan, "enrichment": math.nan, "n_extreme": 0}
    a, b = np.quantile(lq, [tail, 1 - tail])
    ext = (lq <= a) | (lq >= b)
    es, base = float(is_f[ext].mean()), float(is_f.mean())
    return {"extreme_formal_share": es, "formal_share": base, "enrichment": es - base, "n_extreme": int(ext.sum())}


# ----------------------------------------------------------------------------------------------------
# rank correlation with a permutation null


def _ranks(v: np.ndarray) -> np.ndarray:
    from scipy.stats import rankdata

    return rankdata(v)


def spearman_permutation(
    x: np.ndarray, y: np.ndarray, *, n_perm: int = 2000, seed: int = 0, alternative: str = "less"
) -> dict[str, Any]:
    """Spearman's ρ of the finite pairs of ``x`` and ``y``, its 95 % interval (Fisher z) and its permutation
    p (``y`` shuffled): one-sided ``"less"`` (ρ ≤ observed) or ``"greater"``."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    m = np.isfinite(x) & np.isfinite(y)
    n = int(m.sum())
    if n < 3 or np.ptp(x[m]) == 0 or np.ptp(y[m]) == 0:
        return {
            "rho": math.nan,
            "low": None,
            "high": None,
            "p": None,
            "n": n,
            "n_perm": n_perm,
            "alternative": alternative,
        }
    rx, ry = _ranks(x[m]), _ranks(y[m])
    rx = (rx - rx.mean()) / np.linalg.norm(rx - rx.mean())
    ry = (ry - ry.mean()) / np.linalg.norm(ry - ry.mean())
    rho = float(rx @ ry)
    rng = np.random.default_rng(seed)
    perm = np.argsort(rng.random((n_perm, n)), axis=1)
    null = ry[perm] @ rx
    hit = null <= rho + 1e-12 if alternative == "less" else null >= rho - 1e-12
    out = {"rho": rho, "low": None, "high": None, "p": float((1 + hit.sum()) / (1 + n_perm)), "n": n}
    if n > 3:  # Fisher z with the Fieller–Hartley–Pearson standard error of Spearman's ρ, √(1.06 / (n − 3))
        z, half = math.atanh(max(-1 + 1e-12, min(1 - 1e-12, rho))), 1.959963984540054 * math.sqrt(1.06 / (n - 3))
        out.update(low=math.tanh(z - half), high=math.tanh(z + half))
    return {**out, "n_perm": n_perm, "alternative": alternative, "interval": "Fisher z, SE √(1.06/(n−3)), 95 %"}


# ----------------------------------------------------------------------------------------------------
# generated text


def text_pieces(text: str) -> list[str]:
    """The Whitespace pre-tokenizer's pieces of ``text`` (``\\w+`` and ``[^\\w\\s]+`` runs)."""
    return PIECE.findall(text)


def is_code_piece(piece: str) -> bool:
    """The lexical code criterion of the module docstring, for one piece."""
    if not piece:
        return False
    if not any(ch.isalnum() or ch == "_" for ch in piece):
        return any(ch in CODE_SYMBOLS for ch in piece)
    return (
        "_" in piece
        or piece in PY_WORDS
        or bool(_CAMEL.search(piece))
        or (piece[0].isdigit() and bool(_DIGIT_WORD.match(piece)))
    )


def code_chars(text: str) -> tuple[int, int]:
    """(characters in code pieces, characters in all pieces) of ``text``."""
    ps = text_pieces(text)
    return sum(len(p) for p in ps if is_code_piece(p)), sum(len(p) for p in ps)


def code_fraction(text: str) -> float:
    """Characters of code pieces / characters of all pieces (NaN for text without pieces)."""
    c, n = code_chars(text)
    return c / n if n else math.nan


def punctuation_fraction(text: str) -> float:
    """Characters of :data:`string.punctuation` / non-whitespace characters (NaN for blank text)."""
    chars = [ch for ch in text if not ch.isspace()]
    return sum(ch in _PUNCT for ch in chars) / len(chars) if chars else math.nan


def pooled_fractions(texts: Sequence[str]) -> dict[str, float]:
    """``code_frac`` and ``punct_chars_frac`` of several texts pooled (ratio of summed counts)."""
    c = n = p = m = 0
    for t in texts:
        a, b = code_chars(t)
        c, n = c + a, n + b
        chars = [ch for ch in t if not ch.isspace()]
        p, m = p + sum(ch in _PUNCT for ch in chars), m + len(chars)
    return {"code_frac": c / n if n else math.nan, "punct_chars_frac": p / m if m else math.nan}


def python_token_share(tokens: np.ndarray, domain: np.ndarray, vocab_size: int) -> np.ndarray:
    """Per token id v: ``r_py / (r_py + r_story)`` with ``r_d = (count_d(v) + 1) / (N_d + V)`` over the
    windows ``tokens (N, T)`` of each domain (``domain (N,)``): 0.5 = equally typical of both domains."""
    tok = np.asarray(tokens)
    dom = np.asarray(domain)
    r = []
    for d in (STORY, PYTHON):
        c = np.bincount(tok[dom == d].ravel(), minlength=vocab_size)[:vocab_size].astype(np.float64)
        r.append((c + 1) / (c.sum() + vocab_size))
    return r[PYTHON] / (r[PYTHON] + r[STORY])


def python_token_fraction(ids: Sequence[Sequence[int]], share: np.ndarray, threshold: float) -> float:
    """Fraction of the tokens in ``ids`` whose python share (:func:`python_token_share`) is ≥ ``threshold``."""
    flat = np.asarray([int(t) for row in ids for t in row], dtype=np.int64)
    return float((share[flat] >= threshold).mean()) if flat.size else math.nan


# ----------------------------------------------------------------------------------------------------
# per-seed statistics from the stored per-feature arrays


def lookahead_alignment(alignment: np.ndarray) -> np.ndarray:
    """Per-feature alignment ``(F,)``: the mean over offsets k = 2..K of ``alignment (K, F)`` (the cosine of
    each encoder column with its projection on the top-r right singular subspace of the map ``A_k``);
    offset 1 (the next token itself) is left out, it is not a look-ahead predictor."""
    a = np.asarray(alignment, dtype=np.float64)
    if a.shape[0] < 2:
        return np.full(a.shape[1], np.nan)
    return np.array([nanmean(a[1:, f]) for f in range(a.shape[1])])


def feature_statistics(
    share: np.ndarray,
    q: np.ndarray,
    alignment: np.ndarray | None,
    threshold: float,
    *,
    n_boot: int,
    n_perm: int,
    confidence: float,
    seed: int,
) -> dict[str, Any]:
    """Everything claim (a) and claim (c) need from one model: labels, σ(ln Q) by label with bootstrap and
    permutation, the story-only sensitivity check, the extreme-Q enrichment, and ρ(alignment, Q) with its
    permutation p (one-sided, ρ < 0).  ``alignment``: the ``(K, F)`` array of :func:`lookahead_alignment`."""
    labels = label_features(share, threshold)
    story_only = labels.copy()
    story_only[(labels == OTHER) & (np.asarray(share) > 1 - threshold)] = DEAD
    scored = np.isfinite(log_q(q))
    out: dict[str, Any] = {
        "n_live": int((labels != DEAD).sum()),
        "n_dead": int((labels == DEAD).sum()),
        "n_formal_live": int((labels == FORMAL).sum()),
        "n_other_live": int((labels == OTHER).sum()),
        "n_scored": int((scored & (labels != DEAD)).sum()),
        "share_histogram": share_histogram(share),
        "sigma": bootstrap_sigma(q, labels, n_boot=n_boot, confidence=confidence, seed=seed),
        "permutation": permutation_sigma(q, labels, n_perm=n_perm, seed=seed + 1),
        "sigma_story_only": bootstrap_sigma(q, story_only, n_boot=n_boot, confidence=confidence, seed=seed + 2),
        "enrichment": extreme_enrichment(q, labels),
    }
    if alignment is not None:
        a = lookahead_alignment(alignment)
        qq = np.where(scored, np.asarray(q, dtype=np.float64), np.nan)
        out["lookahead"] = spearman_permutation(a, qq, n_perm=n_perm, seed=seed + 3, alternative="less")
    return out


def nanmean(values: Any) -> float:
    """Mean of the finite values (NaN when there is none; no warning)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    return float(v.mean()) if v.size else math.nan


STEER_GROUPS = ("top", "bottom", "random")
STEER_METRICS = ("code_frac", "punct_frac", "python_token_frac")


def steering_statistics(cells: Sequence[dict[str, Any]], alphas: Sequence[float]) -> dict[str, Any]:
    """Per metric: the mean over prompts per (group, α) and of the unsteered baseline ("zero"); per prompt
    the mean over α of each group; per seed the mean over prompts and α ("seed_means", one number per
    group and "zero": the unit the tests over seeds use)."""
    prompts = sorted({int(c["prompt"]) for c in cells})
    out: dict[str, Any] = {}
    for m in STEER_METRICS:
        get: dict[tuple[int, str, float], float] = {
            (int(c["prompt"]), c["group"], float(c["alpha"])): c[m] for c in cells if c.get(m) is not None
        }

        def val(p: int, g: str, a: float, get: dict = get) -> float:
            v = get.get((p, g, 0.0 if g == "zero" else float(a)))
            return math.nan if v is None else float(v)

        per_prompt = {g: [nanmean([val(p, g, a) for a in alphas]) for p in prompts] for g in (*STEER_GROUPS, "zero")}
        out[m] = {
            "by_alpha": {g: {f"{a:g}": nanmean([val(p, g, a) for p in prompts]) for a in alphas} for g in STEER_GROUPS},
            "per_prompt": per_prompt,
            "seed_means": {g: nanmean(v) for g, v in per_prompt.items()},
        }
    return out
