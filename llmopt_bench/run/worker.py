"""The child process that runs one stage: load, warm up, measure, tear down, and send back
its samples or the reason it could not (typed events, procs/events.py). Started by the
supervisor as `python -m llmopt_bench.run.worker RUN_DIR/stages/NAME/job.json` in a new session,
so it can be killed whole; with several jobs, a stage group that shares one engine
(engines/engine_pool.py). Each job is a StageJob, its paths relative to the run directory."""

from __future__ import annotations

import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from llmopt_bench.core.contract import StageContext, StageSkipped
from llmopt_bench.core.errors import describe, is_oom
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.models import ModelInfo, local_path
from llmopt_bench.core.records import StrictModel
from llmopt_bench.core.results import EnergyRecord, StageTiming
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.procs.events import EventWriter, Failed, Interrupted, Loaded, Progress, Result, Skipped, WorkerMemory
from llmopt_bench.run.preload import GO_ENV, await_turn
from llmopt_bench.run.registry import import_entry


class StageJob(StrictModel):
    """A stage's job file (stages/<name>/job.json): written by its supervisor, read by its worker.
    Paths are relative to the run directory (a committed run leaks no machine's layout); a worker
    started ahead reads its jobs at its go, when they are written again."""

    stage: str  # its name in the run: the journey's label, else the stage's
    entry: str  # the stage class, "module:Class" (run/registry.import_entry)
    params: Json  # free-form here: the stage's own params, which the worker checks against its Params model
    model: ModelInfo
    workload: WorkloadConfig
    stage_dir: str
    log: str
    reference_file: str | None = None  # the run's quality reference, written by its provider
    reference_name: str | None = None
    provides_reference: bool = False
    spawned_at: float  # the worker's spawn (or go): its load_s counts from here
    owns_device: bool = True  # False: a client of a device it does not hold (its energy is not the stage's)
    share_key: str | None = None  # the engine configuration it shares with later jobs of its group

    @classmethod
    def read(cls, path: Path) -> StageJob:
        return cls.model_validate_json(path.read_text())


def _torch_memory(device: str) -> WorkerMemory:
    memory = WorkerMemory(cpu_max_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    torch = sys.modules.get("torch")
    if torch is not None and device == "cuda" and torch.cuda.is_initialized():
        memory.torch_peak_allocated_bytes = torch.cuda.max_memory_allocated()
        memory.torch_peak_reserved_bytes = torch.cuda.max_memory_reserved()
        memory.torch_allocated_bytes = torch.cuda.memory_allocated()
    return memory


def _pick_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def context(job: StageJob, job_path: Path, device: str, events: EventWriter) -> StageContext:
    from llmopt_bench.run.rundir import RunDir

    rd = RunDir(job_path.resolve().parent.parent.parent)
    return StageContext(
        run_dir=rd.root, stage_dir=rd.root / job.stage_dir, device=device, log_path=rd.root / job.log,
        progress=lambda msg, done=None, total=None: events.send(Progress(msg=msg, done=done, total=total)),
        reference_file=rd.root / job.reference_file if job.reference_file else None,
        reference_name=job.reference_name, provides_reference=job.provides_reference,
        keep_partial=lambda data: rd.write_json(rd.partial(job.stage), data),
        meter=TimedMeter() if job.owns_device else TimedMeter(read_mj=lambda: None))


def run_one(job: StageJob, job_path: Path, events: EventWriter, shared: dict[str, Any], started: float) -> bool:  # shared: see StageContext.shared
    """One stage: load, warm up, measure, tear down, its outcome sent as an event. True when it
    ended so that a stage group may go on (a result, or skipped). shared: what the stages of one
    worker hand on (the group's engine pool), as core/contract.StageContext.shared."""
    stage = None
    device = "cpu"
    try:
        cls = import_entry(job.entry)
        params = cls.Params(**job.params)
        model = job.model.model_copy(update={"path": local_path(job.model.path)})
        device = _pick_device()
        ctx = context(job, job_path, device, events)
        ctx.shared = shared
        stage = cls()
        info = stage.load(model, params, ctx)
        ready = time.time()
        events.send(Loaded(info=info, load_s=ready - started, memory=_torch_memory(device)))
        if device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        stage.warmup(job.workload, ctx)
        measuring = time.time()
        run = stage.run(job.workload, ctx)
        energy = ctx.meter.record("main")
        events.send(Result(run=run, memory=_torch_memory(device), energy=EnergyRecord.model_validate(energy) if energy else None,
                           timing=timing(ready, measuring, time.time(), ctx.meter)))
        return True
    except StageSkipped as e:
        events.send(Skipped(reason=e.reason, fix=e.fix))
        return True
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the child exits
        tb = traceback.format_exc()
        print(tb, file=sys.stderr, flush=True)
        memory = _torch_memory(device)
        if isinstance(e, KeyboardInterrupt):
            events.send(Interrupted(reason=describe(e), traceback=tb, memory=memory))
        else:
            events.send(Failed(status="oom" if is_oom(e) else "error", reason=describe(e), traceback=tb, memory=memory))
        return False
    finally:
        if stage is not None:
            try:
                stage.teardown()
            except Exception:  # noqa: BLE001 - teardown must not hide the stage's own outcome
                traceback.print_exc()


def timing(ready: float, measuring: float, ran: float, meter: TimedMeter) -> StageTiming:
    """Where the stage's time after its load went, by the worker's own clocks (the supervisor adds
    the teardown and what a worker started ahead imported)."""
    return StageTiming(warmup_s=round(measuring - ready, 3), run_s=round(ran - measuring, 3),
                       measured_s=round(meter.window_seconds, 3) if meter.totals else None)


def log_to(path: Path) -> None:
    """This process's stdout and stderr into the next stage's log (a stage group). Processes an
    engine started keep the log they were started with: the first stage's."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def main(job_paths: list[str]) -> int:
    """One stage, or a stage group: stages that share an engine, in order; the group stops at
    the first stage that fails (the runner runs the rest on their own)."""
    from llmopt_bench.engines.engine_pool import POOL_KEY, EnginePool

    events = EventWriter()
    paths = [Path(p) for p in job_paths]
    if GO_ENV in os.environ and not await_turn(prefetch_names(paths), events.send):
        return 0  # started ahead, and the run stopped before its turn
    jobs = [StageJob.read(p) for p in paths]  # written again at the go: spawned_at is the go's time
    pool = EnginePool() if len(jobs) > 1 else None
    try:
        for i, (job, path) in enumerate(zip(jobs, paths)):
            if i:
                log_to(path.resolve().parent.parent.parent / job.log)
            if pool is not None:
                pool.current, pool.current_key = job.stage, job.share_key
                pool.later = {j.share_key for j in jobs[i + 1:] if j.share_key}
            if not run_one(job, path, events, {POOL_KEY: pool} if pool else {}, job.spawned_at if i == 0 else time.time()):
                return 1
        return 0
    finally:
        if pool is not None:
            pool.close_all()


def prefetch_names(paths: list[Path]) -> list[str]:
    """What the stages of these jobs import, for a worker started ahead (Stage.prefetch_imports)."""
    names: list[str] = []
    for path in paths:
        try:
            cls = import_entry(StageJob.read(path).entry)
        except Exception:  # noqa: BLE001 - the stage's turn reports a stage that does not load
            continue
        names += [n for n in cls.prefetch_imports() if n not in names]
    return names


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
