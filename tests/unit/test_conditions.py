"""Each repeat's conditions (measure/conditions.py) are the machine's, read for real: a repeat
that computes gets a CPU share near one, a repeat that sleeps near zero; the report explains
repeats only when they differ."""

from __future__ import annotations

import os
import time

from gatekit import BASELINE, load, only_stages, repeats_run

from llmopt_bench.analysis.gate.compare import SidesConditions, compare_runs
from llmopt_bench.core.results import RunResult
from llmopt_bench.measure.conditions import (
    ConditionsRecorder,
    RepeatConditions,
    conditions_sentence,
    conditions_summary,
    repeats_differ,
)
from llmopt_bench.render.compare_text import to_markdown


def _spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_computing_repeat_and_a_sleeping_one_read_apart():
    with ConditionsRecorder() as busy:
        _spin(0.3)
    with ConditionsRecorder() as idle:
        time.sleep(0.3)
    # relative, not 0.5: on a shared host (load 13 on 2 cores) a spinning repeat got a third of a core
    assert busy.result.cpu_share > max(0.1, 4 * idle.result.cpu_share) and idle.result.cpu_share < 0.2
    for c in (busy.result, idle.result):
        assert c.cpus == len(os.sched_getaffinity(0)) and c.involuntary_switches >= 0
        assert c.steal_s is not None and 0 <= c.steal_s < 1  # Linux counts it, a VM or not
        assert c.load1 is not None and abs(c.load1 - os.getloadavg()[0]) < 2


def test_no_gpu_clock_without_nvml(monkeypatch):
    monkeypatch.setattr("llmopt_bench.measure.nvml.device_indices", lambda: [])
    with ConditionsRecorder() as probe:
        pass
    assert probe.result.gpu_sm_mhz is None


def test_the_sentence_sets_each_repeat_next_to_its_conditions():
    conds = [RepeatConditions(load1=1.2, involuntary_switches=10, cpu_share=0.99),
             RepeatConditions(load1=7.9, involuntary_switches=5400, cpu_share=0.61)]
    text = conditions_sentence("tpot_p50", [0.0213, 0.0327], conds)
    assert "tpot_p50 21.3 / 32.7 ms" in text and "host load 1.2 / 7.9" in text
    assert "preempted 10 / 5400 times" in text and "CPU share 0.99 / 0.61" in text
    assert "GPU" not in text and "steal" not in text  # not recorded: not said
    conds[1].steal_s = 2.5
    assert "steal - / 2.5 s" in conditions_sentence("tpot_p50", [0.0213, 0.0327], conds)
    conds[0].gpu_sm_mhz, conds[1].gpu_sm_mhz = 1980, 1410
    assert "GPU SM clock 1980 / 1410 MHz" in conditions_sentence("tpot_p50", [0.0213, 0.0327], conds)


def test_only_repeats_that_differ_are_explained():
    assert repeats_differ([0.0213, 0.0327, 0.0240])  # the committed H200 hf-fp16
    assert not repeats_differ([0.00450, 0.00451, 0.00450])  # its vllm stage
    assert not repeats_differ([0.02, None]) and not repeats_differ([])


def test_the_summary_gives_each_figure_s_range_over_the_repeats():
    raw = [{"load1": 1.2, "cpus": 2, "involuntary_switches": 10, "cpu_share": 0.99},
           {"load1": 7.9, "cpus": 2, "involuntary_switches": 5400, "cpu_share": 0.61}]
    assert conditions_summary(raw) == "host load 1.2-7.9, preempted 10-5400 times a repeat, CPU share 0.61-0.99 (2 repeats)"
    assert conditions_summary([]) is None and conditions_summary(None) is None


def _with_conditions(raw: dict, load: float) -> dict:
    for s in raw["stages"]:
        s["extra"]["conditions"] = [{"load1": load, "cpus": 16, "involuntary_switches": 3, "cpu_share": 1.0}] * 3
    return raw


def test_compare_sets_a_regressed_stage_s_conditions_side_by_side():
    """The committed H200 baseline's vllm stage against its own repeats 20% slower as a whole, the
    slow run's machine a little busier (within what host_signals lets pass): the regressed stage
    carries both sides' conditions. (A load that moved beyond it: tests/unit/test_host_signals.py.)"""
    base = only_stages(load(BASELINE), ["vllm", "awq-int4"])
    slow = only_stages(repeats_run(load(BASELINE), [0, 1, 2], factor=1.2), ["vllm"])
    slow["stages"] += [s for s in base["stages"] if s["name"] == "awq-int4"]  # unchanged: no conditions line
    cmp = compare_runs(RunResult.model_validate(_with_conditions(base, 1.1)),
                       RunResult.model_validate(_with_conditions(slow, 1.6)))
    assert ("vllm", "tpot_p50") in cmp.regressions and all(s != "awq-int4" for s, _ in cmp.regressions)
    assert cmp.conditions == {"vllm": SidesConditions("host load 1.1, preempted 3 times a repeat, CPU share 1 (3 repeats)",
                                                      "host load 1.6, preempted 3 times a repeat, CPU share 1 (3 repeats)")}
    assert "Repeat conditions of vllm: baseline host load 1.1" in to_markdown(cmp)
    assert cmp.to_dict()["conditions"]["vllm"]["new"].startswith("host load 1.6")


def test_the_stage_s_child_processes_count(tmp_path):
    """A vLLM engine computes in processes below the stage's: a child that spins while the stage's
    own process sleeps still shows as CPU used during the repeat."""
    import subprocess
    import sys

    go, spun = tmp_path / "go", tmp_path / "spun"
    child = subprocess.Popen([sys.executable, "-c", (
        "import time, pathlib\n"
        f"while not pathlib.Path({str(go)!r}).exists(): time.sleep(0.01)\n"
        "end = time.process_time() + 0.5\n"
        "while time.process_time() < end: pass\n"
        f"pathlib.Path({str(spun)!r}).touch()\n"
        "time.sleep(60)\n")])
    try:
        time.sleep(0.5)  # the child's start-up is over before the repeat begins
        t0 = time.perf_counter()
        with ConditionsRecorder() as probe:
            go.touch()
            deadline = time.time() + 30
            while not spun.exists() and time.time() < deadline:
                time.sleep(0.05)
        wall = time.perf_counter() - t0
    finally:
        child.kill()
        child.wait()
    assert spun.exists()
    assert probe.result.processes >= 2
    assert probe.result.cpu_share * wall > 0.4  # the child's 0.5 s of CPU, however long it took on this host


def test_the_stage_report_explains_repeats_that_differ():
    from llmopt_bench.core.results import load_run
    from llmopt_bench.run.registry import load_stage

    run = load_run(BASELINE)
    stage = run.stage("hf-fp16")
    cls = load_stage("hf-fp16")

    def texts(per_repeat, conditions):
        stage.extra = {**stage.extra, "conditions": conditions,
                       "stopping": {"metric": "tpot_p50", "min_repeats": 3, "max_repeats": 3, "target_pct": 2.0,
                                    "repeats_run": 3, "per_repeat": per_repeat, "stopped": "fixed"}}
        return [b.text or "" for b in cls.report_blocks(stage, run)]

    busy = [{"load1": x, "cpus": 16, "involuntary_switches": n, "cpu_share": 1.0} for x, n in ((1.1, 3), (9.4, 4100), (1.3, 5))]
    line = next(t for t in texts([0.0213, 0.0327, 0.0240], busy) if t.startswith("Repeat conditions"))
    assert "tpot_p50 21.3 / 32.7 / 24 ms" in line and "host load 1.1 / 9.4 / 1.3" in line and "preempted 3 / 4100 / 5" in line
    assert not any(t.startswith("Repeat conditions") for t in texts([0.0213, 0.0214, 0.0213], busy))
    assert not any(t.startswith("Repeat conditions") for t in texts([0.0213, 0.0327, 0.0240], []))  # runs before them
