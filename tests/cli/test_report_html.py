"""`llmopt report` with html and several runs: what it writes by default and the usage errors
(exit 2, one line and the fix) of a format several runs cannot make and a run that is not there."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results/cpu/gate-calibration/run01"


def test_one_run_writes_markdown_and_html_by_default(tmp_path, capfd):
    assert cli_in_process(["report", str(RUN), "-o", str(tmp_path)]) == 0
    written = [Path(x).name for x in capfd.readouterr().out.split()]
    assert written[0] == "report.md" and written[-1] == "report.html" and (tmp_path / "report.html").stat().st_size > 1e6


@pytest.mark.parametrize("args,needle", [
    ([str(RUN), str(RUN), "-f", "md"], "several runs make one page, html"),
    ([str(RUN), str(RUN), "-f", "html,csv"], "several runs make one page, html"),
    ([str(RUN), "/nonexistent/run", "-f", "html"], "no run directory at /nonexistent/run"),
])
def test_usage_errors_of_several_runs_exit_2(args, needle, tmp_path, capfd):
    assert cli_in_process(["report", *args, "-o", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert needle in err and "fix:" in err and "Traceback" not in err
    assert not (tmp_path / "runs.html").exists()
