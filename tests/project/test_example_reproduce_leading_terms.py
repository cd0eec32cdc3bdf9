"""``examples/reproduce_leading_terms.py`` runs end to end at a tiny scale through the library API: the corpus,
both training runs, their reports and the summary, whose numbers come from the reports."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from originlens.data.storyworld import generate_stories

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "reproduce_leading_terms.py"


def _load():
    spec = importlib.util.spec_from_file_location("reproduce_leading_terms", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def _threads_restored():
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)  # the example sets torch's thread count (--threads 1)


def test_example_reproduces_at_tiny_scale(tmp_path, capsys, _threads_restored):
    text = tmp_path / "stories.txt"
    text.write_text("\n".join(generate_stories(300, seed=1)) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    rc = _load().main(
        [
            "--out", str(out), "--data", str(text), "--vocab-size", "60", "--seq-len", "8", "--batch-size", "32",
            "--train-windows", "64", "--eval-windows", "32", "--runs", "0.005:1,0.05:2", "--threads", "1",
        ]
    )  # fmt: skip
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["train_windows"] == 64 and summary["steps_per_epoch"] == 2
    assert set(summary["runs"]) == {"eta=0.005-ep1", "eta=0.05-ep2"}
    for label, run in summary["runs"].items():
        assert "error" not in run, run
        report = json.loads((out / label / "report.json").read_text())
        assert run["steps"] == (2 if label.endswith("ep1") else 4)
        cos, ours = run["min_cos_all"], report["min_cosine_over_training"]
        for k in ("W", "V", "W_O"):  # W is still zero (undefined cosine) after 2 steps from zero init
            assert cos[k] == (None if ours[k] is None else pytest.approx(ours[k])), k
        assert cos["W_O"] > 0.9 and cos["V"] > 0.9
        assert cos["W"] is None if label.endswith("ep1") else cos["W"] > 0.9
        assert math.isfinite(run["loss_last"])
    assert summary["commands"][0].startswith("originlens corpus build ")
    assert sum(c.startswith("originlens assoc train ") for c in summary["commands"]) == 2
    assert "# Leading terms on TinyStories" in (out / "summary.md").read_text()
    assert "originlens assoc report" in capsys.readouterr().out
