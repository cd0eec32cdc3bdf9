"""Values that used to be accepted silently or to end in a traceback: each is now one clear error line
(``originlens: error: ... — fix: ...`` with status 2, or an argparse usage line with status 2)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from originlens.cli.main import main


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad-values")
    assert (
        main(
            [
                "-q",
                "corpus",
                "build",
                "--stories",
                "20",
                "--vocab-size",
                "100",
                "--seq-len",
                "16",
                "--oov",
                "unk",
                "--out",
                str(d / "c"),
            ]
        )
        == 0
    )
    assert main(["-q", "stats", str(d / "c"), "--out", str(d / "s")]) == 0
    return d


def one_error_line(capsys, argv, *, usage: bool = False) -> str:
    if usage:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    else:
        assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith(("usage:", " "))]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--chunk-size", "0"], "chunk size must be an integer ≥ 1"),
        (["--pad-id", "100"], "pad id 100 is not a token id of this vocabulary (0..99)"),
        (["--pad-id", "-1"], "pad id -1 is not a token id"),
    ],
)
def test_stats_values(corpus, capsys, flags, needle, tmp_path):
    line = one_error_line(capsys, ["-q", "stats", str(corpus / "c"), "--out", str(tmp_path / "s"), *flags])
    assert needle in line and " — fix: " in line
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_centering_must_be_finite(corpus, capsys, value, tmp_path):
    line = one_error_line(
        capsys, ["-q", "stats", str(corpus / "c"), "--out", str(tmp_path / "s"), f"--centering={value}"], usage=True
    )
    assert "--centering: expected a finite number" in line


def test_library_rejects_a_non_finite_centering():
    from originlens.errors import ConfigError
    from originlens.stats import corpus_statistics

    with pytest.raises(ConfigError, match="centering must be a finite number"):
        corpus_statistics(np.zeros((2, 5), dtype=np.int64), 4, centering=float("nan"))


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--lr", "3e37"], "lr must be a positive number ≤ 1e30"),
        (["--lr", "nan"], "lr must be a positive number"),
        (["--eps", "0"], "eps must be a positive number"),
        (["--probe-alpha", "nan"], "a finite probe_alpha ≥ 0"),
        (["--probe-alpha", "-1"], "a finite probe_alpha ≥ 0"),
    ],
)
def test_ntp_train_values(capsys, flags, needle, tmp_path):
    line = one_error_line(
        capsys,
        [
            "-q",
            "ntp",
            "train",
            "--task",
            "majority",
            "--steps",
            "2",
            "--d-model",
            "16",
            "--batch-size",
            "8",
            "--out",
            str(tmp_path / "r"),
            *flags,
        ],
    )
    assert needle in line
    assert not (tmp_path / "r" / "config.json").exists()


def test_bpe_vocabulary_smaller_than_the_alphabet(capsys, tmp_path):
    line = one_error_line(
        capsys,
        [
            "-q",
            "corpus",
            "build",
            "--stories",
            "20",
            "--tokenizer",
            "bpe",
            "--vocab-size",
            "5",
            "--seq-len",
            "16",
            "--out",
            str(tmp_path / "c"),
        ],
    )
    assert "a BPE vocabulary of 5 ids cannot cover this text" in line and "--vocab-size ≥ " in line
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["lm", "generate", "--model", "M", "--prompt", "Once \udcff\udcfe upon"],
        ["assoc", "top", "--stats", "S", "--word", "\udcff"],
    ],
)
def test_text_arguments_must_be_utf8(capsys, argv):
    # how Python passes the bytes b"\xff\xfe" of a non-UTF-8 command line
    line = one_error_line(capsys, ["-q", *argv], usage=True)
    assert "not valid UTF-8 text" in line


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("vocab_size", "abc", "vocab_size = 'abc' (expected an integer ≥ 1)"),
        ("centering", "xyz", "centering = 'xyz' (expected a finite number)"),
        ("centering", "NaN", "centering = nan"),
        ("unigram", "[1,2", "unigram = '[1,2' (expected 100 numbers)"),
        ("token_ids", "[0, 1]", "token_ids = '[0, 1]' (expected 100 numbers in 0..99)"),
        ("seq_len", None, "lacks the metadata field 'seq_len'"),
        ("meta", "notjson", "meta = 'notjson'"),
        ("n_pairs", "-5", "n_pairs = -5"),
        ("size", "7", "size = 7 with 100×100 matrices"),
        ("vocab_size", "5", "vocab_size 5"),
    ],
)
def test_malformed_statistics_metadata(corpus, capsys, tmp_path, key, value, needle):
    src = corpus / "s" / "statistics.safetensors"
    out = tmp_path / "s"
    out.mkdir()
    (out / "vocab.json").write_text((corpus / "s" / "vocab.json").read_text())
    with safe_open(str(src), "np") as h:
        meta = dict(h.metadata())
    if value is None:
        meta.pop(key)
    else:
        meta[key] = value
    save_file(load_file(str(src)), str(out / "statistics.safetensors"), metadata=meta)
    word = json.loads((out / "vocab.json").read_text())[5]
    line = one_error_line(capsys, ["-q", "assoc", "top", "--stats", str(out), "--word", word])
    assert needle in line and "recompute it with `originlens stats`" in line


def test_a_capitalised_word_points_to_its_lower_case_form(corpus, capsys):
    vocab = json.loads((corpus / "s" / "vocab.json").read_text())
    word = next(w for w in vocab if w.isalpha() and len(w) > 2)
    line = one_error_line(capsys, ["-q", "assoc", "top", "--stats", str(corpus / "s"), "--word", word.capitalize()])
    assert f"but '{word}' is" in line and "lower-cases every word" in line


def test_devices_are_named_once_and_cuda_on_a_cpu_build_is_one_line(tmp_path, capsys):
    """Every ``--device`` takes cpu | cuda | cuda:N | auto (checked when parsing); CUDA asked for where torch
    has none is one error line before anything loads; ``auto`` falls back to the CPU everywhere, the NTP
    config included."""
    import torch

    from originlens.cli.main import main
    from originlens.devices import check_device_spec, resolve_device
    from originlens.errors import ConfigError
    from originlens.train.ntp import NTPConfig

    assert check_device_spec(" CUDA:1 ") == "cuda:1"
    with pytest.raises(ConfigError, match="unknown device"):
        check_device_spec("gpu")
    NTPConfig(task="majority", device="auto").validate() if hasattr(NTPConfig, "validate") else NTPConfig(
        task="majority", device="auto"
    )
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert resolve_device("auto") == torch.device("cpu")
    for args in (
        [
            "lm",
            "qscore",
            "--model",
            str(tmp_path / "m"),
            "--corpus",
            str(tmp_path / "c"),
            "--sae",
            str(tmp_path / "s"),
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "q"),
        ],
        [
            "lm",
            "compare",
            "--model",
            str(tmp_path / "m"),
            "--corpus",
            str(tmp_path / "c"),
            "--device",
            "cuda",
            "--out",
            str(tmp_path / "c2"),
        ],
        ["ntp", "train", "--task", "majority", "--steps", "1", "--device", "cuda", "--out", str(tmp_path / "n")],
    ):
        capsys.readouterr()
        assert main(["-q", *args]) == 2
        err = capsys.readouterr().err
        assert "CUDA is unavailable" in err and err.count("\n") == 1 and "Traceback" not in err, err
    for cmd in (["ntp", "train", "--task", "majority"], ["ntp", "attribute", "x"], ["assoc", "report", "x"]):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--device", "tpu", "--out", str(tmp_path / "z")])
        assert e.value.code == 2 and "unknown device" in capsys.readouterr().err
