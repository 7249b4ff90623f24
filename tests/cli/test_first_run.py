"""A first run as a new user makes it, through the real CLI on this CPU machine, with a stage
registered the way a third party does (it reports what the workload handed it): the lighter CPU
defaults are used and said (progress, run.json's workload notes, under the table); a plain text
prompt file is read one prompt a line, and a JSONL file with "prompt" keys, and the run says
which; the table printed at COLUMNS=80 fits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from testkit import ROOT, read_run, write_plugin

from llmopt_bench.run.registry import cuda_devices

pytestmark = pytest.mark.skipif(bool(cuda_devices()), reason="the lighter defaults are the CPU's")

PLUGIN = textwrap.dedent('''
    import time

    from llmopt_bench.core.records import LoadInfo, RequestSample, StageRun
    from llmopt_bench.core.contract import Stage
    from llmopt_bench.core.workload import build_requests


    class Echo(Stage):
        name = "t-echo"
        description = "reports the workload it was handed"

        def load(self, model, params, ctx):
            return LoadInfo(implementation={"engine": "test"})

        def run(self, workload, ctx):
            reqs = build_requests(workload, lambda text: [ord(c) for c in text])
            t, samples = time.perf_counter(), []
            for rep in range(workload.repeats):
                for i, r in enumerate(reqs):
                    times = [t + 0.001 * (k + 1) for k in range(workload.max_new_tokens)]
                    samples.append(RequestSample(request_id=r.id, prompt_id=r.prompt_id, repeat=rep, prompt_tokens=len(r.token_ids),
                                                 output_tokens=len(times), t_submit=t, t_first=times[0], t_done=times[-1],
                                                 token_times=times))
                    t = times[-1]
            texts = {r.prompt_id: "".join(map(chr, r.token_ids)) for r in reqs}
            return StageRun(samples=samples, extra={"seen": texts, "workload": workload.model_dump()})
''')


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory, tiny_model) -> dict[str, str]:
    return write_plugin(tmp_path_factory.mktemp("plugin"), "llmopt_echoplug", {"t-echo": "llmopt_echoplug:Echo"}, PLUGIN)


def start(out, plugin_env, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "llmopt_bench", "bench", "--stages", "t-echo", "--model", "synthetic:tiny",
                             "--output", str(out), *args], cwd=ROOT,
                            env={**os.environ, **plugin_env, "COLUMNS": "80"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, plugin_env, llmopt_cache) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    """Four first runs, started together (mostly process start-ups and the probe); the last named,
    its prompts read from under the model cache, whose path run.json writes $LLMOPT_CACHE."""
    tmp = tmp_path_factory.mktemp("first")
    (llmopt_cache / "first-run-prompts.txt").write_text("Where is my cache?\n", encoding="utf-8")
    (tmp / "mine.txt").write_text("How does vLLM page its KV cache?\n\nWhat does AWQ protect?\nWhy batch requests?\n",
                                  encoding="utf-8")
    (tmp / "peer.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}?"}) + "\n" for i in range(2)))
    args = {"defaults": (), "text": ("--prompts", str(tmp / "mine.txt"), "--num-prompts", "3"),
            "prompt_key": ("--prompts", str(tmp / "peer.jsonl"), "--num-prompts", "2", "--no-report"),
            "named": ("--prompts", str(llmopt_cache / "first-run-prompts.txt"), "--num-prompts", "1", "--name", "first light")}
    procs = {k: (start(tmp / k, plugin_env, *a), tmp / k) for k, a in args.items()}
    done = {}
    for k, (proc, out) in procs.items():
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, (k, stderr[-3000:])
        done[k] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), read_run(out))
        done[k][1]["_dir"] = str(out)
    return done


def test_cpu_defaults_used_and_said(runs):
    r, run = runs["defaults"]
    w = run["workload"]
    assert (w["num_prompts"], w["max_new_tokens"], w["warmup"], w["repeats"]) == (4, 32, 1, 2)
    note = w["notes"][0]
    assert note.startswith("lighter defaults on CPU: --num-prompts 4, --max-new-tokens 32, --warmup 1, --repeats 2")
    s = run["stages"][0]
    assert s["extra"]["workload"]["num_prompts"] == 4  # what the stage was handed
    assert s["metrics"]["requests"] == 4 * 2 and s["metrics"]["output_tokens"] == 4 * 2 * 32
    assert f"llmopt: {note}" in r.stderr  # said while it runs
    lines = r.stdout.splitlines()
    assert f"workload: {note}" in " ".join(r.stdout.split())  # and under the table (wrapped at 80)
    assert f"  - {note}" in (Path(run["_dir"]) / "report.md").read_text().splitlines()  # and in the report
    assert all(len(line) <= 80 for line in lines) and "…" not in r.stdout, r.stdout


def test_plain_text_prompts_one_a_line(runs):
    r, run = runs["text"]
    assert run["workload"]["prompt_key"] == "line"
    assert "as plain text, one prompt a line" in r.stderr
    assert "prompts read as plain text, one a line" in (Path(run["_dir"]) / "report.md").read_text()
    assert run["stages"][0]["extra"]["seen"] == {"line-1": "How does vLLM page its KV cache?",
                                                 "line-3": "What does AWQ protect?", "line-4": "Why batch requests?"}


def test_jsonl_with_prompt_keys(runs):
    r, run = runs["prompt_key"]
    assert run["workload"]["prompt_key"] == "prompt"
    assert 'as JSONL, key "prompt"' in r.stderr
    assert run["stages"][0]["extra"]["seen"] == {"p0": "question 0?", "p1": "question 1?"}


def test_a_run_is_named_after_its_directory_or_its_name(runs):
    assert runs["defaults"][1]["name"] == "defaults"
    assert runs["named"][1]["name"] == "first light"


def test_the_report_bench_wrote_is_the_one_llmopt_report_renders(runs, tmp_path):
    """One run, one report (issue 46): bench renders the run it holds, `llmopt report` the
    run.json it reads, where a path under the model cache is written $LLMOPT_CACHE."""
    _, run = runs["named"]
    assert run["workload"]["prompts"] == "$LLMOPT_CACHE/first-run-prompts.txt"
    res = subprocess.run([sys.executable, "-m", "llmopt_bench", "report", run["_dir"], "-o", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    by_bench = (Path(run["_dir"]) / "report.md").read_text()
    assert "from $LLMOPT_CACHE/first-run-prompts.txt" in by_bench
    assert (tmp_path / "report.md").read_text() == by_bench
