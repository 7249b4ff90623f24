"""`llmopt tune` end to end through the real CLI on vLLM-CPU (synthetic:tiny, FP32, eager): the FP16
reference through the runner, then the search over a space of 4 knobs where one known knob wins.
The baseline serves one sequence at a time (max_num_seqs 1, [baseline]); max_num_seqs 4 completes
3-6x as many requests a second (measured on this 2-core host: 11 vs 70-80 req/s at 1 vs 8
sequences, 24 in / 64 out); an FP8 KV cache and a smaller card share change nothing here, and 256
tokens a step with chunked prefill off is a combination vLLM refuses (below max_model_len). The
search must screen every one-knob change on its ceiling alone, not start the refused one, narrow
only max_num_seqs 4, hold it with both ends of both capacities bounded, and confirm it by vLLM's
client, all within its budget, where the search before issue 43 spent a server start
and a short SLO search on every configuration it drew (16 here), and its defaults' capacity had
no upper end. The run is killed (SIGKILL: no clean-up, its server left running) once the
defaults' trial has ended and another trial's server is starting, then resumed to its end. One
run feeds every test here. Timings are not asserted, only what the search decided and recorded
(the winning knob wins by 3x or more, far beyond this host's noise)."""

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
enable_chunked_prefill = false

[baseline]
max_num_seqs = 1  # one sequence at a time: a server whose capacity the client times easily

[space]
max_num_seqs = [4]  # the known winner
max_num_batched_tokens = [256]  # below max_model_len with chunked prefill off: vLLM refuses it (not started)
kv_cache_dtype = ["fp8"]
gpu_memory_utilization = [0.5]  # vLLM-CPU sizes its KV cache from VLLM_CPU_KVCACHE_SPACE: no effect

[load]
requests_per_point = 8
warmup_s = 0.5
max_point_s = 8
ceiling_requests = 64

[search]
screen_noise = 0.5  # one all-at-once point on 2 shared cores moves by a third between runs
rounds = 1
combinations = 0  # the combinations are the unit tests' (test_tune_search.py): here the host's noise would make some
short_precision = 0.3
short_point_s = 2
short_probes = 4
precision = 0.15
point_s = 2.5
probes = 3
"""
BUDGET_S = 20 * 60  # the plan takes 6-8 min here; server starts take 35 s to 3 min on this shared host
ARGS = ["--model", "synthetic:tiny", "--num-prompts", "4", "--input-len", "24", "--max-new-tokens", "32", "--slo", SLO,
        "--hold", "4", "--budget", f"{BUDGET_S}s"]
BASELINE = {"max_num_seqs": 1, "max_num_batched_tokens": "default", "kv_cache_dtype": "default", "gpu_memory_utilization": "default"}


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
    later = ("decision", "confirmation")  # what the search makes of a trial afterwards (narrowed in trial N; the defaults confirmed)
    for n in finished:
        assert starts(out, n) <= 1, f"trial {n} finished before the kill and was started again"
        assert {k: v for k, v in trials(tuned)[n].items() if k not in later} == \
            {k: v for k, v in before[n].items() if k not in later}, f"trial {n}'s record changed"
    n = tuned["killed_in"]
    assert before[n]["outcome"] == "running" and trials(tuned)[n]["outcome"] != "running"
    assert starts(out, n) == 2, "the interrupted trial runs again under its number"
    assert sorted(trials(tuned)) == list(range(1, len(trials(tuned)) + 1))
    assert not servers_of(out), "a server of this run is still alive"
    assert tuned["rec"]["wall_s"] > tuned["killed"]["wall_s"]


def test_every_one_knob_change_is_screened_on_its_ceiling_alone_and_the_refused_one_is_not_started(tuned):
    got = trials(tuned)
    d = got[1]
    assert d["defaults"] and d["config"] == BASELINE and tuned["rec"]["defaults"] == 1
    assert d["command"].startswith("vllm serve ") and "--max-num-seqs 1" in d["command"]
    assert [r["name"] for r in d["rungs"]] == ["ceiling", "short", "precise", "held"]
    screens = [t for t in got.values() if t["phase"] == "screen"]
    changed = {k for t in screens for k, v in t["config"].items() if v != BASELINE[k]}
    assert changed == {"max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype", "gpu_memory_utilization"}
    assert len(screens) == 4 and all(sum(v != BASELINE[k] for k, v in t["config"].items()) == 1 for t in screens)
    for t in screens:
        if t["config"]["max_num_batched_tokens"] == 256:  # vLLM 0.32's SchedulerConfig refuses it: never started
            assert t["outcome"] == "not started" and "below max_model_len (512)" in t["reason"] and not t["command"], t
        else:  # rung 0: one all-at-once point, no point of the SLO search
            assert t["outcome"] == "screened" and [r["name"] for r in t["rungs"]] == ["ceiling"], t
            assert t["rungs"][0]["ceiling_rps"] > 0 and t["rungs"][0]["probes"] == 1


def test_the_known_knob_wins_held_bounded_at_both_ends_and_confirmed_within_the_budget(tuned):
    rec, got = tuned["rec"], trials(tuned)
    w = got[rec["winner"]]
    assert w["config"]["max_num_seqs"] == 4 and w["phase"] in ("narrow", "combine"), w["label"]
    # the screen kept every configuration without the known knob out of the SLO search (a knob the
    # noise lifted past screen_noise may be combined with it: then that combination is searched too)
    searched = [t for t in got.values() if any(r["name"] == "short" for r in t["rungs"])]
    assert all(t["defaults"] or t["config"]["max_num_seqs"] == 4 for t in searched), [t["label"] for t in searched]
    held = [r for r in w["rungs"] if r["name"] == "held"][0]
    d = [r for r in got[1]["rungs"] if r["name"] == "held"][0]
    # both ends of both capacities, to the precision; on a busy 2-core host the client may fall behind
    # above the winner's capacity (40+ req/s of 32 tokens), and the search then says its capacity is a
    # lower bound (load/capacity/search.py: nothing above an untrusted point is told), never a guess
    client_limit = any("measure the client, not the server" in n for n in held["notes"])
    for r in (held, d) if not client_limit else (d,):
        assert r["held"] and r["capacity_rps"] > 0 and r["upper_rps"] and r["upper_rps"] / r["capacity_rps"] - 1 <= 0.15 + 1e-9, r
    ratio = rec["ratio"]
    assert ratio["lo"] is not None and 1.5 < ratio["lo"] <= ratio["value"], ratio
    assert ratio["hi"] is not None or client_limit, (ratio, held["notes"])
    c = w["confirmation"]
    assert c and c["verdict"] in ("held", "missed") and c["figures"]["completed"] > 0, c
    assert c["rate_rps"] == held["capacity_rps"] and "bench serve" in c["command"]
    assert (tuned["out"] / "trials" / f"{w['number']:03d}" / "vllm-bench-serve" / "command.txt").is_file()
    assert rec["wall_s"] <= BUDGET_S, "the search ran past its budget"
    stdout = tuned["resumed"].stdout.splitlines()
    assert stdout[0].startswith(f"winner: trial {w['number']}")
    assert stdout[1] == w["command"].replace("$LLMOPT_CACHE", tuned["env"]["LLMOPT_CACHE"])  # the line to paste here


def test_quality_is_judged_against_the_fp16_reference_on_every_started_server(tuned):
    run = tuned["run"]
    assert run["stages"][0]["name"] == "hf-fp16" and run["stages"][0]["quality_reference"]
    for t in trials(tuned).values():
        if t["outcome"] in ("cannot start", "not started"):
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
    assert not re.search(r"left\] trial 1 \(", err), "the resumed run started the defaults' trial again"
    assert re.search(rf"left\] trial {tuned['killed_in']} \(", err)
    assert "## Where the budget went" in md and "narrowed in trial" in md and "not started" in md


def test_compare_shows_both_runs_held_capacities(tuned):
    """Two tune runs side by side: their held capacities; and the gate's verdict on their stages,
    one repeat a side (a hold), which no interval can settle: inconclusive, exit 9 (issue 33),
    never a pass that says nothing."""
    r = run_cli("compare", str(tuned["out"]), str(tuned["out"]), "--no-history", env=tuned["env"])
    assert r.returncode == 9, r.stderr
    assert "inconclusive" in r.stderr and "one repeat a side" in r.stderr
    assert "llmopt tune's held capacities" in r.stdout and "- defaults:" in r.stdout
