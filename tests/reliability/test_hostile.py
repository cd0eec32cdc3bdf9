"""Hostile inputs, concurrent writers and faults, each through the real CLI: status 2, one line
``originlens: error: … — fix: …``, no traceback, nothing lost (every file that was there before is there,
byte for byte, afterwards), and a pickle is never unpickled.

docs/reliability.md states the counts this module tries (:data:`BAD_INPUTS`, one concurrent writer per
writing command); ``test_docs_state_the_counts`` keeps them in agreement.  The other faults of the same
list live beside it, each once: a learning rate that makes the loss NaN (``test_numerical_health.py``:
one line naming the update, the last good checkpoint kept and resumable), SIGTERM mid-run
(``test_kill_resume.py``: one line, bit-identical resume), output directories that are not the
command's own (``test_output_safety.py``)."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import pickle
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from originlens.cli.main import build_parser
from originlens.cli.main import main as cli_main

from ._helpers import SUBPROCESS_ENV

REPO = Path(__file__).resolve().parents[2]


class _Unpickled:
    """Unpickling this writes the file ``MARKER`` (so a test sees whether anything unpickled it)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A corpus and its statistics (built once); each case works on a copy."""
    w = tmp_path_factory.mktemp("hostile")
    argv = ["corpus", "build", "--stories", "40", "--vocab-size", "60", "--seq-len", "8", "--oov", "unk"]
    assert cli_main(["-q", *argv, "--out", str(w / "corpus")]) == 0
    assert cli_main(["-q", "stats", str(w / "corpus"), "--out", str(w / "stats")]) == 0
    return w


def _snapshot(root: Path) -> dict[str, str]:
    """Every file below ``root`` (but lock files, which writers leave by design) → its SHA-256."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def _one_error_line(argv: list[str]) -> str:
    """Run ``argv`` in-process; assert status 2 and exactly one ``originlens: error: … — fix: …`` line (a
    traceback would escape as an exception and fail the test)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = cli_main(["-q", *argv])
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, (rc, err.getvalue())
    assert lines[0].startswith("originlens: error: ") and " — fix: " in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------------------------------------------
# bad input: each builds its input inside ``case`` and returns (argv, what the error line must say)


def _statistics_variant(world: Path, case: Path, edit) -> Path:
    d = case / "stats"
    shutil.copytree(world / "stats", d)
    edit(d / "statistics.safetensors")
    return d


def _rewrite(path: Path, change) -> None:
    arrays = load_file(str(path))
    with safe_open(str(path), "numpy") as f:
        meta = f.metadata()
    save_file(change(arrays), str(path), metadata=meta)


def _top(d: Path) -> list[str]:
    return ["assoc", "top", "--stats", str(d), "--word", "the"]


def bad_statistics(kind: str):
    def build(world: Path, case: Path) -> tuple[list[str], str]:
        edits = {
            "zero-byte": lambda p: p.write_bytes(b""),
            "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
            "wrong-shape": lambda p: _rewrite(p, lambda a: {**a, "bigram": a["bigram"][:3]}),
            "wrong-dtype": lambda p: _rewrite(p, lambda a: {**a, "bigram": a["bigram"].astype(np.int32)}),
            "missing-key": lambda p: _rewrite(p, lambda a: {k: v for k, v in a.items() if k != "bigram"}),
            "pickle": lambda p: p.write_bytes(pickle.dumps(_Unpickled(case / "UNPICKLED"))),
        }
        return _top(_statistics_variant(world, case, edits[kind])), "statistics.safetensors"

    return build


def pickle_as_pt(world: Path, case: Path) -> tuple[list[str], str]:
    (case / "model.pt").write_bytes(pickle.dumps(_Unpickled(case / "UNPICKLED")))
    return ["lm", "export", "--model", str(case / "model.pt"), "--out", str(case / "hf")], "model.pt"


def corpus_of(kind: str):
    def build(world: Path, case: Path) -> tuple[list[str], str]:
        f = case / "text.txt"
        if kind == "invalid-utf8":
            f.write_bytes(b"the cat \xff\xfe sat on the mat .\n" * 20)
        elif kind == "empty":
            f.write_bytes(b"")
        else:  # one line of 8 MB without a separator: one word, no window of T+1 tokens
            f.write_bytes(b"a" * (8 << 20))
        needle = "longest document has 1 tokens" if kind == "single-huge-line" else "text.txt"
        return ["corpus", "build", str(f), "--out", str(case / "c")], needle

    return build


def config_not_json(world: Path, case: Path) -> tuple[list[str], str]:
    run = case / "run"
    run.mkdir()
    (run / "config.json").write_text("{task: majority,", encoding="utf-8")
    return ["ntp", "train", "--task", "majority", "--out", str(run), "--resume"], "config.json"


def non_positive(command: str, flag: str):
    def build(world: Path, case: Path) -> tuple[list[str], str]:
        if command == "ntp":
            head = ["ntp", "train", "--task", "majority", "--out", str(case / "r")]
        else:
            head = ["assoc", "train", str(world / "corpus"), "--out", str(case / "r")]
            head += ["--epochs", "1"] if flag == "--batch-size" else []
        return [*head, flag, "0"], flag.lstrip("-").replace("-", "_")

    return build


BAD_INPUTS = {
    **{f"statistics-{k}": bad_statistics(k) for k in ("zero-byte", "truncated", "wrong-shape")},
    **{f"statistics-{k}": bad_statistics(k) for k in ("wrong-dtype", "missing-key", "pickle")},
    "pickle-as-pt": pickle_as_pt,
    **{f"corpus-{k}": corpus_of(k) for k in ("invalid-utf8", "empty", "single-huge-line")},
    "config-not-json": config_not_json,
    "ntp-steps-0": non_positive("ntp", "--steps"),
    "ntp-batch-size-0": non_positive("ntp", "--batch-size"),
    "assoc-steps-0": non_positive("assoc", "--steps"),
    "assoc-batch-size-0": non_positive("assoc", "--batch-size"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_nothing_is_lost(world, tmp_path, name):
    case = tmp_path / "case"
    case.mkdir()
    argv, needle = BAD_INPUTS[name](world, case)
    before, world_before = _snapshot(case), _snapshot(world)
    line = _one_error_line(argv)
    needle_in = needle in line or needle.replace("_", "-") in line
    assert needle_in, f"{name}: the error should name {needle!r}: {line}"
    assert _snapshot(case) == before and _snapshot(world) == world_before
    assert not (case / "UNPICKLED").exists(), "a pickle was unpickled"


def test_a_path_with_spaces_and_unicode_works(world, tmp_path):
    """Not an error: a corpus and an output under ``dir with spaces/ünïcødé ✓``."""
    d = tmp_path / "dir with spaces" / "ünïcødé ✓"
    shutil.copytree(world / "corpus", d / "corpus")
    assert cli_main(["-q", "stats", str(d / "corpus"), "--out", str(d / "stats")]) == 0
    assert (d / "stats" / "statistics.safetensors").is_file()


# ---------------------------------------------------------------------------------------------------
# two writers: for every command that writes, a second process holds what it declares it writes


def _leaves(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from _leaves(sub, (*prefix, name))
            return
    yield prefix, parser


def _argv_for(words: tuple[str, ...], parser: argparse.ArgumentParser, root: Path) -> list[str]:
    """The shortest command line that parses: every required argument filled (paths below ``root``)."""
    argv = list(words)
    for a in parser._actions:
        if not a.required or isinstance(a, argparse._HelpAction):
            continue
        value = (a.choices and next(iter(a.choices))) or (str(root / a.dest) if a.type in (None, str) else "1")
        value = str(root / "out") if a.dest == "out" else str(value)
        argv += ([a.option_strings[0]] if a.option_strings else []) + [value]
    for group in parser._mutually_exclusive_groups:
        if group.required:  # e.g. assoc train's --steps | --epochs
            argv += [group._group_actions[0].option_strings[0], "1"]
    if "--out" not in argv and any(a.dest == "out" for a in parser._actions):
        argv += ["--out", str(root / "out")]
    return argv


def writing_commands() -> dict[str, list[str]]:
    out = {}
    for words, parser in _leaves(build_parser()):
        argv = _argv_for(words, parser, Path("/ROOT"))
        if parser.get_default("writes")(build_parser().parse_args(argv)):
            out[" ".join(words)] = argv
    return out


def test_every_command_declares_what_it_writes():
    missing = [" ".join(w) for w, p in _leaves(build_parser()) if p.get_default("writes") is None]
    assert missing == [], f"set_defaults(writes=...) missing for: {missing}"
    assert len(writing_commands()) >= 25  # all but the read-only ones (corpus info, assoc top, lm generate, sae info)


HOLDER = """
import sys, time
from originlens.locks import hold_path
for p in sys.argv[1:]:
    hold_path(p)
print("held", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("command", sorted(writing_commands()))
def test_a_second_writer_is_refused_with_one_line(tmp_path, command):
    argv = [str(tmp_path) + a[len("/ROOT") :] if a.startswith("/ROOT") else a for a in writing_commands()[command]]
    paths = [str(p) for p in build_parser().parse_args(argv).writes(build_parser().parse_args(argv)) if p]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("mine")
    before = _snapshot(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", HOLDER, *paths], stdout=subprocess.PIPE, text=True, env=SUBPROCESS_ENV)
    try:
        assert p.stdout.readline().strip() == "held"
        line = _one_error_line(argv)
        assert f"is being written by another process (pid {p.pid} on " in line, line
    finally:
        p.kill()
        p.wait()
    assert _snapshot(tmp_path) == before


# ---------------------------------------------------------------------------------------------------
# faults


def _limited(limit_bytes: int):
    def set_limit() -> None:  # Python ignores SIGXFSZ, so a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return set_limit


NTP = ["ntp", "train", "--task", "majority", "--d-model", "16", "--n-layer", "1", "--heads", "2"]
NTP += ["--batch-size", "8", "--checkpoint-every", "2", "--eval-every", "2", "--probe-every", "0", "--threads", "1"]


def _cli(args: list[str], preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "originlens", "-q", *args],
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
    )


@pytest.mark.slow
def test_a_write_cut_short_by_a_file_size_limit_keeps_the_checkpoint_and_resume_works(tmp_path):
    run, ref = tmp_path / "run", tmp_path / "ref"
    assert _cli([*NTP, "--steps", "2", "--out", str(run)]).returncode == 0
    ck = sorted((run / "checkpoints").glob("step-*.safetensors"))[-1]
    kept = ck.read_bytes()
    p = _cli([*NTP, "--steps", "4", "--out", str(run), "--resume"], preexec=_limited(ck.stat().st_size // 2))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("originlens: error: "), p.stderr
    assert "Traceback" not in p.stderr and ck.read_bytes() == kept
    load_file(str(ck))  # still loadable
    assert _cli([*NTP, "--steps", "4", "--out", str(run), "--resume"]).returncode == 0
    assert _cli([*NTP, "--steps", "4", "--out", str(ref)]).returncode == 0
    last = "step-000004.safetensors"
    a, b = load_file(str(run / "checkpoints" / last)), load_file(str(ref / "checkpoints" / last))
    assert all(a[k].tobytes() == b[k].tobytes() for k in b)  # the resumed run equals an uninterrupted one


@pytest.mark.slow
def test_statistics_cut_short_by_a_file_size_limit_keep_the_earlier_output(world, tmp_path):
    out = tmp_path / "stats"
    shutil.copytree(world / "stats", out)
    before = _snapshot(out)
    p = _cli(["stats", str(world / "corpus"), "--out", str(out)], preexec=_limited(4096))
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("originlens: error: "), p.stderr
    assert _snapshot(out) == before
    assert not [q.name for q in tmp_path.iterdir() if ".partial-" in q.name or ".old-" in q.name]


# ---------------------------------------------------------------------------------------------------


def test_docs_state_the_counts():
    text = (REPO / "docs" / "reliability.md").read_text(encoding="utf-8")
    row = next((ln for ln in text.splitlines() if ln.startswith("| hostile inputs")), "")
    want = f"{len(BAD_INPUTS)} bad inputs + 1 path with spaces and unicode; {len(writing_commands())} writing commands"
    assert want in row, f"docs/reliability.md's 'hostile inputs' row should say: {want}"
    assert re.search(r"tracebacks 0, files lost 0", row), row
