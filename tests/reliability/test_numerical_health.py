"""Numerical health: training stops on NaN/Inf with the update, the offending tensor
and the last good checkpoint named, and that checkpoint is intact and finite.

NTP trainer (``originlens ntp train``): a diverging learning rate (the loss itself becomes non-finite)
and non-finite gradients injected into one named parameter through a tensor hook (the loss stays
finite, so only the gradient check can catch it).  The assoc trainer has the same checks
(``tests/cli/test_assoc_cmd.py::test_error_diverging_lr_names_step_and_checkpoint``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from _helpers import tensors

from originlens.cli.main import main as cli_main
from originlens.errors import NumericalError
from originlens.train.ntp import NTPConfig, Trainer, list_checkpoints

TINY = dict(
    task="cond-majority",
    d_model=16,
    n_head=2,
    batch_size=16,
    steps=12,
    eval_size=64,
    log_every=1,
    eval_every=0,
    probe_every=0,
    checkpoint_every=2,
)


def test_diverging_learning_rate_stops_with_step_tensor_and_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    rc = cli_main(
        [
            "-q",
            "ntp",
            "train",
            "--task",
            "cond-majority",
            "--d-model",
            "16",
            "--heads",
            "2",
            "--batch-size",
            "16",
            "--steps",
            "12",
            "--eval-size",
            "64",
            "--eval-every",
            "0",
            "--probe-every",
            "0",
            "--checkpoint-every",
            "1",
            "--lr",
            "1e30",
            "--out",
            str(run),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("originlens: error: training loss is") and err.count("\n") == 1, err
    cks = list_checkpoints(run)
    assert cks, "no checkpoint before the divergence"
    step, last = cks[-1]
    assert f"at update {step + 1} " in err and f"last good checkpoint: {last}" in err
    arrays = tensors(last)
    assert all(np.isfinite(v).all() for k, v in arrays.items() if k.startswith("model."))
    assert not (run / "model.safetensors").exists() and not (run / "summary.json").exists()


@pytest.mark.parametrize(
    "bad, param", [(math.nan, "blocks.1.copies.0.mlp_in.weight"), (math.inf, "embed.0.wpe.weight")]
)
def test_non_finite_gradient_names_the_parameter(tmp_path, bad, param):
    trainer = Trainer(NTPConfig(**TINY), tmp_path / "run")
    target = dict(trainer.model.named_parameters())[param]

    def poison(t):
        if t.step == 4:  # the gradient of update 5 becomes non-finite; the loss stays finite
            target.register_hook(lambda g: g + bad)

    trainer.add_callback("on_step_end", poison)
    with pytest.raises(NumericalError) as ei:
        trainer.run()
    msg = str(ei.value)
    assert f"non-finite gradient of parameter {param!r} at update 5 " in msg, msg
    assert "step-000004.safetensors" in msg and "fix:" in msg
    assert trainer.step == 4  # the poisoned update was not applied
    assert [s for s, _ in list_checkpoints(tmp_path / "run")] == [2, 4]
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    arrays = tensors(tmp_path / "run" / "checkpoints" / "step-000004.safetensors")
    assert np.array_equal(arrays[f"model.{param}"], target.detach().numpy())  # = the last good weights


def test_nan_weights_are_caught_at_the_next_update(tmp_path):
    trainer = Trainer(NTPConfig(**TINY), tmp_path / "run")

    def poison(t):
        if t.step == 3:
            with torch.no_grad():
                dict(t.model.named_parameters())["head.0.ln_f.bias"].fill_(math.nan)

    trainer.add_callback("on_step_end", poison)
    with pytest.raises(NumericalError, match=r"training loss is nan at update 4 .*step-000002\.safetensors"):
        trainer.run()


def test_resume_from_the_last_good_checkpoint_after_a_numerical_error(tmp_path):
    """After the error the run resumes from the named checkpoint and ends like an uninterrupted run."""
    ref = Trainer(NTPConfig(**TINY), tmp_path / "ref")
    ref.run()
    trainer = Trainer(NTPConfig(**TINY), tmp_path / "run")
    target = dict(trainer.model.named_parameters())["blocks.0.copies.0.attn_qkv.weight"]
    trainer.add_callback("on_step_end", lambda t: t.step == 6 and target.register_hook(lambda g: g * math.nan))
    with pytest.raises(NumericalError, match="step-000006"):
        trainer.run()
    resumed = Trainer(NTPConfig(**TINY), tmp_path / "run", resume=True)
    resumed.run()
    for (n, a), (_, b) in zip(ref.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(a, b), n


def test_resume_refuses_a_checkpoint_with_non_finite_values(tmp_path):
    """A checkpoint whose weights or Adam state hold NaN/Inf (a disk error, a hand edit) is never resumed
    from as if it were good: one error naming it and the earlier checkpoint to resume from instead."""
    from originlens.storage import load_tensors, save_tensors

    Trainer(NTPConfig(**{**TINY, "steps": 6}), tmp_path / "run").run()
    last = tmp_path / "run" / "checkpoints" / "step-000006.safetensors"
    arrays, meta = load_tensors(last)
    key = next(k for k in arrays if k.startswith("adam.") and arrays[k].ndim == 2)
    arrays[key] = np.full_like(arrays[key], math.nan)
    save_tensors(last, arrays, kind=meta.pop("kind"), metadata={k: v for k, v in meta.items() if k != "format_version"})
    (tmp_path / "run" / "summary.json").unlink()
    (tmp_path / "run" / "model.safetensors").unlink()
    with pytest.raises(NumericalError) as ei:
        Trainer(NTPConfig(**{**TINY, "steps": 8}), tmp_path / "run", resume=True).run()
    msg = str(ei.value)
    assert "step-000006.safetensors holds non-finite values" in msg and "adam." in msg
    assert "delete it to resume from" in msg and "step-000004.safetensors" in msg
