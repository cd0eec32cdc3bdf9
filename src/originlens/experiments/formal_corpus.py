"""The shared corpus of the formal-feature experiment (:mod:`originlens.experiments.formal`): real stories and
real Python source in one BPE corpus whose windows carry their domain and held-out flag.

:func:`build_mixed_corpus` writes ``OUT/corpus`` (an originlens corpus directory, ``windows="split"``) and
``OUT/corpus-data``: ``documents.jsonl`` (the documents in corpus order: training stories, training Python,
held-out stories, held-out Python), ``python.jsonl`` + ``python.provenance.jsonl``
(:func:`originlens.data.formal.write_documents`), ``tokenizer/`` (a BPE trained on the training documents
only), ``windows.npz`` (per window ``domain`` int8 (0 story, 1 python), ``heldout`` bool and ``document``,
the index of its document in that order, from the corpus's ``window_documents.npy``) and
``corpus-info.json`` (counts per domain and part, sources, licences, hashes).  Because the held-out
documents come last, the held-out windows are the corpus's last ``n_heldout`` windows: the trainer's eval
set (``eval_size = n_heldout``), while it trains on the others.

Caveats: held-out characters the tokenizer never saw become ``<unk>`` (counted in ``unk_tokens``); the
whitespace the Whitespace pre-tokenizer drops is gone from every window (code loses its layout).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from ..storage import atomic_write_json, atomic_write_text, read_json
from . import formal_metrics as fm


@dataclass
class MixedCorpus:
    """The shared corpus: ``tokens (N, T+1)``, per window ``domain`` (0 story, 1 python) and ``heldout``;
    the held-out windows are the last ``n_heldout``."""

    path: Path
    tokens: np.ndarray
    domain: np.ndarray
    heldout: np.ndarray
    info: dict[str, Any]

    @property
    def n_heldout(self) -> int:
        return int(self.heldout.sum())

    def heldout_of(self, d: int) -> np.ndarray:
        return np.nonzero(self.heldout & (self.domain == d))[0]

    def analysis(self, n: int, seed: int) -> np.ndarray:
        """``n`` held-out windows of each domain (fewer if there are fewer), story first, seeded."""
        rng = np.random.default_rng([seed, 17])
        idx = [self.heldout_of(d) for d in (fm.STORY, fm.PYTHON)]
        m = min(n, *(len(i) for i in idx))
        return np.concatenate([np.sort(rng.permutation(i)[:m]) for i in idx])


def load_stories(s: dict[str, Any], seed: int) -> tuple[list[str], str]:
    """The data root's TinyStories lines (one story each), ``s["stories"]`` of them drawn at random (seeded,
    kept in file order; None: all), and a description of the source.  Without TinyStories files: the
    built-in storyworld, described as such."""
    from ..data import storyworld
    from ..data.readers import iter_documents
    from ..paths import tinystories_files

    files = tinystories_files()
    if files:
        docs, src = list(iter_documents(files)), f"TinyStories lines of {', '.join(f.name for f in files)}"
    else:
        docs = storyworld.generate_stories(s["stories"] or 2000, seed)
        src = "the built-in storyworld (no TinyStories under the data root): NOT real stories"
    if s["stories"] is not None and s["stories"] < len(docs):
        keep = np.sort(np.random.default_rng([seed, 19]).choice(len(docs), s["stories"], replace=False))
        docs = [docs[i] for i in keep]
    return docs, src


def select_python(s: dict[str, Any], budget: int, seed: int) -> list[Any]:
    """Python files (:func:`~originlens.data.formal.python_source_documents` of ``s["python_sources"]``, at
    most ``s["python_max_chars"]`` characters each) in a seeded random order until their Whitespace
    pre-tokenizer pieces reach ``budget`` (all of them when they do not)."""
    from ..data.formal import python_source_documents

    docs = list(python_source_documents(s["python_sources"], max_chars=s["python_max_chars"]))
    out, total = [], 0
    for i in np.random.default_rng([seed, 23]).permutation(len(docs)):
        if total >= budget:
            break
        out.append(docs[i])
        total += len(fm.text_pieces(docs[i].text))
    return out


def build_mixed_corpus(
    out: str | Path,
    stories: list[str],
    python: list[Any],
    *,
    heldout_frac: float,
    vocab_size: int,
    seq_len: int,
    split_seed: int = 0,
    story_source: str = "",
) -> MixedCorpus:
    """Build ``OUT/corpus`` (+ ``OUT/corpus-data``) from story texts and Python documents (``SourceDocument``
    or str); see the module docstring.  Raises :class:`InputError` when a domain is missing."""
    from ..data.build import build_corpus
    from ..data.formal import SourceDocument, write_documents
    from ..data.store import WINDOW_DOCUMENTS
    from ..data.tokenizers import BPETokenizer

    out = Path(out)
    texts = {0: [t for t in stories if t and t.strip()], 1: [getattr(d, "text", d) for d in python]}
    texts[1] = [t for t in texts[1] if t and t.strip()]
    fix = "check the TinyStories files under the data root (ORIGINLENS_DATA) and the Python sources (python_sources)"
    for d, name in enumerate(fm.DOMAINS):
        if len(texts[d]) < 2:
            raise InputError(f"the mixed corpus needs ≥ 2 {name} documents (one held out), got {len(texts[d])}", fix)
    data = out / "corpus-data"
    data.mkdir(parents=True, exist_ok=True)
    split: dict[int, np.ndarray] = {}
    for d in (0, 1):
        n = len(texts[d])
        split[d] = np.zeros(n, bool)
        split[d][np.random.default_rng([split_seed, 31, d]).permutation(n)[: max(1, round(heldout_frac * n))]] = True
    order = [(d, h, t) for h in (False, True) for d in (0, 1) for t, hh in zip(texts[d], split[d]) if hh == h]
    atomic_write_text(
        data / "documents.jsonl",
        "".join(
            json.dumps({"text": t, "domain": fm.DOMAINS[d], "heldout": h}, ensure_ascii=False) + "\n"
            for d, h, t in order
        ),
    )
    src_docs = [d for d in python if isinstance(d, SourceDocument)]
    if src_docs:
        write_documents(src_docs, data / "python")
    tok = BPETokenizer.train((t for d, h, t in order if not h), vocab_size)
    tok.save(data / "tokenizer")
    store = build_corpus(
        [data / "documents.jsonl"],
        out / "corpus",
        tokenizer=str(data / "tokenizer"),
        seq_len=seq_len,
        windows="split",
        oov="unk",
        overwrite=True,
    )
    if store.manifest["counts"]["documents_read"] != len(order):
        raise InputError("the corpus reader skipped documents; windows cannot be traced", "report this as a bug")
    doc = np.load(out / "corpus" / WINDOW_DOCUMENTS)
    domain = np.array([d for d, _, _ in order], np.int8)[doc]
    heldout = np.array([h for _, h, _ in order], bool)[doc]
    counts = {}
    for d, name in enumerate(fm.DOMAINS):
        for h, part in ((False, "train"), (True, "heldout")):
            counts[f"{name}_{part}_windows"] = int(((domain == d) & (heldout == h)).sum())
            counts[f"{name}_{part}_documents"] = int(
                ((np.array([x[0] for x in order]) == d) & (np.array([x[1] for x in order]) == h)).sum()
            )
            if counts[f"{name}_{part}_windows"] == 0:
                raise InputError(
                    f"no {part} window of {seq_len + 1} tokens in the {name} documents",
                    "lower seq_len or add longer documents",
                )
    n_h = int(heldout.sum())
    if not (heldout[len(heldout) - n_h :].all() and not heldout[: len(heldout) - n_h].any()):
        raise InputError(
            "held-out windows are not the corpus's last windows", "report this as a bug"
        )  # pragma: no cover
    np.savez(data / "windows.npz", domain=domain, heldout=heldout, document=doc.astype(np.int64))
    info = {
        "story_source": story_source,
        "counts": counts,
        "vocab_size": store.vocab_size,
        "seq_len": seq_len,
        "tokens_sha256": store.manifest["tokens_sha256"],
        "vocab_hash": store.manifest["vocab_hash"],
        "python_origins": sorted({d.origin for d in src_docs}),
        "python_licences": sorted({d.licence for d in src_docs}),
        "tokenizer": "BPE trained on the training documents only; held-out characters it lacks map to <unk>",
        "unk_tokens": store.manifest["counts"]["oov_tokens"],
        "pieces": {name: sum(len(fm.text_pieces(t)) for t in texts[d]) for d, name in enumerate(fm.DOMAINS)},
    }
    atomic_write_json(data / "corpus-info.json", info)
    return open_mixed_corpus(out)


def open_mixed_corpus(out: str | Path) -> MixedCorpus:
    from ..data.store import TokenStore

    out = Path(out)
    w = np.load(out / "corpus-data" / "windows.npz")
    store = TokenStore.open(out / "corpus")
    return MixedCorpus(
        out / "corpus",
        np.asarray(store.tokens),
        w["domain"],
        w["heldout"],
        read_json(out / "corpus-data" / "corpus-info.json"),
    )


def unigram_losses(corpus: MixedCorpus, n: int) -> dict[str, float]:
    """Held-out cross-entropy per domain of the add-one unigram model of the training windows."""
    V = int(corpus.info["vocab_size"])
    c = np.bincount(corpus.tokens[~corpus.heldout][:, 1:].ravel(), minlength=V).astype(np.float64) + 1
    logp = np.log(c / c.sum())
    return {
        name: float(-logp[corpus.tokens[corpus.heldout_of(d)[:n]][:, 1:]].mean()) for d, name in enumerate(fm.DOMAINS)
    }
