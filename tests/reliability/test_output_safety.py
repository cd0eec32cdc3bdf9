"""Output safety: an output directory is new, empty, or an earlier output of the same kind — never the
input, a parent of the input, or a foreign directory (whose files would be replaced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from originlens.cli.main import main as cli_main
from originlens.errors import OriginlensError
from originlens.storage import atomic_directory, check_output_directory


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture()
def corpus(tmp_path):
    from originlens.data import build_corpus

    d = tmp_path / "corpus"
    build_corpus(None, d, storyworld_stories=60, vocab_size=60, seq_len=8, oov="unk")
    return d


def test_stats_into_its_own_corpus_is_refused_and_the_corpus_survives(corpus, capsys):
    before = _files(corpus)
    assert cli_main(["-q", "stats", str(corpus), "--out", str(corpus)]) != 0
    assert "would delete the input" in capsys.readouterr().err
    assert _files(corpus) == before


def test_stats_into_a_parent_of_the_corpus_is_refused(corpus, capsys):
    before = _files(corpus.parent)
    assert cli_main(["-q", "stats", str(corpus), "--out", str(corpus.parent)]) != 0
    assert "parent of the input" in capsys.readouterr().err
    assert _files(corpus.parent) == before


def test_stats_never_replaces_a_foreign_directory(corpus, tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my notes")
    assert cli_main(["-q", "stats", str(corpus), "--out", str(foreign)]) != 0
    assert "is not a statistics output" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "my notes" and len(list(foreign.iterdir())) == 1


def test_stats_replaces_an_earlier_statistics_output_and_accepts_an_empty_directory(corpus, tmp_path):
    out = tmp_path / "stats"
    out.mkdir()
    assert cli_main(["-q", "stats", str(corpus), "--out", str(out)]) == 0
    first = (out / "statistics.safetensors").read_bytes()
    assert cli_main(["-q", "stats", str(corpus), "--max-windows", "10", "--out", str(out)]) == 0
    assert (out / "statistics.safetensors").read_bytes() != first


def test_corpus_build_refuses_an_output_holding_its_source(corpus):
    """Even an earlier corpus directory is not replaced when the new build reads a file inside it."""
    from originlens.data import build_corpus

    (corpus / "extra.txt").write_text("the cat sat on the mat . " * 50)
    before = _files(corpus)
    with pytest.raises(OriginlensError, match="would delete the input"):
        build_corpus([corpus / "extra.txt"], corpus, vocab_size=20, seq_len=4, overwrite=True)
    assert _files(corpus) == before


def test_check_output_directory_rules(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OriginlensError, match="is not a"):
        check_output_directory(tmp_path / "file", kind_file="marker")
    (tmp_path / "link").symlink_to(tmp_path)
    with pytest.raises(OriginlensError, match="is not a"):
        check_output_directory(tmp_path / "link", kind_file="marker")
    check_output_directory(tmp_path / "new", kind_file="marker")  # absent: fine
    (tmp_path / "ours").mkdir()
    (tmp_path / "ours" / "marker").write_text("")
    check_output_directory(tmp_path / "ours", kind_file="marker")  # same kind: fine
    with pytest.raises(OriginlensError, match="refusing"), atomic_directory(tmp_path, kind_file="marker"):
        pass
