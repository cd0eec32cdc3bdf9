"""Inference over seeds: every interval and test against its definition or a simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from originlens.experiments import inference as inf


def test_mean_ci_is_the_student_t_interval():
    v = [0.1, 0.4, 0.35, 0.2, 0.3]
    c = inf.mean_ci(v)
    half = stats.t.ppf(0.975, 4) * np.std(v, ddof=1) / math.sqrt(5)
    assert c["n"] == 5 and math.isclose(c["mean"], np.mean(v))
    assert math.isclose(c["low"], np.mean(v) - half) and math.isclose(c["high"], np.mean(v) + half)
    assert inf.mean_ci([1.0])["low"] is None and inf.mean_ci([float("nan"), None])["n"] == 0


def test_correlation_ci_is_fisher_z_and_stays_in_range():
    r = [0.97, 0.99, 0.995, 0.93, 0.999]
    c = inf.correlation_ci(r)
    z = np.arctanh(r)
    half = stats.t.ppf(0.975, 4) * z.std(ddof=1) / math.sqrt(5)
    assert math.isclose(c["mean"], math.tanh(z.mean()))
    assert math.isclose(c["low"], math.tanh(z.mean() - half)) and math.isclose(c["high"], math.tanh(z.mean() + half))
    assert -1 < c["low"] < c["high"] < 1
    # the plain t-interval of the same values leaves [-1, 1]; the Fisher one cannot
    assert inf.mean_ci(r)["high"] > 1 or inf.mean_ci([0.2, 0.99, 0.999])["high"] > 1
    assert inf.correlation_ci([1.0, 1.0, 0.9])["high"] <= 1


def test_bootstrap_interval_brackets_the_mean_and_is_degenerate_for_constants():
    b = inf.bootstrap_ci([0.1, 0.5, 0.3, 0.2, 0.4], n_boot=4000)
    assert b["low"] < 0.3 < b["high"]
    c = inf.bootstrap_ci([0.7, 0.7, 0.7])
    assert c["low"] == pytest.approx(0.7) and c["high"] == pytest.approx(0.7)


def test_paired_test_matches_scipy_on_fisher_z():
    a = [0.8, 0.85, 0.78, 0.9, 0.82]
    b = [0.6, 0.7, 0.69, 0.65, 0.71]
    t = inf.paired_test(a, b, alternative="greater")
    want = stats.ttest_rel(np.arctanh(a), np.arctanh(b), alternative="greater").pvalue
    assert math.isclose(t["p_t"], want, rel_tol=1e-12)
    assert math.isclose(t["p_wilcoxon"], 1 / 32)  # all 5 differences positive: exact 2^-5
    d = np.arctanh(a) - np.arctanh(b)
    assert math.isclose(t["dz"], d.mean() / d.std(ddof=1))
    raw = inf.paired_test(a, b, correlation=False, alternative="less")
    assert math.isclose(raw["p_t"], stats.ttest_rel(a, b, alternative="less").pvalue)
    assert raw["p_t"] > 0.99
    # pairs with a missing member are dropped
    assert inf.paired_test([0.5, None, 0.7], [0.4, 0.3, float("nan")])["n"] == 1


def test_power_agrees_with_simulation():
    rng = np.random.default_rng(0)
    n, dz, reps = 5, 1.2, 20000
    d = rng.normal(dz, 1.0, (reps, n))
    p = stats.ttest_1samp(d, 0.0, axis=1, alternative="greater").pvalue
    assert abs(inf.paired_power(dz, n) - float((p < 0.05).mean())) < 0.015
    m = inf.detectable_effect(n)
    assert math.isclose(inf.paired_power(m, n), 0.8, abs_tol=1e-6)
    assert inf.detectable_effect(10) < m  # more seeds detect smaller effects


def test_holm_step_down():
    adj = inf.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": None})
    assert adj == {"a": pytest.approx(0.03), "b": pytest.approx(0.06), "c": pytest.approx(0.06), "d": None}
    assert inf.holm({"x": 0.6, "y": 0.7})["y"] == 1.0 or inf.holm({"x": 0.6, "y": 0.7})["y"] == pytest.approx(1.0)


def test_bounded_metrics_keep_their_range():
    c = inf.mean_ci([0.99, 1.0, 0.97], bounds=(0, 1))
    assert c["high"] == 1.0 and c["low"] < 0.99 and "clipped" in c["interval"]
    assert inf.mean_ci([0.99, 1.0, 0.97])["high"] > 1


def test_tost_is_two_one_sided_t_tests_and_agrees_with_the_interval_rule():
    from scipy import stats

    from originlens.errors import ConfigError

    rng = np.random.default_rng(4)
    for _ in range(200):
        x = rng.normal(rng.uniform(-0.3, 0.3), rng.uniform(0.01, 0.2), size=int(rng.integers(3, 11)))
        m = float(rng.uniform(0.02, 0.4))
        t = inf.tost(list(x), m)
        n, mean, se = x.size, x.mean(), x.std(ddof=1) / np.sqrt(x.size)
        p_lo = 1 - stats.t.cdf((mean + m) / se, n - 1)  # H0 μ ≤ −m
        p_hi = stats.t.cdf((mean - m) / se, n - 1)  # H0 μ ≥ m
        assert t["p_lower"] == pytest.approx(p_lo, abs=1e-12) and t["p_upper"] == pytest.approx(p_hi, abs=1e-12)
        assert t["p"] == max(t["p_lower"], t["p_upper"])
        # equivalent at α exactly when the (1 − 2α) interval lies inside the margin
        assert t["equivalent"] == (-m < t["low"] and t["high"] < m)
    assert inf.tost([0.01] * 4, 0.1)["equivalent"] and not inf.tost([0.5] * 4, 0.1)["equivalent"]
    assert inf.tost([0.1], 0.1)["p"] is None  # one seed tests nothing
    for bad in (0, -0.1, float("nan"), True, "0.1"):
        with pytest.raises(ConfigError, match="positive"):
            inf.tost([0.0, 0.1], bad)
