"""The package's shape, read from its source: no import cycle between modules (function-level
imports count, and so do imports under TYPE_CHECKING: a type that two modules need from each
other belongs in a module below both), and few modules at the package root, so that the folders
show the layers (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import llmopt_bench

PACKAGE = Path(llmopt_bench.__file__).resolve().parent


def _module_names() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules this file imports, at any depth (functions and TYPE_CHECKING blocks included)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    modules = _module_names()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_cycles_finds_a_cycle_through_a_function_level_or_type_only_import(tmp_path):
    # the checker itself: a -> b at module level, b -> a inside a function, c -> a only for types
    edges = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(edges) == [["a", "b"]]
    src = tmp_path / "m.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.t import T\n"
                   "def f():\n    from p.u import U\n")
    assert imports_of(src, {"p.t": src, "p.u": src}) == {"p.t", "p.u"}


def test_the_package_has_no_import_cycle():
    assert cycles(graph()) == []


def test_few_modules_at_the_package_root():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= 8, root
