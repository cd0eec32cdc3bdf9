"""Property-based fuzz of the command line: random flag combinations with hostile values never end in a
traceback.

* **Parsing**, every leaf command: random subsets of its options with values drawn from integers (0,
  negative, huge), floats (nan, inf, 1e308), empty and unicode strings (lone surrogates included, as Python
  passes undecodable bytes), option-looking strings and missing values.  ``parse_args`` either returns or
  exits with status 2 (argparse's usage error); any other exception is a bug.
* **Running**, commands whose inputs are checked before any long work (``stats``, ``corpus info``,
  ``assoc top``, ``lm generate``, ``sae train``, ``ntp attribute`` on paths that hold nothing valid):
  ``main`` returns 0 or 2 (one ``originlens: error`` line), never raises.
"""

from __future__ import annotations

import argparse

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from originlens.cli.main import build_parser, main

SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def leaf_commands() -> dict[str, argparse.ArgumentParser]:
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: list[str]) -> None:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[" ".join(path)] = p
            return
        for name, sub in subs[0].choices.items():
            walk(sub, [*path, name])

    walk(build_parser(), [])
    return out


LEAVES = leaf_commands()
values = st.one_of(
    st.integers(-3, 3).map(str),
    st.sampled_from(
        [
            "0",
            "-1",
            "99999999999999999999",
            "1e308",
            "nan",
            "inf",
            "-inf",
            "",
            " ",
            "--",
            "-x",
            "1,2,,3",
            "0-",
            "3-1",
            "a-b",
            "1:2:3",
            "all",
            "hf:",
            "hf:x@",
            "@",
            "/",
            ".",
            "../..",
            "\x00",
        ]
    ),
    st.text(st.characters(codec=None), max_size=12),  # includes lone surrogates
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def option_args(parser: argparse.ArgumentParser):
    opts = [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]

    @st.composite
    def build(draw):
        argv: list[str] = []
        for a in draw(st.lists(st.sampled_from(opts), max_size=6)) if opts else []:
            argv.append(draw(st.sampled_from(a.option_strings)))
            if a.nargs != 0:
                if draw(st.integers(0, 9)):  # usually a value, sometimes none
                    argv.append(draw(values))
        positionals = [
            a
            for a in parser._actions
            if not a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
        ]
        argv += [draw(values) for _ in positionals if draw(st.booleans())]
        return draw(st.permutations(argv)) if draw(st.booleans()) else argv

    return build()


@pytest.mark.parametrize("command", sorted(LEAVES))
def test_parsing_random_flags_never_raises(command, capsys):
    parser = build_parser()

    @settings(max_examples=40, **SETTINGS)
    @given(option_args(LEAVES[command]))
    def check(argv):
        try:
            parser.parse_args([*command.split(), *argv])
        except SystemExit as exc:
            assert exc.code in (0, 2)
        capsys.readouterr()

    check()


FAST = {  # command, fixed leading arguments (inputs that hold nothing valid)
    "stats": ["stats", "{tmp}/missing-corpus", "--out", "{tmp}/out"],
    "corpus info": ["corpus", "info", "{tmp}/missing-corpus"],
    "assoc top": ["assoc", "top", "--stats", "{tmp}/missing-stats", "--word", "fish"],
    "lm generate": ["lm", "generate", "--model", "{tmp}/missing.safetensors"],
    "sae train": [
        "sae",
        "train",
        "--model",
        "{tmp}/missing.safetensors",
        "--corpus",
        "{tmp}/missing.npy",
        "--out",
        "{tmp}/sae",
    ],
    "ntp attribute": ["ntp", "attribute", "{tmp}/missing-run", "--sites", "1:3", "--out", "{tmp}/store"],
}


@pytest.mark.parametrize("command", sorted(FAST))
def test_running_with_random_flags_is_a_result_or_one_error_line(command, tmp_path, capsys):
    base = [a.format(tmp=tmp_path) for a in FAST[command]]
    leaf = LEAVES[command]
    fixed = {a for a in base if a.startswith("--")}

    @settings(max_examples=25, **SETTINGS)
    @given(option_args(leaf))
    def check(argv):
        argv = [a for a in argv if a not in fixed]
        try:
            rc = main(["-q", *base, *argv])
        except SystemExit as exc:  # argparse: a usage error
            assert exc.code in (0, 2)
            capsys.readouterr()
            return
        err = capsys.readouterr().err
        assert rc in (0, 2), (argv, err)
        if rc == 2:
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert len(lines) == 1 and lines[0].startswith("originlens: error:"), (argv, err)

    check()
