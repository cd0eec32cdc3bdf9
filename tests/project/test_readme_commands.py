"""The README's command lines work as written.

* The block after ``<!-- readme-commands:run -->`` is executed line by line, in order, in a fresh
  directory (each line builds on the earlier ones), through this interpreter (``originlens`` →
  ``python -m originlens``, ``torchrun`` → ``python -m torch.distributed.run``); every line must exit 0.
* The block after ``<!-- readme-commands:parse -->`` (the papers' scale, hours each) is parsed with the
  real argument parser, ``$ORIGINLENS_DATA`` expanded, so a renamed or removed flag fails here.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from originlens.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def block(marker: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    assert f"<!-- readme-commands:{marker} -->" in text, f"README lacks the {marker} block"
    after = text.split(f"<!-- readme-commands:{marker} -->", 1)[1]
    body = after.split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def argv_of(line: str) -> list[str]:
    return shlex.split(line, comments=True)


def test_blocks_are_found_and_commented():
    run, parse = block("run"), block("parse")
    assert len(run) >= 10 and len(parse) >= 5
    # every tiny-scale line states its expected time (the lines that just print help excepted)
    assert all(" s" in ln.split("#", 1)[1] for ln in run if "#" in ln and "--help" not in ln)


def test_paper_scale_lines_parse(monkeypatch):
    monkeypatch.setenv("ORIGINLENS_DATA", os.environ.get("ORIGINLENS_DATA", "../shared/data"))
    for line in block("parse"):
        argv = [os.path.expandvars(a) for a in argv_of(line)]
        assert argv[0] == "originlens", line
        try:
            args = build_parser().parse_args(argv[1:])
        except SystemExit as exc:  # pragma: no cover - the failure message
            pytest.fail(f"README line does not parse (exit {exc.code}): {line}")
        assert getattr(args, "func", None) is not None, line


@pytest.mark.slow
def test_tiny_scale_block_runs_as_written(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "ORIGINLENS_HEARTBEAT": "0"}
    env.pop("CI", None)
    timings = []
    for line in block("run"):
        argv = argv_of(line)
        head = {
            "originlens": [sys.executable, "-m", "originlens"],
            "torchrun": [sys.executable, "-m", "torch.distributed.run"],
        }[argv[0]]
        t0 = time.perf_counter()
        p = subprocess.run([*head, *argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        timings.append((round(time.perf_counter() - t0, 1), line[:60]))
        assert p.returncode == 0, f"README line failed ({p.returncode}): {line}\n{p.stderr[-2000:]}"
    for d in ("runs/lt", "runs/grid", "runs/side-by-side", "runs/cmp", "runs/q"):
        assert (tmp_path / d / "report.html").is_file(), d
    assert (tmp_path / "runs/oth/attribution/report.html").is_file() or any(
        (tmp_path / "runs/oth").rglob("report.html")
    )
    print("\n".join(f"{t:7.1f} s  {ln}" for t, ln in timings))
