"""--prefetch with real processes: the next stage's worker starts while the current one loads,
imports ahead (a test module whose import takes ~3 s of running time and notes a heartbeat every
50 ms), is stopped while the current stage measures, and runs its stage at its turn in the same
process; load_s no longer holds the import, timing.prefetched_s does. And when things go wrong:
a worker that died ahead is replaced, --fail-fast, Ctrl-C and a killed runner leave no process
behind and lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from testkit import PLUGIN_SAMPLES, ROOT, read_run, run_cli, write_plugin

TINY = ("--model", "synthetic:tiny", "--num-prompts", "2", "--max-new-tokens", "4", "--repeats", "1",
        "--warmup", "0", "--no-report")
JOURNEY = ("--stages", "p-first,p-second")
IMPORT_BEATS = 60  # x 50 ms of running time: the import p-second's worker does ahead

PLUGIN = textwrap.dedent('''
    import json
    import os
    import time
    from pathlib import Path

    from llmopt_bench.core.contract import Stage
    from llmopt_bench.core.records import LoadInfo, StageRun


    def marks():
        return Path(os.environ["P_MARKS"])


    class First(Stage):
        """Loads for 1 s (P_WAIT_AHEAD: once the next worker's import has begun), then measures
        for 3 s (one timed window)."""
        name = "p-first"
        description = "the stage before"

        def load(self, model, params, ctx):
            deadline = time.time() + 120
            while os.environ.get("P_WAIT_AHEAD") and not (marks() / "import.pid").exists() and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)
            (marks() / "first.ready").write_text(str(time.time()))
            return LoadInfo()

        def run(self, workload, ctx):
            (marks() / "first.pid").write_text(str(os.getpid()))
            if os.environ.get("P_FAIL"):
                raise RuntimeError("p-first fails")
            if os.environ.get("P_HANG"):
                time.sleep(300)
            with ctx.meter.window("main") as window:
                time.sleep(3.0)
                out = samples()
                window.tokens = 8
            (marks() / "first.end").write_text(str(time.time()))
            return StageRun(samples=out)


    class Second(Stage):
        """Imports a slow module in its load, as a real stage imports torch: ahead with --prefetch."""
        name = "p-second"
        description = "the stage after"
        prefetch = ("torch", "llmopt_slowimport")  # torch: the worker imports it before load() (_pick_device)

        def load(self, model, params, ctx):
            t0 = time.time()
            import llmopt_slowimport  # noqa: F401
            (marks() / "second.load").write_text(json.dumps({"pid": os.getpid(), "import_s": time.time() - t0}))
            return LoadInfo()

        def run(self, workload, ctx):
            return StageRun(samples=samples())
''') + PLUGIN_SAMPLES

SLOW_IMPORT = textwrap.dedent(f'''
    """Imported by p-second's worker: its pid, then a heartbeat every 50 ms of running time."""
    import json
    import os
    import time
    from pathlib import Path

    _marks = Path(os.environ["P_MARKS"])
    _ahead = "LLMOPT_GO_FD" in os.environ
    (_marks / ("import.pid" if _ahead else "import-in-turn.pid")).write_text(str(os.getpid()))
    if _ahead and os.environ.get("P_IMPORT_DIES"):
        os._exit(3)
    _beats = []
    for _ in range({IMPORT_BEATS}):
        _beats.append(time.time())
        time.sleep(0.05)
    (_marks / "import.beats").write_text(json.dumps(_beats))
''')


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory, tiny_model) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("prefetch-plugin")
    env = write_plugin(tmp, "llmopt_prefplug", {"p-first": "llmopt_prefplug:First", "p-second": "llmopt_prefplug:Second"},
                       PLUGIN)
    (tmp / "llmopt_prefplug-site" / "llmopt_slowimport.py").write_text(SLOW_IMPORT)
    return env


def start(out: Path, marks: Path, plugin_env: dict[str, str], *extra: str, **env: str) -> subprocess.Popen:
    marks.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "llmopt_bench", "bench", *JOURNEY, *TINY, "--output", str(out), *extra],
                            env={**os.environ, **plugin_env, "P_MARKS": str(marks), **env}, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has exited (a zombie counts as gone: its parent has not reaped it yet)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_for(path: Path, proc: subprocess.Popen, within_s: float = 180) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and proc.poll() is None:
        if path.is_file() and path.read_text().strip():
            return int(path.read_text())
        time.sleep(0.1)
    raise AssertionError(f"{path.name} never appeared; llmopt: {finish(proc, 5)[1][-3000:]}")


def stage(run: dict, name: str) -> dict:
    return next(s for s in run["stages"] if s["name"] == name)


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory, plugin_env):
    """The same journey with and without --prefetch, at once (both cores)."""
    tmp = tmp_path_factory.mktemp("prefetch-runs")
    procs = {"prefetch": start(tmp / "prefetch", tmp / "prefetch-marks", plugin_env, "--prefetch", P_WAIT_AHEAD="1"),
             "no-prefetch": start(tmp / "no-prefetch", tmp / "no-prefetch-marks", plugin_env, "--no-prefetch"),
             "first-fails": start(tmp / "first-fails", tmp / "first-fails-marks", plugin_env, "--prefetch", P_FAIL="1",
                                  P_WAIT_AHEAD="1")}
    done = {mode: finish(p) for mode, p in procs.items()}
    for mode, (code, err) in done.items():
        assert code == (4 if mode == "first-fails" else 0), f"{mode}: {err[-3000:]}"
    return tmp


def test_the_next_worker_imports_ahead_in_the_process_that_runs_its_stage(both_runs):
    marks, run = both_runs / "prefetch-marks", read_run(both_runs / "prefetch")
    second = stage(run, "p-second")
    loaded = json.loads((marks / "second.load").read_text())
    assert int((marks / "import.pid").read_text()) == loaded["pid"]  # imported ahead, in the worker that ran it
    assert loaded["import_s"] < 0.5  # its load found the module imported
    assert IMPORT_BEATS * 0.05 * 0.9 < second["timing"]["prefetched_s"] < 10, second["timing"]
    assert second["load_s"] < IMPORT_BEATS * 0.05, second  # less than the import alone: it is not in load_s ...
    assert second["duration_s"] < 10, second  # ... nor in its wall time
    first = stage(run, "p-first")
    t = first["timing"]  # the worker's own split of the stage before
    assert 2.9 < t["measured_s"] <= t["run_s"] < 8 and t["warmup_s"] < 1 and t["teardown_s"] >= 0, t
    assert first.get("timing", {}).get("prefetched_s") is None  # the first worker started as before


def test_the_worker_ahead_is_stopped_while_the_stage_before_measures(both_runs):
    marks = both_runs / "prefetch-marks"
    beats = json.loads((marks / "import.beats").read_text())
    ready, end = (float((marks / f).read_text()) for f in ("first.ready", "first.end"))
    assert beats[0] < ready + 0.5  # it imported while p-first loaded
    during = [b for b in beats if ready + 0.5 < b < end]  # SIGSTOP follows the load event within ms
    assert not during, f"{len(during)} heartbeats while p-first measured ({ready:.2f} to {end:.2f})"
    assert beats[-1] > end  # and went on once p-first's result was in


def test_without_prefetch_the_import_is_in_the_stage_load(both_runs):
    marks, run = both_runs / "no-prefetch-marks", read_run(both_runs / "no-prefetch")
    second = stage(run, "p-second")
    assert not (marks / "import.pid").exists()  # nothing ran ahead
    assert json.loads((marks / "second.load").read_text())["import_s"] > IMPORT_BEATS * 0.05 * 0.9
    assert second["load_s"] > IMPORT_BEATS * 0.05 * 0.9 and second["timing"].get("prefetched_s") is None


def test_after_a_failed_stage_the_worker_ahead_runs_the_next(both_runs):
    marks, run = both_runs / "first-fails-marks", read_run(both_runs / "first-fails")
    assert stage(run, "p-first")["status"] == "error"
    second = stage(run, "p-second")
    assert second["status"] == "ok" and second["timing"]["prefetched_s"] > 0
    assert int((marks / "import.pid").read_text()) == json.loads((marks / "second.load").read_text())["pid"]


def test_a_worker_that_died_ahead_is_replaced_by_a_fresh_one(tmp_path, plugin_env):
    code, err = finish(start(tmp_path / "run", tmp_path / "marks", plugin_env, "--prefetch", P_IMPORT_DIES="1"))
    assert code == 0, err[-3000:]
    second = stage(read_run(tmp_path / "run"), "p-second")
    assert second["status"] == "ok"
    assert any("started ahead" in n and "a fresh worker ran it" in n for n in second["notes"]), second["notes"]
    assert (tmp_path / "marks" / "import-in-turn.pid").is_file()  # the fresh worker imported in its load


def test_fail_fast_ends_the_worker_ahead(tmp_path, plugin_env):
    marks = tmp_path / "marks"
    code, err = finish(start(tmp_path / "run", marks, plugin_env, "--prefetch", "--fail-fast", P_FAIL="1",
                             P_WAIT_AHEAD="1"))
    assert code == 4, err[-3000:]
    ahead = int((marks / "import.pid").read_text())
    assert gone(ahead), f"the worker started ahead ({ahead}) still runs"
    run = read_run(tmp_path / "run")
    assert [s["name"] for s in run["stages"]] == ["p-first"] and stage(run, "p-first")["status"] == "error"
    assert "Traceback" not in err


def test_ctrl_c_ends_the_stopped_worker_ahead_and_resume_finishes(tmp_path, plugin_env):
    marks, out = tmp_path / "marks", tmp_path / "run"
    proc = start(out, marks, plugin_env, "--prefetch", P_HANG="1", P_WAIT_AHEAD="1")
    first = wait_for(marks / "first.pid", proc)
    ahead = wait_for(marks / "import.pid", proc)
    deadline = time.monotonic() + 10
    while state_of(ahead) != "T" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert state_of(ahead) == "T"  # stopped while p-first "measures"
    proc.send_signal(signal.SIGINT)
    code, err = finish(proc, 120)
    assert code == 130, err[-3000:]
    assert gone(ahead) and gone(first), "a worker outlived the interrupted run"
    assert stage(read_run(out), "p-first")["status"] == "interrupted"
    r = run_cli("bench", "--resume", str(out), "--prefetch", "--no-report", env={**plugin_env, "P_MARKS": str(marks)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert [(s["name"], s["status"]) for s in read_run(out)["stages"]] == [("p-first", "ok"), ("p-second", "ok")]


def test_a_killed_runner_takes_the_worker_ahead_with_it(tmp_path, plugin_env):
    marks = tmp_path / "marks"
    proc = start(tmp_path / "run", marks, plugin_env, "--prefetch", P_HANG="1", P_WAIT_AHEAD="1")
    first = wait_for(marks / "first.pid", proc)
    ahead = wait_for(marks / "import.pid", proc)
    try:
        proc.kill()  # SIGKILL: no finally runs in the runner
        proc.communicate()
        assert gone(ahead), "the worker started ahead outlived a killed runner"
    finally:
        try:
            os.killpg(first, signal.SIGKILL)  # p-first's worker outlives the runner, as any stage's does
        except ProcessLookupError:
            pass
