"""Checkpoints of a next-token-prediction run: parameters, Adam state and RNG states in one safetensors file
(kind ``ntp-checkpoint``), the vocabulary-hash check, listing ``RUN/checkpoints/step-NNNNNN.safetensors``.
Part of :mod:`originlens.train.ntp`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from ...errors import CompatibilityError, InputError
from ...models.gpt import GPT
from ...runs import CHECKPOINT_DIR, RunDir, checkpoint_name
from ...storage import (
    load_tensors,
    save_tensors,
)
from .config import CHECKPOINT_KIND, NTPConfig


def _encode_json_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(obj).encode("utf-8"), dtype=np.uint8).copy()


def numpy_global_seed(seed: int) -> int:
    """The seed a fresh run gives NumPy's legacy global RNG (``numpy.random.seed`` takes 32 bits)."""
    return int(seed) % (1 << 32)


def _numpy_rng_state() -> np.ndarray:
    # the global legacy RNG is an MT19937, whose legacy state is this tuple (never the dict form)
    state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    name, keys, pos, has_gauss, cached = state
    return _encode_json_bytes([name, keys.tolist(), int(pos), int(has_gauss), float(cached)])


def _set_numpy_rng_state(raw: np.ndarray) -> None:
    name, keys, pos, has_gauss, cached = json.loads(bytes(raw.astype(np.uint8)).decode("utf-8"))
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def checkpoint_tensors(model: GPT, optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor | np.ndarray]:
    """Flat tensor dict: ``model.NAME``, ``adam.NAME.{exp_avg,exp_avg_sq,step}``, ``rng.torch``,
    ``rng.numpy`` (JSON bytes of ``np.random.get_state()``), ``rng.cuda.I`` (uint8)."""
    out: dict[str, torch.Tensor | np.ndarray] = {f"model.{k}": v for k, v in model.state_dict().items()}
    for name, p in model.named_parameters():
        st = optimizer.state.get(p)
        if st:
            for key in ("exp_avg", "exp_avg_sq", "step"):
                out[f"adam.{name}.{key}"] = torch.as_tensor(st[key])
    out["rng.torch"] = torch.get_rng_state()
    out["rng.numpy"] = _numpy_rng_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def save_checkpoint(
    path: str | Path,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    step: int,
    config: NTPConfig,
    extra: dict[str, Any] | None = None,
    *,
    vocab_hash: str | None = None,
) -> Path:
    """Write a checkpoint (safetensors, atomic) holding weights, Adam state, step and RNG states;
    ``vocab_hash`` (:func:`originlens.storage.vocab_hash` of the training data's vocabulary) goes into the
    metadata when known."""
    meta = {"step": int(step), "ntp_config": config.to_dict(), "gpt_config": model.config.to_dict(), **(extra or {})}
    if vocab_hash is not None:
        meta["vocab_hash"] = str(vocab_hash)
    return save_tensors(path, checkpoint_tensors(model, optimizer), kind=CHECKPOINT_KIND, metadata=meta)


def check_checkpoint_vocab(path: str | Path, meta: dict[str, str], expect_vocab_hash: str | None) -> None:
    """:class:`CompatibilityError` when the checkpoint or model file ``path`` (metadata ``meta``) records a
    vocabulary hash other than ``expect_vocab_hash``, the hash of the data it is used with.  Files without
    a hash (written before it was recorded) and an unknown expected hash pass."""
    got = meta.get("vocab_hash")
    if expect_vocab_hash is None or got is None:
        return
    if got != str(expect_vocab_hash):
        raise CompatibilityError(
            f"{path} was trained on another vocabulary (hash {got}) than the data it is used with "
            f"(hash {expect_vocab_hash})",
            "use the corpus / task the model was trained on (a corpus rebuilt in place gets a new vocabulary), "
            "or pass --overwrite to train from scratch",
        )


def load_checkpoint(
    path: str | Path,
    model: GPT,
    optimizer: torch.optim.Optimizer,
    *,
    restore_rng: bool = True,
    expect_vocab_hash: str | None = None,
) -> int:
    """Load weights, Adam state (and RNG states) of :func:`save_checkpoint` into ``model``/``optimizer``;
    returns the step.  ``expect_vocab_hash``: refuse (``CompatibilityError``) a checkpoint that records
    another vocabulary."""
    arrays, meta = load_tensors(path, kind=CHECKPOINT_KIND)
    check_checkpoint_vocab(path, meta, expect_vocab_hash)
    dev = next(model.parameters()).device
    state = {k[len("model.") :]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("model.")}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CompatibilityError(
            f"checkpoint {path} does not fit this model ({str(exc).splitlines()[0]})",
            "resume with the configuration the run was started with",
        ) from None
    names = [n for n, _ in model.named_parameters()]
    opt_state: dict[int, dict[str, torch.Tensor]] = {}
    for i, name in enumerate(names):
        keys = [f"adam.{name}.{k}" for k in ("exp_avg", "exp_avg_sq", "step")]
        if all(k in arrays for k in keys):
            opt_state[i] = {
                "exp_avg": torch.from_numpy(arrays[keys[0]].copy()).to(dev),
                "exp_avg_sq": torch.from_numpy(arrays[keys[1]].copy()).to(dev),
                # save_tensors stores 0-d arrays as shape (1,)
                "step": torch.from_numpy(np.array(arrays[keys[2]]).reshape(())),
            }
    step = int(json.loads(meta["step"]))
    if step > 0 and not opt_state:
        raise CompatibilityError(
            f"checkpoint {path} holds no optimizer (Adam) state after {step} updates: training or its replay "
            "would go on with zeroed moments",
            "use a checkpoint written by the trainer (model and Adam state), or retrain",
        )
    groups = optimizer.state_dict()["param_groups"]
    optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    if restore_rng:
        torch.set_rng_state(torch.from_numpy(arrays["rng.torch"].copy()))
        _set_numpy_rng_state(arrays["rng.numpy"])
        cuda = sorted(k for k in arrays if k.startswith("rng.cuda."))
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.from_numpy(arrays[k].copy()) for k in cuda])
    return int(json.loads(meta["step"]))


def checkpoint_metadata(path: str | Path) -> dict[str, str]:
    """The string metadata of a checkpoint (without reading its tensors)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return dict(f.metadata() or {})
    except Exception as exc:  # safetensors raises its own error types
        raise InputError(f"{path} is not a readable safetensors file ({exc})", "remove the broken checkpoint") from None


def checkpoint_path(run: RunDir, step: int) -> Path:
    return run.file(CHECKPOINT_DIR, checkpoint_name(step))


# ----------------------------------------------------------------------------------------------------
# Probe bookkeeping
