"""``originlens lm compare``: leading-term features across training checkpoints (arXiv 2601.19208).

::

    originlens lm compare (--model SPEC [--checkpoints A,B,C | --log-steps MAX] | --checkpoint-dir DIR)
        (--corpus PATH[,PATH] | --stats DIR) [--tokenizer TOK] [--top-tokens K] [--layers 1-4]
        [--heads-layers 2,4] [--window 128] [--max-windows N] [--bos auto|none|ID] [--centering C]
        [--on-missing stop|skip] [--no-null-baseline] [--token-centred] --out RUN

Checkpoints: ``--checkpoint-dir`` takes every checkpoint file in DIR ordered by step; ``--checkpoints``
entries are paths or ``hf:ID@REV`` specs, and with ``--model hf:ID`` bare entries are revisions
(``--log-steps 512`` = step1, step2, …, step512).  ``--corpus`` is an originlens corpus directory (its
vocabulary must be the model's) or raw text (files/directories, ``hf:DATASET``) tokenised with the model's
tokenizer (``--tokenizer``: llama2.c ``.bin``, ``tokenizer.json``, an originlens tokenizer directory or
``hf:ID[@REV]``; by default the tokenizer stored with the first checkpoint: a Hugging Face directory's or
hub revision's ``tokenizer.json``).  ``results.json`` records the tokenizer used and, for hub revisions,
the commit each one resolved to (``grid.commits``).
The command parses into :class:`originlens.experiments.compare_run.CompareRunConfig`;
:func:`~originlens.experiments.compare_run.run_compare` writes RUN/results.json, RUN/figures/*.png and
RUN/report.html.

Mounted under the ``lm`` group registered by :mod:`originlens.cli.lm_cmd` (listed after it in
``COMMAND_MODULES``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .options import (
    add_device,
    add_device_map,
    add_option,
    add_threads,
    apply_threads,
    finite_float,
    int_list,
    shard_arg,
)


def cmd_compare(args: argparse.Namespace) -> int:
    from ..experiments.compare_run import CompareRunConfig, run_compare

    apply_threads(args)
    cfg = CompareRunConfig(
        model=args.model,
        checkpoints=args.checkpoints,
        checkpoint_dir=args.checkpoint_dir,
        log_steps=args.log_steps,
        tokenizer=args.tokenizer,
        on_missing=args.on_missing,
        no_hash=args.no_hash,
        corpus=args.corpus,
        stats=args.stats,
        top_tokens=args.top_tokens,
        window=args.window,
        max_texts=args.max_texts,
        min_chars=args.min_chars,
        min_tokens=args.min_tokens,
        bos=args.bos,
        centering=args.centering,
        layers=args.layers,
        heads_layers=args.heads_layers or [],
        null_baseline=args.null_baseline,
        token_centred=args.token_centred,
        token_chunk=args.token_chunk,
        device=args.device,
        dtype=args.dtype,
        shard=args.shard,
        device_map=args.device_map,
    )
    _print_comparison(run_compare(cfg, args.out, overwrite=args.overwrite), args.out)
    return 0


def cmd_compare_merge(args: argparse.Namespace) -> int:
    from ..experiments.compare_run import merge_compare_runs

    _print_comparison(merge_compare_runs(args.runs, args.out, overwrite=args.overwrite), args.out)
    return 0


def _print_comparison(run: Any, out: str) -> None:
    from ..lm.compare import MAPPINGS

    result = run.result
    for v, data in result.cosines.items():
        for key in MAPPINGS:
            print(
                f"{v:>18} {key:>16}: mean over layers "
                + " ".join(f"{lab}={x:.3f}" for lab, x in zip(result.labels, data[key].mean(axis=0)))
            )
    for w in result.warnings:
        print(f"warning: {w}")
    print(
        f"compared {len(result.labels)} checkpoint(s) at K = {result.statistics['K']} in "
        f"{run.seconds:.1f} s; {Path(out) / 'results.json'}, {run.report}"
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    m = p.add_argument_group("model and checkpoints")
    m.add_argument("--model", default=None, help="checkpoint path, or hf:ORG/NAME[@REV] (base for --checkpoints)")
    m.add_argument("--checkpoints", default=None, help="comma-separated paths, hf:ID@REV specs or revisions")
    m.add_argument("--checkpoint-dir", default=None, help="every checkpoint file in DIR, ordered by step")
    m.add_argument("--log-steps", type=int, default=None, help="with --model hf:ID: revisions step1, step2, …, stepMAX")
    m.add_argument(
        "--tokenizer",
        default=None,
        help="the model's tokenizer (llama2.c .bin, tokenizer.json, "
        "originlens tokenizer dir, hf:ID[@REV]; default: the one "
        "stored with the first checkpoint)",
    )
    m.add_argument(
        "--on-missing",
        choices=["stop", "skip"],
        default="stop",
        help="a missing checkpoint stops the run (default) or is skipped",
    )
    m.add_argument("--no-hash", action="store_true", help="do not hash weights (no duplicate detection)")
    s = p.add_argument_group("statistics")
    s.add_argument("--corpus", default=None, help="originlens corpus dir, or text files/dirs (comma-separated)")
    s.add_argument("--stats", default=None, help="statistics directory from `originlens stats` (model token ids)")
    s.add_argument("--top-tokens", type=int, default=None, help="K most frequent tokens (default 2000)")
    s.add_argument("--window", type=int, default=128, help="tokens per text window incl. BOS (default 128)")
    add_option(
        s, "--max-windows", dest="max_texts", type=int, default=None, help="use at most N texts / windows (texts kept)"
    )
    s.add_argument(
        "--min-chars",
        type=int,
        default=0,
        help="skip texts with fewer characters (the paper's OpenWebText filter: 512)",
    )
    s.add_argument(
        "--min-tokens",
        type=int,
        default=0,
        help="skip texts with fewer tokens (e.g. 127 with --window 128: only full windows)",
    )
    s.add_argument("--bos", default="auto", help="auto (the model's BOS) | none | TOKEN_ID")
    s.add_argument(
        "--centering", type=finite_float, default=None, help="centring constant (default 1/|V| of the model)"
    )
    c = p.add_argument_group("comparison")
    c.add_argument("--layers", type=int_list, default=None, help="1-based layers, e.g. 1-24 (default all)")
    c.add_argument("--heads-layers", type=int_list, default=None, help="1-based layers for per-head maps, e.g. 2,13,24")
    c.add_argument(
        "--null-baseline",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also compare with the token-permuted theory, the chance level of the cosine (on by "
        "default; --no-null-baseline skips it)",
    )
    c.add_argument(
        "--token-centred",
        action="store_true",
        help="also the token-centred cosine (mean row removed; not in the paper)",
    )
    c.add_argument("--token-chunk", type=int, default=4096, help="tokens per model pass (memory bound)")
    add_device(c, help="where the models run and the comparison matmuls are done (default cpu)")
    add_device_map(c)
    c.add_argument(
        "--dtype",
        choices=["float64", "float32"],
        default="float64",
        help="precision of the statistics and of the weight comparisons",
    )
    c.add_argument(
        "--shard",
        type=shard_arg,
        default=None,
        metavar="I/N",
        help="compare only the I-th of N contiguous blocks of the checkpoints (0-based; combine the N runs "
        "with `lm compare-merge`)",
    )
    add_threads(c)
    p.add_argument("--out", required=True, help="run directory to write")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier comparison run at --out")


def _lm_subparsers(subparsers: Any) -> Any:
    lm = subparsers.choices.get("lm")
    if lm is None:
        lm = subparsers.add_parser("lm", help="language models")
    for action in lm._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return lm.add_subparsers(dest="lm_command", metavar="LM_COMMAND")


def register(subparsers: Any) -> None:
    p = _lm_subparsers(subparsers).add_parser(
        "compare",
        help="leading-term features across checkpoints (covariance cosine heatmaps)",
        description="Compare each checkpoint's per-token representations and attention mapping with the "
        "corpus leading terms (Q̄, Φ̄ᵀB̄ᵀ) restricted to the top-K tokens "
        "(the Pythia comparison of arXiv 2601.19208); "
        "writes results.json, heatmaps and report.html to --out.",
    )
    add_arguments(p)
    p.set_defaults(func=cmd_compare, writes=lambda a: [a.out])
    m = _lm_subparsers(subparsers).add_parser(
        "compare-merge",
        help="combine the runs of `lm compare --shard I/N` into one comparison run",
        description="Read N block run directories (every I/N once, same statistics, model and settings) and "
        "write the comparison of the whole checkpoint list, as an unsharded run would.",
    )
    m.add_argument("runs", nargs="+", help="the block run directories")
    m.add_argument("--out", required=True, help="run directory to write")
    m.add_argument("--overwrite", action="store_true", help="replace an earlier comparison run at --out")
    m.set_defaults(func=cmd_compare_merge, writes=lambda a: [a.out])
