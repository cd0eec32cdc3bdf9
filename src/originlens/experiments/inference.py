"""Statistical inference over training seeds: the unit of replication of every experiment.

Every function takes one value per seed (a run's summary number: a mean probe correlation, an
integrated influence, a loss) and returns plain dicts that go straight into a results file.

* :func:`correlation_ci` — mean and confidence interval of correlations (values in [−1, 1]) through
  Fisher's z: ``z = atanh(r)``, Student-t interval of the z's over seeds, mapped back with ``tanh`` so
  the interval never leaves [−1, 1]; the centre is ``tanh(mean z)``.
* :func:`mean_ci` — Student-t interval of an unbounded quantity (losses, influences).
* :func:`bootstrap_ci` — percentile bootstrap of the mean (any range; for few seeds it is narrower
  than the t-interval, so it is reported beside it, never instead).
* :func:`paired_test` — a paper's ordering "a > b" tested as a hypothesis over seeds paired by seed
  (the same seed fixes the data order and the eval set in every regime): paired t-test on the
  per-seed differences (of Fisher z's for correlations), the exact Wilcoxon signed-rank test, the
  effect size d_z = mean/sd of the differences, and the power of the one-sided paired t-test at
  α = 0.05 for the observed d_z and the smallest d_z that n seeds detect with power 0.8.
* :func:`holm` — Holm's step-down adjustment of a family of p-values.
* :func:`tost` — an equivalence claim ("not learned", "≪") as two one-sided tests against a margin
  fixed before the run, never as a failed difference test.

Caveats: with n seeds the exact one-sided Wilcoxon p-value cannot fall below 2⁻ⁿ (0.031 for 5 seeds,
0.125 for 3), so it is reported as a robustness check beside the t-test; a t-test on 3 seeds has little
power (reported, not hidden).  Fisher's z treats each value as one correlation; a per-run *mean* of
correlations is transformed the same way (a monotone map, applied to the unit of replication).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

R_CLIP = 1 - 1e-12  # atanh(±1) is infinite; a perfect correlation is clipped just inside


def _finite(values: Sequence[float | None]) -> np.ndarray:
    return np.asarray([float(v) for v in values if v is not None and math.isfinite(float(v))], dtype=np.float64)


def _t_half(sd: float, n: int, confidence: float) -> float:
    from scipy import stats

    return float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * sd / math.sqrt(n)


def mean_ci(
    values: Sequence[float | None], confidence: float = 0.95, bounds: tuple[float, float] | None = None
) -> dict[str, Any]:
    """Mean, sample sd and two-sided Student-t interval over the finite ``values`` (None bounds for n < 2);
    ``bounds``: the metric's range (e.g. (0, 1) for an accuracy), to which the interval is clipped."""
    v = _finite(values)
    n = int(v.size)
    out: dict[str, Any] = {
        "n": n,
        "mean": float(v.mean()) if n else None,
        "sd": None,
        "low": None,
        "high": None,
        "values": v.tolist(),
        "interval": f"Student t, {confidence:g}, over seeds",
    }
    if n >= 2:
        sd = float(v.std(ddof=1))
        half = _t_half(sd, n, confidence)
        out.update(sd=sd, low=out["mean"] - half, high=out["mean"] + half)
        if bounds is not None:
            out.update(
                low=max(bounds[0], out["low"]),
                high=min(bounds[1], out["high"]),
                interval=out["interval"] + f", clipped to [{bounds[0]:g}, {bounds[1]:g}]",
            )
    return out


def fisher_z(r: np.ndarray | float) -> np.ndarray:
    """``atanh(r)`` with r clipped to ±(1 − 1e-12)."""
    return np.arctanh(np.clip(np.asarray(r, dtype=np.float64), -R_CLIP, R_CLIP))


def correlation_ci(values: Sequence[float | None], confidence: float = 0.95) -> dict[str, Any]:
    """Centre ``tanh(mean z)`` and interval ``tanh(mean z ± t·sd_z/√n)`` of correlations over seeds;
    also the plain mean of the r's (``mean_r``)."""
    v = _finite(values)
    n = int(v.size)
    out: dict[str, Any] = {
        "n": n,
        "mean": None,
        "mean_r": float(v.mean()) if n else None,
        "low": None,
        "high": None,
        "values": v.tolist(),
        "interval": f"Fisher z, Student t on z, {confidence:g}, over seeds",
    }
    if n == 0:
        return out
    z = fisher_z(v)
    out["mean"] = float(np.tanh(z.mean()))
    if n >= 2:
        half = _t_half(float(z.std(ddof=1)), n, confidence)
        out.update(low=float(np.tanh(z.mean() - half)), high=float(np.tanh(z.mean() + half)))
    return out


def bootstrap_ci(
    values: Sequence[float | None],
    confidence: float = 0.95,
    *,
    n_boot: int = 10000,
    seed: int = 0,
    statistic: Callable[[np.ndarray], np.ndarray] | None = None,
) -> dict[str, Any]:
    """Percentile bootstrap interval of ``statistic`` (default: the mean over axis 1) over seeds."""
    v = _finite(values)
    n = int(v.size)
    stat = statistic or (lambda a: a.mean(axis=-1))
    if n < 2:
        return {"n": n, "low": None, "high": None, "interval": "percentile bootstrap"}
    rng = np.random.default_rng(seed)
    draws = stat(v[rng.integers(0, n, (n_boot, n))])
    lo, hi = np.quantile(draws, [0.5 - confidence / 2, 0.5 + confidence / 2])
    return {
        "n": n,
        "low": float(lo),
        "high": float(hi),
        "interval": f"percentile bootstrap of the mean, {n_boot} resamples, {confidence:g}",
    }


def paired_power(dz: float, n: int, alpha: float = 0.05) -> float:
    """Power of the one-sided paired t-test (H1: mean difference > 0) at effect size ``dz`` with n pairs."""
    from scipy import stats

    if n < 2 or not math.isfinite(dz):
        return float("nan")
    crit = stats.t.ppf(1 - alpha, n - 1)
    return float(stats.nct.sf(crit, n - 1, dz * math.sqrt(n)))


def detectable_effect(n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """Smallest d_z the one-sided paired t-test detects with ``power`` at level ``alpha`` with n pairs."""
    from scipy import optimize

    if n < 2:
        return float("nan")
    return float(optimize.brentq(lambda d: paired_power(d, n, alpha) - power, 1e-6, 100.0))


def paired_test(
    a: Sequence[float | None],
    b: Sequence[float | None],
    *,
    alternative: str = "greater",
    correlation: bool = True,
    alpha: float = 0.05,
    confidence: float = 0.95,
) -> dict[str, Any]:
    """Test "a > b" (``alternative="greater"``), "a < b" (``"less"``) or "a ≠ b" (``"two-sided"``)
    on values paired by position (seed).  Pairs with a non-finite member are dropped.

    ``correlation``: the differences are taken on Fisher z's (``atanh``); otherwise on the raw values.
    Returns n, the mean raw difference, the mean transformed difference with its t-interval, the paired
    t-test p, the exact Wilcoxon signed-rank p (None when every difference is 0), d_z, the power at the
    observed d_z and the d_z detectable with power 0.8 (both one-sided, at ``alpha``)."""
    from scipy import stats

    if alternative not in ("greater", "less", "two-sided"):
        raise ValueError(f"alternative must be greater, less or two-sided, got {alternative!r}")
    pairs = [
        (float(x), float(y))
        for x, y in zip(a, b)
        if x is not None and y is not None and math.isfinite(float(x)) and math.isfinite(float(y))
    ]
    n = len(pairs)
    out: dict[str, Any] = {
        "n": n,
        "alternative": alternative,
        "scale": "fisher z" if correlation else "raw",
        "mean_diff": None,
        "diff": None,
        "diff_low": None,
        "diff_high": None,
        "p_t": None,
        "p_wilcoxon": None,
        "dz": None,
        "power": None,
        "detectable_dz": None,
    }
    if n == 0:
        return out
    x = np.array([p[0] for p in pairs])
    y = np.array([p[1] for p in pairs])
    d = (fisher_z(x) - fisher_z(y)) if correlation else (x - y)
    out["mean_diff"] = float((x - y).mean())
    out["diff"] = float(d.mean())
    if n < 2:
        return out
    sd = float(d.std(ddof=1))
    half = _t_half(sd, n, confidence)
    out.update(diff_low=float(d.mean() - half), diff_high=float(d.mean() + half))
    if sd > 0:
        out["p_t"] = float(stats.ttest_1samp(d, 0.0, alternative=alternative).pvalue)
        dz = float(d.mean() / sd)
        out["dz"] = dz
        signed = dz if alternative != "less" else -dz
        out["power"] = paired_power(abs(dz) if alternative == "two-sided" else signed, n, alpha)
    elif d.mean() != 0:
        out["p_t"] = 0.0 if (alternative == "two-sided" or (d.mean() > 0) == (alternative == "greater")) else 1.0
    out["detectable_dz"] = detectable_effect(n, alpha)
    if np.any(d != 0):
        out["p_wilcoxon"] = float(
            stats.wilcoxon(
                d,
                alternative=alternative,
                method="exact" if n <= 25 and len(set(np.abs(d[d != 0]))) == int((d != 0).sum()) else "auto",
            ).pvalue
        )
    return out


def holm(pvalues: dict[str, float | None]) -> dict[str, float | None]:
    """Holm-adjusted p-values of a family (None entries are left out of the family and stay None)."""
    keys = [k for k, p in pvalues.items() if p is not None]
    m = len(keys)
    order = sorted(keys, key=lambda k: pvalues[k])  # type: ignore[arg-type, return-value]
    out: dict[str, float | None] = {k: None for k in pvalues}
    running = 0.0
    for rank, k in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[k])))  # type: ignore[arg-type]
        out[k] = running
    return out


def tost(values: Sequence[float | None], margin: float, *, alpha: float = 0.05) -> dict[str, Any]:
    """Equivalence of the mean of ``values`` (one per seed; e.g. paired differences or a gain) to zero
    within ± ``margin``: two one-sided t-tests (H₀ μ ≤ −margin and H₀ μ ≥ +margin), p = the larger of the
    two; equivalent at ``alpha`` exactly when the (1 − 2α) t-interval lies inside (−margin, margin).
    Non-finite values are dropped.  The margin is part of the claim: fix it before the run and record it.

    Returns n, margin, mean, the (1 − 2α) interval, the two one-sided p's, ``p`` and ``equivalent``."""
    from scipy import stats

    from ..errors import ConfigError

    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
        raise ConfigError(f"an equivalence margin must be a positive number, got {margin!r}", "e.g. margin=0.1")
    x = _finite(values)
    n = int(x.size)
    out: dict[str, Any] = {
        "n": n,
        "margin": float(margin),
        "mean": float(x.mean()) if n else None,
        "low": None,
        "high": None,
        "interval": f"Student t, {1 - 2 * alpha:g}, over seeds",
        "p_lower": None,
        "p_upper": None,
        "p": None,
        "equivalent": False,
    }
    if n < 2:
        return out
    sd = float(x.std(ddof=1))
    half = _t_half(sd, n, 1 - 2 * alpha)
    out.update(low=float(x.mean() - half), high=float(x.mean() + half))
    if sd > 0:
        p_lo = float(stats.ttest_1samp(x, -margin, alternative="greater").pvalue)
        p_hi = float(stats.ttest_1samp(x, margin, alternative="less").pvalue)
    else:  # every seed the same value: inside or outside the margin for certain
        inside = abs(float(x[0])) < margin
        p_lo = p_hi = 0.0 if inside else 1.0
    out.update(p_lower=p_lo, p_upper=p_hi, p=max(p_lo, p_hi))
    out["equivalent"] = out["p"] < alpha
    return out
