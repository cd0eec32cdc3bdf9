"""Optional metric sinks: TensorBoard and Weights & Biases, never required.

Every run already logs to ``RUN/metrics.jsonl`` (:meth:`originlens.runs.RunDir.log_metrics`); this
module mirrors the numeric fields of each record to external trackers when asked, with the CLI's global
``--log-to tensorboard,wandb`` flag, the ``ORIGINLENS_LOG_TO`` environment variable, or
:func:`set_sinks`.  Sinks are opened lazily per run directory (TensorBoard event files under
``RUN/tensorboard``; W&B in offline mode unless ``WANDB_MODE`` says otherwise, files under ``RUN``).

A W&B run gets the run directory's ``config.json`` (when it has one) as its ``config``.

Caveats: only scalar (int/float) fields are forwarded; the x-axis is the record's ``step`` (else a
per-run counter).  A requested tracker that is not installed is a :class:`CompatibilityError` naming the
package to install, raised by :func:`set_sinks` (so ``--log-to`` fails before a command creates its run
directory); trackers asked for through ``ORIGINLENS_LOG_TO`` alone are imported at the first record.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, Protocol, cast

from .errors import CompatibilityError, ConfigError

SINKS = ("tensorboard", "wandb")
_REQUESTED: list[str] | None = None
_OPEN: dict[tuple[str, str], Any] = {}
_COUNTERS: dict[str, int] = {}


def parse_sinks(spec: str | None) -> list[str]:
    """``"tensorboard,wandb"`` → ``["tensorboard", "wandb"]`` (validated; empty/None → [])."""
    names = [s.strip().lower() for s in (spec or "").split(",") if s.strip()]
    bad = [n for n in names if n not in SINKS]
    if bad:
        raise ConfigError(f"unknown metric sink(s) {', '.join(bad)}", f"use any of: {', '.join(SINKS)}")
    return names


def set_sinks(names: list[str] | str | None) -> None:
    """Select the sinks for this process (overrides ``ORIGINLENS_LOG_TO``); a selected tracker that is not
    installed is a :class:`CompatibilityError` now, before anything is written."""
    global _REQUESTED
    chosen = parse_sinks(names) if isinstance(names, str) or names is None else parse_sinks(",".join(names))
    for name in chosen:
        _IMPORTS[name]()
    _REQUESTED = chosen


def reset_sinks() -> None:
    """Back to the environment's choice (``ORIGINLENS_LOG_TO``)."""
    global _REQUESTED
    _REQUESTED = None


def requested_sinks() -> list[str]:
    return _REQUESTED if _REQUESTED is not None else parse_sinks(os.environ.get("ORIGINLENS_LOG_TO"))


class _Sink(Protocol):
    def log(self, values: Mapping[str, float], step: int) -> None: ...


def _summary_writer() -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise CompatibilityError(
            "TensorBoard logging was requested but tensorboard is not installed",
            "pip install tensorboard (or drop --log-to tensorboard)",
        ) from None
    return SummaryWriter


def _wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise CompatibilityError(
            "Weights & Biases logging was requested but wandb is not installed",
            "pip install wandb (or drop --log-to wandb)",
        ) from None
    return wandb


_IMPORTS: dict[str, Callable[[], Any]] = {"tensorboard": _summary_writer, "wandb": _wandb}


def _run_config(run_dir: Path) -> dict[str, Any]:
    """The run's ``config.json`` as a dict (empty when missing or not a JSON object)."""
    try:
        cfg = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


class _TensorBoard:
    def __init__(self, run_dir: Path) -> None:
        self.writer = _summary_writer()(log_dir=str(run_dir / "tensorboard"))

    def log(self, values: Mapping[str, float], step: int) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()


class _WandB:
    def __init__(self, run_dir: Path) -> None:
        wandb = _wandb()
        # WANDB_MODE is passed through as given; wandb.init validates it.
        mode = cast(Literal["online", "offline", "disabled", "shared"], os.environ.get("WANDB_MODE", "offline"))
        self.run = wandb.init(dir=str(run_dir), name=run_dir.name, mode=mode, reinit=True, config=_run_config(run_dir))

    def log(self, values: Mapping[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)


_FACTORIES: dict[str, Callable[[Path], _Sink]] = {"tensorboard": _TensorBoard, "wandb": _WandB}


def forward(run_dir: str | os.PathLike, record: Mapping[str, Any]) -> None:
    """Send the scalar fields of ``record`` to every requested sink of ``run_dir``."""
    names = requested_sinks()
    if not names:
        return
    values = {
        k: float(v)
        for k, v in record.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
    }
    if not values:
        return
    key = str(Path(run_dir).resolve())
    step = record.get("step")
    if not isinstance(step, int):
        step = _COUNTERS.get(key, 0)
        _COUNTERS[key] = step + 1
    for name in names:
        sink = _OPEN.get((name, key))
        if sink is None:
            sink = _OPEN[(name, key)] = _FACTORIES[name](Path(run_dir))
        sink.log(values, step)


def close_all() -> None:
    """Flush and close every open sink (called at interpreter exit by the CLI)."""
    for sink in _OPEN.values():
        w = getattr(sink, "writer", None) or getattr(sink, "run", None)
        for meth in ("close", "finish"):
            if hasattr(w, meth):
                getattr(w, meth)()
                break
    _OPEN.clear()
    _COUNTERS.clear()
