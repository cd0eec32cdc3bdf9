"""``originlens lm ...``: pretrained language models of every supported format.

``originlens lm generate --model M [--revision R] [--tokenizer TOK] [--prompt TEXT] [--max-new-tokens N]
[--greedy | --temperature T] [--seed S]`` prints the prompt and its continuation.  ``M`` is a llama2.c
``.bin``, an originlens GPT ``.safetensors``, a Hugging Face directory, or ``hf:ID[@REVISION]``.

``originlens lm export --model M --out DIR [--tokenizer tokenizer.json] [--overwrite]`` writes a GPT
checkpoint as a Hugging Face GPT-2 directory or a llama2.c checkpoint as a Hugging Face Llama directory.

Models are loaded through :mod:`originlens.lm.loading` (format registry).  Generation starts from the
model's BOS token (or the tokenizer's; a model without one needs ``--prompt``) and stops after N new
tokens, at a stop token (llama2.c: BOS again; Hugging Face: the generation config's EOS ids; our GPT:
the tokenizer's end-of-text) or when the context is full.  llama2.c models decode with their KV cache;
other models re-run the prefix each step (fine for short samples).

Registration imports neither torch nor :mod:`originlens.lm` (``originlens --help`` and the commands that
do not need torch start fast); they are imported when a command runs.  The format names in the help text
are :data:`FORMAT_NAMES`, kept equal to ``originlens.lm.loading.MODEL_FORMATS`` by a test.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, InputError
from .options import utf8_text

if TYPE_CHECKING:
    from ..lm.adapter import LMAdapter
    from ..lm.codecs import TextCodec

__all__ = ["FORMAT_NAMES", "generate_ids", "generate_text", "register"]
# the names of originlens.lm.loading.MODEL_FORMATS, for the help text (tests/reliability/test_cli_startup.py)
FORMAT_NAMES = ("llama2c", "originlens-gpt", "hf")


def generate_ids(
    adapter: LMAdapter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
    stop_ids: Sequence[int] = (),
) -> list[int]:
    """Continue ``prompt_ids`` by up to ``max_new_tokens`` tokens with any adapter: incrementally with its
    key/value cache where it has one (:meth:`LMAdapter.decode`; llama2.c), else by re-running the prefix.

    Greedy takes the first argmax; otherwise samples ``softmax(logits / temperature)`` with a CPU
    generator seeded by ``seed`` (the same rule as :func:`originlens.lm.llama2c.generate_tokens`).  Stops
    before appending a token of ``stop_ids`` and when the context ``adapter.max_seq_len`` is full.
    """
    if max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens} is negative", "use a value >= 0")
    if not greedy and not temperature > 0:
        raise ConfigError(f"temperature={temperature} must be > 0 for sampling", "use --greedy or T > 0")
    if not prompt_ids:
        raise ConfigError("nothing to continue: empty prompt and no BOS token", "pass --prompt TEXT")
    limit = adapter.max_seq_len
    if limit is not None and len(prompt_ids) > limit:
        raise ConfigError(f"prompt of {len(prompt_ids)} tokens exceeds the context of {limit}", "shorten the prompt")
    import torch

    with torch.no_grad():
        return _generate_ids(
            adapter, prompt_ids, max_new_tokens, greedy=greedy, temperature=temperature, seed=seed, stop_ids=stop_ids
        )


def _generate_ids(
    adapter: LMAdapter,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    greedy: bool,
    temperature: float,
    seed: int,
    stop_ids: Sequence[int],
) -> list[int]:
    import torch

    limit = adapter.max_seq_len
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ids, stops = list(prompt_ids), set(int(s) for s in stop_ids)
    cached = adapter.supports_decode  # a key/value cache: one token per step, not the whole prefix
    cache, fresh = None, list(ids)
    for _ in range(max_new_tokens):
        if limit is not None and len(ids) >= limit:
            break
        if cached:
            out, cache = adapter.decode(torch.tensor([fresh], dtype=torch.long, device=adapter.device), cache)
            logits = out[0, -1].float().cpu()
        else:
            full = adapter.run(torch.tensor([ids], dtype=torch.long, device=adapter.device))
            assert isinstance(full, torch.Tensor)  # logits only: no residuals were asked for
            logits = full[0, -1].float().cpu()
        if greedy:
            nxt = int(torch.argmax(logits))
        else:
            nxt = int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=gen))
        if nxt in stops:
            break
        ids.append(nxt)
        fresh = [nxt]
    return ids


def generate_text(
    adapter: LMAdapter,
    codec: TextCodec,
    prompt: str = "",
    max_new_tokens: int = 256,
    *,
    greedy: bool = True,
    temperature: float = 1.0,
    seed: int = 0,
) -> str:
    """Prompt plus continuation as text, for any adapter (see the module docstring for the rules)."""
    from ..lm.codecs import check_vocab
    from ..lm.llama2c import generate_tokens
    from ..lm.native import Llama2cAdapter

    check_vocab(adapter, codec)
    bos = adapter.bos_id if adapter.bos_id is not None else codec.bos_id
    ids = ([bos] if bos is not None else []) + codec.encode(prompt)
    if isinstance(adapter, Llama2cAdapter):  # KV cache; stops at BOS like llama2.c
        out = generate_tokens(adapter.module, ids, max_new_tokens, greedy=greedy, temperature=temperature, seed=seed)
    else:
        stops = tuple(getattr(adapter, "stop_ids", ()) or ())
        if not stops and codec.eos_id is not None:
            stops = (codec.eos_id,)
        out = generate_ids(
            adapter, ids, max_new_tokens, greedy=greedy, temperature=temperature, seed=seed, stop_ids=stops
        )
    return codec.decode(out)


def _cmd_generate(args: argparse.Namespace) -> int:
    from ..distributed import single_process
    from ..experiments.lm_inputs import load_model_and_codec
    from .lm_features_cmd import model_source

    single_process("lm generate")

    adapter, codec = load_model_and_codec(model_source(args))
    if codec is None:
        raise InputError(f"no tokenizer found next to {args.model}", "pass --tokenizer")
    greedy = args.temperature is None
    text = generate_text(
        adapter,
        codec,
        args.prompt,
        args.max_new_tokens,
        greedy=greedy,
        temperature=1.0 if greedy else args.temperature,
        seed=args.seed,
    )
    sys.stdout.write(text + "\n")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ..distributed import single_process
    from ..lm.export import export_to_hf
    from ..lm.loading import load_model
    from ..models.gpt import GPT

    single_process("lm export")

    model = load_model(args.model)
    if not isinstance(model, GPT) and args.tokenizer is not None:
        raise InputError(
            "--tokenizer is only copied for GPT exports (a tokenizer.json)",
            "drop --tokenizer; pass the llama2.c tokenizer .bin to `lm generate --tokenizer`",
        )
    out = export_to_hf(model, args.out, tokenizer=args.tokenizer, overwrite=args.overwrite)
    sys.stdout.write(f"{out}\n")
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
    from .lm_features_cmd import add_model_arguments

    formats = ", ".join(FORMAT_NAMES)
    lm = subparsers.add_parser("lm", help="pretrained language models (llama2.c, originlens GPT, Hugging Face)")
    lm_sub = lm.add_subparsers(dest="lm_command", metavar="LM_COMMAND")
    g = lm_sub.add_parser(
        "generate",
        help="generate text from BOS (and an optional prompt)",
        description="Print the prompt and its continuation; generation starts from BOS "
        f"and stops at a stop token, a full context, or after N new tokens. Model formats: {formats}.",
    )
    add_model_arguments(g, corpus=False)  # --model, --tokenizer, --device, --device-map, --dtype, --backend …
    g.add_argument("--prompt", type=utf8_text, default="", help="text to continue (default: none)")
    g.add_argument("--max-new-tokens", type=_non_negative_int, default=256, help="default 256")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="always take the most likely token (default)")
    mode.add_argument(
        "--temperature",
        type=_positive_float,
        default=None,
        help="sample from softmax(logits / T) instead of greedy decoding",
    )
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.set_defaults(func=_cmd_generate, writes=lambda a: [])

    e = lm_sub.add_parser(
        "export",
        help="write a GPT or llama2.c checkpoint as a Hugging Face directory",
        description="GPT checkpoint -> GPT-2 directory; llama2.c checkpoint -> Llama "
        "directory (rotary rows permuted to Hugging Face's layout).",
    )
    e.add_argument("--model", required=True, help="GPT .safetensors or llama2.c .bin")
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--tokenizer", default=None, help="tokenizer.json to copy into the directory (GPT only)")
    e.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    e.set_defaults(func=_cmd_export, writes=lambda a: [a.out])
