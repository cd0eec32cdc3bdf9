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
Writes RUN/results.json, RUN/figures/*.png and RUN/report.html.

Mounted under the ``lm`` group registered by :mod:`originlens.cli.lm_cmd` (listed after it in
``COMMAND_MODULES``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError
from .options import add_device, add_option, add_threads, apply_threads, finite_float, int_list


def checkpoint_specs(
    model: str | None, checkpoints: str | None, checkpoint_dir: str | None, log_steps: int | None
) -> list[str]:
    """The checkpoint spec list of the command line (see the module docstring)."""
    from ..lm.checkpoints import checkpoints_in_dir, pythia_revisions

    given = sum(x is not None for x in (checkpoints, checkpoint_dir, log_steps))
    if given > 1:
        raise ConfigError(
            "give only one of --checkpoints, --checkpoint-dir, --log-steps",
            "e.g. --checkpoint-dir runs/gpt/checkpoints",
        )
    if checkpoint_dir is not None:
        return checkpoints_in_dir(checkpoint_dir)
    if log_steps is not None:
        if not (model or "").startswith("hf:") or "@" in (model or ""):
            raise ConfigError(
                "--log-steps needs --model hf:ORG/NAME (without @REVISION)",
                "e.g. --model hf:EleutherAI/pythia-1.4b-deduped --log-steps 512",
            )
        return pythia_revisions(log_steps, model[3:])  # type: ignore[index]
    if checkpoints is not None:
        entries = [e.strip() for e in checkpoints.split(",") if e.strip()]
        if not entries:
            raise ConfigError("--checkpoints is empty", "e.g. --checkpoints step1,step2,step4")
        out = []
        for e in entries:
            if e.startswith("hf:") or Path(e).exists() or model is None:
                out.append(e)
            elif model.startswith("hf:") and "@" not in model:
                out.append(f"{model}@{e}")
            elif Path(model).is_dir():
                out.append(str(Path(model) / e))
            else:
                out.append(e)
        return out
    if model is None:
        raise ConfigError("no model or checkpoints given", "pass --model SPEC, --checkpoints or --checkpoint-dir")
    return [model]


def _resolve_bos(flag: str, adapter: Any) -> int | None:
    if flag == "auto":
        return adapter.bos_id
    if flag == "none":
        return None
    try:
        bos = int(flag)
    except ValueError:
        raise ConfigError(f"--bos must be auto, none or a token id, got {flag!r}", "e.g. --bos auto") from None
    if not 0 <= bos < adapter.vocab_size:
        raise ConfigError(f"--bos {bos} is outside the vocabulary 0..{adapter.vocab_size - 1}", "pass a valid id")
    return bos


class _Session:
    """State shared by the statistics provider and the per-checkpoint vocabulary check."""

    def __init__(self, args: argparse.Namespace, specs: list[str] | None = None) -> None:
        self.args = args
        self.specs = list(specs or [])
        self.tokenizer: Any = None
        self.corpus_identity: Any = None
        self.tokenizer_size: int | None = None
        self.info: dict[str, Any] = {}
        self._resolved = False

    def _tokenizer(self, adapter: Any) -> Any:
        """The model's tokenizer, resolved once through the one loader of :mod:`originlens.lm.loading`:
        ``--tokenizer`` (a path of any kind or ``hf:ID[@REV]``), else the adapter's own, else the one stored
        next to the first checkpoint (a Hugging Face directory's or hub revision's ``tokenizer.json``)."""
        from ..errors import OriginlensError
        from ..lm.compare import tokenizer_vocab
        from ..lm.loading import load_tokenizer, open_tokenizer

        if not self._resolved:
            self._resolved = True
            if self.args.tokenizer is not None:
                self.tokenizer = open_tokenizer(self.args.tokenizer, vocab_size=adapter.vocab_size)
            else:
                self.tokenizer = getattr(adapter, "tokenizer", None)
                if self.tokenizer is None and self.specs:
                    try:
                        self.tokenizer = load_tokenizer(self.specs[0])
                    except (OriginlensError, OSError) as exc:
                        self.info["tokenizer_not_found"] = getattr(exc, "what", None) or str(exc)
            if self.tokenizer is not None:
                self.tokenizer_size = len(tokenizer_vocab(self.tokenizer))
                self.info["tokenizer_source"] = getattr(self.tokenizer, "source", None) or type(self.tokenizer).__name__
        return self.tokenizer

    def check_model(self, label: str, adapter: Any) -> list[str]:
        from ..lm.compare import check_vocab, model_identity

        tok = self._tokenizer(adapter)
        if self.tokenizer_size is not None and self.tokenizer_size > adapter.vocab_size:
            raise ConfigError(
                f"the tokenizer has {self.tokenizer_size} tokens but checkpoint {label!r} only {adapter.vocab_size}",
                "pass the tokenizer that belongs to the model",
            )
        if self.corpus_identity is None:
            return []
        return check_vocab(
            model_identity(adapter, tok),
            self.corpus_identity,
            self.corpus_identity.source,
            tokenizer_size=self.tokenizer_size,
        )

    def statistics(self, adapter: Any) -> Any:
        a = self.args
        if a.stats:
            return self._from_stats(adapter)
        return self._from_corpus(adapter)

    def _from_stats(self, adapter: Any) -> Any:
        from ..lm.compare import VocabIdentity, check_vocab, model_identity
        from ..stats import load_statistics
        from ..storage import read_json

        a = self.args
        stats = load_statistics(a.stats)
        if a.top_tokens is not None and a.top_tokens != stats.size:
            raise ConfigError(
                f"--top-tokens {a.top_tokens} differs from the {stats.size} tokens of the statistics in {a.stats}",
                "drop --top-tokens, or recompute the statistics",
            )
        man = Path(a.stats) / "manifest.json"
        corpus = read_json(man).get("corpus") if man.is_file() else None
        vh = stats.meta.get("tokenizer_vocab_hash") or (corpus or {}).get("vocab_hash")
        self.corpus_identity = VocabIdentity(int(stats.vocab_size), vh, f"statistics {a.stats}")
        self.info["warnings"] = check_vocab(
            model_identity(adapter, self._tokenizer(adapter)),
            self.corpus_identity,
            self.corpus_identity.source,
            tokenizer_size=self.tokenizer_size,
        )
        stats.meta.setdefault("source", f"statistics {a.stats}")
        return stats

    def _from_corpus(self, adapter: Any) -> Any:
        import numpy as np

        from ..data import TokenStore, is_corpus_dir, iter_documents
        from ..lm.compare import (
            VocabIdentity,
            check_vocab,
            comparison_statistics,
            model_identity,
            prepend_bos,
            tokenizer_identity,
            tokenizer_vocab,
            windows_from_texts,
        )

        a = self.args
        K = 2000 if a.top_tokens is None else a.top_tokens
        bos = _resolve_bos(a.bos, adapter)
        sources = [s.strip() for s in a.corpus.split(",") if s.strip()]
        tok = self._tokenizer(adapter)
        V = int(adapter.vocab_size)
        if len(sources) == 1 and is_corpus_dir(sources[0]):
            store = TokenStore.open(sources[0])
            self.corpus_identity = VocabIdentity(store.vocab_size, store.vocab_hash, f"corpus {sources[0]}")
            self.info["warnings"] = check_vocab(
                model_identity(adapter, tok),
                self.corpus_identity,
                self.corpus_identity.source,
                tokenizer_size=self.tokenizer_size,
            )
            tokens = store.tokens if a.max_texts is None else store.tokens[: a.max_texts]
            windows = prepend_bos(np.asarray(tokens), bos)
            vocab = store.vocab if len(store.vocab) == V else None
            stats = comparison_statistics(windows, V, top_k=K, centering=a.centering, vocab=vocab)
            desc = (
                f"corpus directory {sources[0]} ({windows.shape[0]} windows of {windows.shape[1]} tokens, "
                f"BOS {'id ' + str(bos) + ' first' if bos is not None else 'not prepended'})"
            )
            vh = store.vocab_hash
        else:
            if tok is None:
                why = self.info.get("tokenizer_not_found")
                raise InputError(
                    "raw text needs the model's tokenizer" + (f" (none next to the checkpoint: {why})" if why else ""),
                    "pass --tokenizer (llama2.c .bin, tokenizer.json, an originlens tokenizer "
                    "directory or hf:ID[@REV]), or an originlens corpus directory as --corpus",
                )
            if hasattr(tok, "pieces"):  # llama2.c tokenizer: BOS handled below

                def encode(text: str) -> list[int]:
                    return tok.encode(text, bos=False)
            else:
                encode = tok.encode
            counts: dict[str, int] = {}
            windows, valid = windows_from_texts(
                iter_documents(sources),
                encode,
                bos_id=bos,
                window_tokens=a.window,
                max_texts=a.max_texts,
                min_tokens=a.min_tokens,
                min_chars=a.min_chars,
                counts=counts,
            )
            self.info["texts"] = counts
            vocab = tokenizer_vocab(tok)
            vocab = vocab + [f"<id:{i}>" for i in range(len(vocab), V)]
            stats = comparison_statistics(windows, V, valid=valid, top_k=K, centering=a.centering, vocab=vocab[:V])
            desc = (
                f"text {', '.join(sources)} tokenised with the model tokenizer ({windows.shape[0]} texts"
                + (
                    f" of ≥ {a.min_chars} characters and ≥ {a.min_tokens} tokens, {counts['skipped_short']} "
                    "shorter ones skipped"
                    if a.min_tokens or a.min_chars
                    else ""
                )
                + f", cut/padded to {a.window} tokens, BOS {'id ' + str(bos) if bos is not None else 'none'})"
            )
            vh = tokenizer_identity(tok).vocab_hash
        stats.meta.update({"source": desc, "bos_id": bos, "tokenizer_vocab_hash": vh, "top_k": K})
        return stats


def _source_records(corpus: str | None) -> list[dict[str, Any]] | None:
    """What each ``--corpus`` source was: files with sizes and sha256, ``hf:`` datasets with their config,
    revision, split and the commit the revision resolved to in the local hub cache."""
    if not corpus:
        return None
    from ..data import source_fingerprint

    return source_fingerprint([s.strip() for s in corpus.split(",") if s.strip()])


def cmd_compare(args: argparse.Namespace) -> int:
    import time

    from ..lm.checkpoints import CheckpointGrid
    from ..lm.compare import MAPPINGS, CompareConfig, check_out, compare_checkpoints, write_comparison

    if bool(args.corpus) == bool(args.stats):
        raise InputError(
            "give exactly one of --corpus and --stats",
            "e.g. --corpus ../shared/data/tinystories --tokenizer tok512.bin",
        )
    check_out(args.out, args.overwrite)
    apply_threads(args)
    from ..devices import resolve_device

    args.device = str(resolve_device(args.device))  # CUDA missing: one line, before any checkpoint loads
    t0 = time.perf_counter()
    specs = checkpoint_specs(args.model, args.checkpoints, args.checkpoint_dir, args.log_steps)
    grid = CheckpointGrid(specs, on_missing=args.on_missing, hash_weights=not args.no_hash)
    session = _Session(args, specs)
    cfg = CompareConfig(
        top_tokens=args.top_tokens or 2000,
        layers=args.layers,
        head_layers=args.heads_layers or (),
        null_baseline=args.null_baseline,
        token_centred=args.token_centred,
        token_chunk=args.token_chunk,
        device=args.device,
        dtype=args.dtype,
    )
    result = compare_checkpoints(grid, session.statistics, cfg, check_model=session.check_model)
    result.warnings = session.info.get("warnings", []) + result.warnings
    result.config["tokenizer_source"] = session.info.get("tokenizer_source")
    result.config["texts"] = session.info.get("texts")
    result.config["corpus_sources"] = _source_records(args.corpus)
    extra = {
        "model": args.model,
        "checkpoints": specs,
        "corpus": args.corpus,
        "stats": args.stats,
        "tokenizer": args.tokenizer,
    }
    report = write_comparison(result, args.out, extra=extra, overwrite=args.overwrite)
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
        f"{time.perf_counter() - t0:.1f} s; {Path(args.out) / 'results.json'}, {report}"
    )
    return 0


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
    add_device(c, help="device of the comparison matmuls (default cpu)")
    c.add_argument(
        "--dtype",
        choices=["float64", "float32"],
        default="float64",
        help="precision of the statistics and of the weight comparisons",
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
    p.set_defaults(func=cmd_compare)
