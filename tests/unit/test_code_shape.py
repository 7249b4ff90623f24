"""The codebase stays one people can copy (issue 17): small modules, short functions, and a
report that knows no stage by name. Checked on the source itself, so a change that breaks the
rule fails here with the place to look."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "llmopt_bench"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in modules() if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert not long, f"split these modules (one idea each): {long}"


def test_no_function_over_60_lines():
    long = []
    for p in modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(PACKAGE)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, "split these functions into named phases: " + "; ".join(long)


def test_render_and_analysis_name_no_stage():
    """The quality reference is a flag on its result and the claims are the stages' own hooks:
    the report and the analyses read no stage's name (schema 1's reference lives in migrate.py)."""
    from importlib.metadata import entry_points

    names = {ep.name for ep in entry_points(group="llmopt.stages")}
    assert "hf-fp16" in names
    found = [f"{p.relative_to(PACKAGE)}: {n!r}" for d in ("render", "analysis") for p in (PACKAGE / d).rglob("*.py")
             for n in names if f'"{n}"' in p.read_text() or f"'{n}'" in p.read_text()]
    assert not found, found
