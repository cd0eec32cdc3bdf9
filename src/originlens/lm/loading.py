"""Model checkpoints of any supported format, behind one call: :func:`load_model`.

:data:`MODEL_FORMATS` is a registry of :class:`ModelFormat` entries (how to recognise a checkpoint, load
the model, load its tokenizer); :func:`detect_format` picks the entry from the path (extension, directory
contents, header), so further formats (Hugging Face directories, our own GPT checkpoints) are one entry
each.  Caveat: only the llama2.c version-0 format is registered so far.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from .llama2c import HEADER_INTS, Llama2cConfig, Llama2cTokenizer, expected_llama2c_bytes, load_llama2c


@dataclass(frozen=True)
class ModelFormat:
    """One checkpoint format: how to recognise it, load the model, and load its tokenizer."""

    name: str
    description: str
    detect: Callable[[Path], bool]
    load: Callable[[Path], Any]
    load_tokenizer: Callable[[Path | None, Any], Any]


def _looks_like_llama2c(path: Path) -> bool:
    """A ``.bin`` file, or any file whose 7-int header predicts its exact size."""
    if not path.is_file():
        return False
    if path.suffix == ".bin":
        return True
    try:
        with open(path, "rb") as f:
            raw = f.read(4 * HEADER_INTS)
        if len(raw) < 4 * HEADER_INTS:
            return False
        d, h, nl, nh, nkv, v, s = (int(x) for x in np.frombuffer(raw, "<i4"))
        cfg = Llama2cConfig(d, h, nl, nh, nkv, abs(v), s, shared_classifier=v > 0)
        cfg.validate()
        return expected_llama2c_bytes(cfg) == path.stat().st_size
    except (OSError, InputError, OverflowError, ValueError):
        return False


def _llama2c_tokenizer(path: Path | None, model: Any) -> Llama2cTokenizer:
    if path is None:
        raise InputError("a llama2.c checkpoint needs its tokenizer",
                         "pass --tokenizer PATH (e.g. tok512.bin next to stories260K.bin)")
    return Llama2cTokenizer.from_file(path, model.cfg.vocab_size)


MODEL_FORMATS: list[ModelFormat] = [
    ModelFormat("llama2c", "llama2.c version-0 checkpoint (.bin, 7-int32 header + float32 weights)",
                _looks_like_llama2c, load_llama2c, _llama2c_tokenizer),
]


def detect_format(path: str | os.PathLike) -> ModelFormat:
    """The registered format of ``path``; :class:`InputError` listing the supported ones otherwise."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"model path {path} does not exist", "check the --model path")
    for fmt in MODEL_FORMATS:
        if fmt.detect(path):
            return fmt
    supported = "; ".join(f"{f.name}: {f.description}" for f in MODEL_FORMATS)
    raise InputError(f"unrecognised model format at {path}", f"supported formats are {supported}")


def load_model(path: str | os.PathLike) -> Any:
    """Load a model checkpoint of any registered format (see :data:`MODEL_FORMATS`)."""
    return detect_format(path).load(Path(path))
