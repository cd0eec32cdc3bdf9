"""2-process runs on torch.distributed (gloo, CPU) equal 1-process runs.

Statistics: integer counts equal the single pass exactly; floating sums equal the single-process merge
of the same two shards bit for bit (and the unsharded pass to round-off).
Training (ntp, assoc; float64): 2-process weights, Adam moments and logged losses equal the 1-process
run to float tolerance; a killed 2-process run resumed under torchrun equals the uninterrupted one bit
for bit.  Attribution: segments spread over 2 ranks give bit-identical tables.  The slicing arithmetic
of ``originlens.train.parallel`` is also checked rank by rank in one process (collectives stubbed).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from originlens.distributed import corpus_statistics_sharded, shard_bounds
from originlens.stats import corpus_statistics, load_statistics

pytestmark = pytest.mark.slow


def torchrun(args, cwd, nproc=2, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ORIGINLENS_QUIET": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "originlens",
        "-q",
        *args,
    ]
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
    torchrun(["stats", "--tokens", "tokens.npy", "--vocab-size", str(V), "--out", "st2", "--chunk-size", "8"], tmp_path)
    two = load_statistics(tmp_path / "st2")
    ref_sharded = corpus_statistics_sharded(tokens, V, 2, chunk_size=8)
    ref = corpus_statistics(tokens, V)
    for k, v in ref_sharded.as_dict().items():
        np.testing.assert_array_equal(two.as_dict()[k], v, err_msg=k)  # exact
        np.testing.assert_allclose(two.as_dict()[k], ref.as_dict()[k], rtol=1e-12, atol=1e-15)
    # counts: the bigram map is built from integer counts, so it is exactly the single-pass one
    np.testing.assert_array_equal(two.bigram, ref.bigram)
    assert two.n_pairs == ref.n_pairs
    manifest = (tmp_path / "st2" / "manifest.json").read_text()
    assert '"processes": 2' in manifest


# ----------------------------------------------------------------------------------------------------
# data-parallel training and parallel attribution: one torchrun launch (startup dominates) runs every
# 2-process command of the tests below; the 1-process references are computed here, in-process.

NTP_ARGS = [
    "--task",
    "majority",
    "--n-layers",
    "2",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--batch-size",
    "9",
    "--steps",
    "6",
    "--eval-size",
    "40",
    "--log-every",
    "1",
    "--eval-every",
    "3",
    "--probe-every",
    "3",
    "--checkpoint-every",
    "2",
    "--dtype",
    "float64",
    "--seed",
    "1",
]
NTP_CONFIG = dict(
    task="majority",
    n_layer=2,
    d_model=16,
    n_head=2,
    batch_size=9,
    steps=6,
    eval_size=40,
    log_every=1,
    eval_every=3,
    probe_every=3,
    checkpoint_every=2,
    dtype="float64",
    seed=1,
)
ASSOC_V = 11
ASSOC_ARGS = [
    "--tokens",
    "tok.npy",
    "--vocab-size",
    str(ASSOC_V),
    "--steps",
    "5",
    "--batch-size",
    "9",
    "--dtype",
    "float64",
    "--checkpoint-every",
    "2",
    "--init",
    "gaussian",
    "--init-std",
    "0.1",
    "--n-layers",
    "2",
]
# --threads 1: the statistics' numba kernels (assoc train, same process) raise OpenMP's thread count to the
# core count, and bit-exact replay needs the training's thread count
ATTR_ARGS = ["--sites", "1:3,2:10", "--features", "is_majority_<0>", "--segments", "3", "--threads", "1"]

DRIVER = """
import shutil, sys
from pathlib import Path
from originlens.cli.main import main
from originlens.distributed import barrier, world

def run(*argv):
    rc = main(["-q", *argv])
    if rc:
        sys.exit(rc)          # torchrun then stops the other rank

NTP, ASSOC, ATTR = {ntp!r}, {assoc!r}, {attr!r}
run("ntp", "train", *NTP, "--out", "ntp2")
if world()[0] == 0:           # an interrupted copy: killed after the checkpoint of update 4
    shutil.copytree("ntp2", "ntp2-killed")
    for f in ("checkpoints/step-000006.safetensors", "model.safetensors", "summary.json", "probes.safetensors",
              "probe_metrics.npz"):
        Path("ntp2-killed", f).unlink()
barrier()
run("ntp", "train", *NTP, "--out", "ntp2-killed", "--resume")
run("assoc", "train", *ASSOC, "--out", "assoc2")
run("ntp", "attribute", "attr-run", *ATTR, "--out", "attr2")
"""


def _train_attr_run(path):
    from originlens.train.ntp import NTPConfig, Trainer

    cfg = NTPConfig(
        task="majority",
        n_layer=2,
        d_model=8,
        n_head=2,
        batch_size=8,
        steps=6,
        eval_size=40,
        log_every=1,
        eval_every=0,
        probe_every=0,
        checkpoint_every=2,
        dtype="float64",
    )
    Trainer(cfg, path).run()


@pytest.fixture(scope="module")
def two_process(tmp_path_factory):
    """Directory holding the outputs of the 2-process commands (see DRIVER)."""
    d = tmp_path_factory.mktemp("dp")
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the ranks run with OMP_NUM_THREADS=1: bit-exact replay needs the same
    try:
        _train_attr_run(d / "attr-run")
    finally:
        torch.set_num_threads(old)
    np.save(d / "tok.npy", np.random.default_rng(3).integers(0, ASSOC_V, size=(37, 7)))
    (d / "driver.py").write_text(DRIVER.format(ntp=NTP_ARGS, assoc=ASSOC_ARGS, attr=ATTR_ARGS))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ORIGINLENS_QUIET": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "driver.py"]
    r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (d / "stdout.txt").write_text(r.stdout)
    return d


def test_only_rank_zero_prints_the_summaries(two_process):
    """Both ranks run every command of DRIVER; only rank 0's summaries reach the standard output."""
    lines = [line for line in (two_process / "stdout.txt").read_text().splitlines() if line.strip()]
    assert any("ntp2-killed" in line for line in lines), lines  # rank 0 printed its summaries
    twice = sorted({line for line in lines if lines.count(line) > 1})
    assert not twice, twice


@pytest.fixture
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _metrics(path, event):
    out = []
    for line in (path / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("event") == event:
            r.pop("time", None)
            out.append(r)
    return out


def _state(path):
    from originlens.storage import load_tensors

    return load_tensors(path)[0]


def test_two_process_ntp_train_equals_one_process(two_process, tmp_path, one_thread):
    from originlens.train.ntp import NTPConfig, Trainer

    Trainer(NTPConfig(**NTP_CONFIG), tmp_path / "ntp1").run()
    one, two = tmp_path / "ntp1", two_process / "ntp2"
    a, b = _state(one / "model.safetensors"), _state(two / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(b[k], a[k], rtol=1e-10, atol=1e-12, err_msg=k)
    # Adam moments of the checkpoints, too (same global batch → same optimiser trajectory)
    for step in (2, 4, 6):
        ca = _state(one / "checkpoints" / f"step-{step:06d}.safetensors")
        cb = _state(two / "checkpoints" / f"step-{step:06d}.safetensors")
        for k in ca:
            if k.startswith(("model.", "adam.")):
                np.testing.assert_allclose(cb[k], ca[k], rtol=1e-10, atol=1e-14, err_msg=f"{step} {k}")
    # the logged loss is the global batch's (Σ over ranks), written once (rank 0 only)
    la, lb = _metrics(one, "train"), _metrics(two, "train")
    assert [r["step"] for r in lb] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([r["loss"] for r in lb], [r["loss"] for r in la], rtol=1e-12)
    ea, eb = _metrics(one, "eval"), _metrics(two, "eval")
    assert [r["step"] for r in eb] == [3, 6]
    np.testing.assert_allclose([r["eval_loss"] for r in eb], [r["eval_loss"] for r in ea], rtol=1e-10)
    assert len(_metrics(two, "probe")) == 2
    assert json.loads((two / "environment.json").read_text())["processes"] == 2
    assert json.loads((two / "summary.json").read_text())["finished"]


def test_resume_under_torchrun_equals_the_uninterrupted_run(two_process):
    full, resumed = two_process / "ntp2", two_process / "ntp2-killed"
    a, b = _state(full / "model.safetensors"), _state(resumed / "model.safetensors")
    for k in a:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)  # same ranks, same sums: bit-exact
    assert _metrics(resumed, "train") == _metrics(full, "train")  # metrics after update 4 were trimmed
    assert [r["step"] for r in _metrics(resumed, "eval")] == [3, 6]


def test_two_process_assoc_train_equals_one_process(two_process, tmp_path, one_thread):
    from originlens.train import AssocTrainConfig, train_assoc

    tokens = np.load(two_process / "tok.npy")
    cfg = AssocTrainConfig(
        n_layers=2,
        steps=5,
        batch_size=9,
        dtype="float64",
        checkpoint_every=2,
        init="gaussian",
        init_std=0.1,
        out=str(tmp_path / "assoc1"),
    )
    train_assoc(tokens, ASSOC_V, cfg)
    one, two = tmp_path / "assoc1", two_process / "assoc2"
    a, b = _state(one / "model.safetensors"), _state(two / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:  # step 5 is the epoch's short batch (1 row: one rank idle)
        np.testing.assert_allclose(b[k], a[k], rtol=1e-10, atol=1e-13, err_msg=k)
    la, lb = _metrics(one, "step"), _metrics(two, "step")
    assert [r["step"] for r in lb] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([r["loss"] for r in lb], [r["loss"] for r in la], rtol=1e-12)
    ca, cb = _metrics(one, "checkpoint"), _metrics(two, "checkpoint")
    assert [r["step"] for r in cb] == [2, 4, 5]
    np.testing.assert_allclose([r["min_cos"]["W_O"] for r in cb], [r["min_cos"]["W_O"] for r in ca], rtol=1e-8)
    assert (two / "statistics" / "statistics.safetensors").is_file()
    assert json.loads((two / "environment.json").read_text())["processes"] == 2


def test_two_process_attribution_equals_one_process(two_process, tmp_path, one_thread):
    from originlens.attribution import store as ostore
    from originlens.attribution.segments import attribute_segments

    res = attribute_segments(
        two_process / "attr-run",
        segments=3,
        sites=[(1, 3), (2, 10)],
        features=["is_majority_<0>"],
        out=tmp_path / "attr1",
    )
    assert [(r.info["moments_from"], r.path.name) for r in res] == [
        (0, "segment-000000-000002.parquet"),
        (2, "segment-000002-000004.parquet"),
        (4, "segment-000004-000006.parquet"),
    ]
    for a, b in zip(
        sorted((tmp_path / "attr1").glob("segment-*.parquet")),
        sorted((two_process / "attr2").glob("segment-*.parquet")),
    ):
        assert a.name == b.name
        ta, tb = ostore.read_segment(a)[0], ostore.read_segment(b)[0]
        assert ta.num_rows > 0 and ta.equals(tb), a.name  # bit-identical tables
    meta = json.loads((two_process / "attr2" / "meta.json").read_text())
    assert [s["file"] for s in meta["segments"]] == [r.path.name for r in res]
    # the rank with segment 2:4 either found the moments at 2 stored by the rank that finished 0:2, or
    # (the usual order) started before they existed and recomputed them from 0 — which one depends on the
    # machine's load; the tables above are bit-identical either way
    infos = ostore.read_segment_infos(two_process / "attr2")
    assert infos[1]["moments_from"] in (0, 2)
    assert all(i["checks"]["checkpoints_verified"] for i in infos)
    # refused up front (on every rank alike): recomputing without overwrite, Adam without starting moments
    from originlens.errors import CompatibilityError, ConfigError

    kw = dict(sites=[(1, 3)], features=["is_majority_<0>"])
    with pytest.raises(CompatibilityError, match="already exists"):
        attribute_segments(
            two_process / "attr-run", segments=3, out=tmp_path / "attr1", **{**kw, "sites": [(1, 3), (2, 10)]}
        )
    with pytest.raises(ConfigError, match="moments after update 2"):
        attribute_segments(two_process / "attr-run", segments=2, segment=(2, 6), out=tmp_path / "fresh", **kw)


def test_segment_bounds_cover_the_updates():
    from originlens.attribution.segments import segment_bounds
    from originlens.errors import ConfigError

    for start, end in ((0, 7), (3, 10)):
        for n in range(1, end - start + 1):
            b = segment_bounds(start, end, n)
            assert b[0][0] == start and b[-1][1] == end and len(b) == n
            assert all(x[1] == y[0] and x[0] < x[1] for x, y in zip(b, b[1:]))
    with pytest.raises(ConfigError):
        segment_bounds(0, 3, 4)


# ----------------------------------------------------------------------------------------------------
# the slicing arithmetic of originlens.train.parallel, rank by rank in one process (collectives stubbed:
# each simulated rank's contribution is kept, and the test sums them as the all-reduce would)


def _simulate(monkeypatch, rank, world_size):
    from originlens.train import parallel

    monkeypatch.setattr(parallel, "is_distributed", lambda: True)
    monkeypatch.setattr(parallel, "world", lambda: (rank, world_size))
    monkeypatch.setattr(parallel, "all_reduce_sum", lambda t: t)
    return parallel


def test_gpt_shard_losses_and_gradients_sum_to_the_global_batch(monkeypatch, one_thread):
    from originlens.models.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=7, seq_len=6, n_layer=1, d_model=8, n_head=2, n_positions=7, dtype="float64"))
    x = torch.randint(0, 7, (10, 6))
    # brute force: mean next-token cross-entropy over all B(T−1) positions of the global batch
    logits = model(x)
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 7), x[:, 1:].reshape(-1))
    ref_grads = torch.autograd.grad(ref, list(model.parameters()))
    for W in (2, 3, 4):  # 10 rows: unequal slices for 3 and 4
        total, grads = 0.0, [torch.zeros_like(p) for p in model.parameters()]
        for r in range(W):
            parallel = _simulate(monkeypatch, r, W)
            model.zero_grad(set_to_none=True)
            loss = parallel.shard_loss(model, x)
            total += parallel.global_value(loss)
            loss.backward()
            grads = [g + p.grad for g, p in zip(grads, model.parameters())]
        assert abs(total - float(ref.detach())) <= 1e-14
        for g, rg in zip(grads, ref_grads):
            torch.testing.assert_close(g, rg, rtol=1e-12, atol=1e-15)


def test_mean_over_shards_scales_slices_by_their_share(monkeypatch):
    x = torch.arange(7, dtype=torch.float64).reshape(7, 1) + 1.0
    w = torch.nn.Parameter(torch.tensor([0.5], dtype=torch.float64))

    def accumulate(rows):  # mean of (w·x)² over the rows, gradient into .grad
        loss = (w * rows).pow(2).mean()
        loss.backward()
        return float(loss.detach())

    ref = float((w * x).pow(2).mean().detach())
    ref_grad = float(torch.autograd.grad((w * x).pow(2).mean(), [w])[0])
    for W in (2, 3, 7, 8):  # W = 8 > 7 rows: one rank has no rows
        total, grad = 0.0, 0.0
        for r in range(W):
            parallel = _simulate(monkeypatch, r, W)
            w.grad = None
            total += parallel.mean_over_shards(accumulate, x, [w])
            grad += float(w.grad)
        assert abs(total - ref) <= 1e-14 and abs(grad - ref_grad) <= 1e-14


def test_allreduce_gradients_buckets_every_gradient_once(monkeypatch):
    from originlens.train import parallel

    monkeypatch.setattr(parallel, "is_distributed", lambda: True)
    monkeypatch.setattr(parallel, "BUCKET_ELEMENTS", 5)
    calls = []

    def doubled(t):
        calls.append(t.numel())
        return t * 2

    monkeypatch.setattr(parallel, "all_reduce_sum", doubled)
    ps = [torch.nn.Parameter(torch.randn(n)) for n in (3, 2, 7, 1, 1)]
    for p in ps:
        p.grad = torch.randn_like(p)
    ps.append(torch.nn.Parameter(torch.randn(2)))  # no gradient: skipped
    before = [None if p.grad is None else p.grad.clone() for p in ps]
    parallel.allreduce_gradients(ps)
    assert calls == [5, 7, 2]
    for p, b in zip(ps, before):
        assert (p.grad is None) if b is None else torch.equal(p.grad, 2 * b)
