"""Formal-text documents from this interpreter's own Python sources: whole files, provenance, declared
licences, deduplication, length limits, a JSON Lines file that `corpus build` reads."""

from __future__ import annotations

import json
from email.message import Message

import pytest

from originlens.data.formal import STDLIB_LICENCE, declared_licence, python_source_documents, write_documents
from originlens.errors import ConfigError


def _meta(**fields) -> Message:
    m = Message()
    for k, v in fields.items():
        for x in v if isinstance(v, list) else [v]:
            m[k.replace("_", "-")] = x
    return m


def test_declared_licence_rules():
    assert declared_licence(_meta(License_Expression="MIT", License="BSD")) == "MIT"
    assert declared_licence(_meta(License="MPL-2.0 AND MIT\nlong text ...")) == "MPL-2.0 AND MIT"
    assert (
        declared_licence(
            _meta(
                License="UNKNOWN",
                Classifier=["License :: OSI Approved :: Apache Software License", "Programming Language :: Python"],
            )
        )
        == "Apache Software License"
    )
    assert declared_licence(_meta()) == "unknown"


def test_stdlib_documents_are_whole_files_with_provenance():
    docs = list(python_source_documents(["stdlib"], min_chars=500, max_chars=20_000, max_files=40))
    assert len(docs) == 40
    for d in docs:
        assert d.origin == "stdlib" and d.licence == STDLIB_LICENCE and d.path.endswith(".py")
        with open(d.path, encoding="utf-8") as f:
            assert f.read() == d.text  # the whole file, not lines
        assert 500 <= len(d.text) <= 20_000
    assert len({d.sha256 for d in docs}) == len(docs)
    assert [d.path for d in docs] == [
        d.path for d in python_source_documents(["stdlib"], min_chars=500, max_chars=20_000, max_files=40)
    ]


def test_distribution_documents_carry_their_declared_licence():
    docs = list(python_source_documents(["site-packages"], max_files=300))
    by_origin = {d.origin: d for d in docs}
    assert len(by_origin) >= 2 and all(d.licence for d in docs)
    assert any(d.licence != "unknown" for d in docs)


def test_exact_duplicates_are_dropped(monkeypatch, tmp_path):
    import originlens.data.formal as F

    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text("x = 1\n" * 50)
    b.write_text("x = 1   \n" * 50)  # same up to trailing blanks
    c.write_text("y = 2\n" * 50)
    monkeypatch.setattr(F, "_stdlib_files", lambda: iter([(p, "stdlib", "3", "PSF-2.0") for p in (a, b, c)]))
    docs = list(F.python_source_documents(["stdlib"], min_chars=10))
    assert [d.path for d in docs] == [str(a), str(c)]


def test_jsonl_feeds_corpus_build(tmp_path):
    from originlens.data import build_corpus

    docs = list(python_source_documents(["stdlib"], min_chars=2000, max_chars=8000, max_files=25))
    body, prov, n = write_documents(docs, tmp_path / "code")
    assert n == 25 and body.name == "code.jsonl" and prov.name == "code.provenance.jsonl"
    rec = [json.loads(x) for x in prov.read_text().splitlines()]
    assert all("text" not in r and r["licence"] == STDLIB_LICENCE and r["chars"] > 0 for r in rec)
    store = build_corpus([str(body)], tmp_path / "corpus", tokenizer="bpe", vocab_size=400, seq_len=32, windows="first")
    assert len(store) == 25  # one document per file


def test_bad_arguments():
    with pytest.raises(ConfigError, match="unknown source"):
        list(python_source_documents(["npm"]))
    with pytest.raises(ConfigError, match="min_chars"):
        list(python_source_documents(["stdlib"], min_chars=10, max_chars=5))


def test_split_windows_stay_inside_their_document_and_are_traced(tmp_path):
    from originlens.data import TokenStore, build_corpus

    docs = ["a b c d e f g h i j k", "x y", "l m n o p q r", "a b c d e"]  # 11, 2, 7, 5 words
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    store = build_corpus([str(src)], tmp_path / "c", vocab_size=40, seq_len=2, windows="split")
    vocab = store.vocab
    got = [[vocab[i] for i in row] for row in store.tokens]
    want, owner = [], []
    for j, d in enumerate(docs):
        words = d.split()
        for k in range(0, len(words) - 2, 3):
            want.append(words[k : k + 3])
            owner.append(j)
    assert got == want and store.window_documents.tolist() == owner  # doc 1 (2 words) too short
    c = store.manifest["counts"]
    assert c["documents_dropped"]["too_short"] == 1 and c["tokens_discarded_tail"] == 2 + 1 + 2
    first = build_corpus([str(src)], tmp_path / "f", vocab_size=40, seq_len=2, windows="first")
    assert first.window_documents.tolist() == [0, 2, 3]
    packed = build_corpus([str(src)], tmp_path / "p", vocab_size=40, seq_len=2, windows="pack")
    assert packed.window_documents is None
    assert TokenStore.open(tmp_path / "c").window_documents.tolist() == owner
