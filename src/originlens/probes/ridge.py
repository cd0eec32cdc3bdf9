"""Linear ridge probes per (layer, position), fitted in closed form (the probes of arXiv 2603.14087).

``fit_probes(residuals, features)`` fits, for every residual site (k, i), one multi-output ridge
regression (penalty ``alpha`` on the weights, unpenalised intercept — the usual ridge with intercept)
on the first ``train_frac`` of the sequences and evaluates on the rest: Pearson r, R², MSE and, for
discrete targets, accuracy of the prediction rounded to the nearest target value; optionally the same
metrics within each feature type (e.g. Othello's NTP-useful vs NTP-useless cells), reported only when
that subset has more than one distinct target value (NaN otherwise).

Shapes: ``residuals`` (n, K, T, d) — K residual sites r^0..r^{K−1}; ``features`` (n, T, F);
``feature_types`` (n, T, F) small integers or None.  The probe direction of feature f at site (k, i) is
``ProbeSet.weights[k, i, f]`` (d,), the intercept dropped.  Position 0 is skipped by
default (it holds BOS).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError
from ..storage import load_tensors, save_tensors


@dataclass
class ProbeSet:
    """Fitted probes: ``weights`` (K, P, F, d), ``intercepts`` (K, P, F) for the listed sites."""

    weights: np.ndarray
    intercepts: np.ndarray
    layers: list[int]
    positions: list[int]
    feature_names: list[str]
    alpha: float

    def direction(self, layer: int, position: int, feature: str | int) -> np.ndarray:
        """Probe direction w (d,) of ``feature`` at residual site (layer, position)."""
        k, i = self._site(layer, position)
        f = self.feature_names.index(feature) if isinstance(feature, str) else int(feature)
        return self.weights[k, i, f]

    def _site(self, layer: int, position: int) -> tuple[int, int]:
        try:
            return self.layers.index(layer), self.positions.index(position)
        except ValueError:
            raise InputError(
                f"no probe at layer {layer}, position {position}",
                f"layers {self.layers}, positions {self.positions[0]}..{self.positions[-1]}",
            ) from None

    def predict(self, residuals: np.ndarray) -> np.ndarray:
        """Predictions (n, K, P, F) from residuals (n, K_all, T, d) (sites picked by layers/positions)."""
        X = np.asarray(residuals)[:, self.layers][:, :, self.positions].astype(np.float64)
        return np.einsum("nkpd,kpfd->nkpf", X, self.weights) + self.intercepts[None]

    def save(self, path: str | Path) -> Path:
        return save_tensors(
            path,
            {"weights": self.weights, "intercepts": self.intercepts},
            kind="probes",
            metadata={
                "layers": self.layers,
                "positions": self.positions,
                "feature_names": self.feature_names,
                "alpha": self.alpha,
            },
        )

    @classmethod
    def load(cls, path: str | Path) -> ProbeSet:
        import json

        arrays, meta = load_tensors(path, kind="probes")
        return cls(
            weights=arrays["weights"],
            intercepts=arrays["intercepts"],
            layers=json.loads(meta["layers"]),
            positions=json.loads(meta["positions"]),
            feature_names=json.loads(meta["feature_names"]),
            alpha=float(json.loads(meta["alpha"])),
        )


@dataclass
class ProbeMetrics:
    """Test-split metrics, each (K, P, F); ``by_type[τ]`` holds Pearson r within feature type τ."""

    pearson: np.ndarray
    r2: np.ndarray
    mse: np.ndarray
    accuracy: np.ndarray
    by_type: dict[int, np.ndarray] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    feature_names: list[str] = field(default_factory=list)

    def summary(self, feature: str | None = None) -> dict[str, Any]:
        """Mean metrics over sites (and over features unless one is named), NaNs ignored."""
        sl = slice(None) if feature is None else self.feature_names.index(feature)
        out = {
            "pearson": float(np.nanmean(self.pearson[..., sl])),
            "r2": float(np.nanmean(self.r2[..., sl])),
            "mse": float(np.nanmean(self.mse[..., sl])),
            "accuracy": float(np.nanmean(self.accuracy[..., sl])),
        }
        for t, v in self.by_type.items():
            vals = v[..., sl]
            out[f"pearson_type{t}"] = float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
        return out


def _pearson(y: np.ndarray, p: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Pearson r along axis 0 of (n, ...) arrays, optionally over rows where ``mask``; NaN if constant."""
    if mask is None:
        mask = np.ones(y.shape, dtype=bool)
    m = mask.astype(np.float64)
    cnt = m.sum(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        my = (y * m).sum(0) / cnt
        mp = (p * m).sum(0) / cnt
        dy, dp = (y - my) * m, (p - mp) * m
        cov = (dy * dp).sum(0)
        vy, vp = (dy * dy).sum(0), (dp * dp).sum(0)
        r = cov / np.sqrt(vy * vp)
    # "more than one distinct value" for the target within the subset
    ymax = np.where(mask, y, -np.inf).max(0)
    ymin = np.where(mask, y, np.inf).min(0)
    r[~(ymax > ymin)] = np.nan
    return r


def fit_probes(
    residuals: np.ndarray,
    features: np.ndarray,
    *,
    feature_names: Sequence[str] | None = None,
    feature_types: np.ndarray | None = None,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    alpha: float = 1.0,
    train_frac: float = 0.7,
) -> tuple[ProbeSet, ProbeMetrics]:
    """Fit ridge probes on the first ``train_frac`` sequences, evaluate on the rest."""
    R = np.asarray(residuals)
    Y = np.asarray(features, dtype=np.float64)
    if R.ndim != 4 or Y.ndim != 3 or R.shape[0] != Y.shape[0] or R.shape[2] != Y.shape[1]:
        raise InputError(
            f"residuals (n, K, T, d) and features (n, T, F) disagree: {R.shape} vs {Y.shape}",
            "collect residuals with return_residuals=True on the same sequences",
        )
    n, K, T, d = R.shape
    F = Y.shape[2]
    if not 0 < train_frac < 1 or alpha < 0:
        raise ConfigError(
            f"need 0 < train_frac < 1 and alpha ≥ 0 (got {train_frac}, {alpha})", "use the defaults 0.7 and 1.0"
        )
    n_tr = int(round(n * train_frac))
    if n_tr < 2 or n - n_tr < 2:
        raise InputError(
            f"{n} sequences are too few for a {train_frac:.0%}/{1 - train_frac:.0%} split",
            "probe on more sequences (at least ~10)",
        )
    layers = list(range(K)) if layers is None else [int(k) for k in layers]
    positions = list(range(1, T)) if positions is None else [int(i) for i in positions]
    if any(not 0 <= k < K for k in layers) or any(not 0 <= i < T for i in positions):
        raise ConfigError(f"layers must lie in 0..{K - 1} and positions in 0..{T - 1}", "check the site lists")
    names = list(feature_names) if feature_names is not None else [f"f{j}" for j in range(F)]
    if len(names) != F:
        raise CompatibilityError(f"{len(names)} feature names for {F} features", "pass one name per feature")

    X = R[:, layers][:, :, positions].astype(np.float64)  # (n, K', P, d)
    Yp = Y[:, positions]  # (n, P, F)
    Xtr, Xte = X[:n_tr], X[n_tr:]
    Ytr, Yte = Yp[:n_tr], Yp[n_tr:]
    xm = Xtr.mean(0)  # (K', P, d)
    ym = Ytr.mean(0)  # (P, F)
    Xc = Xtr - xm
    Yc = Ytr - ym
    Xs = np.ascontiguousarray(np.moveaxis(Xc, 0, 2))  # (K', P, n, d): batched BLAS
    gram = Xs.transpose(0, 1, 3, 2) @ Xs + alpha * np.eye(d)
    rhs = Xs.transpose(0, 1, 3, 2) @ np.moveaxis(Yc, 0, 1)[None]  # (K', P, d, F)
    W = np.linalg.solve(gram, rhs)  # (K', P, d, F)
    weights = np.ascontiguousarray(np.moveaxis(W, -1, -2))  # (K', P, F, d)
    intercepts = ym[None] - np.einsum("kpd,kpfd->kpf", xm, weights)
    probes = ProbeSet(
        weights=weights,
        intercepts=intercepts,
        layers=layers,
        positions=positions,
        feature_names=names,
        alpha=float(alpha),
    )

    pred = np.moveaxis(np.moveaxis(Xte, 0, 2) @ np.swapaxes(weights, -1, -2), 2, 0) + intercepts[None]
    yt = np.broadcast_to(Yte[:, None], pred.shape)
    mse = ((pred - yt) ** 2).mean(0)
    var = yt.var(0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = np.where(var > 0, 1 - mse / var, np.nan)
    pearson = _pearson(yt, pred)
    # accuracy: round to the nearest value the target takes in training (for discrete targets)
    acc = np.full(mse.shape, np.nan)
    for f in range(F):
        vals = np.unique(Ytr[..., f])
        if len(vals) <= 16:
            idx = np.abs(pred[..., f, None] - vals).argmin(-1)
            acc[..., f] = (vals[idx] == yt[..., f]).mean(0)
    by_type: dict[int, np.ndarray] = {}
    if feature_types is not None:
        ft = np.asarray(feature_types)
        if ft.shape != Y.shape:
            raise InputError(
                f"feature_types shape {ft.shape} differs from features {Y.shape}",
                "pass one type per (sequence, position, feature)",
            )
        fte = np.broadcast_to(ft[n_tr:, positions][:, None], pred.shape)
        for t in np.unique(ft):
            by_type[int(t)] = _pearson(yt, pred, fte == t)
    metrics = ProbeMetrics(
        pearson=pearson,
        r2=r2,
        mse=mse,
        accuracy=acc,
        by_type=by_type,
        layers=layers,
        positions=positions,
        feature_names=names,
    )
    return probes, metrics
