"""Tests for the trainer's fast path (``Trainer.host_sync = "log"``, the default on GPUs), exercised on the
CPU: the same updates bit for bit as the per-step path, device-side batches equal to the host's, the token
check done once on the host, non-finite values still caught (at the next read), and the CUDA kernel
settings (TF32, deterministic kernels) validated and recorded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from originlens.devices import check_matmul_precision, configure_device
from originlens.errors import ConfigError, InputError, NumericalError
from originlens.models import GPT
from originlens.models.gpt import GPTConfig
from originlens.storage import read_json
from originlens.train.ntp import NTPConfig, Trainer
from originlens.train.ntp.config import config_identity
from originlens.train.ntp.data import PoolData, SampledData, check_ids


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def tiny(**kw) -> NTPConfig:
    base = dict(
        task="cond-majority",
        d_model=16,
        n_head=2,
        batch_size=16,
        steps=12,
        eval_size=64,
        log_every=4,
        eval_every=6,
        probe_every=0,
        checkpoint_every=5,
        train_size=256,
    )
    base.update(kw)
    return NTPConfig(**base)


def _train(cfg: NTPConfig, path, host_sync: str):
    tr = Trainer(cfg, path)
    tr.host_sync = host_sync
    seen: list[float] = []
    tr.add_callback("on_step_end", lambda t: seen.append(t.last_loss))
    tr.run()
    return tr, seen


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(task="majority", train_size=0, regime="myopic+untied"),
        dict(task="othello", othello_pool=300, train_size=0),
    ],
)
def test_fast_path_gives_the_per_step_path_bit_for_bit(tmp_path, kw):
    cfg = tiny(**kw)
    a, seen_a = _train(cfg, tmp_path / "step", "step")
    b, seen_b = _train(cfg, tmp_path / "log", "log")
    for (n, p), (_, q) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(p, q), n
    assert seen_a == seen_b and len(seen_a) == cfg.steps  # callbacks read every update's loss
    logs = [
        [(r["step"], r["loss"], r["last_loss"]) for r in Trainer_metrics(d) if r.get("event") == "train"]
        for d in (tmp_path / "step", tmp_path / "log")
    ]
    assert logs[0] == logs[1] and [s for s, _, _ in logs[0]] == [4, 8, 12]
    assert (tmp_path / "step" / "model.safetensors").read_bytes() == (
        tmp_path / "log" / "model.safetensors"
    ).read_bytes()
    assert read_json(tmp_path / "log" / "environment.json")["host_sync"] == "log"


def Trainer_metrics(d):
    from originlens.runs import RunDir

    return RunDir(d, create=False).read_metrics()


def test_device_batches_equal_host_batches():
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 7, size=(50, 9)).astype(np.uint8)
    data = PoolData(pool, 3, 8, "a pool")
    for b in range(4):
        x = data.device_batch(b, torch.device("cpu"), 7)
        assert x.dtype == torch.int64 and np.array_equal(x.numpy(), data.batch(b))
    with pytest.raises(InputError, match="outside the vocabulary"):
        PoolData(pool, 3, 8, "a pool").device_batch(0, torch.device("cpu"), 6)  # the pool is checked once
    from originlens.tasks import get_task

    sampled = SampledData(get_task("majority"), 1, 5)
    assert np.array_equal(sampled.device_batch(2, torch.device("cpu"), 100).numpy(), sampled.batch(2))
    check_ids(np.zeros((0, 3), dtype=np.int64), 1)  # empty: nothing to check


def test_trusted_tokens_skips_only_the_range_check():
    m = GPT(GPTConfig(vocab_size=5, d_model=8, n_head=2, n_layer=1, seq_len=4))
    bad = torch.tensor([[0, 1, 7]])
    with pytest.raises(InputError, match="outside the vocabulary"):
        m(bad)
    with m.trusted_tokens():
        assert not m.check_token_range
        with pytest.raises((IndexError, RuntimeError)):  # the embedding itself refuses it
            m(bad)
        with pytest.raises(InputError, match="integers"):  # dtype and shape are still checked
            m(torch.zeros(1, 3))
    assert m.check_token_range


def test_fast_path_catches_a_nonfinite_loss_at_its_update(tmp_path):
    tr = Trainer(tiny(steps=30, lr=1e30, checkpoint_every=0, eval_every=0, log_every=10), tmp_path / "r")
    tr.host_sync = "log"
    with pytest.raises(NumericalError, match=r"training loss is (nan|inf) at update \d+"):
        tr.run()
    assert not (tmp_path / "r" / "model.safetensors").exists()


def test_fast_path_catches_a_nonfinite_gradient_with_a_finite_loss(tmp_path):
    tr = Trainer(tiny(steps=10, checkpoint_every=0, eval_every=0, log_every=5), tmp_path / "r")
    tr.host_sync = "log"
    name = "blocks.0.mlp.fc.weight"
    p = dict(tr.model.named_parameters()).get(name) or next(tr.model.parameters())

    def poison(t):  # an infinite gradient in update 5, the last before a read: its loss is finite
        if t.step == 4:
            p.register_hook(lambda g: torch.full_like(g, float("inf")))

    tr.add_callback("on_step_end", poison)
    with pytest.raises(NumericalError, match=r"became non-finite in updates 1\.\.5"):
        tr.run()


def test_fast_path_names_the_update_a_nonfinite_gradient_may_have_come_from(tmp_path):
    tr = Trainer(tiny(steps=10, checkpoint_every=0, eval_every=0, log_every=10), tmp_path / "r")
    tr.host_sync = "log"
    p = next(tr.model.parameters())

    def poison(t):  # an infinite gradient in update 3 (not read then): the loss of update 4 is the first NaN
        if t.step == 2:
            p.register_hook(lambda g: torch.full_like(g, float("inf")))

    tr.add_callback("on_step_end", poison)
    with pytest.raises(NumericalError, match=r"at update 4 \(or a non-finite gradient at update 3\)"):
        tr.run()


def test_fast_path_signal_after_the_read_checks_the_unread_updates_before_checkpointing(tmp_path):
    import os
    import signal

    from originlens.interrupts import Interrupted

    def run(poison: bool):
        tr = Trainer(tiny(steps=10, checkpoint_every=0, eval_every=0, log_every=10), tmp_path / f"r{poison}")
        tr.host_sync = "log"
        p = next(tr.model.parameters())

        def at_3(t):  # after the step's read: parameters broken (optionally), then SIGTERM
            if t.step == 3:
                if poison:
                    with torch.no_grad():
                        p.fill_(float("nan"))
                os.kill(os.getpid(), signal.SIGTERM)

        tr.add_callback("on_step_end", at_3)
        tr.run()

    with pytest.raises(Interrupted, match="SIGTERM at update 3/10"):
        run(False)
    with pytest.raises(NumericalError, match=r"became non-finite in updates 1\.\.3"):
        run(True)  # no checkpoint of parameters nobody checked
    assert not list((tmp_path / "rTrue").glob("checkpoints/*.safetensors"))


def test_host_sync_must_be_known(tmp_path):
    tr = Trainer(tiny(), tmp_path / "r")
    tr.host_sync = "sometimes"
    with pytest.raises(ConfigError, match="host_sync"):
        tr.run()


def test_matmul_precision_is_validated_and_kept_out_of_old_identities():
    assert check_matmul_precision(" TF32 ") == "tf32"
    with pytest.raises(ConfigError, match="matmul precision"):
        check_matmul_precision("bf16")
    with pytest.raises(ConfigError, match="matmul precision"):
        tiny(matmul_precision="medium")
    assert "matmul_precision" not in config_identity(tiny().to_dict())  # earlier runs stay resumable
    assert config_identity(tiny(matmul_precision="tf32").to_dict())["matmul_precision"] == "tf32"
    # the CPU has no TF32 and no CUDA kernel settings: nothing is changed or recorded
    assert configure_device(torch.device("cpu"), "tf32") == {}
    with pytest.raises(ConfigError):
        configure_device(torch.device("cpu"), "fast")


def test_kernel_flags_are_set_both_ways():
    from originlens.devices import _set_kernel_flags

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.matmul.allow_tf32)
    try:
        _set_kernel_flags(True, True)
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cuda.matmul.allow_tf32
        _set_kernel_flags(False, False)  # a later configuration turns them off again
        assert not torch.are_deterministic_algorithms_enabled()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cuda.matmul.allow_tf32 = before[1]


@pytest.mark.parametrize("host_sync", ["step", "log"])
def test_a_deadline_checkpoints_and_the_resumed_run_is_bit_identical(tmp_path, host_sync):
    import time

    from originlens.errors import BudgetExceeded
    from originlens.train.ntp import list_checkpoints

    cfg = tiny(steps=12, checkpoint_every=0, eval_every=0)
    whole, _ = _train(cfg, tmp_path / "whole", host_sync)
    tr = Trainer(cfg, tmp_path / "cut")
    tr.host_sync = host_sync
    tr.add_callback("on_step_end", lambda t: setattr(t, "deadline", time.time() - 1) if t.step == 4 else None)
    with pytest.raises(BudgetExceeded, match="deadline reached at update 5/12"):
        tr.run()
    assert [s for s, _ in list_checkpoints(tmp_path / "cut")] == [5]
    Trainer(cfg, tmp_path / "cut", resume=True).run()
    assert (tmp_path / "cut" / "model.safetensors").read_bytes() == (
        tmp_path / "whole" / "model.safetensors"
    ).read_bytes()


def test_the_cli_takes_the_matmul_precision(tmp_path, capsys):
    from originlens.cli.main import main as cli_main

    base = [
        "ntp",
        "train",
        "--task",
        "majority",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--steps",
        "2",
        "--eval-size",
        "32",
    ]
    assert cli_main([*base, "--batch-size", "8", "--matmul-precision", "tf32", "--out", str(tmp_path / "r")]) == 0
    assert read_json(tmp_path / "r" / "config.json")["matmul_precision"] == "tf32"
    assert cli_main([*base, "--matmul-precision", "bf16", "--out", str(tmp_path / "s")]) == 2
    assert "unknown matmul precision" in capsys.readouterr().err
