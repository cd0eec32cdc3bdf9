"""``benchmarks/run_all.py``: every benchmark runs at small size and no speed-up falls below its floor; the
guard itself fails when a figure is below its floor or a script records nothing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_ALL = ROOT / "benchmarks" / "run_all.py"


def _run_all():
    spec = importlib.util.spec_from_file_location("run_all", RUN_ALL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_figure_below_its_floor_fails(monkeypatch, capsys):
    mod = _run_all()
    monkeypatch.setitem(mod.FLOORS, "othello.generate.no_types", 1e9)
    assert mod.main(["--quick", "--only", "othello-no-types"]) == 1
    err = capsys.readouterr().err
    assert "othello.generate.no_types" in err and "below its floor" in err


def test_a_script_that_records_nothing_fails(monkeypatch, capsys):
    mod = _run_all()
    monkeypatch.setitem(mod.SCRIPTS, "threads", (["--help"], ["--help"]))  # runs, emits no figure
    assert mod.main(["--quick", "--only", "threads"]) == 1
    assert "recorded no figure" in capsys.readouterr().err


def test_every_floor_names_a_script():
    mod = _run_all()
    scripts = {s.split("-")[0] for s in mod.SCRIPTS}
    assert all(name.split(".")[0] in scripts for name in mod.FLOORS)
    assert all((ROOT / "benchmarks" / f"{s}.py").is_file() for s in scripts)


@pytest.mark.slow
def test_every_benchmark_stays_above_its_floor():
    out = subprocess.run([sys.executable, str(RUN_ALL), "--quick"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "BELOW" not in out.stdout
