"""Tokenizers: exact word pre-tokenisation, vocabulary selection, OOV policy, BPE, pretrained files."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from originlens.data.tokenizers import (
    BPETokenizer,
    PretrainedTokenizer,
    WordTokenizer,
    load_saved,
    load_tokenizer,
    pre_tokenize,
)
from originlens.errors import ConfigError, InputError


def brute_pre_tokenize(text: str) -> list[str]:
    """Definition, character by character: lower-case the whole text, alphabetic runs, other chars alone."""
    out, run = [], ""
    for ch in text.lower():
        if ch.isalpha():
            run += ch
            continue
        if run:
            out.append(run)
            run = ""
        if not ch.isspace():
            out.append(ch)
    if run:
        out.append(run)
    return out


@pytest.mark.parametrize(
    "text,expected",
    [
        ("Hello, World!", ["hello", ",", "world", "!"]),
        ("don't", ["don", "'", "t"]),
        ("Lily's dog", ["lily", "'", "s", "dog"]),
        ("It cost 2023 coins.", ["it", "cost", "2", "0", "2", "3", "coins", "."]),
        ("x1y", ["x", "1", "y"]),
        ("café au lait", ["café", "au", "lait"]),
        ("naïve ÜNÏCÖDÉ", ["naïve", "ünïcödé"]),
        ("cafe\u0301", ["cafe", "\u0301"]),  # decomposed accent: no normalisation
        ("我爱猫。", ["我爱猫", "。"]),  # CJK ideographs are alphabetic
        ("hi😀!", ["hi", "😀", "!"]),
        ("x²y", ["x", "²", "y"]),  # '²' is numeric, not alphabetic
        ("a_b", ["a", "_", "b"]),
        ("١٢٣", ["١", "٢", "٣"]),  # Arabic-Indic digits, one each
        ("“Hi,” she said—", ["“", "hi", ",", "”", "she", "said", "—"]),
        ("a\u00a0b\tc\u2003d", ["a", "b", "c", "d"]),  # all Unicode whitespace dropped
        ("line one\n\n\nline two", ["line", "one", "line", "two"]),
        ("\n\n  \t", []),
        ("", []),
        ("ΟΔΟΣ.", ["οδος", "."]),  # final sigma from whole-text lower()
        ("İ", ["i", "\u0307"]),  # lower() lengthens: i + combining dot
    ],
)
def test_pre_tokenize_exact(text, expected):
    assert pre_tokenize(text) == expected
    assert brute_pre_tokenize(text) == expected


def test_lowercasing_is_of_the_whole_text():
    # the naive invariant "".join(s.split()).lower() fails: final sigma depends on what follows
    s = "ΑΣ Β"
    assert "".join(s.split()).lower() != "".join(c for c in s.lower() if not c.isspace())
    assert "".join(pre_tokenize(s)) == "".join(c for c in s.lower() if not c.isspace())
    assert pre_tokenize(s) == ["ας", "β"]


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60))
@example("ΑΣ'Β ΟΔΟΣ")
@example("ǅ ß ﬁ İ ẞ")
def test_pre_tokenize_properties(s):
    toks = pre_tokenize(s)
    assert toks == brute_pre_tokenize(s)
    assert all(t and not any(c.isspace() for c in t) for t in toks)
    assert "".join(toks) == "".join(c for c in s.lower() if not c.isspace())
    assert all(t.isalpha() or len(t) == 1 for t in toks)
    # alphabetic runs are maximal: consecutive alphabetic tokens were separated by whitespace
    low, pos = s.lower(), 0
    for a, b in zip(toks, toks[1:]):
        pos = low.index(a, pos) + len(a)
        if a.isalpha() and b.isalpha():
            assert low[pos].isspace()


# ------------------------------------------------------------------------------------------ vocabulary

DOCS = ["b a c a", "c a b d", "e d c", "f"]  # counts: a3 c3 b2 d2 e1 f1; first occurrence b a c d e f


def brute_vocab(docs, k):
    counts, first = {}, {}
    for d in docs:
        for t in brute_pre_tokenize(d):
            counts[t] = counts.get(t, 0) + 1
            first.setdefault(t, len(first))
    return sorted(counts, key=lambda t: (-counts[t], first[t]))[:k]


def test_vocabulary_top_k_ties_by_first_occurrence():
    assert brute_vocab(DOCS, 4) == ["a", "c", "b", "d"]
    for k in range(1, 7):
        assert WordTokenizer.train(DOCS, k).vocab == brute_vocab(DOCS, k)
    tok = WordTokenizer.train(DOCS, 100)
    assert tok.vocab_size == 6  # fewer distinct tokens than asked


def test_oov_drop_and_unk():
    drop = WordTokenizer.train(DOCS, 3)  # a c b
    assert drop.unk_id is None and drop.vocab == ["a", "c", "b"]
    assert drop.encode_with_oov("A z, b!") == ([0, 2], 3)  # z , ! dropped
    assert drop.encode("A z, b!") == [0, 2]
    unk = WordTokenizer.train(DOCS, 3, oov="unk")  # <unk> a c  (|V| counts <unk>)
    assert unk.vocab == ["<unk>", "a", "c"] and unk.unk_id == 0 and unk.vocab_size == 3
    assert unk.encode_with_oov("a b c q") == ([1, 0, 2, 0], 2)
    assert unk.decode([1, 0, 2]) == "a <unk> c"


def test_specials_count_towards_vocab_size():
    tok = WordTokenizer.train(DOCS, 4, oov="unk", specials=["<eot>"])
    assert tok.vocab == ["<unk>", "<eot>", "a", "c"] and tok.eot_id == 1
    with pytest.raises(ConfigError, match="too small"):
        WordTokenizer.train(DOCS, 2, oov="unk", specials=["<eot>"])
    with pytest.raises(ConfigError):
        WordTokenizer.train(DOCS, 3, oov="ignore")


def test_special_strings_never_come_from_text():
    tok = WordTokenizer.train(["<unk> <eot> word"], 10, oov="unk", specials=["<eot>"])
    ids = tok.encode("<eot>")
    assert tok.eot_id not in ids and [tok.vocab[i] for i in ids] == ["<", "eot", ">"]


def test_word_tokenizer_save_load(tmp_path):
    tok = WordTokenizer.train(DOCS + ["Ünïcödé ☃"], 8, oov="unk")
    tok.save(tmp_path / "t")
    back = load_saved(tmp_path / "t")
    assert isinstance(back, WordTokenizer) and back.vocab == tok.vocab and back.oov == "unk"
    assert back.settings() == tok.settings()
    assert json.loads(json.dumps(tok.settings())) == tok.settings()
    assert load_tokenizer(tmp_path / "t").vocab == tok.vocab
    assert WordTokenizer.load(tmp_path / "t").encode("ünïcödé a") == tok.encode("ünïcödé a")


def test_load_tokenizer_factory_errors(tmp_path):
    with pytest.raises(ConfigError):
        load_tokenizer("words")  # needs documents
    with pytest.raises(InputError, match="neither 'words', 'bpe' nor an existing path"):
        load_tokenizer(str(tmp_path / "nothing"))
    assert load_tokenizer("words", docs=DOCS, vocab_size=2).vocab == ["a", "c"]


# ------------------------------------------------------------------------------------------ BPE

TEXTS = [
    "The little fish swam in the pond. The fish was happy!",
    "Lily saw a red ball in the garden, and she smiled.",
    "Tom and Lily played with the red ball near the pond.",
    "The birds flew over the tree; the birds sang.",
] * 5


@pytest.fixture(scope="module")
def bpe():
    return BPETokenizer.train(TEXTS, 120)


def whitespace_pieces(text):  # HF Whitespace pre-tokenizer: \w+|[^\w\s]+
    return re.findall(r"\w+|[^\w\s]+", text)


def test_bpe_trains_with_specials_and_wraps(bpe):
    assert bpe.vocab[:4] == ["<unk>", "<pad>", "<s>", "</s>"]
    assert bpe.vocab_size <= 120 and bpe.unk_id == 0 and bpe.eot_id == 3
    ids = bpe.encode(TEXTS[0])
    assert ids[0] == 2 and ids[-1] == 3 and 0 not in ids
    assert bpe.settings()["wrap"] is True


def test_bpe_round_trip(bpe):
    for text in TEXTS[:4]:
        ids = bpe.encode(text)[1:-1]
        # tokens concatenate back to the text without whitespace, and never straddle a pre-token
        assert "".join(bpe.vocab[i] for i in ids) == "".join(text.split())
        pieces, k = whitespace_pieces(text), 0
        for p in pieces:
            acc = ""
            while acc != p:
                acc += bpe.vocab[ids[k]]
                k += 1
                assert p.startswith(acc)
        assert k == len(ids)
    unwrapped = BPETokenizer(bpe._tok, wrap=False)
    assert unwrapped.encode(TEXTS[1]) == bpe.encode(TEXTS[1])[1:-1]


def test_bpe_unknown_characters_are_oov(bpe):
    ids, n_oov = bpe.encode_with_oov("fish ☃")
    assert n_oov == 1 and ids.count(bpe.unk_id) == 1


def test_bpe_save_load_and_pretrained(tmp_path, bpe):
    bpe.save(tmp_path / "bpe")
    back = load_saved(tmp_path / "bpe")
    assert isinstance(back, BPETokenizer) and back.vocab == bpe.vocab
    assert back.encode(TEXTS[2]) == bpe.encode(TEXTS[2])
    # the saved tokenizer.json is an ordinary HF fast-tokenizer file
    for path in (tmp_path / "bpe" / "tokenizer.json", tmp_path / "bpe"):
        pre = PretrainedTokenizer.from_path(path)
        assert pre.vocab == bpe.vocab and pre.unk_id == 0 and pre.eot_id == 3
        assert pre.encode(TEXTS[2]) == bpe.encode(TEXTS[2])[1:-1]
    hf_dir = tmp_path / "hfmodel"
    hf_dir.mkdir()
    (hf_dir / "tokenizer.json").write_text((tmp_path / "bpe" / "tokenizer.json").read_text())
    pre = load_tokenizer(hf_dir)
    assert isinstance(pre, PretrainedTokenizer)
    pre.save(tmp_path / "pre")
    again = load_saved(tmp_path / "pre")
    assert isinstance(again, PretrainedTokenizer) and again.encode("red ball") == pre.encode("red ball")


def test_pretrained_errors(tmp_path):
    with pytest.raises(InputError, match="no tokenizer.json"):
        PretrainedTokenizer.from_path(tmp_path)
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match="not a readable tokenizer.json"):
        PretrainedTokenizer.from_path(bad)


def test_one_tokenizer_protocol(tmp_path, bpe):
    """Corpus tokenizers are Tokenizers; they and the LM tools' codecs are all TextTokenizers, and a codec
    wrapping a corpus tokenizer encodes and decodes like it."""
    from originlens.data import TextTokenizer, Tokenizer
    from originlens.lm.codecs import TextCodec, originlens_codec, tokenizer_json_codec

    word = WordTokenizer.train(TEXTS, 30)
    pre = PretrainedTokenizer.from_path(bpe.save(tmp_path / "bpe") / "tokenizer.json")
    for tok in (word, bpe, pre):
        assert isinstance(tok, Tokenizer) and isinstance(tok, TextTokenizer)
        codec = originlens_codec(tok)
        assert isinstance(codec, TextCodec) and isinstance(codec, TextTokenizer) and not isinstance(codec, Tokenizer)
        assert codec.vocab_size == tok.vocab_size
        text = TEXTS[0]
        ids = [i for i in tok.encode(text) if i not in (codec.bos_id, codec.eos_id)]
        assert codec.encode(text) == ids and codec.decode(ids) == tok.decode(ids)
    json_codec = tokenizer_json_codec(tmp_path / "bpe" / "tokenizer.json")
    assert isinstance(json_codec, TextTokenizer) and json_codec.vocab_size == bpe.vocab_size
