"""Statistics streamed to disk block by block against the in-memory path, and the piecewise safetensors writer."""

from __future__ import annotations

import numpy as np
import pytest

import originlens.stats.stream as stream
from originlens.stats import (
    STAT_KEYS,
    FirstOrderSums,
    SecondOrderSums,
    corpus_statistics,
    load_statistics,
    save_statistics,
    stream_statistics,
)
from originlens.stats.corpus import alpha_dot, spans
from originlens.stats.tensorfile import TensorFileWriter
from originlens.storage import save_tensors


def zipf_corpus(seed, N=40, T=12, V=60):
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, V + 1)
    return rng.choice(V, size=(N, T + 1), p=p / p.sum())


def assert_bitwise_equal(a, b):
    for k in STAT_KEYS:
        x, y = np.asarray(getattr(a, k)), np.asarray(getattr(b, k))
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k


@pytest.mark.parametrize(
    "dtype, kwargs, slab, block",
    [
        (np.float64, {}, None, None),  # one block each
        (np.float64, {"top_k": 37, "pad_id": 0}, 8 * 37 * 3, 8 * 37 * 5),  # many blocks, uneven tails
        (np.float32, {"top_k": 41, "centering": 0.01}, 28 * 41 * 2, 8 * 41 * 2),
        (np.float32, {}, 8 * 60 * 7, 8 * 60 * 59),  # a one-row tail of Q̄ joins the block before
    ],
)
def test_streamed_equals_in_memory_bitwise(tmp_path, monkeypatch, dtype, kwargs, slab, block):
    toks = zipf_corpus(0)
    mask = np.random.default_rng(1).random((toks.shape[0], toks.shape[1] - 1)) > 0.1
    if slab is not None:
        monkeypatch.setattr(stream, "SLAB_BYTES", slab)
    ref = corpus_statistics(toks, 60, dtype=dtype, mask=mask, **kwargs)
    got = stream_statistics(toks, 60, tmp_path / "s", dtype=dtype, mask=mask, block_bytes=block, **kwargs)
    assert_bitwise_equal(got, ref)
    assert (got.n_pairs, got.size, got.seq_len, got.centering) == (ref.n_pairs, ref.size, ref.seq_len, ref.centering)
    np.testing.assert_array_equal(got.unigram, ref.unigram)
    back = load_statistics(tmp_path / "s")
    assert_bitwise_equal(back, ref)
    # the same file as saving the in-memory result
    save_statistics(ref, tmp_path / "r")
    assert (tmp_path / "r" / "statistics.safetensors").read_bytes() == (
        tmp_path / "s" / "statistics.safetensors"
    ).read_bytes()


def test_streamed_matches_definitions_float64(tmp_path):
    """Small corpus: the streamed statistics against dense one-hot formulas of B̄, Σ, Φ̄ and Φ̄ᵀB̄ᵀ."""
    toks = zipf_corpus(3, N=9, T=6, V=8)
    st = stream_statistics(toks, 8, tmp_path / "s", block_bytes=8 * 8 * 3)
    V, T, c = 8, 6, 1.0 / 8
    X, Y = np.eye(V)[toks[:, :-1]], np.eye(V)[toks[:, 1:]]
    P = X.shape[0] * T
    A0 = np.tril(np.ones((T, T))) / np.arange(1, T + 1)[:, None]
    B = np.einsum("ntv,ntw->vw", X, Y - c) / P
    Phi = np.einsum("ntv,ntw->vw", Y - c, np.einsum("ts,nsw->ntw", A0, X)) / P
    for k, want in (("bigram", B), ("interchangeability", B.T @ B), ("context", Phi), ("value_target", Phi.T @ B.T)):
        np.testing.assert_allclose(np.asarray(getattr(st, k)), want, rtol=1e-12, atol=1e-15, err_msg=k)


def test_second_order_row_blocks_add_up_to_the_whole():
    toks = zipf_corpus(5, N=30, T=10, V=25)
    f = FirstOrderSums(25, 10).update(toks)
    first = f.finalize()
    whole = SecondOrderSums(first).update(toks)
    got = []
    for r0, r1 in [(0, 7), (7, 8), (8, 25)]:
        part = SecondOrderSums(first, rows=(r0, r1)).update(toks[:17]).update(toks[17:])
        got.append(part.qk_raw)
        if r0 == 0:
            assert part.delta_parts.tobytes() == whole.delta_parts.tobytes()
        else:
            assert not part.delta_parts.any()
    assert np.concatenate(got).tobytes() == whole.qk_raw.tobytes()


def test_alpha_dot_is_independent_of_column_blocks():
    rng = np.random.default_rng(0)
    M, alpha = rng.standard_normal((300, 97)).astype(np.float32), rng.random(300)
    whole = alpha_dot(alpha, M, width=97)
    for w in (2, 3, 16, 50):
        blocks = [alpha_dot(alpha, np.ascontiguousarray(M[:, a:b]), width=w) for a, b in spans(97, w)]
        assert np.concatenate(blocks).tobytes() == whole.tobytes()
    assert [b - a for a, b in spans(7, 3)] == [3, 4] and list(spans(1, 5)) == [(0, 1)]


def test_seconds_placeholder_and_manifest_function(tmp_path):
    toks = zipf_corpus(2)
    st = stream_statistics(
        toks, 60, tmp_path / "s", meta={"source": "x", "seconds": None}, manifest=lambda s: {"n": s.n_pairs}
    )
    back = load_statistics(tmp_path / "s")
    assert back.meta["source"] == "x" and isinstance(back.meta["seconds"], float) and back.meta["seconds"] >= 0
    assert (tmp_path / "s" / "manifest.json").read_text().count(str(st.n_pairs)) == 1


# ------------------------------------------------------------------ the piecewise safetensors writer
def _tensors():
    rng = np.random.default_rng(0)
    return {
        "b": rng.random((5, 3)).astype(np.float32),
        "a": rng.random(7),
        "c": rng.integers(0, 9, (2, 2)).astype(np.int64),
        "z": np.arange(4, dtype=np.uint8),
    }


@pytest.mark.parametrize("guess", [{"x": [1, 2.5], "s": "str"}, None, {"x": "a much longer provisional value" * 3}])
def test_writer_bytes_equal_save_tensors(tmp_path, guess):
    t, meta = _tensors(), {"x": [1, 2.5], "s": "str"}
    save_tensors(tmp_path / "ref.safetensors", t, kind="k", metadata=meta)
    specs = {k: (v.dtype, v.shape) for k, v in t.items()}
    with TensorFileWriter(tmp_path / "new.safetensors", specs, kind="k", metadata=guess) as w:
        w.write("b", t["b"][3:], 3)  # rows in any order
        w.write("b", t["b"][:3])
        for k in ("a", "c", "z"):
            w.write(k, t[k])
        np.testing.assert_array_equal(w.columns("b", 1, 3), t["b"][:, 1:])
        assert w.fits(meta) == (guess == meta)
        w.commit(meta)
    assert (tmp_path / "new.safetensors").read_bytes() == (tmp_path / "ref.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.safetensors", "ref.safetensors"]


def test_writer_leaves_nothing_when_incomplete_or_failed(tmp_path):
    t = _tensors()
    specs = {k: (v.dtype, v.shape) for k, v in t.items()}
    with TensorFileWriter(tmp_path / "f.safetensors", specs, kind="k") as w:
        w.write("a", t["a"])
        with pytest.raises(RuntimeError, match="not completely written"):
            w.commit()
    with (
        pytest.raises(ValueError, match="expected"),
        TensorFileWriter(tmp_path / "f.safetensors", specs, kind="k") as w,
    ):
        w.write("a", t["a"].astype(np.float32))
    assert list(tmp_path.iterdir()) == []
