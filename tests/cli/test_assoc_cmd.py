"""CLI `originlens assoc train|report|top`: end to end on a tiny storyworld corpus, saved inputs, and the
one-line errors (mismatched statistics, other run in RUN, diverging lr, corrupted checkpoint)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from originlens.cli.main import main
from originlens.data import build_corpus
from originlens.stats import corpus_statistics, load_statistics, save_statistics
from originlens.theory import cosine


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def run_cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line_error(rc, err, needle):
    assert rc == 2, err
    # status lines (progress, "assoc train: ...") may precede it; the error itself is exactly one line, last
    lines = err.strip("\n").split("\n")
    errors = [ln for ln in lines if ln.startswith("originlens: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "fix:" in errors[0], err
    assert needle in errors[0], err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("c") / "corpus"
    build_corpus(None, d, storyworld_stories=120, vocab_size=80, seq_len=10, oov="unk")
    return d


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("r") / "run"
    rc = main(
        [
            "-q",
            "assoc",
            "train",
            str(corpus),
            "--n-layers",
            "2",
            "--lr",
            "0.5",
            "--steps",
            "6",
            "--batch-size",
            "32",
            "--checkpoint-every",
            "2",
            "--holdout",
            "10",
            "--dtype",
            "float64",
            "--out",
            str(run),
        ]
    )
    assert rc == 0
    return run


def test_train_writes_run_statistics_and_data(corpus, trained):
    from originlens.data import load_token_array

    toks, vocab, _ = load_token_array(corpus)
    toks = np.asarray(toks, dtype=np.int64)
    train = np.load(trained / "data" / "train.npy")
    held = np.load(trained / "data" / "heldout.npy")
    np.testing.assert_array_equal(train, toks[:-10])
    np.testing.assert_array_equal(held, toks[-10:])
    assert json.loads((trained / "data" / "vocab.json").read_text()) == vocab
    assert sorted(p.name for p in (trained / "checkpoints").iterdir()) == [
        "step-000002.safetensors",
        "step-000004.safetensors",
        "step-000006.safetensors",
    ]
    # statistics = the first shuffled batch (torch.randperm with the data seed 42), as in the paper
    st = load_statistics(trained / "statistics")
    idx = torch.randperm(train.shape[0], generator=torch.Generator().manual_seed(42))[:32].numpy()
    ref = corpus_statistics(train[idx], len(vocab))
    for k in ("bigram", "context", "value_target", "query_key", "positional"):
        np.testing.assert_allclose(getattr(st, k), getattr(ref, k), rtol=1e-12, atol=1e-15)
    assert st.vocab == vocab
    man = json.loads((trained / "statistics" / "manifest.json").read_text())
    assert man["source"] == "first_batch" and sorted(man["windows"]) == sorted(idx.tolist())


def test_report_end_to_end(corpus, trained, tmp_path, capsys):
    from originlens.data import load_token_array

    _, vocab, _ = load_token_array(corpus)
    rnd = np.random.default_rng(0).integers(0, len(vocab), (40, 11))
    save_statistics(corpus_statistics(rnd, len(vocab), vocab=vocab), tmp_path / "null")
    rc, out, err = run_cli(
        capsys, "assoc", "report", trained, "--json", "--null-corpus", tmp_path / "null", "--examples", "fish,red,zzz"
    )
    assert rc == 0, err
    res = json.loads(out)
    html = (trained / "report.html").read_text()
    assert "data:image/png;base64," in html and "Causal intervention" in html
    assert json.loads((trained / "report.json").read_text()) == res
    # cosines equal theory.cosine recomputed from the checkpoint tensors and the saved statistics
    st = load_statistics(trained / "statistics")
    target = {"W_O": st.bigram, "V": st.value_target, "W": st.query_key, "P": st.positional}
    assert [r["step"] for r in res["checkpoints"]] == [2, 4, 6]
    for rec in res["checkpoints"]:
        w = load_file(str(trained / "checkpoints" / f"step-{rec['step']:06d}.safetensors"))
        for name, v in rec["theory"].items():
            want = cosine(w[name], target[name.split(".")[0]])
            if math.isnan(want):
                assert v["cos"] is None
            else:
                assert v["cos"] == pytest.approx(want, abs=1e-12)
        assert rec["epoch"] == pytest.approx(rec["step"] / res["run"]["steps_per_epoch"])
    assert set(res["min_cosine_over_training"]) == {"W", "V", "W_O", "P"}
    # targets from the first batch: cosines with the full training set's leading terms are tracked too
    full = corpus_statistics(np.load(trained / "data" / "train.npy"), st.vocab_size)
    last = res["checkpoints"][-1]
    w = load_file(str(trained / "checkpoints" / "step-000006.safetensors"))
    assert last["cos_vs"]["full_train"]["V.2"] == pytest.approx(cosine(w["V.2"], full.value_target), abs=1e-12)
    assert res["min_cosine_over_training_full_train"]["W_O"] == pytest.approx(
        min(r["min_cos_vs"]["full_train"]["W_O"] for r in res["checkpoints"])
    )
    # baselines: random unrelated statistics far below the leading term
    b = res["baselines"]["per_weight"]
    for name in ("W_O", "V.1", "W.1"):
        assert b[name]["null_corpus"] < b[name]["leading_term"] - 0.3
        assert abs(b[name]["random"]) < 0.2 and b[name]["pmi"] is not None
    # intervention: removing W_O's leading term costs most, removal leaves ⟨M,T⟩ = 0
    it = res["intervention"]
    assert it["windows"] == 110 and it["losses"]["W_O"]["loss"] > it["original"]
    assert all(abs(v["residual_cos"]) < 1e-10 for v in it["losses"].values())
    h = res["heldout"]
    assert "held-out" in h["source"] and h["uniform"] == pytest.approx(math.log(len(vocab)))
    assert {"trained", "leading_term_eq12", "leading_term_full", "bigram_path", "conditional_bigram"} <= set(h)
    assert "fish" in res["examples"] and "zzz" not in res["examples"]
    assert any("zzz" in w for w in res["warnings"])
    assert len(res["loss_curve"]) == 6


def test_top_still_works(trained, capsys):
    rc, out, err = run_cli(
        capsys,
        "assoc",
        "top",
        "--stats",
        trained / "statistics",
        "--word",
        "fish",
        "--basis",
        "context",
        "-k",
        "3",
        "--json",
    )
    assert rc == 0, err
    assert len(json.loads(out)["fish"]["row"]) == 3


def test_error_statistics_of_other_vocabulary_or_length(corpus, tmp_path, capsys):
    from originlens.data import load_token_array

    toks, vocab, _ = load_token_array(corpus)
    toks = np.asarray(toks, dtype=np.int64)
    save_statistics(corpus_statistics(toks, len(vocab) + 3), tmp_path / "bigger")
    save_statistics(corpus_statistics(toks[:, :6], len(vocab), vocab=vocab), tmp_path / "shorter")
    shuffled = list(reversed(vocab))
    save_statistics(corpus_statistics(toks, len(vocab), vocab=shuffled), tmp_path / "othervocab")
    for stats, needle in (
        ("bigger", f"|V| = {len(vocab) + 3}"),
        ("shorter", "T = 5"),
        ("othervocab", "another vocabulary"),
    ):
        rc, out, err = run_cli(
            capsys,
            "assoc",
            "train",
            corpus,
            "--steps",
            "1",
            "--batch-size",
            "8",
            "--stats",
            tmp_path / stats,
            "--out",
            tmp_path / f"r-{stats}",
        )
        one_line_error(rc, err, needle)
        assert not (tmp_path / f"r-{stats}").exists()
    rc, out, err = run_cli(
        capsys, "assoc", "train", corpus, "--steps", "1", "--stats", "bogus", "--out", tmp_path / "r"
    )
    one_line_error(rc, err, "--stats bogus")


def test_error_run_dir_holds_other_run_and_resume(corpus, tmp_path, capsys):
    args = ["assoc", "train", corpus, "--n-layers", "1", "--steps", "2", "--batch-size", "16", "--out", tmp_path / "r"]
    rc, out, err = run_cli(capsys, *args, "--lr", "0.1")
    assert rc == 0, err
    rc, out, err = run_cli(capsys, *args, "--lr", "0.2")
    one_line_error(rc, err, "holds another run (differs in: lr)")
    rc, out, err = run_cli(capsys, *args, "--lr", "0.1")
    one_line_error(rc, err, "already holds this run")
    rc, out, err = run_cli(capsys, *args, "--lr", "0.2", "--overwrite")
    assert rc == 0, err
    assert json.loads((tmp_path / "r" / "config.json").read_text())["config"]["lr"] == 0.2


def test_error_diverging_lr_names_step_and_checkpoint(corpus, tmp_path, capsys):
    rc, out, err = run_cli(
        capsys,
        "assoc",
        "train",
        corpus,
        "--n-layers",
        "1",
        "--lr",
        "1e30",
        "--steps",
        "4",
        "--batch-size",
        "16",
        "--checkpoint-every",
        "1",
        "--out",
        tmp_path / "r",
    )
    one_line_error(rc, err, "non-finite")
    assert "at step 2" in err and "step-000001.safetensors" in err


def test_error_corrupted_checkpoint(corpus, tmp_path, capsys):
    args = [
        "assoc",
        "train",
        corpus,
        "--n-layers",
        "1",
        "--lr",
        "0.1",
        "--batch-size",
        "16",
        "--checkpoint-every",
        "1",
        "--out",
        tmp_path / "r",
    ]
    rc, out, err = run_cli(capsys, *args, "--steps", "2")
    assert rc == 0, err
    (tmp_path / "r" / "checkpoints" / "step-000002.safetensors").write_bytes(b"\x00garbage")
    rc, out, err = run_cli(capsys, *args, "--steps", "3", "--resume")
    one_line_error(rc, err, "step-000002.safetensors is not a readable safetensors file")
    rc, out, err = run_cli(capsys, "assoc", "report", tmp_path / "r", "--no-intervention", "--no-heldout")
    one_line_error(rc, err, "not a readable safetensors file")


def test_stats_none_then_report_computes_full_statistics(corpus, tmp_path, capsys):
    rc, out, err = run_cli(
        capsys,
        "assoc",
        "train",
        corpus,
        "--n-layers",
        "1",
        "--lr",
        "0.5",
        "--steps",
        "2",
        "--full-batch",
        "--stats",
        "none",
        "--dtype",
        "float64",
        "--out",
        tmp_path / "r",
    )
    assert rc == 0, err
    assert not (tmp_path / "r" / "statistics").exists()
    rc, out, err = run_cli(capsys, "assoc", "report", tmp_path / "r", "--json", "--no-intervention", "--no-heldout")
    assert rc == 0, err
    res = json.loads(out)
    assert "computed by the report" in res["run"]["stats_source"]
    # full-batch GD from zero init: after one step W_O = ηB̄ exactly (full statistics)
    assert res["checkpoints"][-1]["theory"]["W_O"]["cos"] > 0.999 and res["run"]["optimizer"] == "gd"


def test_error_inputs(tmp_path, capsys):
    np.save(tmp_path / "t.npy", np.zeros((4, 5), dtype=np.int64))
    rc, out, err = run_cli(
        capsys, "assoc", "train", "--tokens", tmp_path / "t.npy", "--steps", "1", "--out", tmp_path / "r"
    )
    one_line_error(rc, err, "--vocab-size")
    rc, out, err = run_cli(capsys, "assoc", "report", tmp_path)
    one_line_error(rc, err, "not a training run")


def test_error_device_and_foreign_directory(corpus, tmp_path, capsys):
    base = ["assoc", "train", corpus, "--n-layers", "1", "--steps", "1", "--batch-size", "16"]
    if not torch.cuda.is_available():
        rc, out, err = run_cli(capsys, *base, "--device", "cuda", "--out", tmp_path / "r")
        one_line_error(rc, err, "CUDA is unavailable")
        assert not (tmp_path / "r").exists()
    rc, out, err = run_cli(capsys, *base, "--device", "auto", "--out", tmp_path / "ok")
    assert rc == 0, err
    # a directory holding another kind of run: refused even with --overwrite, nothing deleted
    other = tmp_path / "other"
    (other / "data").mkdir(parents=True)
    (other / "config.json").write_text(json.dumps({"model": "gpt"}))
    (other / "data" / "train.npy").write_bytes(b"theirs")
    (other / "report.md").write_text("theirs")
    rc, out, err = run_cli(capsys, *base, "--out", other, "--overwrite")
    one_line_error(rc, err, "another kind of run")
    assert (other / "data" / "train.npy").read_bytes() == b"theirs" and (other / "report.md").exists()


def test_error_report_statistics_of_another_vocabulary(corpus, trained, tmp_path, capsys):
    from originlens.data import load_token_array

    toks, vocab, _ = load_token_array(corpus)
    toks = np.asarray(toks, dtype=np.int64)
    save_statistics(corpus_statistics(toks, len(vocab), vocab=list(reversed(vocab))), tmp_path / "othervocab")
    save_statistics(corpus_statistics(toks[:, :6], len(vocab), vocab=vocab), tmp_path / "shorter")
    for stats, needle in (("othervocab", "another vocabulary"), ("shorter", "T = 5")):
        rc, out, err = run_cli(
            capsys,
            "assoc",
            "report",
            trained,
            "--stats",
            tmp_path / stats,
            "--no-intervention",
            "--no-heldout",
            "--out",
            tmp_path / f"rep-{stats}",
        )
        one_line_error(rc, err, needle)
        assert not (tmp_path / f"rep-{stats}").exists()
    if not torch.cuda.is_available():
        rc, out, err = run_cli(capsys, "assoc", "report", trained, "--device", "cuda", "--out", tmp_path / "rep-gpu")
        one_line_error(rc, err, "CUDA is unavailable")
        assert not (tmp_path / "rep-gpu").exists()


def test_an_undefined_cosine_is_named_not_printed_as_nan(corpus, tmp_path, capsys):
    from originlens.cli.assoc_cmd import cosine_text

    assert cosine_text("W", float("nan")) == "W undefined (a zero matrix)"
    assert cosine_text("V", 0.99871) == "V 0.9987" and cosine_text("P", None) == "P —"
    assert main(["-q", "assoc", "train", str(corpus), "--out", str(tmp_path / "r"), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "W undefined (a zero matrix)" in out and "nan" not in out  # W is exactly 0 after two GD steps


def test_side_files_missing_after_a_kill_are_written_on_resume(corpus, tmp_path, capsys):
    run = tmp_path / "r"
    assert (
        main(["-q", "assoc", "train", str(corpus), "--out", str(run), "--steps", "2", "--checkpoint-every", "1"]) == 0
    )
    held = np.load(run / "data" / "heldout.npy")
    for name in ("heldout.npy", "source.json"):  # the state of a run killed between two side files
        (run / "data" / name).unlink()
    assert (
        main(
            [
                "-q",
                "assoc",
                "train",
                str(corpus),
                "--out",
                str(run),
                "--steps",
                "3",
                "--checkpoint-every",
                "1",
                "--resume",
            ]
        )
        == 0
    )
    assert np.array_equal(np.load(run / "data" / "heldout.npy"), held)
    assert (run / "data" / "source.json").is_file()
