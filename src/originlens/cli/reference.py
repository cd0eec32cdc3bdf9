"""The CLI reference (``docs/cli.md``) and the Python API reference (``docs/api.md``), generated from the
argparse parsers and the public API's docstrings.

``python -m originlens.cli.reference > docs/cli.md`` and ``... --api > docs/api.md`` regenerate them; a
test fails when a committed file is out of date, so the references cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys


def _subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            return dict(a.choices)
    return {}


def _help_of(p: argparse.ArgumentParser, name: str) -> str:
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for ca in a._choices_actions:
                if ca.dest == name or ca.metavar == name:
                    return ca.help or ""
    return ""


def _section(
    p: argparse.ArgumentParser, path: list[str], parent: argparse.ArgumentParser | None, out: list[str]
) -> None:
    name = " ".join(path)
    level = "#" * min(2 + len(path) - 1, 4)
    out.append(f"{level} `{name}`\n")
    short = _help_of(parent, path[-1]) if parent is not None else ""
    if short:
        out.append(short[0].upper() + short[1:] + ".\n")
    p.prog = name
    usage = p.format_usage().replace("usage: ", "").strip()
    out.append("```text\n" + usage + "\n```\n")
    if p.description and parent is not None:
        out.append(p.description.strip() + "\n")
    rows = []
    for a in p._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flags = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.metavar or a.dest}`"
        text = (a.help or "").replace("%%", "%").replace("|", "\\|").replace("\n", " ")
        flag_only = isinstance(
            a,
            (
                argparse._StoreTrueAction,
                argparse._StoreFalseAction,
                argparse._StoreConstAction,
                argparse.BooleanOptionalAction,
                argparse._CountAction,
                argparse._VersionAction,
            ),
        )
        default = (
            ""
            if (
                a.default is None
                or a.default is argparse.SUPPRESS
                or flag_only
                or not a.option_strings
                or "(default" in text
            )
            else f" (default: `{a.default}`)"
        )
        choices = f" One of: {', '.join(f'`{c}`' for c in a.choices)}." if a.choices else ""
        rows.append(f"| {flags} | {text}{choices}{default} |")
    if rows:
        out.append("| argument | meaning |\n|---|---|\n" + "\n".join(rows) + "\n")
    for sub_name, sub in _subparsers(p).items():
        _section(sub, [*path, sub_name], p, out)


def cli_reference() -> str:
    """Markdown reference of every ``originlens`` command and option."""
    import os

    from .main import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal width
    try:
        root = build_parser()
        text = _render(root)
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return text


def _render(root: argparse.ArgumentParser) -> str:
    out = [
        "# CLI reference\n",
        "Generated from the parsers by `python -m originlens.cli.reference > docs/cli.md`; "
        "do not edit by hand. Every command prints one line `originlens: error: ...` (what is wrong, "
        "how to fix it) and exits with status 2 on bad input.\n",
    ]
    _section(root, ["originlens"], None, out)
    return "\n".join(out)


def api_reference() -> str:
    """Markdown reference of the public Python API (``originlens.__all__``): signature + summary."""
    import importlib
    import inspect

    import originlens

    from .api_examples import EXAMPLES

    out = [
        "# Python API\n",
        "Generated from the docstrings by `python -m originlens.cli.reference --api > docs/api.md`; do not "
        "edit by hand. Everything below is importable from `originlens` directly (imported lazily: "
        "`import originlens` does not import torch).\n",
    ]
    by_module: dict[str, list[str]] = {}
    for name, mod in originlens._API.items():
        by_module.setdefault(mod, []).append(name)
    for mod, names in by_module.items():
        module = importlib.import_module(mod)
        doc = inspect.getdoc(module) or ""
        out.append(f"## `{mod}`\n")
        if doc:
            out.append(doc.split("\n\n")[0].replace("\n", " ") + "\n")
        if mod in EXAMPLES:
            out.append(
                "Example (runs as shown; `tests/project/test_api_examples.py` executes it):\n\n```python\n"
                + EXAMPLES[mod].rstrip()
                + "\n```\n"
            )
        for name in names:
            obj = getattr(module, name)
            kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "constant"
            try:
                sig = str(inspect.signature(obj)) if callable(obj) else ""
            except (TypeError, ValueError):
                sig = "(...)"
            if kind == "constant":
                out.append(f"### `{name}`\n")
            else:
                out.append(f"### `{name}{sig}`\n")
            d = inspect.getdoc(obj) if kind != "constant" else None
            if d:  # the summary, and a class's parameter names where its docstring lists them
                paras = d.split("\n\n")
                out += [p.strip() + "\n" for i, p in enumerate(paras) if i == 0 or p.startswith("Parameter names:")]
    return "\n".join(out)


if __name__ == "__main__":  # pragma: no cover
    sys.stdout.write(api_reference() if "--api" in sys.argv[1:] else cli_reference())
