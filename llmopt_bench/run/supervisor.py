"""The supervisor: a stage group's worker seen from the runner: write its jobs, spawn the worker in
a session of its own, follow its events (procs/events.py: progress, load, then a result, a skip
or a failure) while NVML samples the session's memory from outside, enforce each stage's
timeout, and turn what came back (or how the worker ended) into each stage's result
(run/outcomes.py). The card must be free again before the next group starts."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable, TypedDict

from llmopt_bench.analysis.metrics import compact, compute
from llmopt_bench.core.errors import first_line
from llmopt_bench.core.records import LoadInfo
from llmopt_bench.core.results import GpuFree, MemoryRecord, StageResult, StageTiming, utc_at
from llmopt_bench.measure.memory import MemorySampler
from llmopt_bench.procs import spawn
from llmopt_bench.procs.events import FD_ENV, Failed, Final, Interrupted, Loaded, Prefetched, Progress, Result, Skipped, Unreadable, start_reader
from llmopt_bench.procs.gpu import wait_gpu_free
from llmopt_bench.procs.interpreters import engine_python
from llmopt_bench.procs.tree import session_pids
from llmopt_bench.run.durations import Timeline, phase_label
from llmopt_bench.run.outcomes import failed, interrupted, measured, skipped
from llmopt_bench.run.prefetch import Launched, Turn, prefetched_seconds
from llmopt_bench.run.preload import GO_ENV, RUNNER_ENV
from llmopt_bench.run.registry import StagePlan, entry_value
from llmopt_bench.run.session import ReadyStage, Reporter, RunSession
from llmopt_bench.run.worker import StageJob

FIXES = {"oom": "lower --batch-size, --input-len or the stage's max_model_len, or use a smaller model",
         "timeout": "raise --timeout, or lower --num-prompts / --max-new-tokens",
         "killed": "something outside llmopt killed the stage; --resume runs it again"}


def write_job(session: RunSession, stage: ReadyStage) -> float:
    """The worker's job (run/worker.StageJob), with paths relative to the run directory. Returns
    the spawn time the worker measures its load from (for a worker started ahead, its go: the job
    is written again then)."""
    rd, ref = session.rundir, session.reference
    job = StageJob(stage=stage.name, entry=entry_value(stage.plan.stage), params=stage.plan.params, model=session.model,
                   workload=session.run.workload, stage_dir=rd.relative(rd.stage_dir(stage.name)), log=rd.relative(rd.log(stage.name)),
                   reference_file=rd.relative(ref.file) if ref.file else None, reference_name=ref.name,
                   provides_reference=ref.name == stage.name, spawned_at=time.time(), owns_device=stage.cls.owns_device,
                   share_key=stage.share_key)
    rd.write_json(rd.job(stage.name), job.model_dump(mode="json"))
    return job.spawned_at


def write_jobs(session: RunSession, group: list[ReadyStage]) -> float:
    spawned = 0.0
    for stage in group:
        session.rundir.stage_dir(stage.name).mkdir(parents=True, exist_ok=True)
        spawned = write_job(session, stage)
    return spawned


def launch(session: RunSession, group: list[ReadyStage], ahead: bool = False) -> Launched:
    """Spawn a group's worker in a session of its own, its events on a pipe; ahead=True: a worker
    that imports, then waits for its go (run/prefetch.py)."""
    spawned = write_jobs(session, group)
    rd, first = session.rundir, group[0]
    rfd, wfd = os.pipe()
    extra, fds = {FD_ENV: str(wfd)}, [wfd]
    go_read, go_write = os.pipe() if ahead else (None, None)
    if go_read is not None:
        extra.update({GO_ENV: str(go_read), RUNNER_ENV: str(os.getpid())})
        fds.append(go_read)
    try:
        with open(rd.log(first.name), "w") as log:
            python = engine_python(first.cls.requires.engine) if first.cls.requires.child_in_engine else sys.executable
            proc = spawn.start([python, "-m", "llmopt_bench.run.worker", *(str(rd.job(s.name)) for s in group)],
                               log=log, env=spawn.child_env({**session.worker_env, **extra}), pass_fds=fds)
    except BaseException:
        for fd in (rfd, go_write):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return Launched(proc, start_reader(rfd), spawned, go_write)


@dataclass
class Died:
    """The worker's pipe closed without a final event: the worker died (its exit code)."""

    code: int


@dataclass
class Followed:
    """What one stage's worker sent: its final event (or its death) and when that came, its load
    event, and (a worker started ahead) what it imported before its turn."""

    final: Final | Died
    ended_at: float
    load: Loaded | None = None
    prefetched: Prefetched | None = None


def follow(worker: Launched, stage: ReadyStage, reporter: Reporter, on_load: Callable[[], None] = lambda: None,
           timeline: Timeline | None = None) -> Followed:
    """The worker's events until the stage's final event, the worker's death or the stage's
    timeout; on_load() at its load event; each progress message starts a phase of the timeline
    (where the stage's time went)."""
    timeline = timeline or Timeline(time.time())
    load: Loaded | None = None
    prefetched: Prefetched | None = None
    final: Final | Died | None = None  # the event that ended the stage, or one made up for a timeout or a death
    deadline = time.monotonic() + stage.timeout_s
    while final is None:
        try:
            evt = worker.events.get(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
        except queue.Empty:
            if time.monotonic() > deadline:
                final = Failed(status="timeout", reason=f"exceeded its {stage.timeout_s:.0f} s timeout")
            continue
        if evt is None:  # the pipe closed without a final event: the worker died
            final = Died(worker.proc.wait())
        elif isinstance(evt, Progress):
            timeline.mark(phase_label(evt.msg))
            reporter.progress(stage.name, evt.msg, evt.done, evt.total)
        elif isinstance(evt, Loaded):
            load = evt
            timeline.mark("after load")
            on_load()
            reporter.progress(stage.name, f"loaded in {evt.load_s:.1f} s", None, None)
        elif isinstance(evt, Prefetched):
            prefetched = evt
        elif isinstance(evt, Unreadable):  # llmopt's own bug: the stage ends, and says why
            final = Failed(status="error", reason=f"its worker sent a line that is no event ({evt.error}): {evt.line[:200]}")
        else:
            final = evt
    timeline.mark("after its result (engine shut down, card freed)")
    return Followed(final, time.time(), load, prefetched)


def supervise(session: RunSession, stage: ReadyStage, turn: Turn | None = None) -> StageResult:
    """One stage in a worker of its own: a group of one."""
    results: list[StageResult] = []
    supervise_group(session, [stage], begin=lambda _plan: None, done=lambda _plan, result: results.append(result), turn=turn)
    return results[0]


def take_turn(session: RunSession, group: list[ReadyStage], turn: Turn) -> tuple[Launched, list[str]]:
    """The group's worker: the one started ahead, told to go (its jobs written again now), else a
    fresh one; and the notes the first result carries about it."""
    worker, notes = turn.worker, list(turn.notes)
    if worker is not None:
        worker.spawned = write_jobs(session, group)
        if worker.go():
            return worker, notes
        code = worker.proc.poll()
        worker.kill()
        notes.append(f"its worker, started ahead (--prefetch), was gone at its turn (code {code}): a fresh worker ran it")
    return launch(session, group), notes


def supervise_group(session: RunSession, group: list[ReadyStage], begin: Callable[[StagePlan], None],
                    done: Callable[[StagePlan, StageResult], None], turn: Turn | None = None) -> list[StagePlan]:
    """Stages that share an engine, in one worker, in order (worker.main with several jobs):
    begin(plan) as each starts, done(plan, result) as each ends. The group stops at the first
    stage that does not end in a result or a skip; returns the plans it did not run. turn: its
    worker if started ahead, and the next group's, started now and stopped while this one measures."""
    turn = turn or Turn()
    worker, notes = take_turn(session, group, turn)
    proc = worker.proc
    before = spawn.oom_kills()
    left = [stage.plan for stage in group]
    baseline: dict[int, int] = {}
    try:
        turn.start_ahead()
        for i, stage in enumerate(group):
            begin(stage.plan)
            started = worker.spawned if i == 0 else time.time()
            timeline = Timeline(started, "start-up (process, imports)" if i == 0 else "start")
            with MemorySampler(lambda: session_pids(proc.pid), enabled=stage.cls.owns_device) as sampler:
                # the card before the group's engine started: the later stages' peaks and the
                # group's final check count from there, not from a card the engine already holds
                baseline = baseline if i else dict(sampler.peaks.device_baseline_bytes)
                sampler.peaks.device_baseline_bytes.update(baseline)
                seen = follow(worker, stage, session.reporter, on_load=turn.pause_ahead, timeline=timeline)
            left.remove(stage.plan)
            last = not left or not isinstance(seen.final, (Result, Skipped))
            if last:
                turn.resume_ahead()  # the group's results are in: the next worker may import again
            free = _end_group(proc, seen.final, sampler.peaks.nvml, baseline) if last else None
            final = died(seen.final, before) if isinstance(seen.final, Died) else seen.final
            session.rundir.scrub(session.rundir.log(stage.name))
            ended = time.time()
            observed = Observed(started_at=utc_at(started), log=session.rundir.relative(session.rundir.log(stage.name)),
                                duration_s=round(ended - started, 3), memory=memory_of(seen.load, final, sampler),
                                gpu_free_after=free, load_s=seen.load.load_s if seen.load else None,
                                load=seen.load.info if seen.load else None,
                                timing=timing_of(seen, started, ended, worker.paused), phases=timeline.close())
            result = outcome(session, stage, final, observed, started)
            result.notes += notes if i == 0 else []
            done(stage.plan, result)
            if last:
                return left
    finally:
        worker.close_go()
        spawn.kill_session(proc.pid)
    return left



def died(death: Died, oom_kills_before: int | None) -> Failed:
    """The worker's death as an outcome: oom only with the cgroup's evidence (procs/spawn.Exit)."""
    status, reason = spawn.Exit(death.code, oom_killed=spawn.oom_evidence(oom_kills_before)).outcome()
    return Failed(status=status, reason=f"worker {reason}")


def timing_of(seen: Followed, started: float, ended: float, paused: list[tuple[float, float]]) -> StageTiming:
    """Where the stage's time went (core/results.StageTiming): the worker's own split of its run,
    the teardown seen from here, and the imports a worker started ahead did before its go."""
    timing = seen.final.timing.model_copy() if isinstance(seen.final, Result) else StageTiming()
    timing.teardown_s = round(ended - seen.ended_at, 3)
    p = seen.prefetched
    if p:
        timing.prefetched_s = prefetched_seconds(p.started, p.ended, started, paused)
        timing.prefetch_cuda_initialized = p.cuda_initialized or None
        timing.prefetch_failed = list(p.failed)
    return timing


def _end_group(proc: "subprocess.Popen[bytes]", final: Final | Died, nvml: bool, baseline: dict[int, int]) -> GpuFree | None:
    """The group's worker ends (its engines close in it), then the card must be free."""
    try:
        proc.wait(timeout=60 if isinstance(final, (Result, Skipped)) else 1)
    except subprocess.TimeoutExpired:
        pass
    spawn.kill_session(proc.pid)
    proc.wait()
    if not nvml:
        return None
    seen = wait_gpu_free(baseline, alive=lambda: session_pids(proc.pid))
    if seen.free:
        return GpuFree(free=True, waited_s=round(seen.waited_s, 2))
    return GpuFree(free=False, waited_s=round(seen.waited_s, 2), processes_left=seen.processes_left,
                   used_bytes={str(i): u for i, u in seen.used_bytes.items()})


def memory_of(load: Loaded | None, final: Final, sampler: MemorySampler) -> MemoryRecord:
    """The stage's memory: the worker's own view at its load and its end, NVML's from outside."""
    ends = final.memory if isinstance(final, (Result, Failed)) else None
    memory = MemoryRecord(**{**(load.memory.model_dump(exclude_none=True) if load else {}),
                             **(ends.model_dump(exclude_none=True) if ends else {}), **sampler.peaks.as_dict()})
    if sampler.error:
        memory.note = sampler.error
    if load and load.memory.torch_allocated_bytes is not None:
        memory.after_load_allocated_bytes = load.memory.torch_allocated_bytes
    return memory


class Observed(TypedDict):
    """What the supervisor saw of a stage, whatever its outcome: StageResult's fields every
    result carries."""

    started_at: str
    log: str
    duration_s: float
    memory: MemoryRecord
    gpu_free_after: GpuFree | None
    load_s: float | None
    load: LoadInfo | None
    timing: StageTiming
    phases: dict[str, float]


def outcome(session: RunSession, stage: ReadyStage, final: Final, observed: Observed, spawned: float) -> StageResult:
    """The stage's result from its final event (run/outcomes.py: one builder for each way it ended)."""
    rd, plan, cls = session.rundir, stage.plan, stage.cls
    if not isinstance(final, Result):
        rd.put_requests(plan.name, [])  # an earlier attempt's requests are not this result's
    if isinstance(final, Skipped):
        return skipped(plan, cls, final.reason, final.fix, **observed)
    if isinstance(final, Failed):
        return failed(plan, cls, final.status, final.reason, FIXES.get(final.status, f"see {rd.log(plan.name)}"),
                      partial=rd.read_partial(plan.name, spawned), **observed)
    if isinstance(final, Interrupted):
        return interrupted(plan, cls, final.reason, f"see {rd.log(plan.name)}", partial=rd.read_partial(plan.name, spawned),
                           **observed)
    stage_run = final.run
    samples = stage_run.samples
    result = measured(plan, cls, metrics=compute(samples), samples=compact(samples), energy=final.energy,
                      quality=stage_run.quality, facts=stage_run.facts, extra=stage_run.extra, notes=stage_run.notes,
                      **observed)
    rd.put_requests(plan.name, stage_run.requests or samples)  # a serving stage's: every load point's
    try:  # the stage's own record must match the model it declares
        cls.Extra.model_validate(result.extra)
    except Exception as e:  # noqa: BLE001 - a stage's bug: its measurements stay, the result says what broke
        result.status, result.reason = "error", f"its extra does not match {cls.__name__}.Extra: {first_line(e)}"
    if result.metrics is None and samples:
        result.status, result.reason = "error", f"all {len(samples)} requests failed: {samples[0].error}"
    return result
