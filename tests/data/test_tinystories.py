"""Builds on the real TinyStories subset (skipped when ``originlens.paths.tinystories_files()`` is empty).

The window counts are checked against a brute-force implementation of the paper's protocol
(arXiv 2601.19208's word-level protocol, docs/protocol.md: top-K word tokens, whole story in vocabulary, at least T+1 tokens, first T+1 kept).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from originlens.data import build_corpus
from originlens.data.tokenizers import pre_tokenize
from originlens.paths import tinystories_files

FILES = tinystories_files()
pytestmark = [
    pytest.mark.skipif(not FILES, reason="TinyStories files not found (set ORIGINLENS_DATA)"),
    pytest.mark.slow,
]


@pytest.fixture(scope="module")
def tokenised():
    docs = [ln for f in FILES for ln in f.read_text(encoding="utf-8").split("\n") if ln.strip()]
    return [pre_tokenize(d) for d in docs]


def brute_windows(tokenised, k, T):
    counts, first = Counter(), {}
    for toks in tokenised:
        counts.update(toks)
        for t in toks:
            first.setdefault(t, len(first))
    vocab = sorted(counts, key=lambda t: (-counts[t], first[t]))[:k]
    keep = set(vocab)
    return vocab, [toks[: T + 1] for toks in tokenised if len(toks) >= T + 1 and keep.issuperset(toks)]


@pytest.mark.parametrize("k,T", [(1000, 64), (3000, 200)])
def test_paper_protocol_on_tinystories(tmp_path, tokenised, k, T):
    store = build_corpus(FILES, tmp_path / "c", vocab_size=k, seq_len=T)
    vocab, rows = brute_windows(tokenised, k, T)
    assert store.vocab == vocab and store.vocab_size == k
    assert len(store) == len(rows) > 0
    got = np.asarray(store.tokens)
    ix = {t: i for i, t in enumerate(vocab)}
    assert np.array_equal(got, np.array([[ix[t] for t in r] for r in rows], dtype=got.dtype))
    c = store.manifest["counts"]
    assert c["documents_read"] == len(tokenised) == 7089
    print(f"TinyStories words V={k} T={T}: {len(store)} windows, dropped {c['documents_dropped']}")
