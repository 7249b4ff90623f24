"""The codebase stays one people can copy (issues 17 and 36): a module has one job, a function
fits a screen unless splitting it makes it harder to follow, and the report knows no stage by
name (docs/architecture.md, "The shape of a module").

What a test can check of that, without cutting a story into pieces to meet a count:
- every module says its one job in its docstring, and every package is on the map
  (docs/architecture.md), so a reader finds where a thing lives;
- a sanity bound on modules and functions, far above the usual size: past it a module holds
  several jobs and a function several screens, whatever the story;
- few positional parameters: a flow split into "phases" that hand each other ten values is the
  failure the old 60-line cap caused; a bundle of values wants a type (or keyword-only names).
Checked on the source itself, so a change that breaks a rule fails here with the place to look."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "llmopt_bench"
MAX_MODULE_LINES = 1000  # a sanity bound, not a target: well under it, a module is split by job
MAX_FUNCTION_LINES = 120  # two screens: past this no function reads as one story
MAX_POSITIONAL = 8  # parameters a caller passes by position (self, cls and keyword-only ones aside)

# Functions that took more positional parameters when the rule came in (issue 36): each may not
# take more than it does today, and leaves this list once it takes MAX_POSITIONAL or fewer.
KNOWN_BUNDLES = {
    "analysis/gate/compare.py:compare_stage": 10,
    "analysis/gate/compare.py:compare_runs": 14,
    "analysis/gate/judge.py:judge": 11,
    "analysis/quality.py:evaluate": 9,
    "analysis/roofline.py:make_row": 15,
    "cli/bench.py:plans_and_workload": 11,
    "cli/tune.py:new_options": 9,
    "engines/hf/generate.py:generate_batch": 9,
    "run/history.py:check": 10,
    "scenarios/batching/kv_capacity.py:hf_capacity": 11,
}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@cache
def parsed(p: Path) -> ast.Module:
    return ast.parse(p.read_text())


def functions(tree: ast.AST):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def is_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A typer command's parameters are its options, each named on the command line."""
    return any(isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ("command", "callback")
               for d in fn.decorator_list)


def positional(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return len([a for a in fn.args.posonlyargs + fn.args.args if a.arg not in ("self", "cls")])


def test_every_module_says_its_job():
    silent = [str(p.relative_to(PACKAGE)) for p in modules()
              if p.read_text().strip() and p.name != "__main__.py" and not ast.get_docstring(parsed(p))]
    assert not silent, f"open these modules with a docstring that says their one job: {silent}"


def test_every_package_is_on_the_map():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    packages = sorted(str(p.parent.relative_to(PACKAGE)) + "/" for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)
    missing = [p for p in packages if p not in doc and p.rsplit("/", 2)[-2] + "/" not in doc]
    assert not missing, f"name these packages in docs/architecture.md's map, with what they hold: {missing}"


def test_no_module_past_the_sanity_bound():
    long = {str(p.relative_to(PACKAGE)): n for p in modules() if (n := p.read_text().count("\n")) > MAX_MODULE_LINES}
    assert not long, f"these modules hold more than one job: split them by job: {long}"


def test_no_function_past_two_screens():
    long = [f"{p.relative_to(PACKAGE)}:{fn.lineno} {fn.name} ({n} lines)" for p in modules()
            for fn in functions(parsed(p)) if (n := fn.end_lineno - fn.lineno + 1) > MAX_FUNCTION_LINES]
    assert not long, "these functions no longer read as one story; name their parts: " + "; ".join(long)


def test_no_function_takes_a_bundle_of_positional_values():
    found = {}
    for p in modules():
        for fn in functions(parsed(p)):
            if not is_command(fn) and (n := positional(fn)) > MAX_POSITIONAL:
                found[f"{p.relative_to(PACKAGE)}:{fn.name}"] = n
    grown = {k: n for k, n in found.items() if n > KNOWN_BUNDLES.get(k, MAX_POSITIONAL)}
    assert not grown, (f"these functions take more than {MAX_POSITIONAL} positional parameters (or more than they did): "
                       f"{grown}; pass a typed record, or make the options keyword-only")


def test_the_rules_see_what_they_are_meant_to():
    """The checks above read the source the way they claim: a command is told apart, a
    keyword-only parameter is not positional, a docstring is found."""
    tree = ast.parse('"""Job."""\n@app.command("x")\ndef cmd(a, b): ...\ndef f(self, a, b, *, c, d): ...\n')
    cmd, f = functions(tree)
    assert is_command(cmd) and not is_command(f)
    assert positional(f) == 2 and ast.get_docstring(tree) == "Job."


def test_render_and_analysis_name_no_stage():
    """The quality reference is a flag on its result and the claims are the stages' own hooks:
    the report and the analyses read no stage's name (schema 1's reference lives in migrate.py)."""
    from importlib.metadata import entry_points

    stages = entry_points(group="llmopt.stages")
    # an engine family ("vllm": what load.implementation.engine says) is no stage's name, even where they are spelled alike
    families = {ep.load().requires.engine for ep in stages} - {None}
    assert "vllm" in families
    names = {ep.name for ep in stages} - families
    assert "hf-fp16" in names
    found = [f"{p.relative_to(PACKAGE)}: {n!r}" for d in ("render", "analysis") for p in (PACKAGE / d).rglob("*.py")
             for n in names if f'"{n}"' in p.read_text() or f"'{n}'" in p.read_text()]
    assert not found, found


def test_a_free_form_dict_says_why():
    """Issue 36: a dict whose keys the code knows is a model or a TypedDict; `dict[str, Any]`
    stays only where the data is free-form, and says why on its line, or through one of
    core/freeform.py's names, each of which is commented as free-form."""
    import re

    names = re.findall(r"^(\w+) = dict\[str, Any\]$", (PACKAGE / "core" / "freeform.py").read_text(), re.M)
    assert sorted(names) == ["Json", "Kwargs", "Table"]
    lines = (PACKAGE / "core" / "freeform.py").read_text().splitlines()
    assert all(lines[i - 1].startswith("# ") and "free-form" in "".join(lines[max(0, i - 4):i])
               for i, line in enumerate(lines) if line.endswith("= dict[str, Any]"))
    bare = [f"{p.relative_to(ROOT)}:{i}" for p in modules() if p.name != "freeform.py"
            for i, line in enumerate(p.read_text().splitlines(), 1) if "dict[str, Any]" in line and "#" not in line]
    assert not bare, f"say why these dicts are free-form (a comment), or type them: {bare}"
