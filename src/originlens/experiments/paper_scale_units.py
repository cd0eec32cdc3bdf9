"""The units of a budgeted paper-scale run (:mod:`originlens.experiments.paper_scale`) that run in their own
process, so that the run's deadline can stop them wherever they are: the Othello calibration and the Othello
experiment.  A unit's error or stop is one line (on stderr and in the run's record), never a traceback.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any


def _unit_main(target: Any, args: tuple[Any, ...], error_file: str) -> None:
    """A unit's process: ``target(*args)`` with the command's error handling: a stop at the deadline or an
    error is one line on stderr (also written to ``error_file`` for the run's record) and an exit status,
    never a traceback."""
    import sys

    from ..errors import OriginlensError
    from ..interrupts import Interrupted, terminate_as_interrupt

    def fail(line: str, code: int) -> None:
        print(f"paper-scale unit: {line}", file=sys.stderr)
        from ..storage import atomic_write_text

        atomic_write_text(error_file, line)
        sys.exit(code)

    try:
        with terminate_as_interrupt():
            target(*args)
    except Interrupted as exc:  # a trainer checkpointed before stopping
        fail(f"interrupted by {exc.message}", exc.exit_code)
    except OriginlensError as exc:
        fail(f"error: {exc.one_line()}", 2)
    except KeyboardInterrupt as exc:
        fail("interrupted", 143 if str(exc) == "SIGTERM" else 130)
    except Exception as exc:  # e.g. a CUDA error: its type and message, one line
        fail(" ".join(f"{type(exc).__name__}: {exc}".split()), 1)


def run_until(
    target: Any, args: tuple[Any, ...], seconds: float, grace: float = 15.0, *, single_threaded: bool = True
) -> str:
    """Run ``target(*args)`` in a spawned process for at most ``seconds``: ``"finished"``, ``"deadline"``
    (sent SIGTERM — a trainer checkpoints and stops — then killed after ``grace`` seconds) or
    ``"failed (exit code N): its error line"``.  Not started when ``seconds`` ≤ 0 (``"deadline"``).
    ``single_threaded``: the process starts in :func:`~originlens.train.grid.worker_environment` (else with
    this process's environment)."""
    import multiprocessing as mp

    from ..train.grid import worker_environment

    if seconds <= 0:
        return "deadline"
    with tempfile.TemporaryDirectory() as tmp:
        error_file = Path(tmp) / "error.txt"
        with worker_environment() if single_threaded else contextlib.nullcontext():
            proc = mp.get_context("spawn").Process(target=_unit_main, args=(target, args, str(error_file)))
            proc.start()
        proc.join(seconds)
        if proc.is_alive():
            proc.terminate()
            proc.join(grace)
            if proc.is_alive():
                proc.kill()
                proc.join()
            return "deadline"
        if proc.exitcode == 0:
            return "finished"
        why = error_file.read_text(encoding="utf-8") if error_file.is_file() else ""
        return f"failed (exit code {proc.exitcode})" + (f": {why}" if why else "")
