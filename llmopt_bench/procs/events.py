"""The wire between a stage's worker and its supervisor: one typed event a JSON line on a
dedicated pipe (the worker's stdout and stderr go to its log, where engines are free to be noisy).

The worker sends, in order: `prefetched` (a worker started ahead, once its imports are done),
then per stage `progress` (any number), `load`, and one final event: `result`, `skipped`,
`failed` or `interrupted`. The supervisor reads them back as the same types (`Event`, a union told apart by
`type`); a line that is not one of them is `Unreadable`, never guessed at."""

from __future__ import annotations

import os
import queue
import threading
from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter, ValidationError

from llmopt_bench.core.records import LoadInfo, StageRun, StrictModel
from llmopt_bench.core.results import EnergyRecord, StageTiming

FD_ENV = "LLMOPT_EVENT_FD"

# how a stage failed (core/results.FAILED): the worker says error or oom, the supervisor says
# timeout, or how the worker died (procs/spawn.Exit: killed, oom with the cgroup's evidence)
FailedStatus = Literal["oom", "timeout", "error", "killed"]


class WorkerMemory(StrictModel):
    """The worker's own view of its memory (the supervisor samples NVML from outside): the host
    RSS peak, and torch's CUDA allocator where the stage used CUDA."""

    cpu_max_rss_bytes: int | None = None
    torch_peak_allocated_bytes: int | None = None
    torch_peak_reserved_bytes: int | None = None
    torch_allocated_bytes: int | None = None


class Progress(StrictModel):
    """A stage's progress message; each starts a phase of the stage's timeline (run/durations.py)."""

    type: Literal["progress"] = "progress"
    msg: str
    done: int | None = None
    total: int | None = None


class Loaded(StrictModel):
    """The stage's load() returned: what it learnt, and the seconds from its worker's spawn (or go)."""

    type: Literal["load"] = "load"
    info: LoadInfo
    load_s: float
    memory: WorkerMemory


class Prefetched(StrictModel):
    """A worker started ahead (run/prefetch.py) did its imports: when, which, which failed, and
    whether CUDA got initialized meanwhile (it must not)."""

    type: Literal["prefetched"] = "prefetched"
    started: float
    ended: float
    imports: list[str]
    failed: list[str]
    cuda_initialized: bool


class Result(StrictModel):
    """The stage measured: its run, the worker's memory, the energy of its timed windows, and
    where its time went by the worker's clocks (warm-up, run, measured)."""

    type: Literal["result"] = "result"
    run: StageRun
    memory: WorkerMemory
    energy: EnergyRecord | None = None
    timing: StageTiming


class Skipped(StrictModel):
    """The stage found while loading that it cannot run here (core/contract.StageSkipped)."""

    type: Literal["skipped"] = "skipped"
    reason: str
    fix: str | None = None


class Failed(StrictModel):
    """The stage failed: sent by the worker (an exception: error, oom), or made by the supervisor
    (its timeout, the worker's death)."""

    type: Literal["failed"] = "failed"
    status: FailedStatus
    reason: str
    traceback: str | None = None  # the traceback is in the stage's log too
    memory: WorkerMemory | None = None


class Interrupted(StrictModel):
    """The worker was interrupted (Ctrl-C or SIGTERM reached it as KeyboardInterrupt)."""

    type: Literal["interrupted"] = "interrupted"
    reason: str
    traceback: str | None = None
    memory: WorkerMemory | None = None


Event = Annotated[Union[Progress, Loaded, Prefetched, Result, Skipped, Failed, Interrupted], Field(discriminator="type")]
Final = Union[Result, Skipped, Failed, Interrupted]  # the event that ends a stage
EVENT: TypeAdapter[Event] = TypeAdapter(Event)


class Unreadable(StrictModel):
    """A line on the pipe that is no event (a bug on one side of the wire): kept with the reason."""

    line: str
    error: str


class EventWriter:
    def __init__(self, fd: int | None = None):
        fd = fd if fd is not None else int(os.environ[FD_ENV])
        self._f = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def send(self, event: Event) -> None:
        line = event.model_dump_json()
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()


def read_event(line: str) -> Event | Unreadable:
    try:
        return EVENT.validate_json(line)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(part) for part in err["loc"])
        return Unreadable(line=line.rstrip()[:500], error=f"{where}: {err['msg']}" if where else err["msg"])


def start_reader(fd: int) -> "queue.Queue[Event | Unreadable | None]":
    """Read events on a thread; None on the queue means the worker closed the pipe."""
    q: queue.Queue[Event | Unreadable | None] = queue.Queue()

    def pump() -> None:
        with os.fdopen(fd, "r", encoding="utf-8") as f:
            for line in f:
                q.put(read_event(line))
        q.put(None)

    threading.Thread(target=pump, daemon=True, name="llmopt-events").start()
    return q
