"""2-process runs on torch.distributed (gloo, CPU) equal 1-process runs.

Statistics: integer counts equal the single pass exactly; floating sums equal the single-process merge
of the same two shards bit for bit (and the unsharded pass to round-off).
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from originlens.distributed import corpus_statistics_sharded, shard_bounds
from originlens.stats import corpus_statistics, load_statistics

pytestmark = pytest.mark.slow


def torchrun(args, cwd, nproc=2, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ORIGINLENS_QUIET": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "originlens", "-q", *args]
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_shard_bounds_cover_everything():
    for n in range(0, 20):
        for w in range(1, 5):
            b = [shard_bounds(n, r, w) for r in range(w)]
            assert b[0][0] == 0 and b[-1][1] == n
            assert all(b[i][1] == b[i + 1][0] for i in range(w - 1))
            assert max(y - x for x, y in b) - min(y - x for x, y in b) <= 1


def test_sharded_single_process_matches_unsharded():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 17, size=(37, 9))
    ref = corpus_statistics(tokens, 17)
    for n in (1, 2, 3):
        st = corpus_statistics_sharded(tokens, 17, n)
        assert st.n_pairs == ref.n_pairs
        np.testing.assert_array_equal(st.unigram, ref.unigram)
        for k, v in ref.as_dict().items():
            np.testing.assert_allclose(st.as_dict()[k], v, rtol=1e-12, atol=1e-15)
    one = corpus_statistics_sharded(tokens, 17, 1)
    for k, v in ref.as_dict().items():
        np.testing.assert_array_equal(one.as_dict()[k], v)


def test_two_process_stats_equal_one_process(tmp_path):
    rng = np.random.default_rng(1)
    V = 23
    tokens = rng.integers(0, V, size=(61, 13)).astype(np.int64)
    np.save(tmp_path / "tokens.npy", tokens)
    torchrun(["stats", "--tokens", "tokens.npy", "--vocab-size", str(V), "--out", "st2", "--chunk-size", "8"],
             tmp_path)
    two = load_statistics(tmp_path / "st2")
    ref_sharded = corpus_statistics_sharded(tokens, V, 2, chunk_size=8)
    ref = corpus_statistics(tokens, V)
    for k, v in ref_sharded.as_dict().items():
        np.testing.assert_array_equal(two.as_dict()[k], v, err_msg=k)       # exact
        np.testing.assert_allclose(two.as_dict()[k], ref.as_dict()[k], rtol=1e-12, atol=1e-15)
    # counts: the bigram map is built from integer counts, so it is exactly the single-pass one
    np.testing.assert_array_equal(two.bigram, ref.bigram)
    assert two.n_pairs == ref.n_pairs
    manifest = (tmp_path / "st2" / "manifest.json").read_text()
    assert '"processes": 2' in manifest
