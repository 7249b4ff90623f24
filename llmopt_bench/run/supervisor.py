"""The supervisor: one stage's child process (the worker) seen from the runner: write its job, spawn the worker in a session
of its own, follow its events (progress, load, result) while NVML samples the session's memory
from outside, enforce the timeout, and turn what came back (or how the child ended) into the
stage's result. The card must be free again before the next stage starts."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from typing import Any, Callable

from llmopt_bench.analysis.metrics import compact, compute
from llmopt_bench.core.contract import Stage
from llmopt_bench.core.errors import first_line
from llmopt_bench.core.models import ModelInfo
from llmopt_bench.core.records import StageRun
from llmopt_bench.core.results import FAILED, EnergyRecord, MemoryRecord, RunResult, StageResult, utcnow
from llmopt_bench.measure.memory import MemorySampler
from llmopt_bench.procs import spawn
from llmopt_bench.procs.events import FD_ENV, start_reader
from llmopt_bench.procs.gpu import wait_gpu_free
from llmopt_bench.procs.interpreters import engine_python
from llmopt_bench.procs.tree import session_pids
from llmopt_bench.run.outcomes import Reference, Reporter, skipped, stage_result
from llmopt_bench.run.registry import StagePlan, entry_value
from llmopt_bench.run.rundir import RunDir

FIXES = {"oom": "lower --batch-size, --input-len or the stage's max_model_len, or use a smaller model",
         "timeout": "raise --timeout, or lower --num-prompts / --max-new-tokens",
         "killed": "something outside llmopt killed the stage; --resume runs it again"}


def write_job(plan: StagePlan, cls: type[Stage], run: RunResult, model: ModelInfo, rd: RunDir, ref: Reference,
              share_key: str | None = None) -> float:
    """The child's job, with paths relative to the run directory (a committed run leaks no
    machine's layout). Returns the spawn time the child measures its load from."""
    spawned = time.time()
    rd.write_json(rd.job(plan.name), {
        "stage": plan.name, "entry": entry_value(plan.stage), "params": plan.params,
        "model": model.model_dump(mode="json"), "workload": run.workload.model_dump(mode="json"),
        "stage_dir": rd.relative(rd.stage_dir(plan.name)), "log": rd.relative(rd.log(plan.name)),
        "reference_file": rd.relative(ref.file) if ref.file else None, "reference_name": ref.name,
        "provides_reference": ref.name == plan.name, "spawned_at": spawned, "owns_device": getattr(cls, "owns_device", True),
        "share_key": share_key})
    return spawned


def follow(proc: subprocess.Popen, events: "queue.Queue", plan: StagePlan, timeout: float, reporter: Reporter) -> tuple[dict | None, dict]:
    """The child's events until its result, its death or the timeout: (load event, final event)."""
    load_evt, final = None, None
    deadline = time.monotonic() + timeout
    while final is None:
        try:
            evt = events.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() > deadline:
                final = {"type": "timeout", "reason": f"exceeded its {timeout:.0f} s timeout"}
            continue
        if evt is None:  # the pipe closed without a result: the child died
            final = {"type": "died", "code": proc.wait()}
        elif evt["type"] == "progress":
            reporter.progress(plan.name, evt["msg"], evt.get("done"), evt.get("total"))
        elif evt["type"] == "load":
            load_evt = evt
            reporter.progress(plan.name, f"loaded in {evt['load_s']:.1f} s", None, None)
        elif evt["type"] != "log":
            final = evt
    return load_evt, final


def supervise(plan: StagePlan, cls: type[Stage], run: RunResult, model: ModelInfo, rd: RunDir, timeout: float, ref: Reference,
              env: dict[str, str], reporter: Reporter) -> StageResult:
    """One stage in a worker of its own: a group of one."""
    results: list[StageResult] = []
    supervise_group([plan], [cls], [None], run, model, rd, [timeout], ref, env, reporter,
                    begin=lambda _plan: None, done=lambda _plan, result: results.append(result))
    return results[0]


def supervise_group(plans: list[StagePlan], classes: list[type[Stage]], keys: list[str | None], run: RunResult, model: ModelInfo,
                    rd: RunDir, timeouts: list[float], ref: Reference, env: dict[str, str], reporter: Reporter,
                    begin: Callable[[StagePlan], None], done: Callable[[StagePlan, StageResult], None]) -> list[StagePlan]:
    """Stages that share an engine, in one worker, in order (worker.main with several jobs):
    begin(plan) as each starts, done(plan, result) as each ends. The group stops at the first
    stage that does not end in a result or a skip; returns the plans it did not run."""
    for plan, cls, key in zip(plans, classes, keys):
        rd.stage_dir(plan.name).mkdir(parents=True, exist_ok=True)
        spawned = write_job(plan, cls, run, model, rd, ref, key)
    before = spawn.oom_kills()
    rfd, wfd = os.pipe()
    with open(rd.log(plans[0].name), "w") as log:
        python = engine_python(classes[0].requires.engine) if classes[0].requires.child_in_engine else sys.executable
        proc = spawn.start([python, "-m", "llmopt_bench.run.worker", *(str(rd.job(p.name)) for p in plans)],
                           log=log, env=spawn.child_env({**env, FD_ENV: str(wfd)}), pass_fds=(wfd,))
    left = list(plans)
    baseline: dict[int, int] = {}
    try:
        os.close(wfd)
        events = start_reader(rfd)
        for i, (plan, cls) in enumerate(zip(plans, classes)):
            begin(plan)
            started = spawned if i == 0 else time.time()
            with MemorySampler(lambda: session_pids(proc.pid), enabled=cls.owns_device) as sampler:
                # the card before the group's engine started: the later stages' peaks and the
                # group's final check count from there, not from a card the engine already holds
                baseline = baseline if i else dict(sampler.peaks.device_baseline_bytes)
                sampler.peaks.device_baseline_bytes.update(baseline)
                load_evt, final = follow(proc, events, plan, timeouts[i], reporter)
            left.remove(plan)
            last = not left or final["type"] not in ("result", "skipped")
            free = _end_group(proc, final, sampler.peaks.nvml, baseline) if last else None
            if final["type"] == "died":
                status, reason = spawn.Exit(final["code"], oom_killed=spawn.oom_evidence(before)).outcome()
                final = {"type": status, "reason": f"worker {reason}"}
            rd.scrub(rd.log(plan.name))
            common = dict(started_at=utcnow(), log=rd.relative(rd.log(plan.name)), duration_s=round(time.time() - started, 3),
                          memory=memory_of(load_evt, final, sampler), gpu_free_after=free,
                          load_s=load_evt["load_s"] if load_evt else None, load=(load_evt or {}).get("info"))
            done(plan, outcome(plan, cls, final, common, rd, started))
            if last:
                return left
    except BaseException:
        spawn.kill_session(proc.pid)
        raise
    finally:
        spawn.kill_session(proc.pid)
    return left


def _end_group(proc: subprocess.Popen, final: dict, nvml: bool, baseline: dict[int, int]) -> Any:
    """The group's worker ends (its engines close in it), then the card must be free."""
    try:
        proc.wait(timeout=60 if final["type"] in ("result", "skipped") else 1)
    except subprocess.TimeoutExpired:
        pass
    spawn.kill_session(proc.pid)
    proc.wait()
    if not nvml:
        return None
    seen = wait_gpu_free(baseline, alive=lambda: session_pids(proc.pid))
    if seen.free:
        return {"free": True, "waited_s": round(seen.waited_s, 2)}
    return {"free": False, "waited_s": round(seen.waited_s, 2), "processes_left": seen.processes_left,
            "used_bytes": {str(i): u for i, u in seen.used_bytes.items()}}


def memory_of(load_evt: dict | None, final: dict, sampler: MemorySampler) -> MemoryRecord:
    memory = {**(load_evt or {}).get("memory", {}), **final.get("memory", {}), **sampler.peaks.as_dict()}
    if sampler.error:
        memory["note"] = sampler.error
    if load_evt and "torch_allocated_bytes" in load_evt.get("memory", {}):
        memory["after_load_allocated_bytes"] = load_evt["memory"]["torch_allocated_bytes"]
    return MemoryRecord(**memory)


def outcome(plan: StagePlan, cls: type[Stage], final: dict, common: dict, rd: RunDir, spawned: float) -> StageResult:
    kind = final["type"]
    if kind != "result":
        rd.put_requests(plan.name, [])  # an earlier attempt's requests are not this result's
    if kind == "skipped":
        return skipped(plan, cls, "skipped", final["reason"], final.get("fix"), **common)
    if kind != "result":
        status = kind if kind in FAILED + ("interrupted",) else "error"
        return skipped(plan, cls, status, final.get("reason", kind), FIXES.get(status, f"see {rd.log(plan.name)}"),
                       partial=rd.read_partial(plan.name, spawned), **common)
    stage_run = StageRun(**final["run"])
    samples = stage_run.samples
    result = stage_result(plan, cls, "ok", metrics=compute(samples), samples=compact(samples),
                          energy=EnergyRecord(**final["energy"]) if final.get("energy") else None,
                          quality=stage_run.quality, facts=stage_run.facts, extra=stage_run.extra, notes=stage_run.notes,
                          **common)
    rd.put_requests(plan.name, samples)
    try:  # the stage's own record must match the model it declares
        cls.Extra.model_validate(result.extra)
    except Exception as e:  # noqa: BLE001 - a stage's bug: its measurements stay, the result says what broke
        result.status, result.reason = "error", f"its extra does not match {cls.__name__}.Extra: {first_line(e)}"
    if result.metrics is None and samples:
        result.status, result.reason = "error", f"all {len(samples)} requests failed: {samples[0].error}"
    return result
