"""``originlens lm ...``: pretrained language models (currently llama2.c checkpoints).

``originlens lm generate --model PATH --tokenizer PATH [--prompt TEXT] [--max-new-tokens N]
[--greedy | --temperature T] [--seed S]`` prints the prompt and its continuation.

Models are loaded through :func:`originlens.lm.loading.load_model` (format registry).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..lm.llama2c import generate
from ..lm.loading import MODEL_FORMATS, ModelFormat, detect_format, load_model  # noqa: F401 (re-export)


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
