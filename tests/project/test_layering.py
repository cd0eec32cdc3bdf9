"""The layering of docs/architecture.md: no module imports from a higher layer, and the subpackages of
one layer import each other without cycles.  Every import statement counts, module-level or inside a
function (a deferred import is still a dependency)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import originlens
from originlens.layers import LAYERS, layer_of

ROOT = Path(originlens.__file__).parent
UNITS = {
    p.stem if p.is_file() else p.name
    for p in ROOT.iterdir()
    if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())
}


def _imports() -> dict[str, set[tuple[str, str]]]:
    """top-level unit → {(imported unit, "file:line")} for every originlens import in the package."""
    out: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT)
        unit = rel.parts[0].removesuffix(".py") if len(rel.parts) == 1 else rel.parts[0]
        pkg_parts = ["originlens", *rel.parts[:-1]]  # the package a relative import starts from
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg_parts[: len(pkg_parts) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                    if node.module is None:  # from . import a, b
                        targets = [f"{mod}.{a.name}" for a in node.names]
                    else:
                        targets = [mod]
                else:
                    targets = [node.module or ""]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                parts = t.split(".")
                if parts[0] == "originlens" and len(parts) > 1:
                    dep = parts[1] if parts[1] in UNITS else "__init__"  # `from .. import __version__`
                    out[unit].add((dep, f"{rel}:{node.lineno}"))
    return out


def test_every_unit_has_a_layer():
    units = {
        p.stem if p.is_file() else p.name
        for p in ROOT.iterdir()
        if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())
    }
    listed = {n for names in LAYERS for n in names}
    assert units - listed == set(), "add new modules to originlens.layers.LAYERS"


def test_no_import_from_a_higher_layer():
    bad = []
    for unit, deps in _imports().items():
        for dep, where in deps:
            if dep != unit and layer_of(dep) > layer_of(unit):
                bad.append(f"{where}: {unit} (layer {layer_of(unit)}) imports {dep} (layer {layer_of(dep)})")
    assert not bad, "\n".join(sorted(bad))


def test_no_cycle_between_units():
    graph = {u: {d for d, _ in deps if d != u} for u, deps in _imports().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(u: str, path: list[str]) -> None:
        state[u] = 1
        for d in sorted(graph.get(u, ())):
            if state.get(d) == 1:
                cycles.append(" → ".join([*path[path.index(d) :], d]))
            elif d not in state:
                visit(d, [*path, d])
        state[u] = 2

    for u in sorted(graph):
        if u not in state:
            visit(u, [u])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_deferred_and_relative_imports():
    deps = {d for d, _ in _imports()["demo"]}
    assert {"experiments", "train", "attribution"} <= deps  # function-level imports in demo.py
    assert "errors" in {d for d, _ in _imports()["lm"]}


def test_tests_mirror_the_package():
    """tests/<package>/test_<module>.py: every folder of tests/ is a subpackage of originlens, or one of the
    cross-cutting suites (project: the repository as a whole; reliability: kills, hostile inputs)."""
    tests = Path(__file__).resolve().parents[1]
    folders = {p.name for p in tests.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    packages = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders - packages - {"project", "reliability"} == set()


def test_no_module_forwards_names_through_a_module_getattr():
    """A module-level ``__getattr__`` forwards names that live elsewhere (a shim); only the package's own
    lazy public API (``originlens/__init__.py``) may have one."""
    found = []
    for f in ROOT.rglob("*.py"):
        rel = f.relative_to(ROOT).as_posix()
        for node in ast.parse(f.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__" and rel != "__init__.py":
                found.append(f"{rel}:{node.lineno}")
    assert not found, f"forwarding shims: {found}"


def _module_imports() -> dict[str, set[str]]:
    """module → the package's modules it imports (every import statement: module-level, deferred inside a
    function, or under ``TYPE_CHECKING``); ``from pkg import name`` names the submodule ``pkg.name`` when
    there is one, else ``pkg``'s ``__init__``."""

    def name_of(f: Path) -> str:
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name_of(f): f for f in ROOT.rglob("*.py")}
    out: dict[str, set[str]] = defaultdict(set)
    for mod, f in modules.items():
        package = mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    src = ".".join(base[: len(base) - (node.level - 1)] + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                for a in node.names:
                    target = f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src
                    if target in modules and target != mod:
                        out[mod].add(target)
            elif isinstance(node, ast.Import):
                out[mod] |= {a.name for a in node.names if a.name in modules and a.name != mod}
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_between_modules():
    """No two modules of the package import each other, directly or through others — deferred and
    type-checking imports included (a circle hidden in a function is still a circle)."""
    circles = _circles(_module_imports())
    assert not circles, "import circles:\n" + "\n".join(" ↔ ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _circles(graph) == [["a", "b", "c"]]
    imports = _module_imports()
    # a deferred import (inside a function) and a relative one are seen
    assert "originlens.experiments.othello_check" in imports["originlens.experiments.othello"]
    assert "originlens.experiments.othello_config" in imports["originlens.experiments.othello_strata"]
