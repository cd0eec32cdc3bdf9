"""One leading-terms run analysed as a whole (the leading-terms experiment, :mod:`.leading_run`): a
training run directory of ``train_assoc`` read back (:func:`load_run`), its checkpoints tracked against
the corpus statistics' leading terms with nulls and the intervention (:func:`analyse_run`), for the report
of :mod:`.leading_report`.

The theory it applies lives in :mod:`originlens.theory` (:mod:`~originlens.theory.tracking`: cosines of
checkpoints against leading terms; :mod:`~originlens.theory.nulls`, :mod:`~originlens.theory.intervention`);
this module knows the run directory's format.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..errors import CompatibilityError, InputError
from ..theory.intervention import heldout_losses, intervention_losses
from ..theory.leading_terms import (
    compare_to_theory,
    statistic_of,
    validity_window,
)
from ..theory.nulls import baseline_cosines, pmi_matrix
from ..theory.tracking import (
    EXAMPLE_WORDS,
    checkpoint_files,
    example_associations,
    finite_or_none,
    load_weights,
    min_over_training,
    track_checkpoints,
)


@dataclass
class AnalysisConfig:
    """Options of :func:`analyse_run`.

    * ``eval_windows``: training windows (first n, unshuffled) for the intervention and, when the run has
      no held-out split, for the held-out losses; 0 = all (paper); None (default) = as many as hold
      ``eval_positions`` predicted tokens (131,072: 2,048 windows of T = 64, 655 of T = 200), so that the
      cost of the intervention's 3L + 2 passes over them does not grow with T.
    * ``null_windows``: cap on windows used for null / same-corpus statistics.
    * ``examples``: words whose top associations are listed; ``top_k`` how many.
    * ``intervention`` / ``heldout``: switch those parts off (they run the model over many windows).
    * ``full_stats``: when the targets come from a sample (first batch), also track the cosines with the
      leading terms of all training windows (what SGD over every batch follows).
    * ``device``: where the model runs for the intervention and held-out losses ("cpu", "cuda", "auto").
    """

    eval_windows: int | None = None
    eval_positions: int = 131_072
    null_windows: int = 2048
    examples: tuple[str, ...] = EXAMPLE_WORDS
    top_k: int = 10
    seed: int = 0
    intervention: bool = True
    heldout: bool = True
    batch_size: int = 256
    full_stats: bool = True
    device: str = "cpu"

    def n_eval(self, available: int, seq_len: int) -> int:
        """How many windows (of ``available``, each predicting ``seq_len`` tokens) are evaluated."""
        if self.eval_windows == 0:
            return available
        if self.eval_windows is None:
            return min(available, max(1, -(-int(self.eval_positions) // max(1, int(seq_len)))))
        return min(int(self.eval_windows), available)


@dataclass
class RunData:
    """What :func:`analyse_run` needs from a run directory (see :func:`load_run`)."""

    path: Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    stats: Any
    stats_manifest: dict[str, Any] = field(default_factory=dict)
    train_tokens: np.ndarray | None = None
    heldout_tokens: np.ndarray | None = None
    vocab: list[str] | None = None
    data_note: str = ""

    @property
    def lr(self) -> float:
        return float(self.config["config"]["lr"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["identity"]["vocab_size"])

    @property
    def seq_len(self) -> int:
        return int(self.config["identity"]["seq_len"])

    @property
    def n_layers(self) -> int:
        return int(self.config["config"]["n_layers"])

    @property
    def steps_per_epoch(self) -> int:
        return int(self.config.get("steps_per_epoch", 1))


def _load_npy(p: Path) -> np.ndarray:
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"{p} is not a readable .npy file ({exc})", "re-run `originlens assoc train`") from None


def load_run(run_dir: str | Path, *, stats: Any = None, data: str | Path | None = None) -> RunData:
    """Read ``config.json``, ``metrics.jsonl``, the target statistics (``RUN/statistics`` unless ``stats``)
    and the token windows (``RUN/data/train.npy``, ``heldout.npy``, ``vocab.json`` as written by
    ``originlens assoc train``, or ``data``: a corpus directory or .npy file, all windows = training)."""
    from ..runs import RunDir
    from ..stats import load_statistics
    from ..storage import read_json

    p = Path(run_dir)
    if not (p / "config.json").is_file():
        raise InputError(
            f"{p} is not a training run (no config.json)",
            "pass a directory written by `originlens assoc train --out RUN`",
        )
    cfg = read_json(p / "config.json")
    if not isinstance(cfg, dict) or "identity" not in cfg or "config" not in cfg:
        raise InputError(f"{p / 'config.json'} is not an assoc training config", "pass an assoc run directory")
    metrics = RunDir(p, create=False).read_metrics()
    manifest: dict[str, Any] = {}
    if stats is None and (p / "statistics").is_dir():
        stats = load_statistics(p / "statistics")
        if (p / "statistics" / "manifest.json").is_file():
            manifest = read_json(p / "statistics" / "manifest.json")
    elif stats is None and not (p / "data" / "train.npy").is_file() and data is None:
        raise InputError(
            f"{p} has no statistics/ and no data/ (trained with --stats none or from Python)",
            "pass --stats DIR with statistics of this run's corpus, or --data CORPUS",
        )
    elif isinstance(stats, (str, Path)):
        stats = load_statistics(stats)
        manifest = {"source": "given (report --stats)", "windows": "given"}
    train = held = vocab = None
    note = ""
    if data is not None:
        from ..data import TokenWindows

        windows = TokenWindows.load(data, int(cfg["identity"]["vocab_size"]))
        train, vocab = np.asarray(windows.tokens), windows.vocab
        note = f"windows from {data} (all treated as training windows)"
    elif (p / "data" / "train.npy").is_file():
        train = _load_npy(p / "data" / "train.npy")
        if (p / "data" / "heldout.npy").is_file():
            held = _load_npy(p / "data" / "heldout.npy")
            held = held if held.shape[0] else None
        if (p / "data" / "vocab.json").is_file():
            vocab = read_json(p / "data" / "vocab.json")
        note = "windows saved by `originlens assoc train` (RUN/data)"
    if stats is None:  # --stats none at training time: full statistics of the training windows
        from ..stats import corpus_statistics

        if train is None:
            raise InputError(f"{p} has no statistics/", "pass --stats DIR or --data CORPUS")
        stats = corpus_statistics(train, int(cfg["identity"]["vocab_size"]), vocab=vocab)
        manifest = {
            "source": "full (computed by the report: the run has no statistics/)",
            "windows": "all",
            "n_windows": int(train.shape[0]),
        }
    _check_run_statistics(p, stats, cfg, vocab)
    if vocab is None and getattr(stats, "vocab", None) is not None and stats.size == stats.vocab_size:
        vocab = list(stats.vocab)
    if train is not None:
        h = _tokens_hash(train)
        want = cfg["identity"].get("data_sha256")
        if want and h != want:
            note += " — WARNING: these windows are not the ones the run was trained on (hash differs)"
    return RunData(p, cfg, metrics, stats, manifest, train, held, vocab, note)


def _check_run_statistics(path: Path, stats: Any, cfg: Mapping[str, Any], vocab: Sequence[str] | None) -> None:
    """Statistics must match the run's |V|, T and (when both are known) token strings, unrestricted."""
    V, T = int(cfg["identity"]["vocab_size"]), int(cfg["identity"]["seq_len"])
    B, D = statistic_of(stats, "bigram"), statistic_of(stats, "positional")
    fix = "pass statistics of this run's own corpus (RUN/statistics), computed without --top-k"
    if B.shape != (V, V) or D.shape != (T,):
        raise CompatibilityError(
            f"statistics are {B.shape[0]}×{B.shape[1]} with T = {D.shape[0]}; the run {path} has |V| = {V}, T = {T}",
            fix,
        )
    if getattr(stats, "token_ids", None) is not None:
        raise CompatibilityError("the statistics are restricted to a token subset", fix)
    sv = getattr(stats, "vocab", None)
    if vocab is not None and sv is not None and list(sv) != list(vocab):
        raise CompatibilityError(f"the statistics were computed with another vocabulary than the run {path}", fix)


def _tokens_hash(arr: np.ndarray) -> str:
    a = np.ascontiguousarray(arr, dtype=np.int64)
    h = hashlib.sha256(f"{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _stats_windows(run: RunData) -> np.ndarray | None:
    """Indices (into the training windows) the target statistics were computed on, if known."""
    w = run.stats_manifest.get("windows")
    if run.train_tokens is None:
        return None
    if w is None or isinstance(w, str):  # "all", or "given" statistics (source unknown: use all)
        return np.arange(run.train_tokens.shape[0])
    return np.asarray(w, dtype=np.int64)


def same_corpus_sample(run: RunData, n_max: int) -> tuple[np.ndarray | None, str]:
    """Windows disjoint from the statistics sample (held-out first), as many as that sample (≤ n_max)."""
    if run.train_tokens is None:
        return None, "no token windows available"
    used = _stats_windows(run)
    n_want = min(int(n_max), len(used)) if used is not None else int(n_max)
    parts, src = [], []
    if run.heldout_tokens is not None:
        parts.append(run.heldout_tokens[:n_want])
        src.append(f"{min(n_want, run.heldout_tokens.shape[0])} held-out")
    have = sum(p.shape[0] for p in parts)
    if have < n_want:
        mask = np.ones(run.train_tokens.shape[0], dtype=bool)
        if used is not None:
            mask[used] = False
        rest = np.nonzero(mask)[0][: n_want - have]
        if len(rest):
            parts.append(run.train_tokens[rest])
            src.append(f"{len(rest)} training windows outside the statistics sample")
    if not parts or sum(p.shape[0] for p in parts) == 0:
        return None, "no windows disjoint from the statistics sample"
    return np.concatenate(parts), " + ".join(src)


def resolve_null_statistics(
    spec: str | Path, seq_len: int, *, windows: int = 2048, seed: int = 0
) -> tuple[Any, list[str] | None, str]:
    """Null-corpus statistics from ``spec``: ``"storyworld"`` (a generated corpus, |V| = 500), a statistics
    directory / ``statistics.safetensors``, a corpus directory or an .npy token file (first ``windows``
    windows; longer windows are cut to T+1 tokens).  Returns ``(stats, vocab, description)``."""
    import tempfile

    from ..data import TokenWindows, build_corpus, is_corpus_dir
    from ..stats import corpus_statistics, load_statistics

    spec_s = str(spec)
    vocab: list[str] | None
    if spec_s == "storyworld":
        with tempfile.TemporaryDirectory() as tmp:
            store = build_corpus(
                None, Path(tmp) / "c", storyworld_stories=2000, seed=seed, vocab_size=500, seq_len=seq_len
            )
            toks = np.asarray(store.tokens[:windows])
            vocab = list(store.vocab)
        st = corpus_statistics(toks, len(vocab), vocab=vocab)
        return (
            st,
            vocab,
            f"storyworld (2000 generated stories, seed {seed}, |V| = {len(vocab)}, {toks.shape[0]} windows)",
        )
    p = Path(spec_s)
    if (p.is_dir() and (p / "statistics.safetensors").is_file()) or p.suffix == ".safetensors":
        st = load_statistics(p)
        return st, (list(st.vocab) if st.vocab is not None else None), f"statistics {p}"
    if p.is_dir() and not is_corpus_dir(p):
        raise InputError(
            f"{p} is neither a statistics nor a corpus directory",
            "pass --null-corpus storyworld, a corpus directory or a statistics directory",
        )
    loaded = TokenWindows.load(p)
    vocab = loaded.vocab
    toks = np.asarray(loaded.tokens[:windows])
    if toks.shape[1] > seq_len + 1:
        toks = toks[:, : seq_len + 1]
    V = loaded.vocab_size
    st = corpus_statistics(toks, V, vocab=vocab)
    return st, (list(vocab) if vocab is not None else None), f"corpus {p} ({toks.shape[0]} windows, |V| = {V})"


def _final_weights(run: RunData) -> tuple[int, dict[str, np.ndarray], Path]:
    ck = checkpoint_files(run.path)
    final = run.path / "model.safetensors"
    if final.is_file():
        from ..storage import load_tensors

        _, meta = load_tensors(final)
        s = int(json.loads(meta.get("step", "0"))) if meta.get("step") else (ck[-1][0] if ck else 0)
        return s, load_weights(final), final
    if not ck:
        raise InputError(f"{run.path} holds no checkpoint and no model.safetensors", "train the run first")
    return ck[-1][0], load_weights(ck[-1][1]), ck[-1][1]


def analyse_run(
    run: RunData, cfg: AnalysisConfig | None = None, *, null: tuple[Any, Any, str] | None = None
) -> dict[str, Any]:
    """Everything the report shows, as one JSON-able dict (NaN → None).  ``null`` = the output of
    :func:`resolve_null_statistics` (optional)."""
    from ..models.assoc import AssocConfig, AssocModel
    from ..progress import log
    from ..stats import corpus_statistics

    cfg = cfg or AnalysisConfig()
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    warnings: list[str] = []
    c = run.config["config"]
    optimizer = run.config.get("optimizer", "sgd" if c.get("batch_size") else "gd")
    win = validity_window(run.seq_len, run.n_layers, run.lr, run.vocab_size)
    info = {
        "path": str(run.path),
        "optimizer": optimizer,
        "lr": run.lr,
        "n_layers": run.n_layers,
        "vocab_size": run.vocab_size,
        "seq_len": run.seq_len,
        "batch_size": c.get("batch_size"),
        "init": c.get("init"),
        "init_std": c.get("init_std"),
        "dtype": c.get("dtype"),
        "n_sequences": run.config["identity"].get("n_sequences"),
        "steps_per_epoch": run.steps_per_epoch,
        "total_steps": run.config.get("total_steps"),
        "stats_source": run.stats_manifest.get("source", "given"),
        "stats_windows": (run.stats_manifest.get("n_windows")),
        "data": run.data_note,
        "theory_note": (
            "theory: full-batch GD from zero init; this run uses "
            + ("full-batch GD" if optimizer == "gd" else "minibatch SGD (empirical comparison)")
            + ("" if c.get("init") == "zero" else f", {c.get('init')} init")
        ),
    }
    window = {
        "conditions": win.conditions,
        "holds": win.holds,
        "s_max": win.s_max,
        "steps": win.steps,
        "theorem": win.theorem,
    }

    losses = [
        [int(r["step"]), float(r.get("epoch", r["step"] / run.steps_per_epoch)), r.get("loss")]
        for r in run.metrics
        if r.get("event") == "step"
    ]

    # -- tracking over checkpoints
    ck = checkpoint_files(run.path)
    if not ck:
        raise InputError(f"{run.path} holds no checkpoint", "train the run first (checkpoints/ is empty)")

    def gen() -> Iterator[tuple[int, dict[str, np.ndarray]]]:
        for s, f in ck:
            yield s, load_weights(f)

    other = None
    used = _stats_windows(run)
    if cfg.full_stats and run.train_tokens is not None and used is not None and len(used) < run.train_tokens.shape[0]:
        other = {"full_train": corpus_statistics(run.train_tokens, run.vocab_size)}
    records = track_checkpoints(
        gen(),
        run.stats,
        run.lr,
        steps_per_epoch=run.steps_per_epoch,
        seq_len=run.seq_len,
        vocab_size=run.vocab_size,
        other_stats=other,
    )
    dups = [[a["step"], b["step"]] for a, b in zip(records, records[1:]) if a["hash"] == b["hash"]]
    if dups:
        warnings.append(f"consecutive checkpoints with identical weights: {dups} (mislabelled or duplicated?)")
    timings["tracking_s"] = time.perf_counter() - t0

    s_final, w_final, final_path = _final_weights(run)
    from ..devices import resolve_device

    model = AssocModel(
        AssocConfig(
            vocab_size=run.vocab_size, seq_len=run.seq_len, n_layers=run.n_layers, dtype=c.get("dtype", "float32")
        )
    ).to(resolve_device(cfg.device))
    model.load_weights(w_final)

    # -- baselines on the final weights
    t1 = time.perf_counter()
    pmi = None
    base_notes = []
    if run.train_tokens is not None:
        used = _stats_windows(run)
        sample = run.train_tokens[used] if used is not None else run.train_tokens
        pmi = {k: pmi_matrix(sample, run.vocab_size, k) for k in ("bigram", "context", "query_key")}
        base_notes.append(f"PMI from the {sample.shape[0]} windows of the target statistics")
    same_st = None
    if run.train_tokens is not None:
        same, src = same_corpus_sample(run, cfg.null_windows)
        if same is not None:
            same_st = corpus_statistics(same, run.vocab_size)
            base_notes.append(f"same-corpus statistics from {src}")
        else:
            base_notes.append(f"no same-corpus baseline: {src}")
    null_st = null_vocab = None
    if null is not None:
        null_st, null_vocab, desc = null
        base_notes.append(f"null corpus: {desc}")
    baselines = baseline_cosines(
        w_final,
        run.stats,
        vocab=run.vocab,
        null_stats=null_st,
        null_vocab=null_vocab,
        same_corpus_stats=same_st,
        pmi=pmi,
        seed=cfg.seed,
    )
    timings["baselines_s"] = time.perf_counter() - t1

    # -- causal intervention
    interv = None
    if cfg.intervention and run.train_tokens is not None:
        t1 = time.perf_counter()
        n = cfg.n_eval(run.train_tokens.shape[0], run.seq_len)
        log(f"assoc report: intervention, {len(list(model.named_weights())) + 1} passes over {n} windows")
        interv = intervention_losses(model, run.stats, run.train_tokens[:n], batch_size=cfg.batch_size)
        interv["windows"] = int(n)
        interv["source"] = (
            f"first {n} of {run.train_tokens.shape[0]} training windows (unshuffled)"
            if n < run.train_tokens.shape[0]
            else "all training windows (unshuffled)"
        )
        timings["intervention_s"] = time.perf_counter() - t1
    elif cfg.intervention:
        warnings.append("no token windows: intervention skipped (pass --data)")

    # -- held-out losses
    held = None
    if cfg.heldout and run.train_tokens is not None:
        t1 = time.perf_counter()
        if run.heldout_tokens is not None:
            ev, src = run.heldout_tokens, f"{run.heldout_tokens.shape[0]} held-out windows (never trained on)"
        else:
            n = cfg.n_eval(run.train_tokens.shape[0], run.seq_len)
            ev, src = run.train_tokens[-n:], f"last {n} TRAINING windows (the run has no held-out set)"
        log(f"assoc report: held-out losses over {ev.shape[0]} windows")
        # the losses, then the record's source (text) and step
        held = cast(
            dict[str, Any],
            heldout_losses(model, run.stats, s_final, run.lr, ev, run.train_tokens, batch_size=cfg.batch_size),
        )
        held["source"] = src
        held["step"] = s_final
        timings["heldout_s"] = time.perf_counter() - t1

    examples = example_associations(run.stats, w_final, run.vocab, cfg.examples, cfg.top_k)
    missing = [w for w in cfg.examples if run.vocab is not None and w not in examples]
    if missing:
        warnings.append(f"example words not in the vocabulary: {', '.join(missing)}")
    timings["total_s"] = time.perf_counter() - t0
    return finite_or_none(
        {
            "run": info,
            "validity_window": window,
            "loss_curve": losses,
            "checkpoints": records,
            "min_cosine_over_training": min_over_training(records),
            "min_cosine_over_training_full_train": min_over_training(records, "full_train") if other else None,
            "final": {
                "step": s_final,
                "path": str(final_path),
                "theory": records[-1]["theory"]
                if records[-1]["step"] == s_final
                else compare_to_theory(w_final, run.stats, s_final, run.lr),
            },
            "baselines": {"step": s_final, "per_weight": baselines, "notes": base_notes},
            "intervention": interv,
            "heldout": held,
            "examples": examples,
            "warnings": warnings,
            "timings": timings,
        }
    )
