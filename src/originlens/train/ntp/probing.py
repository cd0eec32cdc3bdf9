"""Probe metrics of a next-token-prediction run on disk (plain ``.npz``, no pickle) and their summaries
(tracked-feature quality).  Part of :mod:`originlens.train.ntp`."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...probes import ProbeMetrics
from ...storage import (
    atomic_write_bytes,
)


def save_probe_metrics(path: str | Path, metrics: ProbeMetrics) -> Path:
    """Write :class:`ProbeMetrics` as a plain ``.npz`` (no object arrays, readable without pickle)."""
    arrays: dict[str, Any] = {
        "pearson": metrics.pearson,
        "r2": metrics.r2,
        "mse": metrics.mse,
        "accuracy": metrics.accuracy,
        "layers": np.asarray(metrics.layers, dtype=np.int64),
        "positions": np.asarray(metrics.positions, dtype=np.int64),
        "feature_names": np.asarray(metrics.feature_names, dtype=str),
    }
    for t, v in metrics.by_type.items():
        arrays[f"by_type_{int(t)}"] = v
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return atomic_write_bytes(path, buf.getvalue())


def load_probe_metrics(path: str | Path) -> ProbeMetrics:
    """Read :func:`save_probe_metrics` output."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path} not found", "train the run to the end (it writes probe_metrics.npz)")
    with np.load(path, allow_pickle=False) as z:
        by_type = {int(k.split("_")[-1]): z[k] for k in z.files if k.startswith("by_type_")}
        return ProbeMetrics(
            pearson=z["pearson"],
            r2=z["r2"],
            mse=z["mse"],
            accuracy=z["accuracy"],
            by_type=by_type,
            layers=z["layers"].tolist(),
            positions=z["positions"].tolist(),
            feature_names=[str(s) for s in z["feature_names"]],
        )


def tracked_quality(
    metrics: ProbeMetrics, layers: Sequence[int], positions: Sequence[int], features: Sequence[str]
) -> dict[str, float]:
    """Mean test Pearson r over the given sites and features: overall (``pearson``) and within feature
    type τ (``pearson_type{τ}``: NaN entries — empty or constant subsets — ignored; NaN if none)."""
    li = [metrics.layers.index(k) for k in layers if k in metrics.layers]
    pi = [metrics.positions.index(i) for i in positions if i in metrics.positions]
    fi = [metrics.feature_names.index(f) for f in features if f in metrics.feature_names]
    sel = np.ix_(li, pi, fi)

    def mean(a: np.ndarray) -> float:
        v = a[sel]
        return float(np.nanmean(v)) if v.size and np.isfinite(v).any() else float("nan")

    out = {"pearson": mean(metrics.pearson)}
    for t, arr in sorted(metrics.by_type.items()):
        if t != 0:
            out[f"pearson_type{t}"] = mean(arr)
    return out


def probe_summary(metrics: ProbeMetrics, tracked: Any) -> dict[str, float]:
    """Flat summary at the task's tracked layers/positions: per tracked feature and over all of them
    (``tracked/...``); ``pearson_type1`` is the NTP-useless part, ``pearson_type2`` the useful part."""
    out: dict[str, float] = {}
    for f in tracked.features:
        for k, v in tracked_quality(metrics, tracked.layers, tracked.positions, [f]).items():
            out[f"{f}/{k}"] = v
    for k, v in tracked_quality(metrics, tracked.layers, tracked.positions, tracked.features).items():
        out[f"tracked/{k}"] = v
    return out


# ----------------------------------------------------------------------------------------------------
# Trainer
