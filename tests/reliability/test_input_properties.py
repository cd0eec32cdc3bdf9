"""Hostile and broken inputs: tokenizers and corpus readers.

For arbitrary unicode, binary junk, empty files, truncated compressed streams, malformed JSON/Parquet and
huge lines, every reader and tokenizer gives either a clean result or an ``OriginlensError`` (one line
with a fix), never another exception.  Where the input is well formed, the result is checked against a
direct construction (the documents written are the documents read; ids lie in 0..|V|-1; a saved
tokenizer loads back with the same encodings).
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from originlens.data import build_corpus, iter_documents, load_token_array
from originlens.data.readers import EOT_MARKER
from originlens.data.tokenizers import SAVED_NAME, BPETokenizer, WordTokenizer, load_saved, load_tokenizer, pre_tokenize
from originlens.errors import OriginlensError
from originlens.lm.llama2c_tokenizer import Llama2cTokenizer

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=200)  # includes lone surrogates
utf8_text = st.text(st.characters(codec="utf-8"), max_size=200)
words_text = st.lists(st.sampled_from(list("abcdé ü.,!?\n\t-") + ["Ωmega", "名字", "🙂", "x1", "  "]), max_size=30).map(
    "".join
)
EXTS = [".txt", ".text", ".json", ".jsonl", ".ndjson", ".txt.gz", ".json.gz", ".jsonl.gz", ".parquet", ".csv", ".bin"]


def read_all(path, **kw):
    """The documents of ``path``, or None after an OriginlensError (anything else fails the test)."""
    try:
        docs = list(iter_documents(path, **kw))
    except OriginlensError:
        return None
    assert all(isinstance(d, str) and d.strip() for d in docs)
    return docs


# ------------------------------------------------------------------------------------------ tokenizers


@settings(max_examples=60, **SETTINGS)
@given(
    docs=st.lists(st.one_of(any_text, words_text), max_size=6),
    vocab=st.integers(-1, 40),
    oov=st.sampled_from(["drop", "unk", "bogus"]),
    probe=any_text,
)
def test_word_tokenizer_on_arbitrary_unicode(docs, vocab, oov, probe):
    try:
        tok = WordTokenizer.train(docs, vocab, oov=oov)
    except OriginlensError:
        return
    V = tok.vocab_size
    assert vocab >= V
    for text in [*docs, probe]:
        ids, n_oov = tok.encode_with_oov(text)
        assert all(0 <= i < V for i in ids)
        n_tok = len(pre_tokenize(text))
        assert len(ids) + (n_oov if oov == "drop" else 0) == n_tok
        tok.decode(ids)


@settings(max_examples=30, **SETTINGS)
@given(docs=st.lists(st.one_of(utf8_text, words_text), min_size=1, max_size=5), oov=st.sampled_from(["drop", "unk"]))
def test_word_tokenizer_save_load_round_trip(tmp_path_factory, docs, oov):
    tok = WordTokenizer.train(docs, 30, oov=oov)
    d = tmp_path_factory.mktemp("tok")
    tok.save(d)
    back = load_saved(d)
    assert back.vocab == tok.vocab
    for text in docs:
        assert back.encode_with_oov(text) == tok.encode_with_oov(text)


@settings(max_examples=15, **SETTINGS)
@given(
    docs=st.lists(st.one_of(utf8_text, words_text), min_size=1, max_size=4), probe=any_text, vocab=st.integers(0, 300)
)
def test_bpe_tokenizer_on_arbitrary_unicode(docs, probe, vocab):
    try:
        tok = BPETokenizer.train(docs, vocab)
    except OriginlensError:
        return
    V = tok.vocab_size
    for text in [*docs, probe]:
        try:
            ids = tok.encode(text)
        except OriginlensError:
            continue
        assert all(0 <= i < V for i in ids)
        tok.decode(ids)


json_junk = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=10)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.sampled_from(["kind", "vocab", "settings", "oov", "model", "x"]), inner, max_size=4),
    ),
    max_leaves=10,
)


@settings(max_examples=60, **SETTINGS)
@given(
    obj=json_junk,
    kind=st.sampled_from(["words", "bpe", "pretrained", None]),
    raw=st.binary(max_size=64),
    use_raw=st.booleans(),
)
def test_saved_tokenizer_junk_is_refused_cleanly(tmp_path_factory, obj, kind, raw, use_raw):
    d = tmp_path_factory.mktemp("junk")
    if isinstance(obj, dict) and kind is not None:
        obj = {**obj, "kind": kind}
    (d / SAVED_NAME).write_bytes(raw if use_raw else json.dumps(obj).encode())
    (d / "tokenizer.json").write_bytes(raw)
    try:
        tok = load_tokenizer(d)
    except OriginlensError:
        return
    ids = tok.encode("hello world")
    assert all(0 <= i < tok.vocab_size for i in ids)


@settings(max_examples=40, **SETTINGS)
@given(raw=st.one_of(st.binary(max_size=200), json_junk.map(lambda o: json.dumps(o).encode())))
def test_tokenizer_json_junk_is_refused_cleanly(tmp_path_factory, raw):
    f = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    f.write_bytes(raw)
    try:
        tok = load_tokenizer(f)
    except OriginlensError:
        return
    tok.encode("hello")  # pragma: no cover - junk rarely parses


@st.composite
def llama2c_files(draw):
    """A tokenizer.bin: either valid (random pieces, maybe with byte tokens) or random / truncated bytes."""
    n = draw(st.integers(1, 12))
    pieces = draw(st.lists(st.binary(min_size=0, max_size=4), min_size=n, max_size=n))
    if draw(st.booleans()):
        pieces += [f"<0x{b:02X}>".encode() for b in range(256)]
    buf = io.BytesIO()
    buf.write(np.int32(4).tobytes())
    for p in pieces:
        buf.write(np.float32(draw(st.floats(-10, 10, width=32))).tobytes())
        buf.write(np.int32(len(p)).tobytes())
        buf.write(p)
    raw = buf.getvalue()
    mode = draw(st.sampled_from(["valid", "truncate", "junk", "wrong_size"]))
    if mode == "truncate":
        return raw[: draw(st.integers(0, len(raw)))], len(pieces)
    if mode == "junk":
        return draw(st.binary(max_size=100)), draw(st.integers(-2, 20))
    if mode == "wrong_size":
        return raw, len(pieces) + draw(st.sampled_from([-1, 1, 5]))
    return raw, len(pieces)


@settings(max_examples=60, **SETTINGS)
@given(spec=llama2c_files(), text=utf8_text)  # lone surrogates: see the report (encode raises UnicodeEncodeError)
def test_llama2c_tokenizer_reader_and_encoder(tmp_path_factory, spec, text):
    raw, vocab_size = spec
    f = tmp_path_factory.mktemp("l2c") / "tokenizer.bin"
    f.write_bytes(raw)
    try:
        tok = Llama2cTokenizer.from_file(f, vocab_size)
    except OriginlensError:
        return
    try:
        # BOS is the fixed id 1 of llama2.c: only inside the vocabulary when it has ≥ 3 pieces
        ids = tok.encode(text, bos=tok.vocab_size >= 3)
    except OriginlensError:
        return
    assert all(0 <= i < tok.vocab_size for i in ids)


# ------------------------------------------------------------------------------------------ readers


def _write(path: Path, data: bytes) -> Path:
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


@settings(max_examples=120, **SETTINGS)
@given(
    raw=st.binary(max_size=300),
    ext=st.sampled_from(EXTS),
    split=st.sampled_from(["auto", "line", "blank", "eot"]),
    errors=st.sampled_from(["strict", "replace"]),
    field=st.sampled_from([None, "text", "story", "body"]),
    gz_raw=st.booleans(),
)
def test_readers_on_binary_junk(tmp_path_factory, raw, ext, split, errors, field, gz_raw):
    d = tmp_path_factory.mktemp("junk")
    p = d / f"data{ext}"
    if ext.endswith(".gz") and gz_raw:
        p.write_bytes(raw)  # junk that is not even gzip
    else:
        _write(p, raw)
    read_all(p, split_mode=split, errors=errors, text_field=field)


@st.composite
def json_documents(draw):
    """(file bytes, extension, expected documents) for JSON / JSONL files of objects or strings, plus
    arbitrary JSON values that do not fit the schema (expected None: any OriginlensError is fine)."""
    docs = draw(st.lists(utf8_text, max_size=5))
    ext = draw(st.sampled_from([".json", ".jsonl", ".json.gz", ".jsonl.gz"]))
    shape = draw(st.sampled_from(["objects", "strings", "junk"]))
    if shape == "junk":
        values = draw(st.lists(json_junk, max_size=4))
        data = (
            json.dumps(values)
            if ext.startswith(".json") and not ext.startswith(".jsonl")
            else "\n".join(json.dumps(v) for v in values)
        )
        return data.encode(), ext, None
    items = [{"text": t} for t in docs] if shape == "objects" else list(docs)
    ascii_ = draw(st.booleans())
    if ext.startswith(".jsonl"):
        data = "\n".join(json.dumps(i, ensure_ascii=ascii_) for i in items) + draw(st.sampled_from(["", "\n", "\n\n"]))
    else:
        data = json.dumps(items, ensure_ascii=ascii_, indent=draw(st.sampled_from([None, 1])))
    return data.encode("utf-8"), ext, [t for t in docs if t.strip()]


@settings(max_examples=80, **SETTINGS)
@given(spec=json_documents())
def test_json_readers_return_exactly_the_documents(tmp_path_factory, spec):
    data, ext, expected = spec
    p = _write(tmp_path_factory.mktemp("json") / f"data{ext}", data)
    got = read_all(p)
    if expected is None:
        return
    if not expected:
        assert got is None  # an empty corpus is an InputError
    else:
        assert got == expected


@settings(max_examples=80, **SETTINGS)
@given(
    docs=st.lists(utf8_text.filter(lambda s: "\n" not in s and "\r" not in s), max_size=6),
    ext=st.sampled_from([".txt", ".txt.gz"]),
)
def test_text_reader_one_document_per_line(tmp_path_factory, docs, ext):
    assume(all(EOT_MARKER not in t for t in docs))
    assume(all(not any(c in t for c in "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029") for t in docs))
    assume(all("\x00" not in t for t in docs))  # a NUL byte makes a file binary (refused: test_readers.py)
    p = _write(tmp_path_factory.mktemp("txt") / f"data{ext}", "\n".join(docs).encode("utf-8"))
    got = read_all(p, split_mode="line")
    expected = [t for t in docs if t.strip()]
    assert got == (expected or None)


@settings(max_examples=40, **SETTINGS)
@given(docs=st.lists(utf8_text, min_size=1, max_size=5), cut=st.floats(0, 1))
def test_truncated_gzip_is_a_clean_error(tmp_path_factory, docs, cut):
    blob = gzip.compress("\n".join(docs).encode("utf-8"), mtime=0)
    p = tmp_path_factory.mktemp("gz") / "data.txt.gz"
    p.write_bytes(blob[: int(len(blob) * cut)])
    read_all(p)


@settings(max_examples=25, **SETTINGS)
@given(
    docs=st.lists(st.one_of(utf8_text, st.none(), st.integers()), max_size=5),
    column=st.sampled_from(["text", "story", "other"]),
    junk=st.binary(max_size=64),
    use_junk=st.booleans(),
)
def test_parquet_reader(tmp_path_factory, docs, column, junk, use_junk):
    import pyarrow as pa
    import pyarrow.parquet as pq

    p = tmp_path_factory.mktemp("pq") / "data.parquet"
    if use_junk:
        p.write_bytes(junk)
        read_all(p)
        return
    try:
        table = pa.table({column: docs})
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):  # mixed ints and strings, ints ≥ 2**63:
        return  # no Parquet table can hold them
    pq.write_table(table, p)
    got = read_all(p)
    if column != "other" and all(isinstance(t, str) or t is None for t in docs):
        expected = [t for t in docs if isinstance(t, str) and t.strip()]
        assert got == (expected or None)


def test_empty_files_and_directories(tmp_path):
    for ext in EXTS:
        p = tmp_path / f"empty{ext}"
        p.write_bytes(b"")
        assert read_all(p) is None  # empty corpus: a clean InputError
    (tmp_path / "d").mkdir()
    assert read_all(tmp_path / "d") is None
    assert read_all(tmp_path / "missing.txt") is None


@pytest.mark.parametrize("ext", [".txt", ".jsonl", ".json", ".txt.gz"])
def test_huge_line_is_one_document(tmp_path, ext):
    big = ("once upon a time é 名 " * 60_000).strip()  # ≈ 1.4 MB of UTF-8 on one line (> the 1 MiB read buffer)
    small = "the end"
    if ext in (".txt", ".txt.gz"):
        data = f"{big}\n{small}\n".encode()
    elif ext == ".jsonl":
        data = (json.dumps({"text": big}) + "\n" + json.dumps({"text": small}) + "\n").encode()
    else:
        data = json.dumps([{"text": big}, small]).encode()
    p = _write(tmp_path / f"big{ext}", data)
    assert read_all(p, split_mode="line") == [big, small]
    if ext == ".txt":
        tok = WordTokenizer.train([big, small], 50)
        assert len(tok.encode(big)) == len(pre_tokenize(big)) == 6 * 60_000


# ---------------------------------------------------------------------------------------- corpus build


@settings(max_examples=15, **SETTINGS)
@given(
    raw=st.one_of(st.binary(max_size=400), words_text.map(str.encode)),
    ext=st.sampled_from([".txt", ".jsonl", ".bin"]),
    seq_len=st.integers(1, 4),
    windows=st.sampled_from(["first", "pack"]),
    oov=st.sampled_from(["drop", "unk"]),
    errors=st.sampled_from(["strict", "replace"]),
)
def test_corpus_build_on_junk(tmp_path_factory, raw, ext, seq_len, windows, oov, errors):
    d = tmp_path_factory.mktemp("build")
    src = d / f"src{ext}"
    src.write_bytes(raw)
    out = d / "corpus"
    try:
        store = build_corpus([src], out, vocab_size=20, seq_len=seq_len, windows=windows, oov=oov, errors=errors)
    except OriginlensError:
        assert not out.exists()  # nothing that looks like a corpus
        return
    toks = np.asarray(store.tokens)
    assert toks.ndim == 2 and toks.shape[1] == seq_len + 1 and len(toks) >= 1
    assert toks.max() < store.vocab_size
    tokens, vocab, _ = load_token_array(out)
    assert np.array_equal(np.asarray(tokens), toks) and len(vocab) == store.vocab_size


@settings(max_examples=40, **SETTINGS)
@given(
    raw=st.binary(max_size=300),
    header_ok=st.booleans(),
    dtype=st.sampled_from(["<u2", "<i8", "<f4", "|b1", "<U3"]),
    shape=st.sampled_from([(0,), (3,), (2, 1), (2, 3), (0, 4), (1, 2, 2)]),
)
def test_token_array_junk(tmp_path_factory, raw, header_ok, dtype, shape):
    p = tmp_path_factory.mktemp("npy") / "tokens.npy"
    if header_ok:
        arr = np.frombuffer(raw[: (len(raw) // np.dtype(dtype).itemsize) * np.dtype(dtype).itemsize], dtype=dtype)
        size = int(np.prod(shape))
        if arr.size < size:
            arr = np.zeros(shape, dtype=dtype)
        np.save(p, arr[:size].reshape(shape))
    else:
        p.write_bytes(raw)
    try:
        tokens, _, _ = load_token_array(p)
    except OriginlensError:
        return
    assert tokens.ndim == 2 and tokens.shape[0] >= 1 and tokens.shape[1] >= 2 and tokens.min() >= 0
