"""build_corpus, TokenStore and load_token_array, checked against brute-force re-implementations."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import Counter

import numpy as np
import pytest

from originlens.data import TokenStore, build_corpus, load_token_array, smallest_uint
from originlens.data.tokenizers import BPETokenizer, pre_tokenize
from originlens.errors import CompatibilityError, ConfigError, InputError, OriginlensError
from originlens.storage import FORMAT_VERSION, vocab_hash

STORIES = [
    "Lily saw a red ball. She was happy!",
    "Tom had a big red car, and he loved it. The car was fast. Tom drove it home.",
    "The fish swam in the pond. A big fish saw a small fish. The small fish swam away fast.",
    "Zebras zigzag quickly",
    "Tim saw the pond. The pond was big and the fish were happy. Tim was happy too.",
    "She had a ball.",
]


def write_corpus(tmp_path, stories=STORIES):
    d = tmp_path / "src"
    d.mkdir(exist_ok=True)
    (d / "s.txt").write_text("\n".join(stories) + "\n")
    return d


def brute_vocab(docs, k):
    counts, first = Counter(), {}
    for d in docs:
        for t in pre_tokenize(d):
            counts[t] += 1
            first.setdefault(t, len(first))
    return sorted(counts, key=lambda t: (-counts[t], first[t]))[:k]


def brute_first_windows(docs, k, T1):
    vocab = brute_vocab(docs, k)
    keep = set(vocab)
    rows = [pre_tokenize(d)[:T1] for d in docs if set(pre_tokenize(d)) <= keep and len(pre_tokenize(d)) >= T1]
    return vocab, rows


def as_strings(store):
    return [[store.vocab[i] for i in row] for row in np.asarray(store.tokens)]


def no_partials(parent):
    return [p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name] == []


# ------------------------------------------------------------------------------------------ first windows


@pytest.mark.parametrize("k,T", [(15, 2), (25, 6), (30, 4), (40, 10)])
def test_first_windows_match_brute_force(tmp_path, k, T):
    src = write_corpus(tmp_path)
    store = build_corpus([src], tmp_path / "c", vocab_size=k, seq_len=T)
    vocab, rows = brute_first_windows(STORIES, k, T + 1)
    assert rows  # the case is not vacuous
    assert store.vocab == vocab
    assert as_strings(store) == rows
    assert store.tokens.shape == (len(rows), T + 1) and store.seq_len == T
    c = store.manifest["counts"]
    assert c["documents_read"] == len(STORIES)
    assert c["documents_kept"] == len(rows) == c["windows"]
    assert c["documents_kept"] + sum(c["documents_dropped"].values()) == len(STORIES)
    n_oov = sum(1 for d in STORIES if not set(pre_tokenize(d)) <= set(vocab))
    assert c["documents_dropped"]["oov"] == n_oov
    assert c["tokens_in_windows"] == len(rows) * (T + 1)


def test_oov_check_covers_the_whole_document(tmp_path):
    # "zzz" is rare and sits after the first window: the paper drops the whole story
    stories = ["a b a b a b a b zzz", "a b a b a b a b", "b a b a b a"]
    src = write_corpus(tmp_path, stories)
    store = build_corpus([src], tmp_path / "c", vocab_size=2, seq_len=3)
    assert as_strings(store) == [["a", "b", "a", "b"], ["b", "a", "b", "a"]]
    assert store.manifest["counts"]["documents_dropped"] == {"oov": 1, "too_short": 0}


def test_oov_unk_maps_instead_of_dropping(tmp_path):
    src = write_corpus(tmp_path)
    store = build_corpus([src], tmp_path / "c", vocab_size=10, seq_len=4, oov="unk")
    vocab = ["<unk>"] + brute_vocab(STORIES, 9)
    assert store.vocab == vocab and store.manifest["unk_id"] == 0
    expected = []
    for d in STORIES:
        toks = [t if t in vocab else "<unk>" for t in pre_tokenize(d)]
        if len(toks) >= 5:
            expected.append(toks[:5])
    assert as_strings(store) == expected
    assert store.manifest["counts"]["documents_dropped"] == {"oov": 0, "too_short": len(STORIES) - len(expected)}


# ------------------------------------------------------------------------------------------ pack


@pytest.mark.parametrize("T", [3, 7])
def test_pack_windows_match_brute_force(tmp_path, T):
    src = write_corpus(tmp_path)
    store = build_corpus([src], tmp_path / "c", vocab_size=200, seq_len=T, windows="pack")
    assert store.vocab[0] == "<eot>" and store.manifest["eot_id"] == 0
    stream = [t for d in STORIES for t in pre_tokenize(d) + ["<eot>"]]
    n = len(stream) // (T + 1)
    assert as_strings(store) == [stream[i * (T + 1) : (i + 1) * (T + 1)] for i in range(n)]
    c = store.manifest["counts"]
    assert c["tokens_discarded_tail"] == len(stream) - n * (T + 1)
    assert c["documents_kept"] == len(STORIES)


def test_pack_with_bpe_wrapping_adds_no_second_eot(tmp_path):
    src = write_corpus(tmp_path)
    store = build_corpus([src], tmp_path / "c", tokenizer="bpe", vocab_size=80, seq_len=5, windows="pack")
    tok = store.tokenizer()
    assert isinstance(tok, BPETokenizer)
    stream = [i for d in STORIES for i in tok.encode(d)]  # each text is <s> ... </s>
    n = len(stream) // 6
    assert np.array_equal(store.tokens, np.array(stream[: n * 6]).reshape(n, 6))
    assert store.manifest["tokenizer"]["kind"] == "bpe" and store.manifest["eot_id"] == 3


def test_max_windows(tmp_path):
    src = write_corpus(tmp_path)
    for mode in ("first", "pack"):
        store = build_corpus([src], tmp_path / mode, vocab_size=200, seq_len=3, windows=mode, max_windows=2)
        assert len(store) == 2 and store.manifest["counts"]["stopped_at_max_windows"] is True
        full = build_corpus([src], tmp_path / (mode + "_full"), vocab_size=200, seq_len=3, windows=mode)
        assert np.array_equal(store.tokens, full.tokens[:2])


def test_pretrained_tokenizer_build(tmp_path):
    src = write_corpus(tmp_path)
    bpe = BPETokenizer.train(STORIES, 90)
    bpe.save(tmp_path / "tok")
    store = build_corpus([src], tmp_path / "c", tokenizer=str(tmp_path / "tok" / "tokenizer.json"), seq_len=4)
    assert store.manifest["tokenizer"]["kind"] == "pretrained" and store.vocab == bpe.vocab
    rows = [bpe.encode(d)[1:6] for d in STORIES if len(bpe.encode(d)) - 2 >= 5]
    assert store.tokens.tolist() == rows


# ------------------------------------------------------------------------------------------ store format


def test_manifest_contents(tmp_path):
    src = write_corpus(tmp_path)
    store = build_corpus([src], tmp_path / "c", vocab_size=30, seq_len=4)
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m == store.manifest
    assert m["format_version"] == FORMAT_VERSION and m["kind"] == "originlens.corpus"
    raw = (src / "s.txt").read_bytes()
    assert m["sources"] == [{"path": str(src / "s.txt"), "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}]
    assert m["tokenizer"]["kind"] == "words" and m["tokenizer"]["vocab_size"] == 30
    assert (m["vocab_size"], m["seq_len"], m["windows"], m["oov"]) == (30, 4, "first", "drop")
    assert m["vocab_hash"] == vocab_hash(store.vocab, 30) == store.vocab_hash
    assert json.loads((tmp_path / "c" / "vocab.json").read_text()) == store.vocab
    assert m["tokens_sha256"] == hashlib.sha256((tmp_path / "c" / "tokens.npy").read_bytes()).hexdigest()
    assert m["shape"] == list(store.tokens.shape) and m["dtype"] == "uint8"
    assert store.tokenizer().vocab == store.vocab
    assert isinstance(store.tokens, np.memmap) and not store.tokens.flags.writeable


def test_smallest_uint():
    assert [smallest_uint(v) for v in (1, 256, 257, 65536, 65537)] == [
        np.uint8,
        np.uint8,
        np.uint16,
        np.uint16,
        np.uint32,
    ]


def test_uint16_store_when_vocabulary_exceeds_256(tmp_path):
    words = ["".join(p) for p in itertools.product("abcdefg", repeat=3)]  # 343 alphabetic words
    docs = [" ".join(words[i : i + 9]) for i in range(0, len(words), 7)]
    src = write_corpus(tmp_path, docs)
    store = build_corpus([src], tmp_path / "c", vocab_size=300, seq_len=4, oov="unk")
    assert store.tokens.dtype == np.uint16 and int(store.tokens.max()) < 300
    assert build_corpus([src], tmp_path / "d", vocab_size=256, seq_len=4, oov="unk").tokens.dtype == np.uint8


# ------------------------------------------------------------------------------------------ failures


def test_no_window_error_names_longest_document_and_leaves_nothing(tmp_path):
    src = write_corpus(tmp_path)
    longest = max(len(pre_tokenize(d)) for d in STORIES)
    with pytest.raises(InputError) as e:
        build_corpus([src], tmp_path / "out", vocab_size=1000, seq_len=longest)
    msg = str(e.value)
    assert f"longest document has {longest} tokens" in msg and "lower --seq-len" in msg
    assert not (tmp_path / "out").exists() and no_partials(tmp_path)


def test_all_documents_oov(tmp_path):
    src = write_corpus(tmp_path, ["a b c", "d e f"])
    with pytest.raises(InputError, match="all 2 documents contain out-of-vocabulary tokens.*--oov unk"):
        build_corpus([src], tmp_path / "out", vocab_size=2, seq_len=1)
    assert not (tmp_path / "out").exists() and no_partials(tmp_path)


def test_decoding_error_mid_build_leaves_nothing(tmp_path):
    src = write_corpus(tmp_path)
    (src / "t.txt").write_bytes(b"fine line\nbroken \xc3\x28 line\n")
    with pytest.raises(InputError, match="not valid UTF-8"):
        build_corpus([src], tmp_path / "out", vocab_size=50, seq_len=2)
    assert not (tmp_path / "out").exists() and no_partials(tmp_path)


@pytest.mark.parametrize(
    "kw",
    [
        dict(windows="sliding"),
        dict(oov="keep"),
        dict(seq_len=0),
        dict(vocab_size=1),
        dict(max_windows=0),
        dict(seq_len=2.5),
    ],
)
def test_bad_configuration(tmp_path, kw):
    src = write_corpus(tmp_path)
    with pytest.raises(ConfigError):
        build_corpus([src], tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists()


def test_refuses_to_replace_a_non_corpus_directory(tmp_path):
    src = write_corpus(tmp_path)
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    with pytest.raises(ConfigError, match="not a corpus directory"):
        build_corpus([src], precious, seq_len=2)
    assert (precious / "thesis.tex").read_text() == "do not delete"
    first = build_corpus([src], tmp_path / "c", vocab_size=20, seq_len=2)
    with pytest.raises(ConfigError, match="already exists"):
        build_corpus([src], tmp_path / "c", vocab_size=20, seq_len=3, overwrite=False)
    again = build_corpus([src], tmp_path / "c", vocab_size=20, seq_len=3)  # API default: overwrite
    assert again.seq_len == 3 and first.seq_len == 2 and no_partials(tmp_path)


def test_storyworld_default_source(tmp_path):
    store = build_corpus(None, tmp_path / "sw", storyworld_stories=40, vocab_size=300, seq_len=16, seed=3)
    src = store.manifest["sources"][0]
    assert src["path"] == "storyworld" and src["stories"] == 40 and src["seed"] == 3
    assert len(store) == 40 and store.tokens.dtype == np.uint8
    with pytest.raises(ConfigError):
        build_corpus([tmp_path], tmp_path / "x", storyworld_stories=5)


# ------------------------------------------------------------------------------------------ opening


def test_open_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        TokenStore.open(tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match="not a corpus directory"):
        TokenStore.open(tmp_path / "plain")
    src = write_corpus(tmp_path)
    d = tmp_path / "c"
    build_corpus([src], d, vocab_size=20, seq_len=3)
    m = json.loads((d / "manifest.json").read_text())

    def with_manifest(**changes):
        (d / "manifest.json").write_text(json.dumps({**m, **changes}))

    with_manifest(shape=[m["shape"][0] + 1, m["shape"][1]])
    with pytest.raises(InputError, match="manifest says"):
        TokenStore.open(d)
    with_manifest(vocab_hash="0" * 16)
    with pytest.raises(InputError, match="does not match the manifest"):
        TokenStore.open(d)
    with_manifest(format_version="999")
    with pytest.raises(CompatibilityError, match="format version 999"):
        TokenStore.open(d)
    with_manifest()
    (d / "tokens.npy").unlink()
    with pytest.raises(InputError, match="lacks tokens.npy"):
        TokenStore.open(d)


def test_load_token_array_from_corpus_and_npy(tmp_path):
    src = write_corpus(tmp_path)
    store = build_corpus([src], tmp_path / "c", vocab_size=20, seq_len=3)
    tokens, vocab, manifest = load_token_array(tmp_path / "c")
    assert np.array_equal(tokens, store.tokens) and vocab == store.vocab and manifest["seq_len"] == 3
    with pytest.raises(InputError, match=r"contains token id \d+ but vocab_size is 2.*vocab size >= \d+"):
        load_token_array(tmp_path / "c", vocab_size=2)
    arr = np.array([[0, 5, 2], [1, 1, 4]], dtype=np.int64)
    np.save(tmp_path / "t.npy", arr)
    tokens, vocab, manifest = load_token_array(tmp_path / "t.npy")
    assert np.array_equal(tokens, arr) and vocab is None and manifest is None
    with pytest.raises(InputError, match="contains token id 5 but vocab_size is 5.*>= 6"):
        load_token_array(tmp_path / "t.npy", vocab_size=5)
    assert load_token_array(tmp_path / "t.npy", vocab_size=6)[0].shape == (2, 3)


@pytest.mark.parametrize(
    "arr,needle",
    [
        (np.zeros((4,), np.int64), "1-D array"),
        (np.zeros((2, 3), np.float32), "dtype float32"),
        (np.zeros((2, 3), np.bool_), "dtype bool"),
        (np.zeros((3, 1), np.int64), "at least 2 are needed"),
        (np.zeros((0, 5), np.int64), "holds no windows"),
        (np.array([[1, -1]], np.int64), "negative token id -1"),
    ],
)
def test_load_token_array_rejects(tmp_path, arr, needle):
    np.save(tmp_path / "t.npy", arr)
    with pytest.raises(InputError, match=needle):
        load_token_array(tmp_path / "t.npy")


def test_load_token_array_other_errors(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([[1, "a"]], dtype=object), allow_pickle=True)
    with pytest.raises(InputError, match="without pickle"):
        load_token_array(tmp_path / "obj.npy")
    (tmp_path / "x.csv").write_text("1,2\n")
    with pytest.raises(InputError, match="neither a corpus directory nor an .npy"):
        load_token_array(tmp_path / "x.csv")
    with pytest.raises(InputError, match="does not exist"):
        load_token_array(tmp_path / "nope.npy")
    np.save(tmp_path / "t.npy", np.ones((2, 3), np.int64))
    with pytest.raises(InputError, match="vocab_size must be >= 1"):
        load_token_array(tmp_path / "t.npy", vocab_size=0)
    (tmp_path / "junk.npy").write_bytes(b"garbage")
    with pytest.raises(OriginlensError):
        load_token_array(tmp_path / "junk.npy")
