"""Tests for originlens.tasks.tinystories: windows and features against a brute-force recomputation from the
raw text, the held-out split, the lazy next-token ``legal`` array, the tokenisation cache, trainer
integration (3 steps, standard and myopic) and clear errors.

Most tests use a small data root in a temporary directory (real TinyStories lines when the shared data is
present, generated stories otherwise, plus planted edge cases), so the file runs in a few seconds.
"""

from __future__ import annotations

import hashlib
import math
import shutil

import numpy as np
import pytest

from originlens.errors import ConfigError, InputError
from originlens.paths import tinystories_files
from originlens.tasks import legal_hits, task_metrics
from originlens.tasks import tinystories as ts
from originlens.tasks import tinystories_data as tsd
from originlens.tasks.base import TaskBatch

T = 64
SHORT_STORY = "Tom ran. He fell."  # far fewer than 64 tokens: never sampled
UNICODE_STORY = ("“Look!” said Mia — the café’s cat … " * 12).strip()  # curly quotes, dashes, accents


def _generated_stories(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [
        "the",
        "cat",
        "dog",
        "ran",
        "saw",
        "a",
        "big",
        "red",
        "ball",
        "Lily",
        "Tim",
        "happy",
        "sad",
        "park",
        "tree",
        "and",
        "then",
        "she",
        "he",
        "was",
        "played",
        "with",
        "friend",
    ]
    out = []
    for _ in range(n):
        k = int(rng.integers(60, 220))
        sent = " ".join(words[i] for i in rng.integers(0, len(words), k))
        out.append("Once upon a time, " + sent.replace(" then ", ". Then ") + ".")
    return out


def _raw_lines(text: str) -> list[str]:
    """Brute-force story split: non-blank lines, a trailing \\r removed."""
    lines = [ln[:-1] if ln.endswith("\r") else ln for ln in text.split("\n")]
    return [ln for ln in lines if ln.strip()]


@pytest.fixture(scope="module")
def small_root(tmp_path_factory):
    """tmp/tinystories/stories-000.txt (+ -001) with ~240 stories and planted edge cases."""
    root = tmp_path_factory.mktemp("ts_data")
    d = root / "tinystories"
    d.mkdir()
    files = tinystories_files()
    if files:
        real = _raw_lines(files[0].read_text(encoding="utf-8"))[:220]
    else:
        real = _generated_stories(220)
    a = real[:120] + [SHORT_STORY, UNICODE_STORY]
    b = real[120:] + [real[5]]  # a duplicate story in another file
    (d / "stories-000.txt").write_text("\n".join(a) + "\n\n", encoding="utf-8")  # blank line skipped
    (d / "stories-001.txt").write_bytes(("\r\n".join(b) + "\r\n").encode("utf-8"))  # CRLF line ends
    return root


@pytest.fixture(scope="module")
def small_task(small_root, tmp_path_factory):
    tsd._LOADED.clear()
    return ts.TinyStoriesTask(data_root=str(small_root), cache_dir=str(tmp_path_factory.mktemp("ts_cache")))


def _stories_of(root) -> list[str]:
    out = []
    for f in sorted((root / "tinystories").glob("stories-*.txt")):
        out += _raw_lines(f.read_bytes().decode("utf-8"))
    return out


def _brute_split(stories, tok, frac):
    """(train ids, held-out ids): ≥ T tokens; held out iff int(sha256[:8]) / 2**64 < frac (exact rationals)."""
    from fractions import Fraction

    train, held = [], []
    for s, text in enumerate(stories):
        if len(tok.encode(text)) < T:
            continue
        u = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
        (held if Fraction(u, 2**64) < Fraction(frac) else train).append(s)
    return np.array(train), np.array(held)


# ------------------------------------------------------------------------------------------ windows


def test_windows_and_features_match_raw_text(small_root, small_task):
    stories = _stories_of(small_root)
    tok = small_task.tokenizer
    assert len(stories) == len(small_task.data.hashes)
    train, held = _brute_split(stories, tok, 0.1)
    assert np.array_equal(small_task.split[0], train) and np.array_equal(small_task.split[1], held)
    assert stories.index(SHORT_STORY) not in set(train) | set(held)
    # the cached tokenizer is the BPE of these stories: retraining gives the same vocabulary
    from originlens.data import BPETokenizer

    assert BPETokenizer.train(stories, 4096, wrap=False).vocab == tok.vocab
    for which, ids, seed in (("train", train, 3), ("heldout", held, 4)):
        fn = small_task.sample if which == "train" else small_task.sample_eval
        batch = fn(40, np.random.default_rng(seed))
        assert batch.tokens.shape == (40, T) and batch.features.shape == (40, T, 2)
        assert batch.feature_names == ["pos_int", "pos_prop"] and batch.metadata["split"] == which
        # the documented draw: story ids[integers(0, S, n)], offset ⌊u (len − T + 1)⌋ (eval sorted by story)
        rng = np.random.default_rng(seed)
        pick, u = rng.integers(0, len(ids), 40), rng.random(40)
        if which == "heldout":
            order = np.argsort(pick, kind="stable")
            pick, u = pick[order], u[order]
        for b in range(40):
            s = int(ids[pick[b]])
            full = tok.encode(stories[s])
            off = math.floor(u[b] * (len(full) - T + 1))
            assert batch.metadata["story"][b] == s and batch.metadata["offset"][b] == off
            assert batch.tokens[b].tolist() == full[off : off + T]
            pos = np.arange(off, off + T, dtype=np.float64)
            assert np.array_equal(batch.features[b, :, 0], pos.astype(np.float32))
            assert np.allclose(batch.features[b, :, 1], pos / len(full), rtol=1e-7, atol=0)
            assert batch.features[b, :, 1].min() >= 0 and batch.features[b, :, 1].max() < 1
        if which == "heldout":
            assert np.all(np.diff(batch.metadata["story"]) >= 0)
    assert small_task.tracked.positions == tuple(range(30, 40)) and small_task.tracked.layers == (1, 2, 3, 4)


def test_next_token_legal_matches_dense_one_hot(small_task):
    batch = small_task.sample(12, np.random.default_rng(0))
    V = small_task.vocab_size
    dense = np.zeros((12, T, V), dtype=bool)
    for b in range(12):
        for i in range(T - 1):
            dense[b, i, batch.tokens[b, i + 1]] = True
    lazy = batch.legal
    assert lazy.shape == dense.shape and np.array_equal(np.asarray(lazy), dense)
    assert np.array_equal(lazy.any(axis=2), dense.any(axis=2))
    twin = TaskBatch(
        tokens=batch.tokens, features=batch.features, feature_names=batch.feature_names, feature_types=None, legal=dense
    )
    rng = np.random.default_rng(1)
    for pred in (rng.integers(0, V, (12, T)), np.concatenate([batch.tokens[:, 1:], batch.tokens[:, :1]], 1)):
        pred[rng.random(pred.shape) < 0.5] = batch.tokens[:, 1:].max()  # mix hits and misses
        assert np.array_equal(legal_hits(pred, batch), legal_hits(pred, twin))
        assert task_metrics(pred, batch) == task_metrics(pred, twin)
    exact = np.concatenate([batch.tokens[:, 1:], np.zeros((12, 1), dtype=np.int64)], 1)
    assert task_metrics(exact, batch)["legal_acc"] == 1.0  # legal_acc is top-1 next-token accuracy
    sub = batch.select(np.array([3, 1]))
    assert np.array_equal(np.asarray(sub.legal), dense[[3, 1]])
    assert np.array_equal(np.asarray(lazy[2:5, 10:20]), dense[2:5, 10:20])


# ------------------------------------------------------------------------------------------ split


def test_heldout_split_is_disjoint_and_deterministic(small_root, small_task, tmp_path):
    train, held = small_task.split
    assert len(train) and len(held) and not set(train) & set(held)
    stories = _stories_of(small_root)
    assert not {stories[s] for s in train} & {stories[s] for s in held}  # disjoint as texts
    dup = [s for s in range(len(stories)) if stories[s] == stories[5]]
    assert len(dup) == 2 and (dup[0] in train) == (dup[1] in train) and (dup[0] in held) == (dup[1] in held)
    tsd._LOADED.clear()  # a fresh load (from the cache) agrees
    again = ts.TinyStoriesTask(data_root=str(small_root), cache_dir=small_task.cache_dir)
    assert all(np.array_equal(x, y) for x, y in zip(again.split, small_task.split))
    a, b = again.sample(16, np.random.default_rng(7)), small_task.sample(16, np.random.default_rng(7))
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.features, b.features)
    ev = again.sample_eval(64, np.random.default_rng(8))
    assert set(ev.metadata["story"]) <= set(held)
    # a larger held-out fraction only moves stories from train to held-out (threshold rule)
    wider = ts.TinyStoriesTask(data_root=str(small_root), cache_dir=small_task.cache_dir, heldout_frac=0.5)
    assert set(held) <= set(wider.split[1]) and set(wider.split[0]) <= set(train)


# ------------------------------------------------------------------------------------------ cache


def test_cache_is_reused_and_invalidated(small_root, tmp_path, monkeypatch):
    root = tmp_path / "data"
    shutil.copytree(small_root, root)
    cache = tmp_path / "cache"
    from originlens.data.tokenizers import BPETokenizer

    trained = []
    real_train = BPETokenizer.train

    def counting_train(docs, vocab_size, **kw):
        trained.append(vocab_size)
        return real_train(docs, vocab_size, **kw)

    monkeypatch.setattr(BPETokenizer, "train", staticmethod(counting_train))

    def build(**kw):
        tsd._LOADED.clear()  # force a read from disk, as a new process would
        t = ts.TinyStoriesTask(data_root=str(root), cache_dir=str(cache), **kw)
        return t, t.data

    t1, d1 = build()
    assert len(trained) == 1 and d1.path.parent == cache / "tinystories"
    t2, d2 = build()
    assert len(trained) == 1 and d2.path == d1.path  # reused, not retrained
    assert np.array_equal(d1.tokens, d2.tokens) and d2.tokenizer.vocab == d1.tokenizer.vocab
    # no temp leftovers (the entry's lock file, .NAME.lock, stays by design: originlens.locks)
    assert not [p for p in d1.path.parent.iterdir() if p.name.startswith(".") and not p.name.endswith(".lock")]
    # the environment variable chooses the cache when no cache_dir is given
    monkeypatch.setenv(tsd.CACHE_ENV_VAR, str(cache))
    tsd._LOADED.clear()
    assert ts.TinyStoriesTask(data_root=str(root)).data.path == d1.path and len(trained) == 1
    # another tokenizer configuration: another entry
    _, d3 = build(bpe_vocab_size=300)
    assert len(trained) == 2 and d3.path != d1.path and d3.tokenizer.vocab_size <= 300
    # the data changes: a new key, a new entry, the new story is present
    extra = _generated_stories(1, seed=9)[0]
    with open(root / "tinystories" / "stories-000.txt", "a", encoding="utf-8") as f:
        f.write(extra + "\n")
    _, d4 = build()
    assert len(trained) == 3 and d4.path != d1.path
    assert len(d4.hashes) == len(d1.hashes) + 1 and d4.manifest["key"] != d1.manifest["key"]
    # a damaged entry is rebuilt in place
    (d4.path / "tokens.npy").unlink()
    _, d5 = build()
    assert len(trained) == 4 and d5.path == d4.path and np.array_equal(d5.tokens, d4.tokens)
    # the key covers file contents and names, the tokenizer settings and the format version
    k1, m1 = tsd.cache_key(t1.files, 4096)
    assert {"data", "tokenizer", "format", "tokenizers_version"} <= set(m1)
    assert tsd.cache_key(t1.files, 4096)[0] != tsd.cache_key(t1.files, 4095)[0]
    # a damaged entry holding a file that is not the cache's is refused, not deleted
    (d4.path / "tokens.npy").unlink()
    (d4.path / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(InputError, match="notes.txt") as err:
        build()
    assert "move" in str(err.value) and (d4.path / "notes.txt").read_text(encoding="utf-8") == "mine"


# ------------------------------------------------------------------------------------------ trainer


@pytest.mark.parametrize("regime", ["standard", "myopic"])
def test_trainer_three_steps(regime, small_root, tmp_path, monkeypatch):
    from originlens.train.ntp import NTPConfig, Trainer, all_task_names, load_probe_metrics

    monkeypatch.setenv("ORIGINLENS_DATA", str(small_root))
    monkeypatch.setenv(tsd.CACHE_ENV_VAR, str(tmp_path / "cache"))
    tsd._LOADED.clear()
    assert "tinystories" in all_task_names()
    cfg = NTPConfig(
        task="tinystories",
        regime=regime,
        n_layer=1,
        d_model=16,
        n_head=2,
        batch_size=4,
        steps=3,
        eval_size=24,
        log_every=1,
        checkpoint_every=0,
        probe_positions=[30, 31, 63],
    )
    assert cfg.probe_every == 100 and cfg.eval_every == 0  # the task's defaults apply
    tr = Trainer(cfg, tmp_path / "run")
    res = tr.run()
    assert res.step == 3 and math.isfinite(res.final_eval["eval_loss"])
    assert 0 <= res.final_eval["legal_acc"] <= 1
    assert tr.eval_data.batch.metadata["split"] == "heldout"
    assert set(tr.eval_data.batch.metadata["story"]) <= set(tr.task.split[1])
    losses = [r["loss"] for r in tr.rundir.read_metrics() if r["event"] == "train"]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    pm = load_probe_metrics(tmp_path / "run" / "probe_metrics.npz")
    assert pm.feature_names == ["pos_int", "pos_prop"] and pm.positions == [30, 31, 63]
    assert pm.pearson.shape == (2, 3, 2)
    assert "pos_int/pearson" in res.probe_summary


def test_defaults_follow_the_spec_table(small_root, tmp_path, monkeypatch):
    from originlens.train.ntp import NTPConfig

    monkeypatch.setenv("ORIGINLENS_DATA", str(small_root))
    monkeypatch.setenv(tsd.CACHE_ENV_VAR, str(tmp_path / "cache"))
    c = NTPConfig(task="tinystories")
    assert (c.n_layer, c.d_model, c.n_head, c.batch_size, c.lr, c.steps, c.eval_size, c.probe_every) == (
        4,
        128,
        4,
        256,
        1e-3,
        1000,
        30000,
        100,
    )


# ------------------------------------------------------------------------------------------ errors


def test_missing_data_root_names_the_environment_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ORIGINLENS_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(InputError, match="ORIGINLENS_DATA"):
        ts.TinyStoriesTask()
    from originlens.train.ntp import NTPConfig

    with pytest.raises(InputError, match="ORIGINLENS_DATA"):
        NTPConfig(task="tinystories")
    from originlens.cli.main import main

    assert main(["ntp", "train", "--task", "tinystories", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "ORIGINLENS_DATA" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_bad_options_are_config_errors(small_root, tmp_path):
    kw = dict(data_root=str(small_root), cache_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="spaCy"):
        ts.TinyStoriesTask(syntax_features=True, **kw)
    for bad in (dict(heldout_frac=1.5), dict(heldout_frac=0), dict(window=1), dict(bpe_vocab_size=True)):
        with pytest.raises(ConfigError):
            ts.TinyStoriesTask(**bad, **kw)
    with pytest.raises(InputError, match="held-out"):  # no story is long enough
        ts.TinyStoriesTask(window=100_000, **kw).sample(1, np.random.default_rng(0))
    (tmp_path / "ro" / "tinystories").mkdir(parents=True)
    (tmp_path / "ro" / "tinystories" / "stories-000.txt").write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(InputError):
        ts.TinyStoriesTask(data_root=str(tmp_path / "ro"), cache_dir=str(tmp_path / "c")).vocab_size


# ------------------------------------------------------------------------------------------ shared data


@pytest.mark.slow
@pytest.mark.skipif(not tinystories_files(), reason="TinyStories files not found (set ORIGINLENS_DATA)")
def test_full_subset_counts(tmp_path):
    tsd._LOADED.clear()
    task = ts.TinyStoriesTask(cache_dir=str(tmp_path))
    lines = [ln for f in tinystories_files() for ln in _raw_lines(f.read_text(encoding="utf-8"))]
    d = task.describe()
    assert d["stories"] == len(lines) == 7089 and d["vocab_size"] == 4096
    assert d["train_stories"] + d["heldout_stories"] + d["skipped_short"] == d["stories"]
    assert 0.07 < d["heldout_stories"] / d["stories"] < 0.13
    rng = np.random.default_rng(0)
    for s in rng.integers(0, len(lines), 25):
        assert task.data.story(int(s)).tolist() == task.tokenizer.encode(lines[int(s)])
