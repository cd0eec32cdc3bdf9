"""CLI: `originlens stats`, `assoc top`, the demo, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from originlens.cli.main import main
from originlens.stats import corpus_statistics, load_statistics


def run_cli(capsys, *argv):
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_stats_from_npy_roundtrip(tmp_path, capsys):
    rng = np.random.default_rng(0)
    toks = rng.integers(0, 7, size=(20, 6)).astype(np.uint8)
    np.save(tmp_path / "t.npy", toks)
    rc, out, err = run_cli(
        capsys, "stats", "--tokens", str(tmp_path / "t.npy"), "--vocab-size", "7", "--out", str(tmp_path / "s")
    )
    assert rc == 0, err
    st = load_statistics(tmp_path / "s")
    ref = corpus_statistics(toks, 7)
    for k in ("bigram", "context", "interchangeability", "value_target", "query_key", "positional"):
        np.testing.assert_array_equal(getattr(st, k), getattr(ref, k))
    from safetensors import safe_open

    with safe_open(str(tmp_path / "s" / "statistics.safetensors"), "numpy") as f:
        assert sorted(f.keys()) == sorted(
            ["bigram", "interchangeability", "context", "value_target", "query_key", "positional"]
        )


def test_stats_bad_inputs_one_line(tmp_path, capsys):
    toks = np.full((3, 4), 9, dtype=np.int64)
    np.save(tmp_path / "t.npy", toks)
    cases = [
        (["stats", "--tokens", str(tmp_path / "missing.npy"), "--vocab-size", "5"], "does not exist"),
        (["stats", "--tokens", str(tmp_path / "t.npy"), "--vocab-size", "5"], "token id 9"),
        (["stats", "--tokens", str(tmp_path / "t.npy")], "--vocab-size"),
        (["stats", "--tokens", str(tmp_path / "t.npy"), "--vocab-size", "0"], "vocab"),
    ]
    for argv, needle in cases:
        rc, out, err = run_cli(capsys, *argv, "--out", str(tmp_path / "o"))
        assert rc == 2, argv
        assert err.count("\n") == 1 and err.startswith("originlens: error:") and needle in err, err
        assert "fix:" in err
        assert not (tmp_path / "o").exists()
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    rc, out, err = run_cli(
        capsys, "stats", "--tokens", str(tmp_path / "bad.npy"), "--vocab-size", "5", "--out", str(tmp_path / "o")
    )
    assert rc == 2 and err.count("\n") == 1


def test_statistics_of_another_vocabulary_refused(tmp_path):
    from originlens.errors import CompatibilityError
    from originlens.stats import save_statistics

    st = corpus_statistics(np.array([[0, 1, 2, 1]]), 3, vocab=["a", "b", "c"])
    save_statistics(st, tmp_path / "s")
    with pytest.raises(CompatibilityError, match="another vocabulary"):
        load_statistics(tmp_path / "s", expect_vocab_hash="0123456789abcdef")


def test_corpus_stats_assoc_pipeline_on_storyworld(tmp_path, capsys):
    rc, out, err = run_cli(
        capsys,
        "corpus",
        "build",
        "--stories",
        "400",
        "--vocab-size",
        "400",
        "--seq-len",
        "32",
        "--out",
        str(tmp_path / "c"),
    )
    assert rc == 0, err
    rc, out, err = run_cli(capsys, "stats", str(tmp_path / "c"), "--out", str(tmp_path / "s"))
    assert rc == 0, err
    assert (tmp_path / "s" / "vocab.json").exists() and (tmp_path / "s" / "manifest.json").exists()
    rc, out, err = run_cli(
        capsys,
        "assoc",
        "top",
        "--stats",
        str(tmp_path / "s"),
        "--basis",
        "context",
        "--word",
        "fish",
        "-k",
        "10",
        "--json",
    )
    assert rc == 0, err
    res = json.loads(out)
    row = [t for t, _ in res["fish"]["row"]]
    assert len(row) == 10 and "fish" not in row
    rc, out, err = run_cli(capsys, "assoc", "top", "--stats", str(tmp_path / "s"), "--word", "zzzz")
    assert rc == 2 and "not in the vocabulary" in err


def test_demo_on_storyworld(tmp_path, capsys):
    from originlens.demo import DemoConfig, run_demo

    path = run_demo(
        DemoConfig(
            out=str(tmp_path / "demo"),
            corpus="storyworld",
            stories=300,
            vocab_size=300,
            seq_len=32,
            stages="statistics",
            quick=True,
        )
    )
    html = path.read_text()
    assert path.name == "report.html" and "data:image/png;base64," in html and "storyworld" in html
    assert (tmp_path / "demo" / "statistics" / "statistics.safetensors").exists()
    assert json.loads((tmp_path / "demo" / "associations.json").read_text())


def test_demo_resumes_finished_stages(tmp_path, capsys, monkeypatch):
    from originlens import progress

    monkeypatch.setattr(progress, "_VERBOSITY", None)  # status lines on
    from originlens.demo import DemoConfig, run_demo

    cfg = dict(
        out=str(tmp_path / "demo"),
        corpus="storyworld",
        stories=300,
        vocab_size=300,
        seq_len=32,
        stages="statistics",
        quick=True,
    )
    first = run_demo(DemoConfig(**cfg)).read_text()
    assert (tmp_path / "demo" / "stages" / "statistics" / "done.json").is_file()
    stats_file = tmp_path / "demo" / "statistics" / "statistics.safetensors"
    mtime = stats_file.stat().st_mtime_ns
    capsys.readouterr()
    again = run_demo(DemoConfig(**cfg)).read_text()
    assert "stage statistics: finished in an earlier run" in capsys.readouterr().err
    assert stats_file.stat().st_mtime_ns == mtime  # not recomputed
    assert (
        "1. Corpus statistics" in again
        and again.count("data:image/png;base64,") == first.count("data:image/png;base64,")
        and "statistics (finished earlier)" in again
    )
    run_demo(DemoConfig(**{**cfg, "vocab_size": 280}))  # other settings: recomputed
    assert "finished in an earlier run" not in capsys.readouterr().err
    run_demo(DemoConfig(**{**cfg, "vocab_size": 280}, restart=True))  # --restart: recomputed
    assert "finished in an earlier run" not in capsys.readouterr().err


def test_demo_library_steps_keep_the_demo_verbosity(monkeypatch):
    """The demo runs its steps through the library, silenced when the demo is quiet; that must not change
    the verbosity the demo's own status lines use afterwards, even when a step fails."""
    from originlens import progress
    from originlens.demo import _quietly

    monkeypatch.setattr(progress, "_VERBOSITY", None)
    monkeypatch.setenv("CI", "1")  # automatic verbosity → quiet
    with _quietly():
        assert progress.verbosity() == 0 and progress._VERBOSITY == 0
    assert progress._VERBOSITY is None
    try:
        with _quietly():
            raise RuntimeError("a failing step")
    except RuntimeError:
        pass
    assert progress._VERBOSITY is None


def test_demo_imports_no_cli():
    """The demo is a library client: it never goes through the command line (layering)."""
    import ast
    from pathlib import Path

    import originlens.demo as demo

    tree = ast.parse(Path(demo.__file__).read_text())
    mods = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [m for m in mods if m == "cli" or m.startswith("cli.")]
