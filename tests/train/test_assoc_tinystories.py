"""The leading-term acceptance criteria on the real TinyStories subset, at a scale CI can afford.

Same protocol as ``examples/reproduce_leading_terms.py`` (word tokenizer, first T+1 tokens per story,
``oov=unk``, 3 layers, zero init, plain SGD, statistics from the first shuffled batch), made smaller so
that it runs in about a minute: |V| = 150, T = 16, batch 256.  Two learning rates, as in the paper:

* η = 0.005, every checkpoint of the first 12 steps: minimum cosine over training ≥ 0.99 for W, V, W_O;
* η = 0.05, 400 steps (t = sη = 20): the loss falls well below ln|V| and removing each matrix's
  leading-term projection hurts most for W_O, then the V's, then the W's (the paper's ordering).

The full CPU-scale figures (|V| = 1,000, T = 64, batch 2,048; |V| = 300, T = 32 for η = 0.05 over 100
epochs) are in docs/results.md.
"""

from __future__ import annotations

import json
import math

import pytest

from originlens.cli.main import main
from originlens.paths import tinystories_files

FILES = tinystories_files()
pytestmark = [
    pytest.mark.skipif(not FILES, reason="TinyStories files not found (set ORIGINLENS_DATA)"),
    pytest.mark.slow,
]
V, T = 150, 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("lt") / "corpus"
    assert (
        main(
            [
                "-q",
                "corpus",
                "build",
                *map(str, FILES[:2]),
                "--vocab-size",
                str(V),
                "--seq-len",
                str(T),
                "--windows",
                "first",
                "--oov",
                "unk",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return out


def _train_and_report(corpus, out, lr: float, steps: int, capsys, extra: list[str]) -> dict:
    assert (
        main(
            [
                "-q",
                "assoc",
                "train",
                str(corpus),
                "--n-layers",
                "3",
                "--lr",
                str(lr),
                "--steps",
                str(steps),
                "--batch-size",
                "256",
                "--stats",
                "first-batch",
                "--init",
                "zero",
                "--dtype",
                "float32",
                "--threads",
                "1",
                "--out",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["-q", "assoc", "report", str(out), "--json", "--no-heldout", "--threads", "1"]) == 0
    return json.loads(capsys.readouterr().out)


def test_small_eta_tracks_the_leading_terms(corpus, tmp_path, capsys):
    rep = _train_and_report(corpus, tmp_path / "r005", 0.005, 12, capsys, ["--checkpoint-every", "1"])
    mins = rep["min_cosine_over_training"]
    steps = [c["step"] for c in rep["checkpoints"]]
    assert steps == list(range(1, 13))
    for name in ("W", "V", "W_O"):
        assert mins[name] >= 0.99, (name, mins)
    # and the first steps are the theorem's: W_O = ηB̄ after one step (cos 1 to float32 round-off)
    assert rep["checkpoints"][0]["theory"]["W_O"]["cos"] > 0.999999


def test_large_eta_loss_drop_and_intervention_ordering(corpus, tmp_path, capsys):
    rep = _train_and_report(corpus, tmp_path / "r05", 0.05, 400, capsys, ["--checkpoint-every", "100"])
    losses = [loss for _step, _epoch, loss in rep["loss_curve"]]  # (step, epoch, train loss) per step
    assert abs(losses[0] - math.log(V)) < 1e-3  # zero init: uniform predictions
    assert losses[-1] < 0.8 * math.log(V), losses[-1]  # "well below ln|V|"
    deltas = {k: v["delta"] for k, v in rep["intervention"]["losses"].items()}
    w_o = deltas["W_O"]
    v_max, v_min = max(deltas[f"V.{l}"] for l in (1, 2, 3)), min(deltas[f"V.{l}"] for l in (1, 2, 3))
    w_max = max(deltas[f"W.{l}"] for l in (1, 2, 3))
    assert w_o > v_max and v_min > w_max, deltas  # W_O, then V, then W
    assert v_min > 0.05 and w_o > 1.0, deltas
