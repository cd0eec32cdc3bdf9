"""docs/cli.md is generated from the parsers and must be current."""

from pathlib import Path

from originlens.cli.main import build_parser
from originlens.cli.reference import cli_reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def test_reference_mentions_every_command_and_option():
    text = cli_reference()
    root = build_parser()
    import argparse

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    assert f"`{' '.join([*path, name])}`" in text
                    walk(sub, [*path, name])
            elif not isinstance(a, argparse._HelpAction):
                for o in a.option_strings:
                    assert f"`{o}`" in text

    walk(root, ["originlens"])


def test_docs_cli_md_is_current():
    assert DOC.exists(), "generate it: python -m originlens.cli.reference > docs/cli.md"
    assert DOC.read_text() == cli_reference(), (
        "docs/cli.md is out of date: python -m originlens.cli.reference > docs/cli.md"
    )


def test_docs_api_md_is_current():
    from originlens.cli.reference import api_reference

    doc = DOC.parent / "api.md"
    assert doc.exists() and doc.read_text() == api_reference(), (
        "docs/api.md is out of date: python -m originlens.cli.reference --api > docs/api.md"
    )


def _options():
    import argparse

    def walk(p, path):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    yield from walk(sub, [*path, name])
            elif not isinstance(a, argparse._HelpAction) and a.option_strings:
                yield " ".join(path), a

    yield from walk(build_parser(), ["originlens"])


def test_every_option_says_what_it_does():
    missing = [f"{cmd} {a.option_strings[0]}" for cmd, a in _options() if not (a.help or "").strip()]
    assert not missing, f"options without help: {missing}"


def test_defaults_are_shown_once_and_never_for_switches():
    text = cli_reference()
    rows = [ln for ln in text.splitlines() if ln.startswith("| `-")]
    assert not [r for r in rows if r.count("(default") > 1], "a default shown twice"
    import argparse

    switches = {
        o
        for _, a in _options()
        if isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        for o in a.option_strings
    }
    shown = [r for r in rows if r.split("|")[1].strip().strip("`") in switches and "(default: `" in r]
    assert not shown, shown[:3]
    assert "| `--seed` | seed of the initialisation, data order and eval set (default: `0`) |" in text  # 0 is shown


def test_every_command_help_formats():
    """`--help` expands each help string with %-formatting: a stray '%' crashes it."""
    import argparse

    def walk(p, path):
        p.format_help()  # raises on a help string argparse cannot expand
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, [*path, name])

    walk(build_parser(), ["originlens"])
