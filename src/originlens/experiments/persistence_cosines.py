"""The measurement of the leading-terms persistence experiments (:mod:`.persistence`, :mod:`.horizon`): the
word-level corpus of a scale (:func:`corpus_for`), the statistics of the two nulls (permuted tokens, a
disjoint batch; :func:`null_statistics`), the trainer callback that records every step's cosine of each
weight type with its leading term and with the nulls (:class:`StepCosines`), and the horizons read from
those cosines (:func:`horizon`, :func:`sustained_horizon`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..storage import atomic_write_json, read_json

KINDS = ("W", "V", "W_O")
THRESHOLDS = (0.99, 0.9, 0.7)
NULLS = ("permuted", "disjoint")


# ----------------------------------------------------------------------------------------------------
# corpus and nulls


def corpus_for(s: dict[str, Any], d: Path) -> Any:
    """A word-level corpus in directory ``d`` from settings ``s`` (``vocab_size``, ``seq_len``, ``windows``,
    ``oov``, ``max_windows``, ``corpus`` = tinystories | storyworld), reused when ``d`` holds one built
    with the same settings (``d.json`` beside it)."""
    from ..data import TokenStore, build_corpus
    from ..paths import data_root, tinystories_files

    want: dict[str, Any] = {k: s.get(k) for k in ("vocab_size", "seq_len", "windows", "oov", "max_windows", "corpus")}
    want["tokenizer"] = s.get("tokenizer", "words")
    marker = d.with_name(d.name + ".json")
    if d.is_dir() and marker.is_file() and read_json(marker) == want:
        return TokenStore.open(d)
    if s["corpus"] == "tinystories":
        files = tinystories_files()
        if not files:
            raise InputError(
                f"no TinyStories files under {data_root() / 'tinystories'}",
                "set ORIGINLENS_DATA to the directory holding tinystories/",
            )
        sources: Any = files
        extra: dict[str, Any] = {}
    else:
        sources, extra = None, {"storyworld_stories": 400, "seed": 0}
    d.parent.mkdir(parents=True, exist_ok=True)
    store = build_corpus(
        sources,
        d,
        tokenizer=want["tokenizer"],
        vocab_size=s["vocab_size"],
        seq_len=s["seq_len"],
        windows=s["windows"],
        oov=s["oov"],
        max_windows=s.get("max_windows"),
        overwrite=True,
        **extra,
    )
    atomic_write_json(marker, want)
    return store


def permuted_windows(tokens: np.ndarray, seed: int) -> np.ndarray:
    """Each window's tokens shuffled (numpy ``default_rng(seed)``): unigram counts per window kept."""
    rng = np.random.default_rng(seed)
    out = np.array(tokens, copy=True)
    for row in out:
        rng.shuffle(row)
    return out


def null_statistics(tokens: np.ndarray, vocab_size: int, batch: int, data_seed: int) -> dict[str, Any]:
    """Statistics of the permuted-token and disjoint-batch nulls for a run with ``data_seed``."""
    import torch

    from ..stats import corpus_statistics

    n = tokens.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(int(data_seed))).numpy()
    first = tokens[perm[:batch]]
    out = {"permuted": corpus_statistics(permuted_windows(first, data_seed), vocab_size, dtype=np.float64)}
    rest = perm[batch : 2 * batch]
    if len(rest):
        out["disjoint"] = corpus_statistics(tokens[rest], vocab_size, dtype=np.float64)
    return out


# ----------------------------------------------------------------------------------------------------
# the per-step cosines


def _unit_targets(stats: Any) -> dict[str, np.ndarray]:
    from ..theory.leading_terms import leading_terms

    out = {}
    for k, M in leading_terms(stats).items():
        if k in KINDS:
            v = np.asarray(M, dtype=np.float64).ravel()
            nv = float(np.linalg.norm(v))
            out[k] = v / nv if nv > 0 else v * np.nan
    return out


class StepCosines:
    """Trainer callback: at every step, the min over layers per weight type of the cosine with the leading
    terms (``lt``, the trainer's own statistics) and with each null, logged as ``{"event": "cosines"}``
    records of ``RUN/metrics.jsonl`` (truncated with the other records on resume)."""

    def __init__(self, nulls: dict[str, Any]) -> None:
        self.nulls = nulls
        self.targets: dict[str, dict[str, np.ndarray]] | None = None
        self.last: dict[str, Any] | None = None  # the latest record (read by other callbacks)

    def _cosines(self, weights: dict[str, Any]) -> dict[str, dict[str, float | None]]:
        assert self.targets is not None
        out: dict[str, dict[str, float | None]] = {}
        flat: dict[str, list[np.ndarray | None]] = {}
        for name, w in weights.items():
            kind = name.split(".")[0]
            if kind in KINDS:
                v = w.detach().cpu().numpy().astype(np.float64).ravel()
                nv = float(np.linalg.norm(v))
                flat.setdefault(kind, []).append(v / nv if nv > 0 else None)
        for which, tg in self.targets.items():
            rec: dict[str, float | None] = {}
            for kind, vs in flat.items():
                cs = [float(np.dot(v, tg[kind])) for v in vs if v is not None]
                rec[kind] = min(cs) if cs and all(math.isfinite(c) for c in cs) and len(cs) == len(vs) else None
            out[which] = rec
        return out

    def on_step_end(self, trainer: Any) -> None:
        if trainer.run_dir is None or trainer.stats is None:
            return
        if self.targets is None:
            self.targets = {"lt": _unit_targets(trainer.stats), **{k: _unit_targets(v) for k, v in self.nulls.items()}}
        self.last = {"event": "cosines", "step": int(trainer.step), **self._cosines(trainer.model.weights())}
        trainer.run_dir.log_metrics(self.last)


# ----------------------------------------------------------------------------------------------------
# horizons


def horizon(series: list[tuple[int, float | None]], threshold: float) -> int | None:
    """First step whose cosine is defined and below ``threshold`` (None: never)."""
    for s, c in series:
        if c is not None and c < threshold:
            return s
    return None


def sustained_horizon(series: list[tuple[int, float | None]], threshold: float) -> int | None:
    """First step from which every later defined cosine stays below ``threshold`` (None: the last defined
    one is not below it).  Unlike :func:`horizon`, a transient dip that recovers does not count."""
    out = None
    for s, c in series:
        if c is None:
            continue
        if c < threshold:
            out = s if out is None else out
        else:
            out = None
    return out
