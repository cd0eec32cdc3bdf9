"""Every command that writes into a run or an output directory, pointed at a read-only one, ends with one
clear error line (status 2), never a traceback, and leaves what was there untouched (issue: read-only
inputs and outputs).  Root ignores permission bits, so the ``read_only`` fixture also sets the immutable
attribute; the whole tree is made read-only, as a run copied from a read-only share would be."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from originlens.cli.main import main as cli_main

NTP = [
    "ntp",
    "train",
    "--task",
    "cond-majority",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--batch-size",
    "16",
    "--steps",
    "6",
    "--eval-size",
    "64",
    "--log-every",
    "1",
    "--eval-every",
    "0",
    "--probe-every",
    "0",
    "--checkpoint-every",
    "2",
    "--threads",
    "1",
]


def _tree_read_only(read_only, root: Path) -> None:
    for d, _, _ in sorted(os.walk(root), key=lambda x: -len(x[0])):
        read_only(Path(d))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line_error(rc: int, err: str) -> None:
    assert rc == 2, err
    assert err.startswith("originlens: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert "read-only" in err or "cannot write" in err or "permission" in err.lower(), err


@pytest.fixture(scope="module")
def ntp_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("ro") / "ntp"
    assert cli_main(["-q", *NTP, "--out", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def assoc_run(tmp_path_factory):
    from originlens.data import build_corpus

    base = tmp_path_factory.mktemp("ro-assoc")
    build_corpus(None, base / "corpus", storyworld_stories=120, vocab_size=80, seq_len=10, oov="unk")
    run = base / "assoc"
    assert (
        cli_main(
            [
                "-q",
                "assoc",
                "train",
                str(base / "corpus"),
                "--n-layers",
                "2",
                "--lr",
                "0.5",
                "--steps",
                "4",
                "--batch-size",
                "32",
                "--holdout",
                "10",
                "--threads",
                "1",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    return run


@pytest.fixture(scope="module")
def gpt_files(tmp_path_factory):
    import torch

    from originlens.models import GPT, GPTConfig

    d = tmp_path_factory.mktemp("ro-lm")
    torch.manual_seed(0)
    GPT(GPTConfig(vocab_size=13, seq_len=24, n_layer=2, d_model=16, n_head=4)).save(d / "gpt.safetensors")
    np.save(d / "toks.npy", np.random.default_rng(0).integers(1, 13, size=(30, 20)).astype(np.uint16))
    assert (
        cli_main(
            [
                "-q",
                "sae",
                "train",
                "--model",
                str(d / "gpt.safetensors"),
                "--corpus",
                str(d / "toks.npy"),
                "--steps",
                "5",
                "--batch-size",
                "64",
                "--d-sae",
                "16",
                "--architecture",
                "topk",
                "--k",
                "3",
                "--site",
                "resid.1",
                "--out",
                str(d / "sae-run"),
            ]
        )
        == 0
    )
    return d


@pytest.mark.slow
def test_ntp_attribute_into_a_read_only_run(ntp_run, tmp_path, read_only, capsys):
    import shutil

    run = tmp_path / "ntp"
    shutil.copytree(ntp_run, run)
    before = _snapshot(run)
    _tree_read_only(read_only, run)
    capsys.readouterr()
    rc = cli_main(["-q", "ntp", "attribute", str(run), "--sites", "1:3", "--features", "all", "--threads", "1"])
    _one_line_error(rc, capsys.readouterr().err)
    assert _snapshot(run) == before
    # the same run attributed into a writable --out works: the run itself is only read
    assert (
        cli_main(
            [
                "-q",
                "ntp",
                "attribute",
                str(run),
                "--sites",
                "1:3",
                "--features",
                "all",
                "--threads",
                "1",
                "--segment",
                "0:2",
                "--out",
                str(tmp_path / "attr"),
            ]
        )
        == 0
    )


@pytest.mark.slow
def test_ntp_train_resume_of_a_read_only_run(ntp_run, tmp_path, read_only, capsys):
    import shutil

    run = tmp_path / "ntp"
    shutil.copytree(ntp_run, run)
    before = _snapshot(run)
    _tree_read_only(read_only, run)
    capsys.readouterr()
    rc = cli_main(["-q", *[a if a != "6" else "8" for a in NTP], "--out", str(run), "--resume"])
    _one_line_error(rc, capsys.readouterr().err)
    assert _snapshot(run) == before


@pytest.mark.slow
def test_assoc_report_and_train_resume_of_a_read_only_run(assoc_run, tmp_path, read_only, capsys):
    import shutil

    run = tmp_path / "assoc"
    shutil.copytree(assoc_run, run)
    before = _snapshot(run)
    _tree_read_only(read_only, run)
    capsys.readouterr()
    rc = cli_main(
        [
            "-q",
            "assoc",
            "report",
            str(run),
            "--eval-windows",
            "16",
            "--null-windows",
            "16",
            "--batch-size",
            "16",
            "--threads",
            "1",
        ]
    )
    _one_line_error(rc, capsys.readouterr().err)
    rc = cli_main(
        ["-q", "assoc", "train", "--resume", str(run.parent / "missing-corpus"), "--out", str(run), "--steps", "6"]
    )
    assert rc == 2 and "Traceback" not in capsys.readouterr().err
    assert _snapshot(run) == before


@pytest.mark.slow
@pytest.mark.parametrize("command", ["sae train", "lm qscore", "stats"])
def test_outputs_under_a_read_only_parent(command, gpt_files, tmp_path, read_only, capsys):
    d = gpt_files
    parent = tmp_path / "ro"
    parent.mkdir()
    read_only(parent)
    out = str(parent / "out")
    if command == "sae train":
        args = [
            "sae",
            "train",
            "--model",
            str(d / "gpt.safetensors"),
            "--corpus",
            str(d / "toks.npy"),
            "--steps",
            "3",
            "--batch-size",
            "64",
            "--d-sae",
            "16",
            "--architecture",
            "topk",
            "--k",
            "3",
            "--site",
            "resid.1",
            "--out",
            out,
        ]
    elif command == "lm qscore":
        args = [
            "lm",
            "qscore",
            "--model",
            str(d / "gpt.safetensors"),
            "--corpus",
            str(d / "toks.npy"),
            "--sae",
            str(d / "sae-run"),
            "--features",
            "0-3",
            "--contexts",
            "2",
            "--max-offset",
            "3",
            "--min-total-kl",
            "0",
            "--out",
            out,
        ]
    else:
        from originlens.data import build_corpus

        build_corpus(None, tmp_path / "corpus", storyworld_stories=60, vocab_size=60, seq_len=8, oov="unk")
        args = ["stats", str(tmp_path / "corpus"), "--out", out]
    capsys.readouterr()
    _one_line_error(cli_main(["-q", *args]), capsys.readouterr().err)
    assert not any(parent.iterdir())
