"""Ridge probes against brute-force least squares and scipy's Pearson r."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sst

from originlens.errors import InputError
from originlens.probes import ProbeSet, fit_probes


def data(seed=0, n=60, K=2, T=4, d=5, F=3):
    rng = np.random.default_rng(seed)
    R = rng.normal(size=(n, K, T, d))
    w = rng.normal(size=(d, F))
    Y = np.sign(R[:, 1] @ w + 0.05 * rng.normal(size=(n, T, F)))  # {-1, +1} targets from layer 1
    Y[:, :, 2] = np.round(R[:, 0, :, 0] * 2)  # an integer-valued target
    types = rng.integers(0, 3, size=(n, T, F)).astype(np.uint8)
    return R, Y, types


def test_matches_brute_force_ridge_and_pearson():
    R, Y, types = data()
    alpha = 0.7
    probes, met = fit_probes(R, Y, feature_types=types, alpha=alpha)
    n_tr = 42
    for k in range(2):
        for pi, i in enumerate(range(1, 4)):
            X = R[:n_tr, k, i]
            # ridge with unpenalised intercept as an augmented least-squares problem
            A = np.hstack([X, np.ones((n_tr, 1))])
            reg = np.sqrt(alpha) * np.hstack([np.eye(5), np.zeros((5, 1))])
            sol, *_ = np.linalg.lstsq(np.vstack([A, reg]), np.vstack([Y[:n_tr, i], np.zeros((5, 3))]), rcond=None)
            np.testing.assert_allclose(probes.weights[k, pi].T, sol[:5], atol=1e-10)
            np.testing.assert_allclose(probes.intercepts[k, pi], sol[5], atol=1e-10)
            pred = R[n_tr:, k, i] @ sol[:5] + sol[5]
            for f in range(3):
                y = Y[n_tr:, i, f]
                np.testing.assert_allclose(met.pearson[k, pi, f], sst.pearsonr(y, pred[:, f])[0], atol=1e-10)
                np.testing.assert_allclose(met.mse[k, pi, f], ((y - pred[:, f]) ** 2).mean(), atol=1e-12)
                m = types[n_tr:, i, f] == 1
                if len(np.unique(y[m])) > 1:
                    np.testing.assert_allclose(met.by_type[1][k, pi, f], sst.pearsonr(y[m], pred[m, f])[0], atol=1e-10)
                else:
                    assert np.isnan(met.by_type[1][k, pi, f])
    # the planted feature is decodable from layer 1, much better than from layer 0
    assert met.pearson[1, :, :2].mean() > 0.75 > 0.3 > met.pearson[0, :, :2].mean()
    assert met.accuracy[1, :, :2].mean() > 0.85


def test_predict_save_load_roundtrip(tmp_path):
    R, Y, _ = data(1)
    probes, _ = fit_probes(R, Y, feature_names=["a", "b", "c"])
    probes.save(tmp_path / "p.safetensors")
    back = ProbeSet.load(tmp_path / "p.safetensors")
    np.testing.assert_array_equal(back.predict(R), probes.predict(R))
    np.testing.assert_array_equal(back.direction(1, 2, "b"), probes.weights[1, 1, 1])
    with pytest.raises(InputError):
        back.direction(5, 0, "a")


def test_bad_shapes():
    R, Y, _ = data()
    with pytest.raises(InputError):
        fit_probes(R[:, :, :3], Y)
    with pytest.raises(InputError):
        fit_probes(R[:3], Y[:3])
