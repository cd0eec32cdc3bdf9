"""Closed-form gradient leading terms of the attention-only model (arXiv 2601.19208).

After s steps of full-batch GD with learning rate η from zero init, every weight of the Def. 3.1 model
is, up to a bounded error, a scalar times a corpus statistic (:mod:`originlens.stats.corpus`)::

    W_O   ≈ s η B̄                         (output_coef)
    V^(l) ≈ C(s,2) η² Φ̄ᵀB̄ᵀ                 (value_coef)
    W^(l) ≈ (3C(s,4) + 2C(s,3)) η⁴ Q̄        (attention_coef)
    P^(l) ≈ (3C(s,4) + 2C(s,3)) η⁴ Δ        (position_coef, same scalar)

This module gives the coefficients, the theorem's validity window and error bounds, the predicted
weights, comparison helpers (cosines, norm ratios, Frobenius errors) and the runnable leading-term
model of Eq. 12.

``stats`` arguments are duck-typed: any object with attributes (or a mapping with keys) ``bigram`` B̄,
``value_target`` Φ̄ᵀB̄ᵀ, ``query_key`` Q̄ and ``positional`` Δ, e.g.
:class:`originlens.stats.CorpusStatistics`.  Everything is computed in float64.

Caveats: the paper's bounds are proved for full-batch GD inside the window; for minibatch SGD, first-batch
statistics or s beyond the window the comparisons are empirical.  The Gaussian-init condition on the
init scale follows our reading of Thm D.12 (std·|V| ≤ η²/T², i.e. ξ = 0), not yet checked against the
paper's exact statement.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import CompatibilityError, ConfigError, InputError

# ----------------------------------------------------------------------------------------------
# coefficients


def _steps(s: int) -> int:
    if int(s) != s or s < 0:
        raise ConfigError(f"step count s must be a non-negative integer (got {s})", "pass s = 0, 1, 2, ...")
    return int(s)


def attention_count(s: int) -> int:
    """3·C(s,4) + 2·C(s,3) (= Σ_{k<s} k·C(k,2)), the integer part of the attention/position scalar."""
    s = _steps(s)
    return 3 * math.comb(s, 4) + 2 * math.comb(s, 3)


def output_coef(s: int, eta: float) -> float:
    """Scalar of W_O's leading term: s·η."""
    return _steps(s) * float(eta)


def value_coef(s: int, eta: float) -> float:
    """Scalar of V^(l)'s leading term: C(s,2)·η²."""
    return math.comb(_steps(s), 2) * float(eta) ** 2


def attention_coef(s: int, eta: float) -> float:
    """Scalar of W^(l)'s leading term: (3C(s,4) + 2C(s,3))·η⁴."""
    return attention_count(s) * float(eta) ** 4


def position_coef(s: int, eta: float) -> float:
    """Scalar of P^(l)'s leading term (same as :func:`attention_coef`)."""
    return attention_coef(s, eta)


# ----------------------------------------------------------------------------------------------
# validity window and error bounds


def error_bounds(s: int, eta: float, seq_len: int, variant: str = "multi") -> dict[str, float]:
    """Theorem bounds on ‖weight − leading term‖_F after s steps.

    ``variant="multi"`` (Thm 4.1 / D.9): 3s²η², 12s³η³, 13s⁵η⁵T (W and P);
    ``variant="one_layer"`` (Thm D.6): 3s²η², 4s³η³, 6s⁵η⁵T.  Keys ``W_O``, ``V``, ``W``, ``P``.
    """
    s, e, T = _steps(s), float(eta), int(seq_len)
    if variant == "multi":
        cv, cw = 12.0, 13.0
    elif variant == "one_layer":
        cv, cw = 4.0, 6.0
    else:
        raise ConfigError(f"unknown theorem variant '{variant}'", "use 'multi' or 'one_layer'")
    w = cw * s**5 * e**5 * T
    return {"W_O": 3.0 * s**2 * e**2, "V": cv * s**3 * e**3, "W": w, "P": w}


@dataclass
class ValidityWindow:
    """The theorem's conditions for a setting, and the largest step count they cover.

    ``s_max`` = (1/η)·min(5/(8√T), 1/(12L)) (multi-layer) or (1/η)·3/(8T^{3/8}) (one layer);
    ``steps`` = ⌊s_max⌋.  ``conditions`` maps a readable condition to whether it holds; ``holds`` is
    their conjunction (the step bound is separate: check ``s <= steps``).
    """

    seq_len: int
    n_layers: int
    eta: float
    vocab_size: int
    variant: str
    conditions: dict[str, bool]
    s_max: float
    steps: int
    theorem: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return all(self.conditions.values())

    def covers(self, s: int) -> bool:
        """True when the conditions hold and 0 ≤ s ≤ s_max."""
        return self.holds and 0 <= s <= self.s_max

    def bounds(self, s: int) -> dict[str, float]:
        """The error bounds of this variant at step s (see :func:`error_bounds`)."""
        return error_bounds(s, self.eta, self.seq_len, self.variant)


def validity_window(
    seq_len: int,
    n_layers: int,
    eta: float,
    vocab_size: int,
    *,
    variant: str | None = None,
    init_std: float | None = None,
) -> ValidityWindow:
    """Conditions of Thm 4.1/D.9 (``variant="multi"``, default for L ≥ 2) or Thm D.6
    (``"one_layer"``, default for L = 1) and the maximal step count s_max.

    With ``init_std`` (Gaussian init) the Thm D.12 conditions T ≤ |V|, η ≥ 1/T and
    std·|V| ≤ η²/T² are added (see module caveat).
    """
    T, L, e, V = int(seq_len), int(n_layers), float(eta), int(vocab_size)
    if T < 1 or L < 1 or V < 1 or not (e > 0 and math.isfinite(e)):
        raise ConfigError(f"invalid setting T={T}, L={L}, η={eta}, |V|={V}", "pass positive values")
    if variant is None:
        variant = "one_layer" if L == 1 else "multi"
    if variant == "multi":
        cond = {"L <= sqrt(T)/4": math.sqrt(T) / 4 >= L, "T >= 60": T >= 60, "|V| >= 500": V >= 500}
        s_max = min(5.0 / (8.0 * math.sqrt(T)), 1.0 / (12.0 * L)) / e
        theorem = "Thm 4.1 / D.9 (zero init)"
    elif variant == "one_layer":
        cond = {"L == 1": L == 1, "T >= 3": T >= 3, "|V| >= 500": V >= 500}
        s_max = 3.0 / (8.0 * T**0.375) / e
        theorem = "Thm D.6 (one layer, zero init)"
    else:
        raise ConfigError(f"unknown theorem variant '{variant}'", "use 'multi' or 'one_layer'")
    notes = []
    if init_std is not None and init_std > 0:
        cond["T <= |V| (gaussian init)"] = T <= V
        cond["eta >= 1/T (gaussian init)"] = e >= 1.0 / T
        cond["init_std*|V| <= eta^2/T^2 (gaussian init)"] = init_std * V <= e**2 / T**2
        theorem += " + D.12 (gaussian init)"
        notes.append("Gaussian-init scale condition as we read Thm D.12 (ξ = 0); check the paper if it matters")
    return ValidityWindow(T, L, e, V, variant, cond, s_max, int(math.floor(s_max + 1e-12)), theorem, notes)


# ----------------------------------------------------------------------------------------------
# statistics access and predicted weights


LEADING_TERM = {"W_O": "bigram", "V": "value_target", "W": "query_key", "P": "positional"}  # weight kind → statistic


def leading_terms(stats: Any) -> dict[str, np.ndarray]:
    """The four targets by weight kind: ``W_O`` → B̄, ``V`` → Φ̄ᵀB̄ᵀ, ``W`` → Q̄, ``P`` → Δ (float64)."""
    return {k: statistic_of(stats, s) for k, s in LEADING_TERM.items()}


def statistic_of(stats: Any, name: str) -> np.ndarray:
    if isinstance(stats, Mapping):
        if name not in stats:
            raise InputError(f"statistics lack '{name}'", "compute them with originlens.stats.corpus_statistics")
        v = stats[name]
    else:
        if not hasattr(stats, name):
            raise InputError(f"statistics lack '{name}'", "compute them with originlens.stats.corpus_statistics")
        v = getattr(stats, name)
    if torch.is_tensor(v):
        v = v.detach().cpu().numpy()
    return np.asarray(v, dtype=np.float64)


def predicted_weights(stats: Any, s: int, eta: float, n_layers: int) -> dict[str, np.ndarray]:
    """Leading-term weights after s steps: keys ``W_O``, ``V.l``, ``W.l``, ``P.l`` (l = 1..L), float64.

    All layers share one V, W and P target (layer uniformity of the leading terms).
    """
    B = statistic_of(stats, "bigram")
    Vt = statistic_of(stats, "value_target")
    Q = statistic_of(stats, "query_key")
    D = statistic_of(stats, "positional")
    out = {"W_O": output_coef(s, eta) * B}
    cv, cw = value_coef(s, eta), attention_coef(s, eta)
    for l in range(1, int(n_layers) + 1):
        out[f"V.{l}"] = cv * Vt
        out[f"W.{l}"] = cw * Q
        out[f"P.{l}"] = cw * D
    return out


# ----------------------------------------------------------------------------------------------
# comparison helpers


def _f64(a: Any) -> np.ndarray:
    if torch.is_tensor(a):
        a = a.detach().cpu().numpy()
    return np.asarray(a, dtype=np.float64)


def cosine(a: Any, b: Any) -> float:
    """Flattened cosine tr(AᵀB)/(‖A‖‖B‖) in float64; NaN when either is zero."""
    a, b = _f64(a).ravel(), _f64(b).ravel()
    if a.shape != b.shape:
        raise InputError(f"cannot compare shapes {a.shape} and {b.shape}", "compare matrices of one shape")
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return float("nan")
    return float(np.dot(a, b) / (na * nb))


def norm_ratio(a: Any, b: Any) -> float:
    """‖A‖/‖B‖ (Frobenius, float64); NaN when ‖B‖ = 0."""
    nb = np.linalg.norm(_f64(b))
    return float(np.linalg.norm(_f64(a)) / nb) if nb > 0 else float("nan")


def _weights_of(model_or_weights: Any) -> dict[str, np.ndarray]:
    if hasattr(model_or_weights, "weights") and callable(model_or_weights.weights):
        model_or_weights = model_or_weights.weights()
    if not isinstance(model_or_weights, Mapping):
        raise InputError("expected an AssocModel or a mapping of weights", "pass model or model.weights()")
    return {k: _f64(v) for k, v in model_or_weights.items()}


def compare_to_theory(
    model_or_weights: Any, stats: Any, s: int, eta: float, *, variant: str | None = None
) -> dict[str, dict[str, float]]:
    """Compare trained weights with their leading terms after s steps at learning rate η.

    Returns ``{name: {"cos", "norm_ratio", "frob_err", "rel_err", "bound"}}`` for ``W_O`` and each
    ``W.l``, ``V.l``, ``P.l``: cosine with the (unscaled) statistic, ‖weight‖/‖predicted‖, ‖weight −
    predicted‖_F, that error relative to ‖predicted‖ and the theorem's bound at s (variant as in
    :func:`validity_window`).  Quantities undefined at small s (zero prediction) are NaN.
    """
    w = _weights_of(model_or_weights)
    L = sum(1 for k in w if k.startswith("W."))
    if "W_O" not in w or L == 0:
        raise InputError("weights need W_O and W.1 … (on-disk names)", "pass AssocModel.weights()")
    pred = predicted_weights(stats, s, eta, L)
    raw = {
        "W_O": statistic_of(stats, "bigram"),
        "V": statistic_of(stats, "value_target"),
        "W": statistic_of(stats, "query_key"),
        "P": statistic_of(stats, "positional"),
    }
    T = raw["P"].shape[0]
    bounds = error_bounds(s, eta, T, variant or ("one_layer" if L == 1 else "multi"))
    out: dict[str, dict[str, float]] = {}
    for name, p in pred.items():
        if name not in w:
            raise InputError(f"weights lack '{name}'", "pass all weights of the model")
        kind = name.split(".")[0]
        if w[name].shape != p.shape:
            raise CompatibilityError(
                f"'{name}' has shape {w[name].shape}, statistics give {p.shape}",
                "compute the statistics with the model's vocabulary and T",
            )
        err = float(np.linalg.norm(w[name] - p))
        npred = float(np.linalg.norm(p))
        out[name] = {
            "cos": cosine(w[name], raw[kind]),
            "norm_ratio": norm_ratio(w[name], p),
            "frob_err": err,
            "rel_err": err / npred if npred > 0 else float("nan"),
            "bound": bounds[kind],
        }
    return out


def min_cosines(comparison: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Minimum cosine over layers per weight type (``W``, ``V``, ``P``, ``W_O``), as in Table 1."""
    out: dict[str, float] = {}
    for name, rec in comparison.items():
        kind = name.split(".")[0]
        c = rec["cos"]
        out[kind] = c if kind not in out else min(out[kind], c)
    return out


# ----------------------------------------------------------------------------------------------
# the leading-term model (Eq. 12)


class LeadingTermModel:
    """Eq. 12 with the scalars reinserted, as a language model built from the statistics alone::

        A      = softmax(causal_mask(c_W (X Q̄ Xᵀ + DM(Δ))))
        logits = c_O ( X B̄ + L_eff · c_V · A X Φ̄ᵀB̄ᵀ B̄ )

    with c_O = sη, c_V = C(s,2)η², c_W = (3C(s,4)+2C(s,3))η⁴.  ``n_layers`` = L_eff counts the layers
    whose (identical, to leading order) attention outputs add up in the residual stream; the default
    1 is Eq. 12 as printed.  :meth:`as_model` instead loads the predicted weights into a full
    :class:`~originlens.models.assoc.AssocModel` (keeps the cross-layer products).

    Baselines: :meth:`bigram_loss` is the residual-only path c_O·X B̄ of this model (same scalar);
    :func:`conditional_bigram_loss` is a plain add-k conditional bigram model.
    """

    def __init__(self, stats: Any, s: int, eta: float, *, n_layers: int = 1) -> None:
        self.s, self.eta, self.n_layers = _steps(s), float(eta), int(n_layers)
        self.c_O, self.c_V, self.c_W = output_coef(s, eta), value_coef(s, eta), attention_coef(s, eta)
        B = statistic_of(stats, "bigram")
        Vt = statistic_of(stats, "value_target")
        self.stats = stats
        self.bigram = torch.from_numpy(B)
        self.value_out = torch.from_numpy(Vt @ B)  # Φ̄ᵀB̄ᵀB̄ = Φ̄ᵀΣ_B̄: key token → next-token logits
        self.query_key = torch.from_numpy(statistic_of(stats, "query_key"))
        self.positional = torch.from_numpy(statistic_of(stats, "positional"))
        self.vocab_size = B.shape[0]
        self.seq_len = self.positional.shape[0]

    def _check(self, x: Any) -> torch.Tensor:
        x = torch.as_tensor(np.asarray(x) if not torch.is_tensor(x) else x)
        if x.dim() != 2 or x.shape[1] < 1 or x.shape[1] > self.seq_len:
            raise InputError(
                f"inputs must be (N, T') with 1 ≤ T' ≤ {self.seq_len}, got {tuple(x.shape)}",
                "pass token windows no longer than the statistics' T",
            )
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= self.vocab_size):
            raise InputError(f"token ids must lie in 0..{self.vocab_size - 1}", "check the vocabulary")
        return x.long()

    def attention(self, inputs: Any) -> torch.Tensor:
        """Leading-term attention pattern (N, T', T') (float64)."""
        from ..models.assoc.ops import causal_softmax, diag_matrix

        x = self._check(inputs)
        T = x.shape[1]
        sc = self.query_key[x[:, :, None], x[:, None, :]] + diag_matrix(self.positional[:T], T)
        return causal_softmax(self.c_W * sc)

    def logits(self, inputs: Any) -> torch.Tensor:
        """Logits (N, T', |V|) for inputs (N, T') (float64)."""
        x = self._check(inputs)
        out = F.embedding(x, self.bigram)
        if self.c_V != 0.0:
            out = out + (self.n_layers * self.c_V) * (self.attention(x) @ F.embedding(x, self.value_out))
        return self.c_O * out

    def _mean_ce(self, tokens: Any, fn, batch_size: int) -> float:
        t = torch.as_tensor(np.asarray(tokens) if not torch.is_tensor(tokens) else tokens)
        if t.dim() != 2 or t.shape[1] < 2:
            raise InputError(f"tokens must be (N, T+1), got {tuple(t.shape)}", "pass token windows")
        total, count = 0.0, 0
        for i in range(0, t.shape[0], batch_size):
            b = t[i : i + batch_size].long()
            lg = fn(b[:, :-1])
            # float64 logits: one call per 2^24 of them bounds the log-softmax's copy
            flat, tgt = lg.reshape(-1, lg.shape[-1]), b[:, 1:].reshape(-1)
            rows = max(1, (1 << 24) // max(1, flat.shape[1]))
            for j in range(0, flat.shape[0], rows):
                total += float(F.cross_entropy(flat[j : j + rows], tgt[j : j + rows], reduction="sum"))
            del lg, flat
            count += b[:, 1:].numel()
        return total / count

    def loss(self, tokens: Any, *, batch_size: int = 256) -> float:
        """Mean cross-entropy over all positions of tokens (N, T'+1)."""
        return self._mean_ce(tokens, self.logits, batch_size)

    def bigram_loss(self, tokens: Any, *, batch_size: int = 256) -> float:
        """Mean cross-entropy of the residual-only path c_O·X B̄ (attention removed)."""
        return self._mean_ce(tokens, lambda x: self.c_O * F.embedding(self._check(x), self.bigram), batch_size)

    def as_model(self, n_layers: int, *, dtype: str = "float64"):
        """An :class:`~originlens.models.assoc.AssocModel` holding the predicted weights."""
        from ..models.assoc import AssocConfig, AssocModel

        m = AssocModel(AssocConfig(vocab_size=self.vocab_size, seq_len=self.seq_len, n_layers=n_layers, dtype=dtype))
        m.load_weights(predicted_weights(self.stats, self.s, self.eta, n_layers))
        return m


def conditional_bigram_loss(train_tokens: Any, eval_tokens: Any, vocab_size: int, *, k: float = 1.0) -> float:
    """Mean cross-entropy of an add-k conditional bigram model p(b|a) = (c(a,b)+k)/(c(a)+k|V|).

    Counts come from all (x_t, x_{t+1}) pairs of ``train_tokens`` (N, T+1); evaluated on every pair of
    ``eval_tokens``.  ``k`` must be > 0 (unseen pairs would have probability 0 otherwise).
    """
    if not k > 0:
        raise ConfigError(f"add-k smoothing needs k > 0 (got {k})", "pass k = 1.0 or another positive value")
    V = int(vocab_size)
    tr, ev = np.asarray(train_tokens), np.asarray(eval_tokens)
    for arr in (tr, ev):
        if arr.ndim != 2 or arr.shape[1] < 2 or arr.min() < 0 or arr.max() >= V:
            raise InputError(f"tokens must be (N, T+1) ids in 0..{V - 1}", "pass token windows")
    counts = np.zeros((V, V), dtype=np.float64)
    np.add.at(counts, (tr[:, :-1].ravel(), tr[:, 1:].ravel()), 1.0)
    logp = np.log(counts + k) - np.log(counts.sum(1, keepdims=True) + k * V)
    return float(-logp[ev[:, :-1].ravel(), ev[:, 1:].ravel()].mean())
