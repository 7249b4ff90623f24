"""Every committed report is what `llmopt report` writes from its run.json today: the committed
runs still load (migrated where older), and a change to the report's code shows up here as a diff
to commit with it, not as a silent drift between results/ and the code (issue 26)."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from testkit import cli_in_process, committed_files

ROOT = Path(__file__).resolve().parents[2]
# the committed reports only (git ls-files): a user's own runs under results/runs/ (gitignored,
# where `make bench` writes) are theirs, rendered by whichever llmopt wrote them
_FILES = set(committed_files())
COMMITTED = sorted(p.parent for p in _FILES if p.name == "report.md" and p.parent / "run.json" in _FILES)


def test_there_are_committed_reports_to_check():
    assert len(COMMITTED) >= 5, COMMITTED


@pytest.mark.parametrize("run_dir", COMMITTED, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_a_committed_report_renders_unchanged(run_dir, tmp_path, capfd):
    assert cli_in_process(["report", str(run_dir), "-o", str(tmp_path)]) == 0, capfd.readouterr().err
    fresh = (tmp_path / "report.md").read_text(encoding="utf-8").splitlines()
    committed = (run_dir / "report.md").read_text(encoding="utf-8").splitlines()
    diff = "\n".join(difflib.unified_diff(committed, fresh, "committed", "rendered now", lineterm="", n=0))
    assert not diff, f"re-render it: llmopt report {run_dir.relative_to(ROOT)}\n{diff[:3000]}"
