"""Majority / Conditioned Majority generators and the task interface, against plain loops."""

from __future__ import annotations

import numpy as np
import pytest

from originlens.errors import ConfigError, InputError
from originlens.tasks import (
    CondMajorityTask,
    MajorityTask,
    Task,
    first_output_accuracy,
    get_task,
    legal_accuracy,
    output_legal_accuracy,
    task_metrics,
    task_names,
)
from originlens.tasks.base import choose_uniform


def _check_common(task, batch, n):
    t = task.seq_len
    assert batch.tokens.shape == (n, t) and batch.tokens.dtype == np.int64
    assert (batch.tokens[:, 0] == 1).all()
    assert ((batch.tokens[:, 1:] >= 2) & (batch.tokens[:, 1:] < task.vocab_size)).all()
    assert batch.features.shape == (n, t, task.n_symbols) and batch.features.dtype == np.float32
    assert not batch.features[:, 0].any()
    assert batch.legal.shape == (n, t, task.vocab_size)
    assert not batch.legal[:, :, :2].any() and not batch.legal[:, -1].any()
    assert batch.feature_types.dtype == np.uint8


def test_vocab_and_layout():
    for name in ("majority", "cond-majority"):
        task = get_task(name)
        assert isinstance(task, Task)
        assert task.vocab == ["<pad>", "<bos>", "<0>", "<1>", "<2>"] and task.vocab_size == 5
        assert task.seq_len == 21
        assert task.tracked.layers == (1, 2) and task.tracked.positions == tuple(range(2, 20))
    assert get_task("majority").feature_names == ["is_majority_<0>", "is_majority_<1>", "is_majority_<2>"]
    assert get_task("majority").tracked.features == tuple(get_task("majority").feature_names)
    assert get_task("cond-majority").tracked.features == ("prev_is_<0>",)
    assert task_names() == ["majority", "cond-majority", "othello", "tinystories"]


def test_majority_against_loop():
    task = MajorityTask()
    n = 400
    batch = task.sample(n, np.random.default_rng(0))
    _check_common(task, batch, n)
    for b in range(n):
        syms = (batch.tokens[b] - 2).tolist()
        counts = [0, 0, 0]
        for i in range(1, 21):
            before_max = max(counts)
            argmax_before = {s for s in range(3) if counts[s] == before_max}
            legal_prev = set(np.flatnonzero(batch.legal[b, i - 1]) - 2)
            if i <= 10:
                assert legal_prev == {0, 1, 2}
            else:
                assert legal_prev == argmax_before and syms[i] in argmax_before
            counts[syms[i]] += 1
            np.testing.assert_array_equal(batch.metadata["counts"][b, i], counts)
            top = max(counts)
            expect = [1.0 if counts[s] == top else 0.0 for s in range(3)]
            np.testing.assert_array_equal(batch.features[b, i], expect)
    out = batch.tokens[:, 11:]
    assert (out == out[:, :1]).all(), "Majority outputs after the first must repeat it"
    assert (batch.legal[:, 11:20, 2:].sum(-1) == 1).all()


def test_majority_types_and_metadata():
    task = MajorityTask()
    batch = task.sample(5, np.random.default_rng(1))
    useful = np.zeros(21, bool)
    useful[10:20] = True
    np.testing.assert_array_equal(batch.useful_positions, useful)
    expect = np.where(useful, 2, 1)
    expect[0] = 0
    np.testing.assert_array_equal(batch.feature_types, np.broadcast_to(expect[None, :, None], (5, 21, 3)))
    assert batch.metadata["output_positions"] == list(range(10, 20))
    assert batch.metadata["first_output_position"] == 10


def test_cond_majority_against_loop():
    task = CondMajorityTask()
    n = 400
    batch = task.sample(n, np.random.default_rng(2))
    _check_common(task, batch, n)
    for b in range(n):
        syms = (batch.tokens[b] - 2).tolist()  # syms[0] = -1 is <bos>
        counts = [0, 0, 0]
        for i in range(1, 11):
            if i >= 2 and syms[i - 1] == 0:
                counts[syms[i]] += 1
            np.testing.assert_array_equal(batch.metadata["counts"][b, i], counts)
        top = max(counts)
        argmax = {s for s in range(3) if counts[s] == top}
        for i in range(11, 21):
            assert syms[i] in argmax
            assert set(np.flatnonzero(batch.legal[b, i - 1]) - 2) == argmax
            np.testing.assert_array_equal(batch.metadata["counts"][b, i], counts)
        for i in range(1, 10):
            assert batch.legal[b, i - 1, 2:].all()
        for i in range(21):
            expect = [0.0] * 3
            if i >= 2:
                expect[syms[i - 1]] = 1.0
            np.testing.assert_array_equal(batch.features[b, i], expect, err_msg=f"{b},{i}")
    assert not batch.useful_positions.any()
    assert (batch.feature_types[:, 1:] == 1).all() and (batch.feature_types[:, 0] == 0).all()


def test_distributions():
    n = 20000
    batch = MajorityTask().sample(n, np.random.default_rng(3))
    freq = np.bincount(batch.tokens[:, 1:11].ravel() - 2, minlength=3) / (10 * n)
    np.testing.assert_allclose(freq, 1 / 3, atol=0.01)
    # first output uniform over a two-way tie {<0>, <1>}
    tie = batch.legal[:, 10, 2:].tolist()
    sel = np.array([row == [True, True, False] for row in tie])
    first = batch.tokens[sel, 11] - 2
    assert sel.sum() > 500 and abs((first == 0).mean() - 0.5) < 0.06
    cond = CondMajorityTask().sample(n, np.random.default_rng(4))
    three = cond.legal[:, 10, 2:].all(-1)  # all counts tied
    outs = cond.tokens[three, 11:] - 2
    np.testing.assert_allclose(np.bincount(outs.ravel(), minlength=3) / outs.size, 1 / 3, atol=0.02)


def test_determinism_prefix_and_sizes():
    for cls in (MajorityTask, CondMajorityTask):
        a = cls().sample(30, np.random.default_rng(7))
        b = cls().sample(50, np.random.default_rng(7))
        np.testing.assert_array_equal(a.tokens, b.tokens[:30])
        np.testing.assert_array_equal(a.features, b.features[:30])
        c = cls(n_symbols=4, n_inputs=6, n_outputs=3).sample(10, np.random.default_rng(0))
        assert c.tokens.shape == (10, 10) and c.legal.shape == (10, 10, 6)
        assert cls().sample(0, np.random.default_rng(0)).tokens.shape == (0, 21)
    with pytest.raises(ConfigError, match="n_symbols"):
        MajorityTask(n_symbols=1)
    with pytest.raises(ConfigError):
        MajorityTask().sample(-1, np.random.default_rng(0))


def test_choose_uniform_matches_sorted_list_rule():
    rng = np.random.default_rng(5)
    mask = rng.random((500, 9)) < 0.4
    mask[:, 4] |= ~mask.any(1)
    u = rng.random(500)
    got = choose_uniform(mask, u)
    for r in range(500):
        cand = sorted(np.flatnonzero(mask[r]).tolist())
        assert got[r] == cand[int(u[r] * len(cand))]


def test_metrics_against_loop():
    task = MajorityTask()
    batch = task.sample(300, np.random.default_rng(6))
    pred = np.random.default_rng(7).integers(0, 5, size=(300, 21))
    hits = {}
    for b in range(300):
        for i in range(20):
            hits[b, i] = bool(batch.legal[b, i, pred[b, i]])
    all_pos = np.mean([hits[b, i] for b in range(300) for i in range(20)])
    outs = np.mean([hits[b, i] for b in range(300) for i in range(10, 20)])
    first = np.mean([hits[b, 10] for b in range(300)])
    assert legal_accuracy(pred, batch) == pytest.approx(all_pos)
    assert legal_accuracy(pred[:, :20], batch) == pytest.approx(all_pos)
    assert output_legal_accuracy(pred, batch) == pytest.approx(outs)
    assert first_output_accuracy(pred, batch) == pytest.approx(first)
    m = task_metrics(pred, batch)
    assert m["legal_output_acc"] == pytest.approx(outs) and m["first_output_token_acc"] == pytest.approx(first)
    # the true next tokens are always legal
    assert output_legal_accuracy(np.c_[batch.tokens[:, 1:], batch.tokens[:, :1]], batch) == 1.0
    with pytest.raises(InputError):
        legal_accuracy(pred[:, :5], batch)
    with pytest.raises(InputError):
        legal_accuracy(pred + 10, batch)


def test_select_and_registry_options():
    batch = get_task("cond-majority", n_inputs=5, n_outputs=4).sample(10, np.random.default_rng(0))
    sub = batch.select([1, 3])
    np.testing.assert_array_equal(sub.tokens, batch.tokens[[1, 3]])
    assert len(sub) == 2 and sub.seq_len == 10
    with pytest.raises(ConfigError, match="valid options"):
        get_task("majority", n_symbol=3)
