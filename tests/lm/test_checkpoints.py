"""Checkpoint grids: specs and labels, one-at-a-time loading, duplicate detection, missing checkpoints."""

import gc
import hashlib
import weakref

import numpy as np
import pytest
import torch

from originlens.errors import ConfigError, InputError
from originlens.lm.checkpoints import (
    CheckpointGrid,
    checkpoints_in_dir,
    default_loader,
    load_gpt_adapter,
    log_spaced_steps,
    parse_spec,
    pythia_revisions,
    weights_hash,
)
from originlens.lm.native import GPTAdapter
from originlens.models.gpt import GPT, GPTConfig


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=11, seq_len=6, n_layer=2, d_model=8, n_head=2))


def _brute_hash(tensors):
    """sha256 of the concatenated 'name|dtype|shape|' headers and raw bytes, names sorted."""
    buf = b""
    for name in sorted(tensors):
        t = tensors[name]
        buf += (
            f"{name}|{str(t.dtype).replace('torch.', '')}|{tuple(t.shape)}|".encode()
            + t.detach().contiguous().numpy().tobytes()
        )
    return hashlib.sha256(buf).hexdigest()


def test_specs_labels_and_log_spaced_steps():
    assert log_spaced_steps(512) == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert log_spaced_steps(10, include_zero=True) == [0, 1, 2, 4, 8]
    assert pythia_revisions(4) == ["step1", "step2", "step4"]
    assert pythia_revisions(2, "EleutherAI/pythia-70m") == [
        "hf:EleutherAI/pythia-70m@step1",
        "hf:EleutherAI/pythia-70m@step2",
    ]
    s = parse_spec("hf:EleutherAI/pythia-1.4b-deduped@step8")
    assert (s.kind, s.repo, s.revision, s.label, s.step) == (
        "hub",
        "EleutherAI/pythia-1.4b-deduped",
        "step8",
        "step8",
        8,
    )
    p = parse_spec("runs/x/checkpoints/step-000064.safetensors")
    assert (p.kind, p.label, p.step) == ("path", "step64", 64)
    assert parse_spec("models/stories260K.bin").label == "stories260K"
    with pytest.raises(ConfigError):
        parse_spec("hf:@x@y")
    with pytest.raises(ConfigError):
        log_spaced_steps(0)


def test_checkpoints_in_dir_orders_by_step(tmp_path):
    for name in ["step-000010.safetensors", "step-000002.safetensors", "final.safetensors", "notes.txt"]:
        (tmp_path / name).write_bytes(b"x")
    got = [p.split("/")[-1] for p in checkpoints_in_dir(tmp_path)]
    assert got == ["step-000002.safetensors", "step-000010.safetensors", "final.safetensors"]
    with pytest.raises(InputError):
        checkpoints_in_dir(tmp_path / "absent")


def test_weights_hash_matches_brute_force_and_detects_changes():
    sd = {k: v.clone() for k, v in _gpt().state_dict().items()}
    h = weights_hash(sd)
    assert h == _brute_hash(sd)
    assert weights_hash({k: sd[k] for k in reversed(list(sd))}) == h  # order-free
    sd2 = {k: v.clone() for k, v in sd.items()}
    k0 = next(iter(sd2))
    sd2[k0].view(-1)[0] += 1e-7
    assert weights_hash(sd2) != h
    renamed = {("x" + k if k == k0 else k): v for k, v in sd.items()}
    assert weights_hash(renamed) != h
    assert weights_hash({k: v.double() for k, v in sd.items()}) != h
    assert weights_hash({k: v.numpy() for k, v in sd.items()}) == _brute_hash(sd)  # numpy arrays too


def test_grid_detects_duplicates_and_loads_gpt_files(tmp_path):
    a, b = _gpt(0), _gpt(1)
    a.save(tmp_path / "step-000000.safetensors", {"bos_id": 3, "vocab_hash": "abc"})
    b.save(tmp_path / "step-000001.safetensors")
    a.save(tmp_path / "step-000002.safetensors")  # same weights as step 0
    grid = CheckpointGrid(checkpoints_in_dir(tmp_path))
    seen = []
    for label, ad in grid:
        assert isinstance(ad, GPTAdapter)
        seen.append((label, ad.bos_id, getattr(ad, "vocab_hash", None)))
    assert seen == [("step0", 3, "abc"), ("step1", None, None), ("step2", None, None)]
    assert [(d.label, d.same_as) for d in grid.duplicates] == [("step2", "step0")]
    summ = grid.summary()
    assert summ["duplicates"][0]["label"] == "step2" and len(summ["hashes"]) == 3
    assert summ["hashes"]["step0"] == _brute_hash(a.state_dict())
    ad = default_loader(str(tmp_path / "step-000001.safetensors"))
    torch.testing.assert_close(ad.module.state_dict()["embed.0.wte.weight"], b.state_dict()["embed.0.wte.weight"])
    assert load_gpt_adapter(tmp_path / "step-000000.safetensors").bos_id == 3


def test_grid_holds_one_checkpoint_at_a_time():
    refs = []
    alive_at_load = []

    class Big:
        def __init__(self):
            self.t = torch.zeros(10)

        def named_tensors(self):
            return {"t": self.t}

    def loader(spec):
        gc.collect()
        alive_at_load.append(sum(r() is not None for r in refs))
        obj = Big()
        obj.t += int(spec[-1])
        refs.append(weakref.ref(obj))
        return obj

    grid = CheckpointGrid(["hf:m@s1", "hf:m@s2", "hf:m@s3"], loader=loader)
    out = grid.map(lambda label, ad: float(ad.t[0]))
    assert out == {"s1": 1.0, "s2": 2.0, "s3": 3.0}
    assert alive_at_load == [0, 0, 0]
    assert not grid.duplicates


def test_missing_checkpoints_stop_or_skip(tmp_path):
    _gpt().save(tmp_path / "step-000001.safetensors")
    specs = [str(tmp_path / "step-000001.safetensors"), str(tmp_path / "step-000002.safetensors")]
    calls = []

    def loader(spec):
        calls.append(spec)
        return default_loader(spec)

    with pytest.raises(InputError, match="step-000002"):
        list(CheckpointGrid(specs, loader=loader))
    assert calls == []  # stopped before loading anything
    grid = CheckpointGrid(specs, loader=loader, on_missing="skip")
    assert [lab for lab, _ in grid] == ["step1"]
    assert [s.label for s in grid.skipped] == ["step2"]

    def hub_loader(spec):
        if spec.endswith("@step2"):
            raise InputError(f"revision step2 of {spec} not found", "check the revision")
        return _Tiny(spec)

    with pytest.raises(InputError, match="'step2'.*not found"):
        list(CheckpointGrid(["hf:m@step1", "hf:m@step2", "hf:m@step4"], loader=hub_loader))
    grid = CheckpointGrid(["hf:m@step1", "hf:m@step2", "hf:m@step4"], loader=hub_loader, on_missing="skip")
    assert [lab for lab, _ in grid] == ["step1", "step4"]
    assert grid.summary()["skipped"][0]["spec"] == "hf:m@step2"


class _Tiny:
    def __init__(self, spec):
        self.t = torch.tensor([float(len(spec))])

    def named_tensors(self):
        return {"t": self.t}


def test_bad_grid_configuration():
    with pytest.raises(ConfigError):
        CheckpointGrid(["a", "b"], on_missing="maybe")
    with pytest.raises(ConfigError, match="same label"):
        CheckpointGrid(["x/step-1.safetensors", "y/step-1.safetensors"])
    with pytest.raises(ConfigError):
        CheckpointGrid([])
    assert np.all(np.asarray(log_spaced_steps(64)) == 2 ** np.arange(7))


def test_ntp_train_checkpoints_load_with_their_weights(tmp_path):
    from originlens.storage import save_tensors
    from originlens.train.ntp import CHECKPOINT_KIND

    model = _gpt(3)
    tensors = {f"model.{k}": v for k, v in model.state_dict().items()}
    tensors["adam.x.exp_avg"] = torch.zeros(2)
    tensors["rng.torch"] = torch.get_rng_state()
    save_tensors(
        tmp_path / "step-000005.safetensors",
        tensors,
        kind=CHECKPOINT_KIND,
        metadata={"step": 5, "gpt_config": model.config.to_dict()},
    )
    ((label, ad),) = list(CheckpointGrid([str(tmp_path / "step-000005.safetensors")]))
    assert label == "step5" and isinstance(ad, GPTAdapter)
    for k, v in model.state_dict().items():
        torch.testing.assert_close(ad.module.state_dict()[k], v, rtol=0, atol=0)
    assert weights_hash(ad.named_tensors()) == weights_hash(model.state_dict())  # optimizer state not hashed


def test_vocab_hash_that_looks_like_a_number_is_kept_verbatim(tmp_path):
    """A hex vocabulary hash made of digits and one 'e' is valid JSON (a float); it must stay a string."""
    import torch

    from originlens.lm.checkpoints import load_gpt_adapter
    from originlens.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    g = GPT(GPTConfig(vocab_size=7, seq_len=4, n_layer=1, d_model=8, n_head=2))
    g.save(tmp_path / "m.safetensors", metadata={"vocab_hash": "1234567e89012345", "bos_id": 3})
    ad = load_gpt_adapter(tmp_path / "m.safetensors")
    assert ad.vocab_hash == "1234567e89012345" and ad.bos_id == 3
