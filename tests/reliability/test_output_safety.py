"""Output safety: an output directory is new, empty, or an earlier output of the same kind — never the
input, a parent of the input, or a foreign directory (whose files would be replaced)."""

from __future__ import annotations

from pathlib import Path

import pytest

from originlens.cli.main import main as cli_main
from originlens.errors import OriginlensError
from originlens.outputs import OutputKind, atomic_directory, check_output_directory


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


MARKED = OutputKind(
    "marked output",
    "marker",
    ("marker", "data.bin", "sub/*"),
    invalid=lambda p: None if p.read_text() == "ok" else "its content is not 'ok'",
)


def test_check_output_directory_rules(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OriginlensError, match="is a file, not a marked output directory"):
        check_output_directory(tmp_path / "file", output=MARKED)
    assert check_output_directory(tmp_path / "new", output=MARKED) == tmp_path / "new"  # absent: fine
    ours = tmp_path / "ours"
    (ours / "sub").mkdir(parents=True)
    (ours / "marker").write_text("ok")
    (ours / "data.bin").write_bytes(b"1")
    (ours / "sub" / "deep.json").write_text("{}")
    assert check_output_directory(ours, output=MARKED) == ours  # every file is the command's own
    (tmp_path / "link").symlink_to(ours)
    assert check_output_directory(tmp_path / "link", output=MARKED) == ours.resolve()  # a link is followed
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(OriginlensError, match="symbolic link to .*nowhere, which does not exist"):
        check_output_directory(tmp_path / "dangling", output=MARKED)


def test_a_foreign_file_is_never_deleted_and_the_refusal_lists_it(tmp_path):
    ours = tmp_path / "ours"
    ours.mkdir()
    (ours / "marker").write_text("ok")
    (ours / "thesis.tex").write_text("important")
    with pytest.raises(OriginlensError, match="not part of a marked output: thesis.tex; replacing it would delete"):
        check_output_directory(ours, output=MARKED)
    with pytest.raises(OriginlensError, match="thesis.tex"), atomic_directory(ours, output=MARKED) as d:
        (d / "marker").write_text("ok")
    assert (ours / "thesis.tex").read_text() == "important"


def test_a_file_that_merely_has_the_markers_name_is_not_an_earlier_output(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "marker").write_text("")
    with pytest.raises(
        OriginlensError, match="its marker is not one \\(its content is not 'ok'\\); replacing it would delete marker"
    ):
        check_output_directory(fake, output=MARKED)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    with pytest.raises(OriginlensError, match="no marker in it\\); replacing it would delete notes.txt"):
        check_output_directory(tmp_path / "plain", output=MARKED)


def test_the_issue_case_an_empty_statistics_file_beside_a_thesis(corpus, tmp_path, capsys):
    """``: > fake/statistics.safetensors; echo important > fake/thesis.tex; originlens stats C --out fake``."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "statistics.safetensors").write_bytes(b"")
    (fake / "thesis.tex").write_text("important\n")
    before = _files(fake)
    assert cli_main(["-q", "stats", str(corpus), "--out", str(fake)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("originlens: error: ") and " — fix: " in err[0]
    assert "statistics.safetensors is not one" in err[0] and "thesis.tex" in err[0]
    assert _files(fake) == before


def test_stats_through_a_link_to_its_earlier_output_replaces_the_target(corpus, tmp_path):
    """The false refusal of ``--out LINK`` (LINK → a real statistics output) is gone: the target is
    replaced and the link keeps pointing at it."""
    real = tmp_path / "real"
    assert cli_main(["-q", "stats", str(corpus), "--out", str(real)]) == 0
    link = tmp_path / "LINK"
    link.symlink_to(real)
    first = (real / "statistics.safetensors").read_bytes()
    assert cli_main(["-q", "stats", str(corpus), "--max-windows", "10", "--out", str(link)]) == 0
    assert link.is_symlink() and (real / "statistics.safetensors").read_bytes() != first
    assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name or ".old-" in p.name]


def test_corpus_build_never_replaces_a_directory_holding_other_files(corpus, capsys):
    (corpus / "notes.md").write_text("mine")
    before = _files(corpus)
    rc = cli_main(["-q", "corpus", "build", "--out", str(corpus), "--stories", "20", "--oov", "unk", "--overwrite"])
    assert rc == 2 and "notes.md" in capsys.readouterr().err
    assert _files(corpus) == before
