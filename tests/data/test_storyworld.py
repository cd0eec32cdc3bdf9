"""Storyworld: determinism, shape of the text, the plants in the text, and their recovery by statistics."""

from __future__ import annotations

import numpy as np
import pytest

from originlens.data import PLANTED, build_corpus, generate_stories, storyworld_corpus
from originlens.data.tokenizers import pre_tokenize

N_STORIES = 1500


@pytest.fixture(scope="module")
def stories():
    return generate_stories(N_STORIES, seed=0)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_corpus(
        None, tmp_path_factory.mktemp("sw") / "c", storyworld_stories=N_STORIES, seed=0, vocab_size=500, seq_len=64
    )


def test_deterministic_and_seeded():
    a = generate_stories(20, seed=7)
    assert a == generate_stories(20, seed=7)
    assert a[:5] == generate_stories(5, seed=7)  # story i depends on (seed, i) only
    assert a != generate_stories(20, seed=8)
    assert storyworld_corpus(3, 7) == a[:3]
    assert generate_stories(0) == []


def test_stories_look_like_simple_english(stories):
    words = [len(s.split()) for s in stories]
    assert min(words) >= 80 and max(words) <= 250
    assert all(s[0].isupper() and s.rstrip()[-1] in '.!"' for s in stories)
    vocab = {t for s in stories for t in pre_tokenize(s)}
    assert 150 <= len(vocab) <= 600  # word-level V of a few hundred covers it all
    assert {".", ",", "!"} <= vocab
    assert min(len(pre_tokenize(s)) for s in stories) >= 65  # every story gives a T = 64 window


def test_plants_hold_in_the_text(stories):
    adjectives = PLANTED.adjective_nouns
    emotions = set(PLANTED.word_classes["emotions"])
    topic_of = {w: k for k, ws in PLANTED.topics.items() for w in ws}
    for s in stories:
        toks = pre_tokenize(s)
        for a, b in zip(toks, toks[1:]):
            if a in adjectives:
                assert b in adjectives[a]
            if b in emotions:
                assert a == "felt"
        topics = {k for k in PLANTED.topics if k in toks}
        assert len(topics) == 1  # one topic token per story
        (topic,) = topics
        own = sum(1 for t in toks if topic_of.get(t) == topic)
        other = sum(1 for t in toks if t in topic_of and topic_of[t] != topic)
        assert own >= 3 and own > 5 * other


def test_bigram_plant_brute_force(store):
    """Own check with a brute-force bigram count: red's most frequent successors are its nouns."""
    ix = {w: i for i, w in enumerate(store.vocab)}
    tok = np.asarray(store.tokens, dtype=np.int64)
    for adj, nouns in PLANTED.adjective_nouns.items():
        nxt = tok[:, 1:][tok[:, :-1] == ix[adj]]
        counts = np.bincount(nxt, minlength=store.vocab_size)
        top = {store.vocab[j] for j in np.argsort(-counts, kind="stable")[: len(nouns)]}
        assert top == set(nouns)


# ------------------------------------------------------------------------------------------ with stats


def _top(matrix, vocab, word, k, exclude_self=False):
    ix = {w: i for i, w in enumerate(vocab)}
    row = np.array(matrix[ix[word]], dtype=np.float64)
    if exclude_self:
        row[ix[word]] = -np.inf
    return [vocab[j] for j in np.argsort(-row, kind="stable")[:k]]


@pytest.fixture(scope="module")
def stats(store):
    from originlens.stats import corpus_statistics

    return corpus_statistics(np.asarray(store.tokens), store.vocab_size)


def test_stats_bigram_matches_definition(store, stats):
    """B̄[a, b] = Pr(x_t = a, x_{t+1} = b) − Pr(x_t = a)/|V| over the N·T pairs, brute force in float64."""
    tok = np.asarray(store.tokens, dtype=np.int64)
    V = store.vocab_size
    joint = np.zeros((V, V))
    np.add.at(joint, (tok[:, :-1].ravel(), tok[:, 1:].ravel()), 1.0)
    joint /= tok[:, :-1].size
    expected = joint - joint.sum(1, keepdims=True) / V
    np.testing.assert_allclose(stats.bigram, expected, atol=1e-12)


def test_stats_recover_adjective_nouns(store, stats):
    for adj, nouns in PLANTED.adjective_nouns.items():
        assert set(_top(stats.bigram, store.vocab, adj, len(nouns))) == set(nouns)


def test_stats_recover_word_classes(store, stats):
    classes = PLANTED.word_classes
    emo = classes["emotions"]
    for e in emo:
        assert set(_top(stats.interchangeability, store.vocab, e, len(emo) - 1, True)) == set(emo) - {e}
    for v in ("saw", "went", "loved"):
        assert set(_top(stats.interchangeability, store.vocab, v, 8, True)) <= set(classes["verbs"])
    for s in ("she", "they", "lily", "tom"):
        top = _top(stats.interchangeability, store.vocab, s, 8, True)
        assert sum(t in classes["subjects"] for t in top) >= 6, top


def test_stats_recover_topics(store, stats):
    top10 = _top(stats.context, store.vocab, "fish", 10)
    assert "pond" in top10
    content = sorted({w for ws in PLANTED.topics.values() for w in ws})
    ix = {w: i for i, w in enumerate(store.vocab)}
    for topic, words in PLANTED.topics.items():
        row = stats.context[ix[topic]]
        ranked = sorted(content, key=lambda w: -row[ix[w]])[: len(words)]
        assert len(set(ranked) & set(words)) >= len(words) - 1, (topic, ranked)
