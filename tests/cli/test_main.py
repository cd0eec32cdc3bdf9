"""The CLI's front door: ``--version``, and command groups without a sub-command print their own help."""

from __future__ import annotations

import pytest

import originlens
from originlens.cli.main import main


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"originlens {originlens.__version__}"


@pytest.mark.parametrize(
    "words, usage",
    [
        (["lm"], "originlens lm "),
        (["sae"], "originlens sae "),
        (["ntp"], "originlens ntp "),
        (["ntp", "experiment"], "originlens ntp experiment "),
        (["assoc"], "originlens assoc "),
        (["-q", "corpus"], "originlens corpus "),
        (["results"], "originlens results "),
    ],
)
def test_groups_print_their_own_help(words, usage, capsys):
    assert main(words) == 2  # a missing sub-command is a usage error
    out = capsys.readouterr().out
    assert out.startswith(f"usage: {usage}"), out[:200]


def test_no_command_prints_the_top_level_help(capsys):
    assert main([]) == 0
    assert capsys.readouterr().out.startswith("usage: originlens [-h]")


@pytest.mark.parametrize(
    "words",
    [
        ["ntp", "train", "--task", "majority"],
        ["ntp", "grid", "--out", "X"],
        ["ntp", "attribute", "RUN"],
        ["ntp", "experiment", "othello", "--out", "X"],
        ["ntp", "experiment", "grid", "--out", "X"],
        ["ntp", "experiment", "tinystories", "--out", "X"],
        ["ntp", "experiment", "othello-run", "--out", "X"],
        ["assoc", "train", "CORPUS", "--out", "X"],
        ["assoc", "report", "RUN"],
        ["lm", "compare", "--model", "M", "--corpus", "C", "--out", "X"],
        ["lm", "qscore", "--model", "M", "--corpus", "C", "--sae", "S", "--out", "X"],
    ],
)
@pytest.mark.parametrize("bad", ["0", "-2", "two"])
def test_threads_must_be_a_positive_integer_everywhere(words, bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*words, "--threads", bad])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--threads: expected an integer ≥ 1" in err and "Traceback" not in err


def test_quiet_and_verbose_work_after_the_sub_command_too():
    from originlens.cli.main import build_parser

    p = build_parser()
    for argv in (
        ["-q", "ntp", "train", "--task", "majority", "--out", "x"],
        ["ntp", "train", "--task", "majority", "--out", "x", "-q"],
        ["ntp", "experiment", "othello", "--out", "x", "--quiet"],
    ):
        a = p.parse_args(argv)
        assert a.quiet is True and a.verbose is False
    a = p.parse_args(["assoc", "report", "RUN", "-v"])
    assert a.verbose is True and a.quiet is False
    a = p.parse_args(["-v", "assoc", "report", "RUN"])  # absent after: the top-level flag stands
    assert a.verbose is True
    with pytest.raises(SystemExit):
        p.parse_args(["stats", "C", "--out", "o", "-q", "-v"])


def test_one_integer_list_grammar():
    import argparse

    from originlens.cli.options import int_list, int_list_or_all

    assert int_list("1,3") == [1, 3] and int_list("1-4") == [1, 2, 3, 4] and int_list("4-16:4") == [4, 8, 12, 16]
    assert int_list("-1,2") == [-1, 2] and int_list(" 2 , 5-6 ") == [2, 5, 6]
    assert int_list_or_all("all") is None and int_list_or_all("0-2") == [0, 1, 2]
    for bad in ("", "a", "1-", "3:2", "1-4:0", ",,"):
        with pytest.raises(argparse.ArgumentTypeError):
            int_list(bad)
    from originlens.cli.main import build_parser

    p = build_parser()  # the same grammar in every command
    assert p.parse_args(["ntp", "experiment", "othello", "--out", "x", "--seeds", "0-4:2"]).seeds == [0, 2, 4]
    assert p.parse_args(
        ["lm", "compare", "--model", "m", "--corpus", "c", "--out", "o", "--heads-layers", "2-24:11"]
    ).heads_layers == [2, 13, 24]
    assert p.parse_args(
        ["ntp", "train", "--task", "othello", "--out", "o", "--probe-positions", "4-8:2"]
    ).ov_probe_positions == [4, 6, 8]


def test_one_spelling_per_concept_old_spellings_warn(capsys):
    """--n-layers is a model's depth, --max-windows how many inputs are read, --top-tokens the K most frequent
    tokens, in every command; the old spellings still parse to the same value, with one warning line."""
    from originlens.cli.main import build_parser
    from originlens.cli.options import RENAMED

    parser = build_parser()
    cases = [
        (["assoc", "train", "c", "--steps", "1", "--out", "o"], "--n-layers", "2", "layers"),
        (["ntp", "train", "--task", "majority", "--out", "o"], "--n-layers", "2", "ov_n_layer"),
        (["stats", "c", "--out", "o"], "--top-tokens", "7", "top_k"),
        (["lm", "compare", "--model", "m", "--corpus", "c", "--out", "o"], "--max-windows", "5", "max_texts"),
    ]
    for base, new, value, dest in cases:
        ns = parser.parse_args([*base, new, value])
        assert capsys.readouterr().err == ""
        for old in RENAMED[new]:
            old_ns = parser.parse_args([*base, old, value])
            err = capsys.readouterr().err.strip().splitlines()
            assert getattr(old_ns, dest) == getattr(ns, dest) == int(value)
            assert len(err) == 1 and old in err[0] and new in err[0] and "warning" in err[0]
    # where --layers selects layers it is not deprecated
    ns = parser.parse_args(["ntp", "attribute", "r", "--layers", "1-2", "--positions", "3"])
    assert ns.layers == [1, 2] and capsys.readouterr().err == ""


def _omp_policy_seen_by_torch(env: dict[str, str]) -> str:
    """OMP_WAIT_POLICY as a fresh ``originlens`` process leaves it when torch's OpenMP runtime starts."""
    import os
    import subprocess
    import sys

    code = "import originlens.cli.main, os, torch; torch.ones(2) @ torch.ones(2); print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"} | env
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout


def test_the_command_lets_idle_openmp_threads_sleep_unless_the_user_chose():
    # spinning OpenMP workers cost a shared machine 3-8x the CPU of one thread (benchmarks/threads.py)
    assert _omp_policy_seen_by_torch({}).strip() == "PASSIVE"
    assert _omp_policy_seen_by_torch({"OMP_WAIT_POLICY": "ACTIVE"}).strip() == "ACTIVE"


def test_a_usage_error_with_an_unencodable_argument_is_printed_escaped(capsys):
    """A lone surrogate (a mis-encoded command line) in a usage error is printed as an escape, not raised
    as a UnicodeEncodeError on a strict UTF-8 stream."""
    import io

    import pytest

    from originlens.cli.main import main

    class Strict(io.StringIO):
        encoding = "utf-8"

        def write(self, s: str) -> int:
            s.encode("utf-8")  # strict, like a UTF-8 terminal
            return super().write(s)

    err = Strict()
    import sys

    old, sys.stderr = sys.stderr, err
    try:
        with pytest.raises(SystemExit) as exc:
            main(["ntp", "attribute", "run", "--sites", "1:3", "\ud800"])
    finally:
        sys.stderr = old
    assert exc.value.code == 2
    assert "\\ud800" in err.getvalue() and "unrecognized arguments" in err.getvalue()
