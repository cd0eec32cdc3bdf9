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


def run_all_units():
    spec = importlib.util.spec_from_file_location("run_all", RUN_ALL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_figure_below_its_guard_fails(monkeypatch, capsys):
    mod = run_all_units()
    monkeypatch.setitem(mod.GUARDS, "othello.generate.no_types", 1e9)
    monkeypatch.setitem(mod.FLOORS, "othello.generate.no_types", 1e9)
    assert mod.main(["--quick", "--only", "othello-no-types"]) == 1
    err = capsys.readouterr().err
    assert "othello.generate.no_types" in err and "below its guard" in err
    # make bench prints the same figure as BELOW and does not fail
    assert mod.main(["--quick", "--only", "othello-no-types", "--reference"]) == 0
    assert "BELOW" in capsys.readouterr().out


def test_a_figure_below_a_reference_floor_is_printed_not_failed(monkeypatch, capsys):
    mod = run_all_units()
    monkeypatch.delitem(mod.GUARDS, "othello.generate.no_types")
    monkeypatch.setitem(mod.REFERENCE, "othello.generate.no_types", 1e9)
    monkeypatch.setitem(mod.FLOORS, "othello.generate.no_types", 1e9)
    assert mod.main(["--quick", "--only", "othello-no-types"]) == 0
    assert "BELOW" in capsys.readouterr().out


def test_guards_and_reference_floors_are_disjoint():
    """A figure is either guarded by the test suite or printed by make bench, never both; the CPU-bound
    figures (subnormals) and wall-time ones (stacked_models) are never guards."""
    mod = run_all_units()
    assert not set(mod.GUARDS) & set(mod.REFERENCE)
    assert mod.FLOORS == {**mod.GUARDS, **mod.REFERENCE}
    assert not any(k.startswith(("subnormals.", "stacked_models.")) for k in mod.GUARDS)


def test_a_script_that_records_nothing_fails(monkeypatch, capsys):
    mod = run_all_units()
    monkeypatch.setitem(mod.SCRIPTS, "threads", (["--help"], ["--help"]))  # runs, emits no figure
    assert mod.main(["--quick", "--only", "threads"]) == 1
    assert "recorded no figure" in capsys.readouterr().err


def test_every_floor_names_a_script():
    mod = run_all_units()
    scripts = {s.split("-")[0] for s in mod.SCRIPTS}
    assert all(name.split(".")[0] in scripts for name in mod.FLOORS)
    assert all((ROOT / "benchmarks" / f"{s}.py").is_file() for s in scripts)


@pytest.mark.slow
def test_every_benchmark_stays_above_its_guard(tmp_path):
    figures = tmp_path / "figures.json"
    out = subprocess.run(
        [sys.executable, str(RUN_ALL), "--quick", "--json", str(figures)], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    import json

    rows = json.loads(figures.read_text())
    guarded = [r for r in rows if r["guard"]]
    assert {r["name"] for r in guarded} == set(run_all_units().GUARDS)
    # CPU-time ratios, or ratios of counts (the same on every machine)
    counts = run_all_units().COUNTS
    assert all(r["cpu"] or r["name"] in counts for r in guarded), [r["name"] for r in guarded if not r["cpu"]]
