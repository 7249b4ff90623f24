"""`llmopt tune` end to end through the real CLI on vLLM-CPU (synthetic:tiny, FP32, eager): the FP16
reference through the runner, a real search over a small space (at max_num_seqs 4: vLLM's default
max_num_batched_tokens, 64, and 2, which vLLM refuses: 2 tokens a step for 4 sequences), short
points and a short hold, vLLM's client at the best held capacity. The run is killed (SIGKILL: no clean-up, its
server left running) once the defaults' trial has ended and another trial's server is starting,
then resumed to its end. One run feeds every test here. Timings are not asserted, only what is
deterministic: the trials and their outcomes, what was and was not run again, the records."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from testkit import ROOT, read_run, run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
SLO = "ttft_p90=1s,tpot_p90=100ms"
SPACE = """
[fixed]
dtype = "float32"
max_model_len = 512
enforce_eager = true  # no compile: a server start is ~30 s on 2 cores
# a small server: its capacity (60-90 req/s of 24 in / 12 out here) stays within what the client can
# time on 2 shared cores (vLLM's default, 256 at once, passes 250 req/s, where the client cannot)
max_num_seqs = 4

[space]
max_num_batched_tokens = [2, 64]  # 2: below max_num_seqs, vLLM refuses to start

[load]
requests_per_point = 8
warmup_s = 0.5
max_point_s = 8

[search]
short_precision = 0.3
short_point_s = 2
short_probes = 4
precision = 0.15
point_s = 2.5
probes = 3
start_concurrency = 4
"""
ARGS = ["--model", "synthetic:tiny", "--num-prompts", "4", "--input-len", "24", "--max-new-tokens", "12", "--slo", SLO,
        "--hold", "4", "--budget", "20m"]


def record(out: Path) -> dict | None:
    try:
        return json.loads((out / "tune.json").read_text())
    except (OSError, ValueError):
        return None


def starts(out: Path, number: int) -> int:
    """How many times the trial's server was spawned (VLLMServer writes "$ <command>" at each)."""
    log = out / "trials" / f"{number:03d}" / "server.log"
    return sum(1 for line in log.read_text(errors="replace").splitlines() if line.startswith("$ ")) if log.is_file() else 0


def servers_of(out: Path) -> list[int]:
    """Live processes started for a trial of this run (the marker in their environment)."""
    mark = f"LLMOPT_TUNE_SERVER={out}/".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if mark in env:
            found.append(int(pid))
    return found


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    tmp = tmp_path_factory.mktemp("tune")
    (tmp / "space.toml").write_text(SPACE)
    out = tmp / "run"
    env = {**os.environ, "LLMOPT_VLLM_PYTHON": VLLM_PYTHON,
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    with open(tmp / "first.err", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "llmopt_bench", "tune", "--space", str(tmp / "space.toml"), *ARGS,
                                 "--output", str(out)], stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        killed_in = None
        deadline = time.monotonic() + 1200
        while killed_in is None and time.monotonic() < deadline and proc.poll() is None:
            rec = record(out)
            trials = rec["trials"] if rec else []
            running = [t["number"] for t in trials if t["outcome"] == "running" and starts(out, t["number"])]
            if trials and trials[0]["outcome"] != "running" and running:
                time.sleep(1)  # its server is starting (a refused one takes ~10 s to exit)
                killed_in = running[0]
                os.kill(proc.pid, signal.SIGKILL)
            time.sleep(0.5)
        proc.wait(timeout=60)
    first_err = (tmp / "first.err").read_text()
    assert killed_in is not None, f"the run ended (exit {proc.returncode}) before a second trial started:\n{first_err[-3000:]}"
    killed = record(out)
    resumed = run_cli("tune", "--resume", str(out), env=env, timeout=1800)
    return {"out": out, "killed": killed, "killed_in": killed_in, "first_err": first_err, "resumed": resumed,
            "rec": record(out), "run": read_run(out), "env": env}


def trials(tuned) -> dict[int, dict]:
    return {t["number"]: t for t in tuned["rec"]["trials"]}


def test_the_resumed_run_finished_without_running_a_finished_trial_again(tuned):
    r, out = tuned["resumed"], tuned["out"]
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-4000:]}"
    assert tuned["rec"]["status"] == "complete"
    before = {t["number"]: t for t in tuned["killed"]["trials"]}
    finished = [n for n, t in before.items() if t["outcome"] != "running"]
    assert 1 in finished and before[1]["outcome"] in ("held", "hold failed")
    for n in finished:
        assert starts(out, n) <= 1, f"trial {n} finished before the kill and was started again"
        assert trials(tuned)[n] == before[n], f"trial {n}'s record changed"
    n = tuned["killed_in"]
    assert before[n]["outcome"] == "running" and trials(tuned)[n]["outcome"] != "running"
    assert starts(out, n) == 2, "the interrupted trial runs again under its number"
    assert sorted(trials(tuned)) == list(range(1, len(trials(tuned)) + 1))
    assert not servers_of(out), "a server of this run is still alive"
    assert tuned["rec"]["wall_s"] > tuned["killed"]["wall_s"]


def test_every_configuration_of_the_space_is_a_trial_and_the_defaults_are_the_first(tuned):
    got = trials(tuned)
    configs = sorted(json.dumps(t["config"], sort_keys=True) for t in got.values())
    assert len(configs) == len(set(configs)) == 3
    d = got[1]
    assert d["defaults"] and d["config"] == {"max_num_batched_tokens": "default"} and tuned["rec"]["defaults"] == 1
    assert d["command"].startswith("vllm serve ") and "--max-num-batched-tokens" not in d["command"]
    assert [r["name"] for r in d["rungs"]] == ["short", "precise", "held"]


def test_a_configuration_vllm_refuses_is_recorded_with_its_reason(tuned):
    t = next(t for t in trials(tuned).values() if t["config"] == {"max_num_batched_tokens": 2})
    assert t["outcome"] == "cannot start", t
    # vLLM 0.32's SchedulerConfig: "max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)"
    assert t["reason"].startswith("invalid combination: ") and "max_num_batched_tokens (2)" in t["reason"], t["reason"]
    assert t["value"] == 0.0 and not t["rungs"] and t["command"].startswith("vllm serve ")


def test_the_winner_is_held_confirmed_and_deployable(tuned):
    rec, got = tuned["rec"], trials(tuned)
    w = got[rec["winner"]]
    held = [r for r in w["rungs"] if r["name"] == "held"][0]
    assert w["outcome"] == "held" and held["held"] and held["capacity_rps"] > 0
    assert held["failing_rps"] is None or held["failing_rps"] > held["capacity_rps"]
    c = w["confirmation"]
    assert c and c["verdict"] in ("held", "missed") and c["figures"]["completed"] > 0, c
    assert c["rate_rps"] == held["capacity_rps"] and "bench serve" in c["command"]
    assert (tuned["out"] / "trials" / f"{w['number']:03d}" / "vllm-bench-serve" / "command.txt").is_file()
    stdout = tuned["resumed"].stdout.splitlines()
    assert stdout[0].startswith(f"winner: trial {w['number']}")
    assert stdout[1] == w["command"].replace("$LLMOPT_CACHE", tuned["env"]["LLMOPT_CACHE"])  # the line to paste here
    if w["number"] != 1:
        assert rec["ratio"]["value"] > 0


def test_quality_is_judged_against_the_fp16_reference_on_every_started_server(tuned):
    run = tuned["run"]
    assert run["stages"][0]["name"] == "hf-fp16" and run["stages"][0]["quality_reference"]
    for t in trials(tuned).values():
        if t["outcome"] == "cannot start":
            continue
        q = t["quality"]
        assert q["reference"] == "hf-fp16" and q["token_match_rate"] is not None, q
        assert q["gate"].startswith("not applied: no meaningful perplexity")  # random weights: not judged


def test_run_json_holds_the_held_results_and_recommend_reads_them(tuned):
    run, rec = tuned["run"], tuned["rec"]
    names = [s["name"] for s in run["stages"]]
    assert names[:2] == ["hf-fp16", "tune-defaults"]
    d = run["stages"][1]
    assert d["facts"]["slo_capacity_held"] and d["facts"]["serve_command"] == trials(tuned)[1]["command"]
    assert d["facts"]["slo"] == SLO and d["metrics"]["requests"] > 0
    assert ("tune-winner" in names) == (rec["winner"] != 1)
    r = run_cli("recommend", str(tuned["out"]), env=tuned["env"])
    assert r.returncode == 0, r.stderr
    assert "vllm serve" in r.stdout and trials(tuned)[rec["winner"]]["command"].split()[-1] in r.stdout
    r = run_cli("report", str(tuned["out"]), "-o", str(tuned["out"] / "report"), env=tuned["env"])
    assert r.returncode == 0, r.stderr
    assert "tune-defaults" in (tuned["out"] / "report" / "report.md").read_text()


def test_the_report_and_the_progress_lines(tuned):
    out = tuned["out"]
    md = (out / "tune.md").read_text()
    assert "## The answer" in md and "## Every trial" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()]
    assert len(rows) == len(trials(tuned))
    assert (out / "charts" / "tune_trials.png").stat().st_size > 1000
    err = tuned["resumed"].stderr
    assert "left]" in err and "best so far" in err
    assert not re.search(r"left\] trial 1: ", err), "the resumed run started the defaults' trial again"
    assert re.search(rf"left\] trial {tuned['killed_in']}: ", err)


def test_compare_shows_both_runs_held_capacities(tuned):
    """Two tune runs side by side: their held capacities; and the gate's verdict on their stages,
    one repeat a side (a hold), which no interval can settle: inconclusive, exit 9 (issue 33),
    never a pass that says nothing."""
    r = run_cli("compare", str(tuned["out"]), str(tuned["out"]), "--no-history", env=tuned["env"])
    assert r.returncode == 9, r.stderr
    assert "inconclusive" in r.stderr and "one repeat a side" in r.stderr
    assert "llmopt tune's held capacities" in r.stdout and "- defaults:" in r.stdout
