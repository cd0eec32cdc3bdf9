"""``originlens corpus build|info`` through the real entry point (only the corpus commands registered)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import originlens.cli.main as cli


@pytest.fixture(autouse=True)
def only_corpus_commands(monkeypatch):
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["originlens.cli.corpus_cmd"])


def run(capsys, *argv):
    rc = cli.main(["-q", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_build_storyworld_and_info(tmp_path, capsys):
    rc, out, err = run(
        capsys,
        "corpus",
        "build",
        "--stories",
        30,
        "--seed",
        2,
        "--vocab-size",
        400,
        "--seq-len",
        32,
        "--out",
        tmp_path / "sw",
    )
    assert rc == 0, err
    assert "storyworld" in out and "30 stories, seed 2" in out
    assert "30 x 33 tokens" in out
    assert np.load(tmp_path / "sw" / "tokens.npy").shape == (30, 33)
    rc, out, _ = run(capsys, "corpus", "info", tmp_path / "sw")
    assert rc == 0 and "30 x 33 tokens" in out and "|V| =" in out and "dropped: oov 0, too_short 0" in out
    rc, out, _ = run(capsys, "corpus", "info", tmp_path / "sw", "--json")
    assert json.loads(out)["seq_len"] == 32


def test_build_from_files_with_options(tmp_path, capsys):
    src = tmp_path / "data.jsonl"
    src.write_text("\n".join(json.dumps({"body": f"the cat sat on the mat number {'one ' * i}"}) for i in range(1, 8)))
    rc, out, err = run(
        capsys,
        "corpus",
        "build",
        src,
        "--text-field",
        "body",
        "--windows",
        "pack",
        "--oov",
        "unk",
        "--vocab-size",
        8,
        "--seq-len",
        5,
        "--max-windows",
        4,
        "--out",
        tmp_path / "c",
    )
    assert rc == 0, err
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert (m["windows"], m["oov"], m["text_field"], m["shape"]) == ("pack", "unk", "body", [4, 6])
    assert "stopped at --max-windows 4" in out


def test_build_warns_what_it_dropped_and_how_to_keep_it(tmp_path, capsys):
    src = tmp_path / "d.txt"
    # 6 documents: 2 too short for T + 1 = 6 tokens, 2 with a word outside the top-3 vocabulary (a, b, c)
    src.write_text("a b c a b c a\n\na b c a b c\n\na b\n\nb c\n\na b c zebra a b c\n\na yak b c a b c\n")
    rc, out, err = run(
        capsys,
        "corpus",
        "build",
        src,
        "--vocab-size",
        3,
        "--seq-len",
        5,
        "--split-mode",
        "blank",
        "--out",
        tmp_path / "c",
    )
    assert rc == 0, err
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    d = m["counts"]["documents_dropped"]
    line = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(line) == 1, err
    assert d["oov"] >= 1 and d["too_short"] >= 1, d
    total = d["oov"] + d["too_short"]
    assert total > 0 and f"{total} of {m['counts']['documents_read']} documents" in line[0]
    if d["oov"]:
        assert f"{d['oov']} oov (--oov unk" in line[0]
    if d["too_short"]:
        assert f"{d['too_short']} too short (--windows pack" in line[0]
    rc, out, err = run(
        capsys,
        "corpus",
        "build",
        src,
        "--vocab-size",
        3,
        "--seq-len",
        5,
        "--split-mode",
        "blank",
        "--oov",
        "unk",
        "--windows",
        "pack",
        "--out",
        tmp_path / "kept",
    )
    assert rc == 0 and "warning:" not in err  # nothing dropped: no warning


def test_errors_are_one_line(tmp_path, capsys):
    rc, out, err = run(capsys, "corpus", "build", tmp_path / "missing.txt", "--out", tmp_path / "c")
    assert rc == 2 and err.startswith("originlens: error:") and err.count("\n") == 1
    assert "does not exist" in err and "Traceback" not in err
    (tmp_path / "a.txt").write_text("one two three\n")
    rc, _, err = run(capsys, "corpus", "build", tmp_path / "a.txt", "--seq-len", 10, "--out", tmp_path / "c")
    assert rc == 2 and "longest document has 3 tokens" in err and not (tmp_path / "c").exists()
    rc, _, err = run(capsys, "corpus", "build", tmp_path / "a.txt", "--stories", 3, "--out", tmp_path / "c")
    assert rc == 2 and "--stories only applies" in err
    rc, _, err = run(capsys, "corpus", "info", tmp_path)
    assert rc == 2 and "not a corpus directory" in err
    run(capsys, "corpus", "build", tmp_path / "a.txt", "--seq-len", 2, "--out", tmp_path / "c")
    rc, _, err = run(capsys, "corpus", "build", tmp_path / "a.txt", "--seq-len", 2, "--out", tmp_path / "c")
    assert rc == 2 and "--overwrite" in err
    rc, _, err = run(
        capsys, "corpus", "build", tmp_path / "a.txt", "--seq-len", 1, "--out", tmp_path / "c", "--overwrite"
    )
    assert rc == 0


def test_help_texts(capsys):
    for argv in (["corpus", "--help"], ["corpus", "build", "--help"], ["corpus", "info", "--help"]):
        with pytest.raises(SystemExit) as e:
            cli.main(argv)
        assert e.value.code == 0
    out = capsys.readouterr().out
    for needle in ("--vocab-size", "--seq-len", "--windows", "--oov", "hf:NAME", "storyworld", "tokens.npy"):
        assert needle in out
    assert cli.main(["corpus"]) == 2  # no action: help, non-zero
