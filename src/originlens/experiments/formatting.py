"""Number formatting shared by the experiment reports and the generated docs (one place, so the same
value prints the same way in a report, ``docs/results.md`` and the README)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def num(x: Any, d: int = 3) -> str:
    """``d`` decimals; "—" for a missing or non-finite value."""
    return "—" if _missing(x) else f"{x:.{d}f}"


def sig(x: Any, d: int = 3) -> str:
    """``d`` significant digits (influences span many orders of magnitude)."""
    return "—" if _missing(x) else f"{x:.{d}g}"


def pval(x: Any) -> str:
    """A p-value: 2 significant digits, scientific below 1e-3."""
    return "—" if x is None else (f"{x:.2g}" if x >= 1e-3 else f"{x:.1e}")


def ci(c: dict[str, Any] | None, d: int = 3, fmt: Callable[[Any], str] | None = None) -> str:
    """``mean [low, high]`` of an interval dict (``mean`` alone without bounds; "—" without a mean)."""
    f = fmt or (lambda v: num(v, d))
    if not c or c.get("mean") is None:
        return "—"
    if c.get("low") is None:
        return f(c["mean"])
    return f"{f(c['mean'])} [{f(c['low'])}, {f(c['high'])}]"


def header(rec: dict[str, Any]) -> list[str]:
    """The opening lines of every results file's ``docs/results.md`` section: command, commit, machine,
    versions, seeds, scale and deviations."""
    sc = rec["scale"]
    return [
        f"- command: `{rec['command']}`",
        f"- commit `{rec['git_commit']}`, {rec['created']}, {rec['machine']['cpus']} CPUs; torch "
        f"{rec['versions'].get('torch', '?')}, numpy {rec['versions'].get('numpy', '?')}",
        f"- seeds: {', '.join(map(str, rec['seeds']))}",
        f"- scale: {sc['summary']}; {sc.get('model', '')}; {sc.get('training', '')}"
        + (f"; {sc['untied']}" if sc.get("untied") else "")
        + (f"; eval {sc['eval']}" if sc.get("eval") else ""),
        f"- deviations from the paper: {', '.join(sc.get('deviations', [])) or 'none'}",
    ]
