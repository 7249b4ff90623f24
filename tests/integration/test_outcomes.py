"""Outcomes that never lie, and nothing measured lost (issue 15 §5-6), through the real CLI:
a SIGKILL without evidence of memory is `killed` and --resume runs it again; a second writer of
one run directory is refused; a torn requests.jsonl does not break a resume; a run that dies in
llmopt itself is `failed`; a failed quality pass keeps the timing samples; run.json and the jobs
hold no machine path."""

from __future__ import annotations

import fcntl
import json
import os
import textwrap

import pytest
from testkit import PLUGIN_SAMPLES, read_run, run_cli, write_plugin

PLUGIN = textwrap.dedent('''
    import os
    import signal
    import time
    from pathlib import Path

    from llmopt_bench.core.records import LoadInfo, StageRun
    from llmopt_bench.core.contract import Stage


    class Good(Stage):
        name = "o-good"
        description = "returns samples"

        def load(self, model, params, ctx):
            return LoadInfo()

        def run(self, workload, ctx):
            return StageRun(samples=samples())


    class Good2(Good):
        name = "o-good2"


    class KilledOnce(Good):
        """Killed by SIGKILL the first time (as by a neighbour, or a human), fine the second."""
        name = "o-killed"

        def run(self, workload, ctx):
            marker = ctx.stage_dir / "killed-once"
            if not marker.exists():
                marker.write_text("x")
                os.kill(os.getpid(), signal.SIGKILL)
            return super().run(workload, ctx)


    class BadDescription(Good):
        """A bug in a stage class that breaks llmopt itself when it records the result."""
        name = "o-bad"
        description = 123
''') + PLUGIN_SAMPLES
STAGES = {"o-good": "llmopt_outcomes:Good", "o-good2": "llmopt_outcomes:Good2", "o-killed": "llmopt_outcomes:KilledOnce",
          "o-bad": "llmopt_outcomes:BadDescription"}
TINY = ("--model", "synthetic:tiny", "--num-prompts", "2", "--max-new-tokens", "4", "--repeats", "1", "--warmup", "0",
        "--no-report")


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_model):
    return write_plugin(tmp_path_factory.mktemp("outcomes"), "llmopt_outcomes", STAGES, PLUGIN)


def stage(run, name):
    return next(s for s in run["stages"] if s["name"] == name)


def test_a_sigkill_without_memory_evidence_is_killed_and_resume_runs_it_again(tmp_path, env):
    out = tmp_path / "run"
    res = run_cli("bench", "--stages", "o-good,o-killed", *TINY, "--output", str(out), env=env)
    assert res.returncode == 4 and "Traceback" not in res.stderr
    s = stage(read_run(out), "o-killed")
    assert s["status"] == "killed" and "signal 9" in s["reason"] and "no evidence" in s["reason"], s
    assert "--resume" in s["fix"]
    again = run_cli("bench", "--resume", str(out), "--no-report", env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert stage(read_run(out), "o-killed")["status"] == "ok"


def test_a_second_writer_of_one_run_directory_is_refused(tmp_path, env):
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # what a running `llmopt bench --output out` holds
    try:
        res = run_cli("bench", "--stages", "o-good", *TINY, "--output", str(out), env=env)
    finally:
        os.close(fd)
    assert res.returncode == 2 and "another llmopt is writing" in res.stderr and "Traceback" not in res.stderr
    assert not (out / "run.json").exists()


def test_a_torn_requests_line_does_not_break_a_resume(tmp_path, env):
    out = tmp_path / "run"
    assert run_cli("bench", "--stages", "o-good", *TINY, "--output", str(out), env=env).returncode == 0
    with open(out / "requests.jsonl", "a") as f:
        f.write('{"stage": "o-good", "request_id": "r')  # a write cut off by a kill or a full disk
    res = run_cli("bench", "--resume", str(out), "--stages", "o-good2", "--no-report", env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "torn line" in res.stderr
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert sorted(x["stage"] for x in lines) == ["o-good", "o-good", "o-good2", "o-good2"]


def test_a_run_that_dies_in_llmopt_is_failed_not_complete(tmp_path, env):
    out = tmp_path / "run"
    res = run_cli("bench", "--stages", "o-good,o-bad", *TINY, "--output", str(out), env=env)
    assert res.returncode == 1  # a bug, said as one: traceback and exit 1
    run = read_run(out)
    assert run["status"] == "failed" and "ValidationError" in run["failure"]
    assert stage(run, "o-good")["status"] == "ok"  # what finished before is kept


def test_a_failed_quality_pass_keeps_the_samples_and_no_path_leaks(tmp_path, llmopt_cache):
    out = tmp_path / "run"
    blocker = out / "stages" / "hf-fp16" / "quality_reference.pt"
    blocker.mkdir(parents=True)  # the reference cannot be written there (as on a full disk)
    res = run_cli("bench", "--stages", "hf-fp16", *TINY, "--output", str(out))
    assert res.returncode == 0, res.stderr[-2000:]
    s = stage(read_run(out), "hf-fp16")
    assert s["status"] == "ok" and s["metrics"]["requests"] == 2 and len(s["samples"]["tpot_s"]) == 2
    assert s["quality"]["error"] and "Is a directory" in s["quality"]["error"]
    text = (out / "run.json").read_text()
    assert str(llmopt_cache) not in text and read_run(out)["model"]["path"].startswith("$LLMOPT_CACHE/")
    job = json.loads((out / "stages" / "hf-fp16" / "job.json").read_text())
    assert not os.path.isabs(job["stage_dir"]) and not os.path.isabs(job["log"])
