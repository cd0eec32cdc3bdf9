"""``originlens lm ...``: pretrained language models (currently llama2.c checkpoints).

``originlens lm generate --model PATH --tokenizer PATH [--prompt TEXT] [--max-new-tokens N]
[--greedy | --temperature T] [--seed S]`` prints the prompt and its continuation.

:func:`load_model` picks the checkpoint format from the path (extension, directory contents, header)
through the :data:`MODEL_FORMATS` registry, so further formats (Hugging Face directories, our own GPT
checkpoints) are one entry each.  Caveat: only the llama2.c version-0 format is registered so far.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import InputError
from ..lm.llama2c import (HEADER_INTS, Llama2cConfig, Llama2cTokenizer, expected_llama2c_bytes, generate,
                          load_llama2c)


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


def _cmd_generate(args: argparse.Namespace) -> int:
    fmt = detect_format(args.model)
    model = fmt.load(Path(args.model))
    tokenizer = fmt.load_tokenizer(None if args.tokenizer is None else Path(args.tokenizer), model)
    greedy = args.temperature is None
    text = generate(model, tokenizer, prompt=args.prompt, max_new_tokens=args.max_new_tokens,
                    greedy=greedy, temperature=1.0 if greedy else args.temperature, seed=args.seed)
    sys.stdout.write(text + "\n")
    return 0


def _positive_float(s: str) -> float:
    v = float(s)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {s}")
    return v


def _non_negative_int(s: str) -> int:
    v = int(s)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {s}")
    return v


def register(subparsers: Any) -> None:
    lm = subparsers.add_parser("lm", help="pretrained language models (llama2.c checkpoints)")
    lm_sub = lm.add_subparsers(dest="lm_command", metavar="LM_COMMAND")
    g = lm_sub.add_parser("generate", help="generate text from BOS (and an optional prompt)",
                          description="Print the prompt and its continuation; generation starts from BOS "
                                      "and stops when BOS is produced again or after N new tokens.")
    g.add_argument("--model", required=True,
                   help="checkpoint; formats: " + ", ".join(f.name for f in MODEL_FORMATS))
    g.add_argument("--tokenizer", default=None, help="tokenizer file (llama2.c: tok512.bin / tokenizer.bin)")
    g.add_argument("--prompt", default="", help="text to continue (default: none)")
    g.add_argument("--max-new-tokens", type=_non_negative_int, default=256, help="default 256")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="always take the most likely token (default)")
    mode.add_argument("--temperature", type=_positive_float, default=None,
                      help="sample from softmax(logits / T) instead of greedy decoding")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.set_defaults(func=_cmd_generate)
