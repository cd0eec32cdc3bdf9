"""docs/cli.md is generated from the parsers and must be current."""
from pathlib import Path

from originlens.cli.main import build_parser
from originlens.cli.reference import cli_reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


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
    assert DOC.read_text() == cli_reference(), \
        "docs/cli.md is out of date: python -m originlens.cli.reference > docs/cli.md"


def test_docs_api_md_is_current():
    from originlens.cli.reference import api_reference
    doc = DOC.parent / "api.md"
    assert doc.exists() and doc.read_text() == api_reference(), \
        "docs/api.md is out of date: python -m originlens.cli.reference --api > docs/api.md"
