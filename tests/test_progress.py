"""Progress without a terminal: heartbeat lines instead of a hidden bar, never when quiet."""

from __future__ import annotations

import pytest
from tqdm.auto import tqdm

from originlens import progress as pg


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(autouse=True)
def auto_verbosity():
    pg.set_verbosity(None)
    yield
    pg.set_verbosity(None)


def test_heartbeat_prints_at_most_every_interval_with_rate_eta_and_postfix(capsys):
    clock = Clock()
    hb = pg.Heartbeat(None, total=100, desc="majority/standard/s0", unit="step", initial=20, every=30, clock=clock)
    for _ in range(10):  # 10 steps in 20 s: below the interval, silent
        clock.t += 2
        hb.update(1)
    assert capsys.readouterr().err == ""
    hb.set_postfix(loss="0.6931")
    clock.t += 10  # 11 steps in 30 s since the start
    hb.update(1)
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["majority/standard/s0: 31/100 step, 2.73 s/step, 3 min left, loss 0.6931"]
    clock.t += 1
    hb.update(1)  # 1 s after the last line: silent again
    assert capsys.readouterr().err == ""


def test_heartbeat_iterates_and_counts(capsys):
    clock = Clock()
    seen = []
    hb = pg.Heartbeat(range(5), total=None, desc="scan", unit="batch", every=1, clock=clock)
    for x in hb:
        seen.append(x)
        clock.t += 0.5
    assert seen == [0, 1, 2, 3, 4] and hb.n == 5 and hb.total == 5
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and all(ln.startswith("scan: ") and "batch/s" in ln for ln in lines)


def test_progress_picks_bar_heartbeat_or_nothing(monkeypatch):
    monkeypatch.setattr(pg.sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("ORIGINLENS_HEARTBEAT", raising=False)
    assert isinstance(pg.progress(total=3), pg.Heartbeat)  # no terminal, not quiet: heartbeat
    monkeypatch.setenv("ORIGINLENS_HEARTBEAT", "0")
    assert not isinstance(pg.progress(total=3), pg.Heartbeat)  # turned off: a hidden bar
    monkeypatch.setenv("ORIGINLENS_HEARTBEAT", "5")
    pg.set_verbosity(0)  # -q: nothing at all
    bar = pg.progress(total=3)
    assert isinstance(bar, tqdm) and bar.disable
    pg.set_verbosity(1)  # forced bars
    bar = pg.progress(total=3)
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()


def test_bars_show_in_a_jupyter_kernel(monkeypatch):
    """A notebook kernel's stderr is no TTY, but it shows (tqdm.auto) bars: no heartbeat there."""
    import sys
    import types

    monkeypatch.setattr(pg.sys.stderr, "isatty", lambda: False, raising=False)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("ORIGINLENS_HEARTBEAT", raising=False)
    pg.set_verbosity(None)
    fake = types.ModuleType("IPython")
    shell = types.SimpleNamespace(kernel=None)  # a terminal IPython: no kernel
    fake.get_ipython = lambda: shell
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert not pg.in_notebook() and isinstance(pg.progress(total=3), pg.Heartbeat)
    shell.kernel = object()  # ipykernel's shell
    assert pg.in_notebook() and pg.verbosity() == 1
    bar = pg.progress(total=3)
    assert isinstance(bar, tqdm) and not bar.disable
    bar.close()
    monkeypatch.setenv("CI", "1")
    assert pg.verbosity() == 0
    monkeypatch.setitem(sys.modules, "IPython", None)
    monkeypatch.delenv("CI")
    assert not pg.in_notebook()
