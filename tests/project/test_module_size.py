"""Module size: one concept per module. A module of the package longer than :data:`LIMIT` lines must say in
its docstring why it is one file (a paragraph starting ``Size:``), so a long file is a decision, not drift."""

from __future__ import annotations

import ast
from pathlib import Path

import originlens

LIMIT = 550
PACKAGE = Path(originlens.__file__).parent


def long_modules() -> dict[str, int]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > LIMIT:
            out[str(path.relative_to(PACKAGE))] = n
    return out


def test_long_modules_state_why_they_are_one_file():
    missing = []
    for rel, n in long_modules().items():
        doc = ast.get_docstring(ast.parse((PACKAGE / rel).read_text(encoding="utf-8"))) or ""
        if not any(line.startswith("Size:") for line in doc.splitlines()):
            missing.append(f"{rel} ({n} lines)")
    assert not missing, "split these modules by concept, or say why each is one file (a 'Size:' paragraph): " + (
        ", ".join(missing)
    )


def test_the_check_sees_every_module():
    assert (PACKAGE / "cli" / "main.py").is_file() and len(list(PACKAGE.rglob("*.py"))) > 100
    assert all(n > LIMIT for n in long_modules().values())
