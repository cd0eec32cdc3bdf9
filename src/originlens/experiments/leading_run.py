"""One leading-terms run of arXiv 2601.19208 end to end: token windows → the Def. 3.1 one-hot attention
model trained in a run directory that holds everything its report needs → the report.

``train_leading_run(LeadingRunConfig(source=CORPUS, train=AssocTrainConfig(...)), OUT)`` does what
``originlens assoc train`` does (the CLI only parses into this config):

* reads the windows (a corpus directory or an (N, T+1) ``.npy``; :func:`load_windows`), keeps the first
  ``max_windows`` and holds the last ``holdout`` out (never trained on);
* trains :func:`originlens.train.train_assoc`, whose run directory holds the checkpoints, metrics and
  ``RUN/statistics/`` (the target statistics);
* writes ``RUN/data/`` (``train.npy``, ``heldout.npy``, ``vocab.json``, ``source.json``) once the run
  directory exists, each side file checked on its own and ``train.npy`` last, so a run killed between two
  of them gets the missing ones on resume.

``report_leading_run(RUN, AnalysisConfig(...))`` is ``originlens assoc report``: tracking over
checkpoints, null baselines, the causal intervention, the leading-term model
(:mod:`.leading_analysis`), written by :mod:`.leading_report` as
``RUN/report.html`` / ``report.md`` / ``report.json``.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CompatibilityError, ConfigError, InputError

STATS_CHOICES = ("first-batch", "full", "none")
# files of a run directory that this module writes beside the trainer's own (removed by ``overwrite``)
OWN_OUTPUTS = ("statistics", "data", "report.html", "report.md", "report.json")


@dataclass
class LeadingRunConfig:
    """A leading-terms training run: the windows it trains on and the trainer's configuration.

    ``source``: a corpus directory (``originlens corpus build``) or an (N, T+1) integer ``.npy``
    (``vocab_size`` then required).  ``stats``: the target statistics — ``first-batch`` (the paper's:
    from the first shuffled batch), ``full`` (the whole training set), ``none``, or a statistics directory
    of the same corpus.  ``train``: :class:`originlens.train.AssocTrainConfig` (its ``out`` is set to the
    run directory)."""

    source: str
    vocab_size: int | None = None
    max_windows: int | None = None
    holdout: int = 0
    stats: str = "first-batch"
    train: Any = None

    def __post_init__(self) -> None:
        if self.train is None:
            from ..train import AssocTrainConfig

            self.train = AssocTrainConfig(steps=10)


def load_windows(source: str | Path, vocab_size: int | None) -> tuple[Path, Any, list[str] | None, Any, int]:
    """``(path, tokens (N, T+1), vocab or None, manifest or None, |V|)`` of a corpus directory or ``.npy``."""
    from ..data import TokenWindows

    src = Path(source)
    if src.suffix.lower() == ".npy" and vocab_size is None:
        raise InputError("a bare .npy of token ids needs the vocabulary size", "pass --vocab-size V (ids must be < V)")
    windows = TokenWindows.load(src, vocab_size)
    V = windows.require_vocab_size(vocab_size)
    return src, windows.tokens, windows.vocab, windows.manifest, V


def split_windows(tokens: Any, max_windows: int | None, holdout: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``max_windows`` windows, split into (training, the last ``holdout`` held out)."""
    if max_windows is not None:
        if max_windows < 1:
            raise ConfigError(f"--max-windows must be ≥ 1 (got {max_windows})", "pass a positive number")
        tokens = tokens[:max_windows]
    tokens = np.asarray(tokens)
    if holdout < 0 or holdout >= tokens.shape[0]:
        raise ConfigError(
            f"--holdout {holdout} must lie in 0..{tokens.shape[0] - 1} (there are {tokens.shape[0]} windows)",
            "hold out fewer windows",
        )
    n = tokens.shape[0] - holdout
    return tokens[:n], tokens[n:]


def given_statistics(spec: str | Path, vocab: list[str] | None, V: int, T: int) -> Any:
    """Load a statistics directory and check it belongs to this corpus (size, length, vocabulary)."""
    from ..stats import load_statistics

    st = load_statistics(spec)
    if st.size != V or st.vocab_size != V or st.seq_len != T or st.token_ids is not None:
        raise CompatibilityError(
            f"statistics in {spec} are for |V| = {st.vocab_size} ({st.size} kept tokens), T = {st.seq_len}; the "
            f"model has |V| = {V}, T = {T}",
            "compute them on this corpus without --top-k (`originlens stats CORPUS --out DIR`) or use "
            "--stats first-batch",
        )
    if vocab is not None and st.vocab is not None and list(st.vocab) != list(vocab):
        raise CompatibilityError(
            f"statistics in {spec} were computed with another vocabulary",
            "compute them on this corpus, or use --stats first-batch",
        )
    return st


class SaveInputs:
    """Trainer callback: once the run directory exists, write ``RUN/data/`` (training and held-out windows,
    vocabulary, source).  The target statistics are written by the trainer itself (``RUN/statistics/``)."""

    def __init__(self, train: np.ndarray, heldout: np.ndarray, vocab: list[str] | None, source: dict) -> None:
        self.train, self.heldout, self.vocab, self.source = train, heldout, vocab, source
        self.done = False

    def on_step_end(self, trainer: Any) -> None:
        if self.done or trainer.run_dir is None:
            return
        from ..storage import atomic_save_npy, atomic_write_json

        data = trainer.run_dir.path / "data"
        # each side file is checked on its own and train.npy is written last, so a run killed between
        # two of them gets the missing ones on resume (the report never takes training windows as held-out)
        if not (data / "heldout.npy").exists():
            atomic_save_npy(data / "heldout.npy", self.heldout)
        if self.vocab is not None and not (data / "vocab.json").exists():
            atomic_write_json(data / "vocab.json", list(self.vocab))
        if not (data / "source.json").exists():
            atomic_write_json(data / "source.json", self.source)
        if not (data / "train.npy").exists():
            atomic_save_npy(data / "train.npy", self.train)
        self.done = True


def train_leading_run(
    config: LeadingRunConfig, out: str | Path, *, resume: bool = False, overwrite: bool = False, rank: int = 0
) -> Any:
    """Train the run described by ``config`` into ``out`` (see the module docstring); returns the trainer's
    run object (:func:`originlens.train.train_assoc`).  ``rank`` ≠ 0 (a data-parallel worker) writes
    nothing of its own."""
    from ..progress import log
    from ..storage import vocab_hash
    from ..train import train_assoc
    from ..train.assoc import run_dir_kind

    if resume and overwrite:
        raise ConfigError("--resume and --overwrite exclude each other", "pass one of them")
    src, tokens, vocab, manifest, V = load_windows(config.source, config.vocab_size)
    train, heldout = split_windows(tokens, config.max_windows, config.holdout)
    T = train.shape[1] - 1
    given = None
    stats_source = {"first-batch": "first_batch", "full": "full", "none": "none"}.get(config.stats)
    if stats_source is None:
        if not Path(config.stats).exists():
            raise InputError(
                f"--stats {config.stats} is neither first-batch, full, none nor an existing directory",
                "pass one of those, or compute statistics with `originlens stats`",
            )
        given = given_statistics(config.stats, vocab, V, T)
        stats_source = "none"
    cfg = config.train
    cfg.stats_source = stats_source
    cfg.out = str(out)
    cfg.validate()
    out = Path(out)
    if overwrite and rank == 0 and run_dir_kind(out) == "assoc":  # never touch a directory we did not write
        for name in OWN_OUTPUTS:  # the trainer wipes its own files; these are ours
            f = out / name
            shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)
    source = {
        "source": str(src),
        "vocab_size": V,
        "seq_len": T,
        "max_windows": config.max_windows,
        "holdout": config.holdout,
        "train_windows": int(train.shape[0]),
        "heldout_windows": int(heldout.shape[0]),
        "vocab_hash": vocab_hash(vocab, V) if vocab is not None else None,
        "corpus_manifest_tokens_sha256": (manifest or {}).get("tokens_sha256"),
        "stats": str(config.stats),
    }
    saver = SaveInputs(train, heldout, vocab, source)
    batch = cfg.batch_size
    log(
        f"assoc train: {train.shape[0]} windows × T={T}, |V|={V}, L={cfg.n_layers}, η={cfg.lr}, "
        + ("full-batch GD" if batch is None else f"SGD batch {batch}")
        + f", statistics: {config.stats}, device: {cfg.device}"
    )
    return train_assoc(train, V, cfg, [saver], stats=given, vocab=vocab, resume=resume, overwrite=overwrite)


@dataclass
class LeadingReportConfig:
    """What ``report_leading_run`` analyses beside the run: ``analysis`` (:class:`AnalysisConfig` of
    :mod:`.leading_analysis`; default its defaults), optional other ``stats`` / ``data``
    directories, and a ``null_corpus`` whose statistics (``analysis.null_windows`` windows,
    ``analysis.seed``) give the disjoint-data null."""

    analysis: Any = None
    stats: str | None = None
    data: str | None = None
    null_corpus: str | None = None


def report_leading_run(
    run_dir: str | Path, config: LeadingReportConfig | None = None, out: str | Path | None = None
) -> tuple[dict[str, Any], Path]:
    """Analyse a finished (or partial) leading-terms run and write its report into ``out`` (default the
    run directory); returns ``(results, path of report.html)``."""
    from ..devices import resolve_device
    from ..progress import log
    from .leading_analysis import AnalysisConfig, analyse_run, load_run, resolve_null_statistics
    from .leading_report import write_report

    config = config or LeadingReportConfig()
    analysis = config.analysis or AnalysisConfig()
    resolve_device(analysis.device)  # fail before the (long) analysis if CUDA is missing
    run = load_run(run_dir, stats=config.stats, data=config.data)
    null = None
    if config.null_corpus:
        log(f"assoc report: null statistics from {config.null_corpus}")
        null = resolve_null_statistics(
            config.null_corpus, run.seq_len, windows=analysis.null_windows, seed=analysis.seed
        )
    results = analyse_run(run, analysis, null=null)
    return results, write_report(results, out or run_dir)
