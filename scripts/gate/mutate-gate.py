#!/usr/bin/env python3
"""A mutation pass over the regression gate (issue 46, item 7; docs/regression.md, "What the tests
pin"): single changes a real bug could look like, applied one at a time to the gate's modules,
each run against the unit tests that cover them. A mutant the tests fail on is *killed*; one they
pass is *alive*: a behaviour no test pins. Not part of CI (minutes per module); a maintainer's tool.

The mutations (an AST walk, so strings, docstrings and f-strings are never touched):
- a comparison flipped: < and <=, > and >=, == and !=, in and not in, is and is not;
- a condition dropped: one operand of an `and`/`or` removed, a `not` removed, `and` and `or` swapped;
- a constant changed: an integer + 1 (off by one), a float doubled, True and False swapped;
- min and max swapped.

Each mutant is written into a copy of the checkout (never the checkout itself) and runs the
`--before` tests (the suite before this pass's tests were added) with -x; a mutant still alive
runs the `--after` tests too, so the report says how many the suite killed before and after.

    scripts/gate/mutate-gate.py --sample 8 --json mutants.json       # 8 mutants a module (seeded), ~40 min here
    scripts/gate/mutate-gate.py --module analysis/gate/judge.py --sample 0   # every mutant of one module
    scripts/gate/mutate-gate.py --list                                # the mutants, not run
    scripts/gate/mutate-gate.py --rerun mutants.json --json again.json   # the ones left alive, after new tests"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["analysis/gate/compare.py", "analysis/gate/judge.py", "analysis/gate/noise.py", "analysis/gate/completeness.py",
           "analysis/gate/baseline_drift.py", "analysis/gate/host_verdict.py", "analysis/gate/host_signals.py",
           "analysis/gate/changepoint.py", "analysis/gate/gate_file.py", "analysis/stopping.py", "analysis/hostbound.py",
           "cli/compare.py"]
# the unit tests over the gate before this pass (issue 46), and the ones it added; the stopping
# rule's tests that run an engine are left out (a minute each): its rule is tested through add_figures
BEFORE = ["tests/unit/test_compare.py", "tests/unit/test_noise.py", "tests/unit/test_host_signals.py",
          "tests/unit/test_host_verdict.py", "tests/unit/test_changepoint.py", "tests/unit/test_baseline_params.py",
          "tests/unit/test_stopping.py::test_halfwidth_is_the_t_interval_of_the_log_values",
          "tests/unit/test_stopping.py::test_repeat_value_is_the_median_tpot_of_ok_requests",
          "tests/unit/test_stopping.py::test_one_token_outputs_are_judged_on_e2e"]
AFTER = ["tests/unit/test_gate_pins.py", "tests/unit/test_gate_file.py", "tests/unit/test_stopping_rule.py"]
SWAP_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
            ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


@dataclass
class Mutant:
    module: str
    index: int  # the site's place in the walk
    line: int
    what: str
    status: str = "not run"  # killed (before) | killed (after) | alive | not run
    seconds: float = 0.0


def in_fstring(tree: ast.AST) -> set[int]:
    return {id(n) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr) for n in ast.walk(j)}


def sites(tree: ast.AST) -> list[tuple[ast.AST, str, object]]:
    """Every mutation site in walk order: (node, description, how)."""
    skip, out = in_fstring(tree), []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in SWAP_CMP:
                    out.append((node, f"{type(op).__name__} -> {SWAP_CMP[type(op)].__name__}", ("cmp", i)))
        elif isinstance(node, ast.BoolOp):
            out.append((node, f"{type(node.op).__name__} -> {'Or' if isinstance(node.op, ast.And) else 'And'}", ("boolop",)))
            for i in range(len(node.values)):
                out.append((node, f"{type(node.op).__name__}: operand {i + 1} of {len(node.values)} dropped", ("drop", i)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            out.append((node, "not dropped", ("not",)))
        elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
            v = node.value
            new = (not v) if isinstance(v, bool) else v + 1 if isinstance(v, int) else (v * 2 if v else 1.0)
            out.append((node, f"{v!r} -> {new!r}", ("const", new)))
        elif isinstance(node, ast.Name) and node.id in ("min", "max"):
            out.append((node, f"{node.id} -> {'max' if node.id == 'min' else 'min'}", ("name",)))
    return out


class Replace(ast.NodeTransformer):
    def __init__(self, target: ast.AST, new: ast.AST):
        self.target, self.new = target, new

    def generic_visit(self, node):
        if node is self.target:
            return self.new
        return super().generic_visit(node)


def mutated_source(source: str, index: int) -> str:
    tree = ast.parse(source)
    node, _, how = sites(tree)[index]
    kind = how[0]
    if kind == "cmp":
        node.ops[how[1]] = SWAP_CMP[type(node.ops[how[1]])]()  # type: ignore[attr-defined]
    elif kind == "boolop":
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()  # type: ignore[attr-defined]
    elif kind == "drop":
        values = [v for i, v in enumerate(node.values) if i != how[1]]  # type: ignore[attr-defined]
        tree = Replace(node, values[0] if len(values) == 1 else ast.BoolOp(node.op, values)).visit(tree)  # type: ignore[attr-defined]
    elif kind == "not":
        tree = Replace(node, node.operand).visit(tree)  # type: ignore[attr-defined]
    elif kind == "const":
        node.value = how[1]  # type: ignore[attr-defined]
    elif kind == "name":
        node.id = "max" if node.id == "min" else "min"  # type: ignore[attr-defined]
    return ast.unparse(ast.fix_missing_locations(tree))


def pytest(copy: Path, tests: list[str], timeout: int) -> int:
    env = {**os.environ, "PYTHONPATH": str(copy), "LLMOPT_HISTORY_DB": str(copy / "no-history.sqlite")}
    cmd = ["nice", sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    try:
        return subprocess.run(cmd, cwd=copy, env=env, capture_output=True, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        return 124  # a mutant that hangs the tests is caught by them (a nightly would time out)


def choose(modules: list[str], sample: int, seed: int, rerun: Path | None) -> list[Mutant]:
    """The mutants to run: a seeded sample of each module's sites, or those a previous run left alive."""
    if rerun:
        return [Mutant(**{**m, "status": "not run"}) for m in json.loads(rerun.read_text()) if m["status"] == "alive"]
    chosen: list[Mutant] = []
    for module in modules:
        tree = ast.parse((ROOT / "llmopt_bench" / module).read_text())
        all_sites = [Mutant(module, i, getattr(n, "lineno", 0), what) for i, (n, what, _) in enumerate(sites(tree))]
        picked = all_sites if not sample else sorted(random.Random(f"{seed}:{module}").sample(
            all_sites, min(sample, len(all_sites))), key=lambda m: m.index)
        chosen += picked
        print(f"{module}: {len(all_sites)} sites, {len(picked)} chosen", file=sys.stderr)
    return chosen


def run_all(chosen: list[Mutant], timeout: int) -> bool:
    """Each mutant in a copy of the checkout, the before tests then the after ones; False when the
    tests fail without any mutant (every mutant would then read as killed)."""
    with tempfile.TemporaryDirectory(prefix="mutate-gate-") as tmp:
        copy = Path(tmp) / "tree"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv*", "__pycache__", "*.pyc"))
        for tests in (BEFORE, AFTER):
            if pytest(copy, tests, timeout) != 0:
                print(f"error: the tests fail without a mutant: {' '.join(tests)}", file=sys.stderr)
                return False
        for n, m in enumerate(chosen, 1):
            path = copy / "llmopt_bench" / m.module
            original = path.read_text()
            start = time.monotonic()
            try:
                path.write_text(mutated_source(original, m.index))
                m.status = ("killed (before)" if pytest(copy, BEFORE, timeout) != 0 else
                            "killed (after)" if pytest(copy, AFTER, timeout) != 0 else "alive")
            finally:
                path.write_text(original)
            m.seconds = round(time.monotonic() - start, 1)
            print(f"[{n}/{len(chosen)}] {m.module}:{m.line} {m.what}: {m.status} ({m.seconds:g} s)", flush=True)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--module", action="append", help="only these (paths under llmopt_bench/; repeatable)")
    ap.add_argument("--sample", type=int, default=8, help="mutants a module, drawn with --seed (0: every one)")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--timeout", type=int, default=600, help="seconds a test run may take (default 600)")
    ap.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    ap.add_argument("--json", type=Path, help="write every mutant and its status to FILE")
    ap.add_argument("--rerun", type=Path, help="run again the mutants a previous --json left alive (after new tests)")
    args = ap.parse_args()
    chosen = choose(args.module or MODULES, args.sample, args.seed, args.rerun)
    if args.list:
        for m in chosen:
            print(f"{m.module}:{m.line}: {m.what}")
        return 0
    if not run_all(chosen, args.timeout):
        return 1
    before = sum(m.status == "killed (before)" for m in chosen)
    after = before + sum(m.status == "killed (after)" for m in chosen)
    print(f"\n{len(chosen)} mutants: killed {before} before ({before / len(chosen):.0%}), {after} after "
          f"({after / len(chosen):.0%}); alive:")
    for m in chosen:
        if m.status == "alive":
            print(f"- {m.module}:{m.line}: {m.what}")
    if args.json:
        args.json.write_text(json.dumps([asdict(m) for m in chosen], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
