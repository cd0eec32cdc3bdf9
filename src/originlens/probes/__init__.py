"""Linear probes on residual-stream sites (ridge, closed form) and their quality metrics."""

from .ridge import ProbeMetrics, ProbeSet, fit_probes

__all__ = ["ProbeMetrics", "ProbeSet", "fit_probes"]
