"""Every bad value of a `llmopt bench` option is refused by the real CLI before anything starts:
exit 2, one error line naming the option, the value and the allowed range, a fix line, no
traceback, and no run directory written."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from testkit import ROOT, run_cli, worktree_stages_env

# (option, bad value, what the error must say is allowed)
BAD = [
    ("--max-new-tokens", "0", "allowed 1 or more"),
    ("--max-new-tokens", "-5", "allowed 1 or more"),
    ("--num-prompts", "0", "allowed 1 or more"),
    ("--batch-size", "0", "allowed 1 or more"),
    ("--repeats", "0", "allowed 1 or more"),
    ("--max-repeats", "0", "allowed 1 to 1000"),
    ("--max-repeats", "1", "below --repeats 2"),  # the CPU default minimum is 2
    ("--stop-within", "0", "allowed 0.1 to 100"),
    ("--input-len", "0", "allowed 1 or more"),
    ("--max-prompt-len", "0", "allowed 1 or more"),
    ("--warmup", "-1", "allowed 0 or more"),
    ("--seed", "-1", "allowed 0 to 4294967295"),
    ("--seed", "4294967296", "allowed 0 to 4294967295"),
    ("--timeout", "0", "allowed more than 0 seconds"),
    ("--timeout", "-3", "allowed more than 0 seconds"),
    ("--timeout", "nan", "allowed more than 0 seconds"),
    ("--workload", "odd", "unknown kind 'odd', allowed fixed, mixed, random, shared-prefix, multi-turn, trace"),
    ("--workload", "shared-prefix:groups=0", "groups: 0 is out of range, allowed 1 or more"),
    ("--workload", "random:in=5..3", "a range A..B needs 1 <= A <= B"),
    ("--workload", "random:colour=red", "unknown key 'colour'"),
    ("--workload", "multi-turn:think=2", "has no unit"),
    ("--workload", "random:in=normal:100", "normal takes MEAN:SD"),
    ("--workload", "trace:speedup=2", "file= is required"),
    ("--workload", "trace:file=no-such-trace.jsonl", "trace file not found"),
    ("--workload", "trace:file=builtin:example-trace.jsonl,start=5,end=2", "end=2 is not after start=5"),
    ("--workload", "shared-prefix:order=sideways", "order: Input should be 'shuffled' or 'grouped'"),
    ("--workload", "shared-prefix:groups", "'groups' is not key=value"),
    ("--workload", "multi-turn:turns=0", "a length is at least 1 token"),
    ("--workload", "multi-turn:think=exp:-1s", "a duration is 0 or more"),
    ("--workload", "random:out=1.5", "is not a whole number"),
    ("--workload", "random:in=hist:no-such-histogram.txt", "no such file"),
    ("--min-quality", "1.5", "not a fraction in (0, 1]"),
]
IDS = [f"{o}={v}" for o, v, _ in BAD]


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmopt_bench", *args], cwd=ROOT, env=dict(os.environ),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, object]]:
    """Every bad value through the real CLI, started together (each is a process start-up)."""
    tmp = tmp_path_factory.mktemp("bad")
    procs = {}
    for case, (option, value, _) in zip(IDS, BAD):
        out = tmp / case.replace("-", "_").replace("=", "_")
        procs[case] = (start("bench", "--stages", "hf-fp16", "--model", "synthetic:tiny", option, value, "--output", str(out)), out)
    done = {}
    for case, (proc, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[case] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), out)
    return done


def refused(r, *needles: str) -> list[str]:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), r.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines


def run(*args: str) -> subprocess.CompletedProcess:
    proc = start(*args)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("option,value,allowed", BAD, ids=IDS)
def test_bad_value_refused_before_anything_starts(refusals, option, value, allowed):
    r, out = refusals[f"{option}={value}"]
    _, fix = refused(r, option, value, allowed)
    assert option in fix
    assert not out.exists()  # refused before the run directory, the probe or any stage


def test_output_that_is_a_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    refused(run("bench", "--stages", "hf-fp16", "--output", str(path)), "--output", str(path), "a file")
    assert path.read_text() == "mine"


def test_output_under_a_file_cannot_be_written(tmp_path):
    (tmp_path / "f").write_text("")
    out = tmp_path / "f" / "run"
    refused(run("bench", "--stages", "hf-fp16", "--output", str(out)), "--output", "cannot write there")


def test_output_that_holds_another_run(tmp_path):
    """A run directory is never overwritten by a new run: its record would be lost."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"kept": true}')
    _, fix = refused(run("bench", "--stages", "hf-fp16", "--output", str(out)), "--output", "already holds a run")
    assert f"--resume {out}" in fix
    assert (out / "run.json").read_text() == '{"kept": true}'


def test_two_bad_values_name_the_first(tmp_path):
    refused(run("bench", "--num-prompts", "0", "--repeats", "0", "--output", str(tmp_path / "run")), "--num-prompts 0")


# What the option parser refuses before llmopt sees a value (typer 0.29 vendors click: these came
# out as a traceback and "internal error", exit 1)
PARSER = [
    (("bench", "--bogus"), "No such option: --bogus", "bench --help"),
    (("bench", "--max-new-tokens", "abc"), "--max-new-tokens", "bench --help"),
    (("bench", "--repeats"), "--repeats", "--help"),
    (("nosuchcommand",), "nosuchcommand", "--help"),
    (("compare", "--bogus", "a", "b"), "--bogus", "compare --help"),
]


@pytest.mark.parametrize("args,says,fix", PARSER, ids=[" ".join(a) for a, _, _ in PARSER])
def test_parser_errors_are_one_line_with_the_fix(args, says, fix):
    _, fix_line = refused(run(*args), says)
    assert fix in fix_line


def test_a_prompt_file_option_with_a_generated_kind(tmp_path):
    """--max-new-tokens is the fixed workload's: with --workload random the length goes inside the spec."""
    _, fix = refused(run("bench", "--stages", "vllm-serve", "--model", "synthetic:tiny", "--workload", "random:in=64",
                         "--max-new-tokens", "16", "--output", str(tmp_path / "run")),
                     "--max-new-tokens", "not of --workload random")
    assert "inside --workload" in fix
    assert not (tmp_path / "run").exists()


def test_a_bad_workload_in_a_journey_file(tmp_path):
    """The prefix-caching stage's own workload (a journey's params) is checked like --workload, before anything starts."""
    journey = tmp_path / "j.toml"
    journey.write_text('[[stage]]\nname = "prefix-caching"\nparams = { workload = "shared-prefix:groups=0" }\n')
    _, fix = refused(run_cli("bench", "--stages", str(journey), "--model", "synthetic:tiny", "--output", str(tmp_path / "run"),
                             env=worktree_stages_env(tmp_path)),
                     "stage prefix-caching: bad param 'workload'", "groups: 0 is out of range")
    assert "workload = shared-prefix:" in fix
    assert not (tmp_path / "run").exists()
