"""A reader that stops reading (`llmopt recommend RUN | head`) ends llmopt quietly, whatever the
command: exit 141 as a shell reports a command killed by SIGPIPE, no message, no traceback
(issue 46). The pipe is real: its read end closed before llmopt writes a byte."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from testkit import ROOT

H200 = str(ROOT / "results" / "h200")
COMMANDS = {
    "help": ["--help"],
    "stages": ["stages", "--json"],
    "recommend": ["recommend", H200],
    "compare": ["compare", H200, H200, "--format", "md"],
}


def run_into_closed_pipe(args: list[str], stderr_too: bool = False) -> subprocess.CompletedProcess:
    """llmopt with stdout (and with stderr_too, stderr: `2>&1 | head`) a pipe nobody reads."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "llmopt_bench", *args], stdout=write_end,
                              stderr=write_end if stderr_too else subprocess.PIPE, cwd=ROOT, timeout=300, text=True)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("name", COMMANDS)
def test_a_closed_pipe_ends_the_command_quietly(name):
    res = run_into_closed_pipe(COMMANDS[name])
    assert res.returncode == 141, res.stderr
    assert res.stderr == ""


def test_a_closed_pipe_on_both_streams_ends_quietly_too():
    assert run_into_closed_pipe(COMMANDS["recommend"], stderr_too=True).returncode == 141


def test_a_broken_pipe_that_is_not_the_output_is_still_a_bug_reported():
    """A server's socket closing under a command is llmopt's error to report (exit 1, the
    traceback), never mistaken for a reader gone: the streams here are read to the end."""
    code = textwrap.dedent("""
        import sys
        from llmopt_bench.cli import main
        from llmopt_bench.cli.app import app

        @app.command("sends")
        def sends():
            print("before")
            raise BrokenPipeError(32, "Broken pipe")

        sys.exit(main(["sends"]))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 1, res
    assert "BrokenPipeError" in res.stderr and "internal error" in res.stderr
