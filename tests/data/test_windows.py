"""TokenWindows: one validated value for token windows (corpus directory or bare .npy), checked against
the store it reads, a brute-force hash of the vocabulary and the three readers that share its checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from originlens.data import TokenStore, TokenWindows, build_corpus, load_token_array
from originlens.data.store import check_window_array
from originlens.errors import CompatibilityError, InputError
from originlens.stats import corpus_statistics
from originlens.storage import vocab_hash
from originlens.train.assoc import AssocTrainConfig, train_assoc

STORIES = [
    "Lily saw a red ball. She was happy!",
    "Tom had a big red car, and he loved it. The car was fast. Tom drove it home.",
    "The fish swam in the pond. A big fish saw a small fish. The small fish swam away fast.",
]


@pytest.fixture
def corpus(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "s.txt").write_text("\n".join(STORIES * 4) + "\n")
    return build_corpus(src, tmp_path / "corpus", vocab_size=20, seq_len=4, oov="unk")


def test_corpus_directory(corpus):
    w = TokenWindows.load(corpus.path)
    store = TokenStore.open(corpus.path)
    assert np.array_equal(w.tokens, store.tokens) and w.vocab == store.vocab
    assert w.vocab_size == len(store.vocab) == store.vocab_size
    assert (w.n_windows, w.seq_len, len(w)) == (store.tokens.shape[0], 4, store.tokens.shape[0])
    # the recorded hash is the hash of the token strings (computed here independently)
    assert w.vocab_hash == vocab_hash(list(store.vocab), len(store.vocab)) == store.manifest["vocab_hash"]
    assert w.tokens_sha256 == store.manifest["tokens_sha256"]
    assert w.require_vocab_size(None) == w.vocab_size == w.require_vocab_size(w.vocab_size)
    with pytest.raises(CompatibilityError, match="differs from the corpus vocabulary"):
        w.require_vocab_size(w.vocab_size + 1)
    head = w[:2]
    assert head.n_windows == 2 and np.array_equal(head.tokens, store.tokens[:2]) and head.vocab_hash == w.vocab_hash
    with pytest.raises(TypeError):
        w[0]
    tokens, vocab, manifest = load_token_array(corpus.path)
    assert np.array_equal(tokens, w.tokens) and vocab == w.vocab and manifest == w.manifest
    assert "named" in repr(w)


def test_bare_array(tmp_path):
    arr = np.array([[0, 3, 1], [2, 2, 4]], np.uint16)
    np.save(tmp_path / "t.npy", arr)
    w = TokenWindows.load(tmp_path / "t.npy")
    assert np.array_equal(w.tokens, arr) and w.vocab is None and w.manifest is None
    assert w.vocab_size == int(arr.max()) + 1 and w.vocab_hash is None and w.tokens_sha256 is None
    assert TokenWindows.load(tmp_path / "t.npy", 9).vocab_size == 9
    assert w.require_vocab_size(7) == 7  # unnamed ids: any bound the ids respect
    with pytest.raises(InputError, match="contains token id 4 but vocab_size is 4"):
        TokenWindows.load(tmp_path / "t.npy", 4)


@pytest.mark.parametrize(
    "arr,needle",
    [
        (np.zeros((4,), np.int64), "expected 2-D"),
        (np.zeros((2, 3), np.float64), "must be integers"),
        (np.zeros((2, 1), np.int64), "at least 2 are needed"),
        (np.zeros((0, 3), np.int64), "empty"),
    ],
)
def test_one_structural_check_for_every_reader(tmp_path, arr, needle):
    """The windows reader, the statistics and the one-hot trainer reject the same arrays, same words."""
    with pytest.raises(InputError, match=needle):
        check_window_array(arr)
    np.save(tmp_path / "t.npy", arr)
    with pytest.raises(InputError, match=needle):
        TokenWindows.load(tmp_path / "t.npy", 5)
    with pytest.raises(InputError, match=needle):
        corpus_statistics(arr, 5)
    with pytest.raises(InputError, match=needle):
        train_assoc(arr, 5, AssocTrainConfig(steps=1))
    with pytest.raises(InputError, match=needle):
        train_assoc(torch.as_tensor(arr), 5, AssocTrainConfig(steps=1))
