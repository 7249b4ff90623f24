"""The spine end to end: real `llmopt bench` runs through the real CLI on synthetic:tiny, with
third-party stages registered through entry points (write_plugin) that succeed, raise, run out
of memory, hang, skip themselves or lack an import; an interrupted run and --resume; journey
files and the user errors that must exit 2 without a traceback."""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from testkit import ROOT, read_run, run_cli, write_plugin

TINY = ("--model", "synthetic:tiny", "--num-prompts", "2", "--max-new-tokens", "8", "--repeats", "1",
        "--warmup", "0", "--no-report")

PLUGIN = textwrap.dedent('''
    """Test stages, registered the way a third party does (entry points of a distribution)."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    from llmopt_bench.core.records import LoadInfo, RequestSample, StageRun, StrictModel
    from llmopt_bench.core.contract import Requirements, Stage, StageSkipped


    def samples(n=2, tokens=4):
        out, t = [], time.perf_counter()
        for i in range(n):
            times = [t + 0.01 * (k + 1) for k in range(tokens)]
            out.append(RequestSample(request_id=f"r{i:04d}", prompt_id=f"p{i}", batch=i, prompt_tokens=5,
                                     output_tokens=tokens, t_submit=t, t_first=times[0], t_done=times[-1],
                                     token_times=times))
            t = times[-1]
        return out


    def note_pid(ctx, name, pid):
        (ctx.stage_dir / name).write_text(str(pid))


    def _hang_worker_starts():
        """In t-hang's worker (argv: worker.py stages/t-hang/job.json), at import, before the
        worker imports torch: note its pid and start a grandchild in its session, so that the
        test can check both are gone even when the 3 s timeout strikes before load()."""
        job = Path(sys.argv[1]) if len(sys.argv) > 1 else None
        if job is None or job.name != "job.json" or job.parent.name != "t-hang":
            return
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        (job.parent / "helper.pid").write_text(str(helper.pid))
        (job.parent / "worker.pid").write_text(str(os.getpid()))


    _hang_worker_starts()


    class Base(Stage):
        description = "a test stage"
        changes = "nothing"

        def load(self, model, params, ctx):
            self.params = params
            return LoadInfo(implementation={"engine": "test"})

        def run(self, workload, ctx):
            return StageRun(samples=samples(workload.num_prompts, workload.max_new_tokens))


    class Good(Base):
        name = "t-good"


    class ParamsModel(StrictModel):
        level: int = 1
        label: str = "default"


    class WithParams(Base):
        name = "t-param"
        Params = ParamsModel

        def run(self, workload, ctx):
            return StageRun(samples=samples(), extra={"seen_params": self.params.model_dump()})


    class Raises(Base):
        name = "t-raise"

        def run(self, workload, ctx):
            raise RuntimeError("boom from t-raise")


    class Oom(Base):
        name = "t-oom"

        def run(self, workload, ctx):
            raise MemoryError("cannot allocate 10 GiB")


    class Skips(Base):
        name = "t-skip"

        def load(self, model, params, ctx):
            raise StageSkipped("no kernel for this shape", "use a model with hidden size divisible by 128")


    class Missing(Base):
        name = "t-missing"
        requires = Requirements(imports={"surely_missing_mod": "bnb"})

        def load(self, model, params, ctx):
            raise AssertionError("a stage with a missing import must not be started")


    class Hangs(Base):
        name = "t-hang"

        def run(self, workload, ctx):
            time.sleep(300)
            return StageRun(samples=samples())


    class Slow(Base):
        """Slow only while LLMOPT_TEST_SLOW is set (the first, interrupted, run)."""
        name = "t-slow"

        def run(self, workload, ctx):
            if os.environ.get("LLMOPT_TEST_SLOW"):
                (ctx.stage_dir / "partial.json").write_text('{"curve": [1, 2], "mixed": []}')  # measured so far
                note_pid(ctx, "worker.pid", os.getpid())
                time.sleep(300)
            return StageRun(samples=samples(workload.num_prompts, workload.max_new_tokens), extra={"quick": True})


    class Flaky(Base):
        """Fails while LLMOPT_TEST_FLAKY is set (a flaky first night), works after."""
        name = "t-flaky"

        def run(self, workload, ctx):
            if os.environ.get("LLMOPT_TEST_FLAKY"):
                raise RuntimeError("flaky from t-flaky")
            return StageRun(samples=samples(workload.num_prompts, workload.max_new_tokens), extra={"second": True})
''')

STAGES = {n: f"llmopt_testplug:{c}" for n, c in [
    ("t-good", "Good"), ("t-param", "WithParams"), ("t-raise", "Raises"), ("t-oom", "Oom"), ("t-skip", "Skips"),
    ("t-missing", "Missing"), ("t-hang", "Hangs"), ("t-slow", "Slow"), ("t-flaky", "Flaky")]}


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory, tiny_model) -> dict[str, str]:
    return write_plugin(tmp_path_factory.mktemp("plugin"), "llmopt_testplug", STAGES, PLUGIN)


class Pending:
    """A `llmopt` command started in the background: the runs below are mostly single-threaded
    process start-ups, so running three at once uses both cores."""

    def __init__(self, *args: str, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen([sys.executable, "-m", "llmopt_bench", *args], env={**os.environ, **(env or {})},
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._done: subprocess.CompletedProcess | None = None

    def result(self, timeout: float = 600) -> subprocess.CompletedProcess:
        if self._done is None:
            out, err = self.proc.communicate(timeout=timeout)
            self._done = subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)
        return self._done

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


OUTCOMES_JOURNEY = """
[[stage]]
name = "t-raise"

[[stage]]
name = "t-oom"

[[stage]]
name = "t-skip"

[[stage]]
name = "t-missing"

[[stage]]
name = "t-param"
params = { level = 3, label = "from the journey" }
timeout_s = 120

[[stage]]
name = "t-param"
label = "t-param-5"
params = { level = 5 }
"""


@pytest.fixture(scope="module", autouse=True)
def background(tmp_path_factory, tiny_model, plugin_env):
    """(a) the real hf-fp16 run, (b) a journey file naming every outcome, then a stage that works
    and takes params, and (b) a stage that cannot run here named with --stages: started together."""
    tmp = tmp_path_factory.mktemp("runs")
    journey = tmp / "outcomes.toml"
    journey.write_text(OUTCOMES_JOURNEY)
    outs = {k: tmp / k for k in ("hf", "outcomes", "missing")}
    runs = {
        "hf": Pending("bench", "--stages", "hf-fp16", *TINY, "--prompts", short_prompts(tmp / "prompts.jsonl"),
                      "--output", str(outs["hf"]), "--json"),
        "outcomes": Pending("bench", "--stages", str(journey), *TINY, "--output", str(outs["outcomes"]), env=plugin_env),
        "missing": Pending("bench", "--stages", "t-missing", *TINY, "--output", str(outs["missing"]), env=plugin_env),
    }
    yield {k: (p, outs[k]) for k, p in runs.items()}
    for p in runs.values():
        p.stop()


def gone(pid: int) -> bool:
    """No such process, or a zombie awaiting its reaper: either way it runs no more."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.05)
    return gone(pid)


def stage(run: dict, name: str) -> dict:
    found = [s for s in run["stages"] if s["name"] == name]
    assert len(found) == 1, [s["name"] for s in run["stages"]]
    return found[0]


def requests_lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines() if line.strip()]


def short_prompts(path: Path) -> str:
    path.write_text("".join(json.dumps({"id": f"p{i}", "text": f"Where is parcel number {i}? It was due on day {i}."})
                            + "\n" for i in range(4)))
    return str(path)


# Sections (d), timeout and (c) come first: they run while the background runs of (a) and (b)
# are still measuring.

# --- (d) journeys, stage lists and user errors --------------------------------------------

def test_bad_param_in_journey_exits_2_naming_it(tmp_path, plugin_env):
    journey = tmp_path / "j.toml"
    journey.write_text('[[stage]]\nname = "t-param"\nparams = { levle = 3 }\n')
    r = run_cli("bench", "--stages", str(journey), *TINY, "--output", str(tmp_path / "run"), env=plugin_env)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "levle" in r.stderr and "t-param" in r.stderr
    assert "level" in r.stderr  # the fix lists the valid params
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "run.json").exists()


def test_bad_param_type_exits_2(tmp_path, plugin_env):
    journey = tmp_path / "j.toml"
    journey.write_text('[[stage]]\nname = "t-param"\nparams = { level = "high" }\n')
    r = run_cli("bench", "--stages", str(journey), *TINY, "--output", str(tmp_path / "run"), env=plugin_env)
    assert r.returncode == 2 and "'level'" in r.stderr and "Traceback" not in r.stderr


def test_unknown_stage_exits_2_listing_known(tmp_path):
    r = run_cli("bench", "--stages", "hf-fp16,no-such-stage", *TINY, "--output", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "no-such-stage" in r.stderr
    assert "known stages" in r.stderr and "hf-fp16" in r.stderr
    assert "Traceback" not in r.stderr


def test_missing_model_path_exits_2(tmp_path):
    r = run_cli("bench", "--stages", "hf-fp16", *TINY[2:], "--model", str(tmp_path / "no-model-here"),
                "--output", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr[-3000:]
    assert "no-model-here" in r.stderr and "not found" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_prompt_file_exits_2_naming_the_line(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n{"id": "c", "text": \n')
    r = run_cli("bench", "--stages", "hf-fp16", *TINY, "--prompts", str(prompts), "--output", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"{prompts}:3:" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "run.json").exists()


def test_stages_json_lists_hf_fp16_available(plugin_env):
    r = run_cli("stages", "--json", env=plugin_env)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["hf-fp16"]["available"] is True and rows["hf-fp16"]["reason"] is None
    assert "dtype" in rows["hf-fp16"]["params"]
    assert rows["t-missing"]["available"] is False
    assert rows["t-missing"]["reason"] == "surely_missing_mod not installed"
    assert rows["t-missing"]["fix"] == "pip install 'llmopt-bench[bnb]'"
    assert rows["t-param"]["params"] == ["level", "label"]


@pytest.mark.parametrize("argv", [["--help"], ["stages", "--json"], ["bench", "--help"]])
def test_cli_does_not_import_torch(argv):
    code = ("import sys, contextlib, io\n"
            "from llmopt_bench.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            f"    rc = main({argv!r})\n"
            "print(rc, len(out.getvalue()) > 0, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["0", "True", "False", "False"], r.stdout


# --- (b) a hanging stage -------------------------------------------------------------------

def test_timeout_kills_the_stage_session(tmp_path, plugin_env):
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = run_cli("bench", "--stages", "t-hang", *TINY, "--timeout", "3", "--output", str(out), env=plugin_env,
                timeout=120)
    assert time.monotonic() - t0 < 90  # it did not sleep out its 300 s
    assert r.returncode == 4, r.stderr[-3000:]
    s = stage(read_run(out), "t-hang")
    assert s["status"] == "timeout"
    assert "3 s timeout" in s["reason"]
    assert s["fix"] and "--timeout" in s["fix"]
    stage_dir = out / "stages" / "t-hang"
    worker, helper = (int((stage_dir / f).read_text()) for f in ("worker.pid", "helper.pid"))
    assert wait_gone(worker), f"worker {worker} still runs"
    assert wait_gone(helper), f"the stage's own child {helper} still runs"


# --- (c) interrupted, then resumed --------------------------------------------------------

@pytest.mark.parametrize("started_ignoring_sigint", [False, True])
def test_interrupt_then_resume(tmp_path, plugin_env, started_ignoring_sigint):
    # started_ignoring_sigint: as a shell without job control starts a background command
    out = tmp_path / "run"
    args = ["bench", "--stages", "t-good,t-slow", *TINY, "--output", str(out)]
    env = {**os.environ, **plugin_env, "LLMOPT_TEST_SLOW": "1"}
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if started_ignoring_sigint else None
    proc = subprocess.Popen([sys.executable, "-m", "llmopt_bench", *args], env=env, cwd=ROOT, preexec_fn=ignore,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    slow_pid_file = out / "stages" / "t-slow" / "worker.pid"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if slow_pid_file.is_file() and slow_pid_file.read_text().strip():
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert slow_pid_file.is_file(), "t-slow never started"
        first = read_run(out)
        assert stage(first, "t-good")["status"] == "ok"  # in run.json before the interrupt
        proc.send_signal(signal.SIGINT)
        try:
            _, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # llmopt dumps every thread's stack to stderr
            time.sleep(2)
            proc.kill()
            _, stderr = proc.communicate()
            pytest.fail(f"llmopt did not stop within 120 s of SIGINT; its stacks:\n{stderr[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr[-3000:]
    assert "--resume" in stderr
    assert "Traceback" not in stderr
    assert wait_gone(int(slow_pid_file.read_text())), "the interrupted stage's process still runs"

    run = read_run(out)  # still valid JSON, with what finished
    assert run["status"] == "interrupted"
    good, slow = stage(run, "t-good"), stage(run, "t-slow")
    assert good["status"] == "ok" and slow["status"] == "interrupted"
    assert "--resume" in slow["fix"] and slow["log"] == "logs/t-slow.log"
    assert slow["partial"] == {"curve": [1, 2], "mixed": []} and slow["extra"] == {}  # what it measured is kept
    assert run_cli("report", str(out), env=plugin_env).returncode == 0
    assert "t-slow stopped early; what it had measured is in run.json, partial: curve." in \
        (out / "report.md").read_text()
    assert {x["stage"] for x in requests_lines(out)} == {"t-good"}

    # no --stages: the resume finishes the journey the run was started with, not the default one
    r = run_cli("bench", "--resume", str(out), "--no-report", env=plugin_env)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = read_run(out)
    assert resumed["status"] == "complete"
    assert [s["name"] for s in resumed["stages"]] == ["t-good", "t-slow"]
    assert [p["name"] for p in resumed["journey"]] == ["t-good", "t-slow"]
    assert stage(resumed, "t-good") == good  # kept as it was (started_at, load_s, ...), not measured again
    slow2 = stage(resumed, "t-slow")
    assert slow2["status"] == "ok" and slow2["extra"] == {"quick": True}
    assert resumed["workload"] == run["workload"]  # the workload came from the run, not the defaults
    lines = requests_lines(out)
    assert sum(x["stage"] == "t-good" for x in lines) == 2
    assert sum(x["stage"] == "t-slow" for x in lines) == 2

    # --stages with --resume adds to the journey: only the new stage runs
    r = run_cli("bench", "--resume", str(out), "--stages", "t-param", "--no-report", env=plugin_env)
    assert r.returncode == 0, r.stderr[-3000:]
    added = read_run(out)
    assert [s["name"] for s in added["stages"]] == ["t-good", "t-slow", "t-param"]
    assert stage(added, "t-slow") == slow2 and [p["name"] for p in added["journey"]] == ["t-good", "t-slow", "t-param"]


def test_resume_reruns_a_failed_stage_in_place_and_keeps_the_rest(tmp_path, plugin_env):
    """Issue 33: one flaky stage of a nightly run used to mean a whole new run (--resume kept it
    as "error"). --rerun failed (or its name) measures it again; every other stage stays as it was."""
    out = tmp_path / "run"
    r = run_cli("bench", "--stages", "t-good,t-flaky,t-param", *TINY, "--output", str(out), "--no-report",
                env={**plugin_env, "LLMOPT_TEST_FLAKY": "1"})
    assert r.returncode == 4 and stage(read_run(out), "t-flaky")["status"] == "error", r.stderr[-2000:]
    first = read_run(out)
    r = run_cli("bench", "--resume", str(out), "--no-report", env=plugin_env)  # as before: kept, and says how to rerun
    assert r.returncode == 4 and "already in the run (error): kept (resume; --rerun failed measures it again)" in r.stderr
    for bad, said in ((["--rerun", "t-flakey"], "did you mean t-flaky?"), (["--rerun", ""], "empty")):
        r = run_cli("bench", "--resume", str(out), *bad, "--no-report", env=plugin_env)
        assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr, r.stderr[-2000:]
    r = run_cli("bench", "--stages", "t-good", *TINY, "--output", str(tmp_path / "other"), "--rerun", "failed", env=plugin_env)
    assert r.returncode == 2 and "--resume" in r.stderr
    r = run_cli("bench", "--resume", str(out), "--rerun", "failed", "--no-report", env=plugin_env)
    assert r.returncode == 0, r.stderr[-3000:]
    again = read_run(out)
    assert stage(again, "t-flaky")["status"] == "ok" and stage(again, "t-flaky")["extra"] == {"second": True}
    assert stage(again, "t-good") == stage(first, "t-good") and stage(again, "t-param") == stage(first, "t-param")
    assert [s["name"] for s in again["stages"]] == ["t-good", "t-flaky", "t-param"] and again["status"] == "complete"
    r = run_cli("bench", "--resume", str(out), "--rerun", "t-good", "--no-report", env=plugin_env)  # by name: an ok one too
    assert r.returncode == 0 and stage(read_run(out), "t-good")["started_at"] != stage(first, "t-good")["started_at"]
    assert stage(read_run(out), "t-flaky") == stage(again, "t-flaky")


# --- (a) the baseline stage, really measured ----------------------------------------------

@pytest.fixture(scope="module")
def hf_run(background):
    pending, out = background["hf"]
    return pending.result(), out


def check_instrumentation(inst: dict) -> None:
    """The overhead block is what its own pairs say: recomputed here from the recorded ratios
    (the interval's order statistics, the median, the verdict), not taken on trust."""
    from llmopt_bench.analysis.overhead import median, median_ci, overhead_verdict

    ratios = inst["ratios_pct"]
    assert 10 <= inst["pairs"] <= 40 and len(ratios) == inst["pairs"]
    assert inst["overhead_pct"] == pytest.approx(median(ratios))
    lo, hi, level = median_ci(ratios)
    assert inst["ci_pct"] == [lo, hi] and inst["ci_level"] == level >= 0.95
    assert sorted(ratios)[1] <= lo and hi <= sorted(ratios)[-2]  # 10+ pairs: the interval drops the extremes
    assert inst["verdict"] == overhead_verdict((lo, hi), inst["budget_pct"])
    assert inst["clock_call_rounds"] >= 5 and 0 < inst["clock_call_s"] <= inst["clock_call_s_max"]
    assert inst["bound_pct"] == pytest.approx(100 * inst["clock_call_s_max"] / inst["per_token_s_without"])


def test_hf_fp16_run_is_complete(hf_run):
    r, out = hf_run
    assert r.returncode == 0, r.stderr[-3000:]
    run = read_run(out)
    assert json.loads(r.stdout) == run  # --json prints exactly run.json
    assert run["status"] == "complete" and run["finished_at"]
    s = stage(run, "hf-fp16")
    assert s["status"] == "ok", (s["reason"], (out / s["log"]).read_text()[-2000:])
    m = s["metrics"]
    assert m["requests"] == 2 and m["failed_requests"] == 0 and m["repeats"] == 1
    assert m["output_tokens"] == 2 * 8
    assert m["ttft_s"]["n"] == 2 and m["e2e_s"]["n"] == 2 and m["tpot_s"]["n"] == 2
    assert m["itl_s"]["n"] == 2 * 7  # 7 gaps between 8 tokens, per request
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        d = m[key]
        assert 0 < d["min"] <= d["p50"] <= d["p90"] <= d["p99"] <= d["max"], (key, d)
    assert m["ttft_s"]["max"] <= m["e2e_s"]["max"]
    assert m["output_tok_s"] > 0 and m["qps"] > 0
    assert len(m["output_tok_s_repeats"]) == 1 and len(m["qps_repeats"]) == 1
    assert s["load_s"] and s["load_s"] > 0
    assert s["load"]["implementation"]["engine"] == "transformers"
    assert s["memory"]["cpu_max_rss_bytes"] > 10 * 1024**2
    check_instrumentation(s["extra"]["instrumentation"])
    assert s["log"] == "logs/hf-fp16.log" and (out / s["log"]).is_file()
    assert s["own_workload"] is False  # the fixed prompt set: its row compares with the other stages'
    assert set(s["params"]) >= {"dtype", "attn_implementation", "measure_overhead"}  # validated, defaults filled


def test_hf_fp16_run_fingerprints_the_environment(hf_run):
    r, out = hf_run
    run = read_run(out)
    env = run["env"]
    assert env["device"] == "cpu"
    assert env["versions"]["torch"] and env["versions"]["transformers"]
    assert env["python"] == sys.version.split()[0]
    assert env["llmopt"]
    assert env["command"].startswith("llmopt bench") and "--stages hf-fp16" in env["command"]
    assert env["ceilings"]["mem_bandwidth_bytes_s"] > 0 and env["ceilings"]["matmul_flops"] > 0
    assert run["model"]["source"] == "synthetic:tiny"
    assert run["workload"]["num_prompts"] == 2 and run["workload"]["max_new_tokens"] == 8


def test_hf_fp16_requests_jsonl(hf_run):
    r, out = hf_run
    lines = requests_lines(out)
    assert len(lines) == 2
    assert {line["stage"] for line in lines} == {"hf-fp16"}
    assert len({line["request_id"] for line in lines}) == 2
    for line in lines:
        assert line["ok"] and line["output_tokens"] == 8
        times = line["token_times"]
        assert len(times) == line["output_tokens"]
        assert times == sorted(times)
        assert line["t_submit"] < line["t_first"] == times[0] <= line["t_done"] == times[-1]
        assert line["prompt_tokens"] > 0
    # run.json's statistics are those of these very samples
    m = stage(read_run(out), "hf-fp16")["metrics"]
    ttfts = [x["t_first"] - x["t_submit"] for x in lines]
    gaps = [b - a for x in lines for a, b in zip(x["token_times"], x["token_times"][1:])]
    assert m["ttft_s"]["p50"] == pytest.approx(statistics.median(ttfts), rel=1e-9)
    assert m["itl_s"]["mean"] == pytest.approx(statistics.fmean(gaps), rel=1e-9)
    assert m["prompt_tokens"] == sum(x["prompt_tokens"] for x in lines)


# --- (b) third-party stages and every outcome ---------------------------------------------

@pytest.fixture(scope="module")
def outcomes_run(background):
    pending, out = background["outcomes"]
    return pending.result(), out


def test_failing_stage_exits_4_and_the_run_goes_on(outcomes_run):
    r, out = outcomes_run
    assert r.returncode == 4, r.stderr[-3000:]
    assert "t-raise" in r.stderr and "t-oom" in r.stderr
    assert "Traceback" not in r.stderr  # the tracebacks are in the stages' logs
    run = read_run(out)
    assert run["status"] == "complete"
    assert [s["name"] for s in run["stages"]] == ["t-raise", "t-oom", "t-skip", "t-missing", "t-param", "t-param-5"]
    assert stage(run, "t-param")["status"] == "ok"  # after four stages that did not work
    assert stage(run, "t-param")["metrics"]["requests"] == 2


def test_raise_in_run_is_error_with_traceback_in_log(outcomes_run):
    r, out = outcomes_run
    s = stage(read_run(out), "t-raise")
    assert s["status"] == "error"
    assert "RuntimeError" in s["reason"] and "boom from t-raise" in s["reason"]
    assert s["metrics"] is None
    log = (out / s["log"]).read_text()
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: boom from t-raise" in log
    assert "llmopt_testplug.py" in log  # the frame that raised
    assert str(out / "logs" / "t-raise.log") in s["fix"]


def test_memory_error_is_oom(outcomes_run):
    r, out = outcomes_run
    s = stage(read_run(out), "t-oom")
    assert s["status"] == "oom"
    assert "MemoryError" in s["reason"]
    assert s["fix"] and "batch-size" in s["fix"]
    assert "MemoryError: cannot allocate 10 GiB" in (out / s["log"]).read_text()


def test_stage_skipped_is_skipped_with_reason_and_fix(outcomes_run):
    r, out = outcomes_run
    s = stage(read_run(out), "t-skip")
    assert s["status"] == "skipped"
    assert s["reason"] == "no kernel for this shape"
    assert s["fix"] == "use a model with hidden size divisible by 128"


def test_missing_import_is_skipped_without_starting(outcomes_run):
    r, out = outcomes_run
    s = stage(read_run(out), "t-missing")
    assert s["status"] == "skipped"
    assert s["reason"] == "surely_missing_mod not installed"
    assert s["fix"] == "pip install 'llmopt-bench[bnb]'"
    assert not (out / "logs" / "t-missing.log").exists()  # never started a process


def test_journey_file_params_reach_the_stage(outcomes_run):
    r, out = outcomes_run
    s = stage(read_run(out), "t-param")
    assert s["status"] == "ok"
    assert s["params"] == {"level": 3, "label": "from the journey"}
    assert s["extra"]["seen_params"] == {"level": 3, "label": "from the journey"}


def test_requests_jsonl_holds_only_successful_stages(outcomes_run):
    r, out = outcomes_run
    lines = requests_lines(out)
    assert sorted(x["stage"] for x in lines) == ["t-param"] * 2 + ["t-param-5"] * 2


def test_a_labelled_stage_runs_again_with_its_own_params_and_name(outcomes_run):
    r, out = outcomes_run
    run = read_run(out)
    first, again = stage(run, "t-param"), stage(run, "t-param-5")
    assert again["status"] == "ok" and again["stage"] == "t-param" and first.get("stage") is None
    assert again["extra"]["seen_params"] == {"level": 5, "label": "default"} and first["extra"]["seen_params"]["level"] == 3
    assert again["log"] == "logs/t-param-5.log" and (out / again["log"]).is_file() and (out / first["log"]).is_file()
    assert (out / "stages" / "t-param-5" / "job.json").is_file()


def test_missing_import_named_on_command_line_exits_3(background):
    pending, out = background["missing"]
    r = pending.result()
    assert r.returncode == 3, r.stderr[-3000:]
    assert "t-missing" in r.stderr and "surely_missing_mod not installed" in r.stderr
    assert "pip install 'llmopt-bench[bnb]'" in r.stderr
    assert "Traceback" not in r.stderr
    s = stage(read_run(out), "t-missing")
    assert s["status"] == "skipped"


def test_each_stage_records_when_it_started_and_where_its_time_went(hf_run, outcomes_run):
    """started_at is the stage's spawn (it held the end before issue 28): each stage's start and
    duration lie within the run and after the previous stage's; its phases, timed from one
    progress message to the next, add up to its duration."""
    from datetime import datetime, timedelta

    for _, out in (hf_run, outcomes_run):
        run = read_run(out)
        created, finished = datetime.fromisoformat(run["created_at"]), datetime.fromisoformat(run["finished_at"])
        ends = created - timedelta(seconds=1)
        for s in [s for s in run["stages"] if s.get("duration_s")]:  # journey order is run order here (no groups)
            start = datetime.fromisoformat(s["started_at"])
            assert start >= ends - timedelta(seconds=1), (s["name"], start, ends)  # to the second: 1 s of rounding
            ends = start + timedelta(seconds=s["duration_s"])
            assert ends <= finished + timedelta(seconds=1), (s["name"], ends, finished)
            assert sum(s["phases"].values()) == pytest.approx(s["duration_s"], abs=1.0), s["phases"]
    phases = stage(read_run(hf_run[1]), "hf-fp16")["phases"]
    assert {"start-up (process, imports)", "loading synthetic:tiny", "repeat"} <= set(phases), phases
