"""A checkpoint comparison (arXiv 2601.19208 §6, the Pythia comparison of Fig. 7): each checkpoint's
per-token representations and attention mapping against the corpus leading terms (Q̄, Φ̄ᵀB̄ᵀ) on the top-K
tokens, written as a run directory (``originlens lm compare``).

``run_compare(CompareRunConfig(checkpoint_dir=DIR, corpus=C), OUT)`` resolves the checkpoints
(:func:`checkpoint_specs`: a directory ordered by step, a list of paths or ``hf:ID@REV`` specs, bare
revisions of ``model``, or the Pythia pattern step1, step2, …, ``log_steps``), the model's tokenizer (one
loader, :func:`originlens.lm.loading.load_tokenizer`: ``tokenizer``, else the adapter's, else the one stored
with the first checkpoint), and the statistics (``stats``: an ``originlens stats`` directory; ``corpus``:
an originlens corpus directory in the model's vocabulary, or raw text tokenised with the model's tokenizer
into ``window``-token texts with the paper's minimum-length filters), checks every checkpoint's vocabulary
against them, and calls :func:`originlens.lm.compare.compare_checkpoints`.  Writes ``OUT/results.json``
(with the tokenizer used, the text counts, every corpus source's fingerprint and, for hub revisions, the
commit each resolved to), ``OUT/figures/*.png`` and ``OUT/report.html``.

Checkpoint grids too long for one process: ``shard=(i, N)`` (``--shard I/N``) compares the i-th of N
contiguous blocks of the checkpoint list, and :func:`merge_compare_runs` (``lm compare-merge``) writes the
run of the whole list from the N block runs (:mod:`originlens.lm.compare_merge`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, InputError


@dataclass
class CompareRunConfig:
    """Checkpoints (one of ``checkpoints``, ``checkpoint_dir``, ``log_steps``; ``model`` alone is one
    checkpoint), statistics (one of ``corpus``, ``stats``) and the comparison settings; layers are
    1-based as in the paper's figures."""

    model: str | None = None
    checkpoints: str | None = None  # comma-separated paths, hf:ID@REV specs or revisions of ``model``
    checkpoint_dir: str | None = None
    log_steps: int | None = None
    tokenizer: str | None = None
    on_missing: str = "stop"  # or "skip"
    no_hash: bool = False
    corpus: str | None = None  # comma-separated sources
    stats: str | None = None
    top_tokens: int | None = None  # K (default 2000, or the statistics' size)
    window: int = 128
    max_texts: int | None = None
    min_chars: int = 0
    min_tokens: int = 0
    bos: str = "auto"  # auto | none | TOKEN_ID
    centering: float | None = None
    layers: list[int] | None = None
    heads_layers: list[int] = field(default_factory=list)
    null_baseline: bool = True
    token_centred: bool = False
    token_chunk: int = 4096
    device: str = "cpu"  # where the models run and the comparison matmuls are done
    dtype: str = "float64"
    shard: tuple[int, int] | None = None  # (i, N): compare block i of N of the checkpoint list
    device_map: str | None = None  # Hugging Face checkpoints: from_pretrained's device_map (not with device)


@dataclass
class CompareRun:
    path: Path
    result: Any  # originlens.lm.compare.ComparisonResult
    report: Path
    seconds: float


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

    def __init__(self, cfg: CompareRunConfig, specs: list[str] | None = None) -> None:
        self.cfg = cfg
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
        from ..lm.compare_statistics import tokenizer_vocab
        from ..lm.loading import load_tokenizer, open_tokenizer

        if not self._resolved:
            self._resolved = True
            if self.cfg.tokenizer is not None:
                self.tokenizer = open_tokenizer(self.cfg.tokenizer, vocab_size=adapter.vocab_size)
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
        from ..lm.compare_statistics import check_vocab, model_identity

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
        a = self.cfg
        if a.stats:
            return self._from_stats(adapter)
        return self._from_corpus(adapter)

    def _from_stats(self, adapter: Any) -> Any:
        from ..lm.compare_statistics import VocabIdentity, check_vocab, model_identity
        from ..stats import load_statistics
        from ..storage import read_json

        a = self.cfg
        assert a.stats is not None
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
        from ..lm.compare_statistics import (
            VocabIdentity,
            check_vocab,
            comparison_statistics,
            model_identity,
            prepend_bos,
            tokenizer_identity,
            tokenizer_vocab,
            windows_from_texts,
        )

        a = self.cfg
        K = 2000 if a.top_tokens is None else a.top_tokens
        bos = _resolve_bos(a.bos, adapter)
        sources = [s.strip() for s in (a.corpus or "").split(",") if s.strip()]
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
            vh: str | None = store.vocab_hash
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
    """What each corpus source was: files with sizes and sha256, ``hf:`` datasets with their config,
    revision, split and the commit the revision resolved to in the local hub cache."""
    if not corpus:
        return None
    from ..data import source_fingerprint

    return source_fingerprint([s.strip() for s in corpus.split(",") if s.strip()])


def placing_loader(device: str, device_map: str | None = None) -> Callable[[str], Any]:
    """A checkpoint loader (:class:`~originlens.lm.checkpoints.CheckpointGrid`) that puts each model where
    it runs: on ``device``, or, for Hugging Face checkpoints, where ``device_map`` places its layers (the
    adapter then feeds inputs to its embedding's device).  A device map with another ``device`` than the
    CPU is refused (one of the two places the model)."""
    from ..lm.checkpoints import default_loader

    if device_map is not None and device != "cpu":
        raise ConfigError(
            f"--device-map {device_map} and --device {device} given together",
            "give one: --device-map places the model's layers itself",
        )

    def load(spec: str) -> Any:
        if device_map is not None:
            from ..lm.loading import load_adapter

            return load_adapter(spec, device_map=device_map, find_tokenizer=False)
        adapter = default_loader(spec)
        module = getattr(adapter, "module", None)
        if device != "cpu":
            if module is None:
                raise ConfigError(f"cannot move a {type(adapter).__name__} to {device}", "use --device cpu")
            module.to(device)
        return adapter

    return load


def run_compare(cfg: CompareRunConfig, out: str | Path, *, overwrite: bool = False) -> CompareRun:
    """Compare every checkpoint with the leading terms and write the run directory (module docstring)."""
    from ..distributed import single_process

    single_process("lm compare")
    from ..devices import resolve_device
    from ..lm.checkpoints import CheckpointGrid
    from ..lm.compare import CompareConfig, compare_checkpoints
    from ..lm.compare_report import check_out, write_comparison

    if bool(cfg.corpus) == bool(cfg.stats):
        raise InputError(
            "give exactly one of --corpus and --stats",
            "e.g. --corpus ../shared/data/tinystories --tokenizer tok512.bin",
        )
    check_out(out, overwrite)
    device = str(resolve_device(cfg.device))  # CUDA missing: one line, before any checkpoint loads
    t0 = time.perf_counter()
    specs = checkpoint_specs(cfg.model, cfg.checkpoints, cfg.checkpoint_dir, cfg.log_steps)
    n_all = len(specs)
    if cfg.shard is not None:
        specs = shard_of(specs, cfg.shard)
    grid = CheckpointGrid(
        specs, loader=placing_loader(device, cfg.device_map), on_missing=cfg.on_missing, hash_weights=not cfg.no_hash
    )
    session = _Session(cfg, specs)
    ccfg = CompareConfig(
        top_tokens=cfg.top_tokens or 2000,
        layers=cfg.layers,
        head_layers=cfg.heads_layers or (),
        null_baseline=cfg.null_baseline,
        token_centred=cfg.token_centred,
        token_chunk=cfg.token_chunk,
        device=device,
        dtype=cfg.dtype,
    )
    result = compare_checkpoints(grid, session.statistics, ccfg, check_model=session.check_model)
    result.warnings = session.info.get("warnings", []) + result.warnings
    result.config["tokenizer_source"] = session.info.get("tokenizer_source")
    result.config["texts"] = session.info.get("texts")
    result.config["corpus_sources"] = _source_records(cfg.corpus)
    if cfg.shard is not None:
        from ..lm.compare_merge import SHARD_KEY

        result.config[SHARD_KEY] = {"index": cfg.shard[0], "count": cfg.shard[1], "checkpoints_total": n_all}
    extra = {
        "model": cfg.model,
        "checkpoints": specs,
        "corpus": cfg.corpus,
        "stats": cfg.stats,
        "tokenizer": cfg.tokenizer,
    }
    report = write_comparison(result, out, extra=extra, overwrite=overwrite)
    return CompareRun(path=Path(out), result=result, report=Path(report), seconds=time.perf_counter() - t0)


def shard_of(specs: list[str], shard: tuple[int, int]) -> list[str]:
    """Block ``i`` of ``N`` contiguous blocks of the checkpoint list (the first ``len % N`` blocks one longer)."""
    from ..distributed import shard_bounds

    i, n = shard
    if not 0 <= i < n:
        raise ConfigError(f"--shard {i}/{n}: the index must be in 0..{n - 1}", "e.g. --shard 0/4")
    if n > len(specs):
        raise ConfigError(
            f"--shard {i}/{n}: {len(specs)} checkpoint(s) cannot fill {n} blocks", f"use at most {len(specs)} shards"
        )
    a, b = shard_bounds(len(specs), i, n)
    return specs[a:b]


def merge_compare_runs(runs: list[str | Path], out: str | Path, *, overwrite: bool = False) -> CompareRun:
    """The run of the whole checkpoint list from the N run directories of ``lm compare --shard I/N``
    (each I once; same statistics, model and settings), written to ``out`` as an unsharded run would be."""
    from ..lm.compare import ComparisonResult
    from ..lm.compare_merge import merge_comparisons
    from ..lm.compare_report import check_out, write_comparison
    from ..storage import read_json

    check_out(out, overwrite)
    t0 = time.perf_counter()
    parts, configs = [], []
    for d in map(Path, runs):
        if not (d / "results.json").is_file():
            raise InputError(
                f"{d} holds no comparison results", "pass finished `lm compare --shard I/N` run directories"
            )
        parts.append(ComparisonResult.from_json(read_json(d / "results.json")))
        configs.append(read_json(d / "config.json") if (d / "config.json").is_file() else {})
    order = sorted(range(len(parts)), key=lambda j: int((parts[j].config.get("shard") or {}).get("index", -1)))
    result = merge_comparisons(parts)
    first = configs[order[0]]
    extra = {
        "model": first.get("model"),
        "checkpoints": [c for j in order for c in configs[j].get("checkpoints") or []],
        "corpus": first.get("corpus"),
        "stats": first.get("stats"),
        "tokenizer": first.get("tokenizer"),
        "merged_from": [str(runs[j]) for j in order],
    }
    report = write_comparison(result, out, extra=extra, overwrite=overwrite)
    return CompareRun(path=Path(out), result=result, report=Path(report), seconds=time.perf_counter() - t0)
