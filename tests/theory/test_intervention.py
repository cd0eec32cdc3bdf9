"""Memory bounds of the intervention and held-out losses (theory/intervention.py) and the evaluation
window budget of the report (experiments/leading_analysis.AnalysisConfig.n_eval)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from originlens.experiments.leading_analysis import AnalysisConfig
from originlens.models.assoc import AssocConfig, AssocModel
from originlens.theory import intervention
from originlens.theory.intervention import mean_loss, summed_cross_entropy, windows_per_batch

from tolerances import reduction_rtol


def test_chunked_cross_entropy_equals_one_float64_call(monkeypatch):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 7, 11, generator=g)
    targets = torch.randint(0, 11, (5, 7), generator=g)
    whole = float(F.cross_entropy(logits.reshape(-1, 11).double(), targets.reshape(-1), reduction="sum"))
    monkeypatch.setattr(intervention, "CE_CHUNK_ELEMENTS", 11 * 3)  # 3 rows a chunk: 12 chunks, the last short
    assert summed_cross_entropy(logits, targets) == pytest.approx(whole, rel=1e-14)


def test_large_vocabularies_are_evaluated_in_fewer_windows_a_batch():
    assert windows_per_batch(256, 64, 500) == 256  # small models keep the requested batch
    assert windows_per_batch(256, 200, 3000) == (1 << 25) // (200 * 3000) == 55
    assert windows_per_batch(256, 10**6, 10**6) == 1


def test_mean_loss_does_not_depend_on_the_batch_it_can_afford():
    torch.manual_seed(0)
    model = AssocModel(AssocConfig(vocab_size=13, seq_len=6, n_layers=2, init="gaussian", init_std=0.3))
    toks = np.random.default_rng(0).integers(0, 13, size=(9, 7))
    per_window = np.mean([mean_loss(model, toks[i : i + 1], batch_size=1) for i in range(9)])
    # float32 logits whose path sums run over |V|·T terms, computed by other kernels for 1 window and 9
    rtol = reduction_rtol(torch.float32, 13 * 6)
    assert mean_loss(model, toks, batch_size=256) == pytest.approx(per_window, rel=rtol)


@pytest.mark.parametrize(
    "eval_windows, available, T, expected",
    [
        (None, 5000, 64, 2048),  # 131,072 predicted tokens
        (None, 5000, 200, 656),
        (None, 100, 200, 100),  # never more than there are
        (0, 5000, 200, 5000),  # 0 = all (the paper)
        (300, 5000, 200, 300),
        (300, 20, 200, 20),
    ],
)
def test_evaluation_windows_by_token_budget(eval_windows, available, T, expected):
    assert AnalysisConfig(eval_windows=eval_windows).n_eval(available, T) == expected
