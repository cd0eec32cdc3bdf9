"""The fit of the horizon experiment (:mod:`.horizon`): ordinary least squares of ln t on ln |V| and ln T
with the prediction at the paper's point (:func:`fit_horizon`, :data:`PAPER_POINT`), pooled over the
uncensored runs and per seed (:func:`_fits`), and the horizon per grid cell over seeds (:func:`summarise`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import inference
from .persistence_cosines import KINDS, THRESHOLDS

if TYPE_CHECKING:
    from .horizon_config import HorizonConfig

PAPER_POINT: dict[str, Any] = {
    "vocab_size": 3000,
    "seq_len": 200,
    "lr": 0.05,
    "observed": {"0.9": "> 48 (every cosine ≥ 0.9 at epoch 30)", "0.7": "> 160 (> 0.7 at epoch 100)"},
}


def fit_horizon(points: list[tuple[int, int, float | None]], confidence: float = 0.95) -> dict[str, Any]:
    """OLS of ln t on [1, ln V, ln T] over ``points`` = [(V, T, t), ...]; exponents with Student-t
    intervals, R², residual sd and the prediction at the paper's (V, T) with its prediction interval.
    With a single T only the |V| exponent is fitted (ln T dropped)."""
    from scipy import stats

    pts = [(v, t, h) for v, t, h in points if h is not None and h > 0]
    n = len(pts)
    Ts = sorted({t for _, t, _ in pts})
    Vs = sorted({v for v, _, _ in pts})
    cols = ["intercept"] + (["ln |V|"] if len(Vs) > 1 else []) + (["ln T"] if len(Ts) > 1 else [])
    out: dict[str, Any] = {"n": n, "terms": cols, "coef": None}
    p = len(cols)
    if n <= p:
        out["note"] = f"{n} uncensored runs for {p} coefficients: no fit"
        return out
    X = np.array(
        [
            [1.0] + ([math.log(v)] if "ln |V|" in cols else []) + ([math.log(t)] if "ln T" in cols else [])
            for v, t, _ in pts
        ]
    )
    y = np.array([math.log(h) for _, _, h in pts])
    beta, *_ = np.linalg.lstsq(X, y, rcond=None)
    resid = y - X @ beta
    dof = n - p
    s2 = float(resid @ resid) / dof
    cov = s2 * np.linalg.inv(X.T @ X)
    se = np.sqrt(np.diag(cov))
    q = float(stats.t.ppf(0.5 + confidence / 2, dof))
    out["coef"] = {
        c: {
            "estimate": float(b),
            "se": float(e),
            "low": float(b - q * e),
            "high": float(b + q * e),
            "p_zero": float(2 * stats.t.sf(abs(b / e), dof)) if e > 0 else None,
        }
        for c, b, e in zip(cols, beta, se)
    }
    tss = float(((y - y.mean()) ** 2).sum())
    out["r2"] = 1 - float(resid @ resid) / tss if tss > 0 else None
    out["resid_sd"] = math.sqrt(s2)
    x0 = np.array(
        [1.0]
        + ([math.log(PAPER_POINT["vocab_size"])] if "ln |V|" in cols else [])
        + ([math.log(PAPER_POINT["seq_len"])] if "ln T" in cols else [])
    )
    mu = float(x0 @ beta)
    half = q * math.sqrt(s2 + float(x0 @ cov @ x0))
    out["prediction_paper_point"] = {
        "t": math.exp(mu),
        "low": math.exp(mu - half),
        "high": math.exp(mu + half),
        "extrapolation": f"|V| {PAPER_POINT['vocab_size']} vs fitted {Vs[0]}–{Vs[-1]}, "
        f"T {PAPER_POINT['seq_len']} vs fitted {Ts[0]}–{Ts[-1]}",
    }
    return out


def _fits(config: HorizonConfig, runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Pooled and per-seed fits of the ``key`` horizons ("horizon": first drop, "sustained") per (type, θ)."""
    lr = float(config.settings["lr"])

    def pts(rs: list[dict[str, Any]], k: str, th: str) -> list[tuple[int, int, float | None]]:
        return [(r["vocab_size"], r["seq_len"], None if r[key][k][th] is None else r[key][k][th] * lr) for r in rs]

    seeds = sorted({r["seed"] for r in runs})
    out: dict[str, Any] = {}
    for k in KINDS:
        for th in (f"{x:g}" for x in THRESHOLDS):
            fit = fit_horizon(pts(runs, k, th), config.confidence)
            fit["censored"] = sum(r[key][k][th] is None for r in runs)
            per = [fit_horizon(pts([r for r in runs if r["seed"] == sd], k, th), config.confidence) for sd in seeds]
            fit["per_seed"] = {
                term: inference.mean_ci(
                    [(f.get("coef") or {}).get(term, {}).get("estimate") for f in per], config.confidence
                )
                for term in ("ln |V|", "ln T")
            }
            out.setdefault(k, {})[th] = fit
    return out


def summarise(config: HorizonConfig, runs: list[dict[str, Any]]) -> dict[str, Any]:
    lr = float(config.settings["lr"])
    cells: dict[str, Any] = {}
    for V, T in config.cells:
        rs = [r for r in runs if r["seq_len"] == T and r["requested_vocab"] == V]
        cell: dict[str, Any] = {
            "vocab_size": rs[0]["vocab_size"] if rs else V,
            "seq_len": T,
            "steps_run": [r["steps_run"] for r in rs],
        }
        for k in KINDS:
            for th in (f"{x:g}" for x in THRESHOLDS):
                for key, name in (("horizon", k), ("sustained", f"{k} sustained")):
                    hs = [r[key][k][th] for r in rs]
                    cell.setdefault(name, {})[th] = {
                        "t": inference.mean_ci([h * lr for h in hs if h is not None], config.confidence),
                        "censored": sum(h is None for h in hs),
                    }
        cells[f"V{V}-T{T}"] = cell
    return {"cells": cells, "fits": _fits(config, runs, "horizon"), "fits_sustained": _fits(config, runs, "sustained")}
