"""The worker -> supervisor wire (procs/events.py): every event crosses a real pipe and comes back
as the type it was sent as; a line that is no event is Unreadable and ends the stage as an error
with the reason, never as a guess (the processes themselves: tests/integration/test_runner.py)."""

from __future__ import annotations

import os
import queue

from llmopt_bench.core.contract import Stage
from llmopt_bench.core.records import LoadInfo, RequestSample, StageRun
from llmopt_bench.core.results import EnergyRecord, StageTiming
from llmopt_bench.procs.events import (
    EventWriter,
    Failed,
    Interrupted,
    Loaded,
    Prefetched,
    Progress,
    Result,
    Skipped,
    Unreadable,
    WorkerMemory,
    read_event,
    start_reader,
)
from llmopt_bench.run.durations import Timeline
from llmopt_bench.run.prefetch import Launched
from llmopt_bench.run.registry import StagePlan
from llmopt_bench.run.session import ReadyStage
from llmopt_bench.run.supervisor import follow

SAMPLE = RequestSample(request_id="r0", prompt_id="p0", prompt_tokens=4, output_tokens=2, t_submit=0.0, t_first=0.1,
                       t_done=0.2, token_times=[0.1, 0.2])
EVENTS = [
    Prefetched(started=1.0, ended=2.5, imports=["torch"], failed=["vllm: ImportError"], cuda_initialized=False),
    Progress(msg="repeat 1/3", done=1, total=3),
    Loaded(info=LoadInfo(phases_s={"weights_s": 1.5}), load_s=3.25, memory=WorkerMemory(cpu_max_rss_bytes=1 << 20)),
    Result(run=StageRun(samples=[SAMPLE], extra={"k": [1, 2]}), memory=WorkerMemory(cpu_max_rss_bytes=2 << 20),
           energy=EnergyRecord(joules=3.0, seconds=1.5), timing=StageTiming(warmup_s=0.5, run_s=2.0, measured_s=1.5)),
    Skipped(reason="no FP8 here", fix="use a card with FP8"),
    Failed(status="oom", reason="CUDA out of memory", traceback="Traceback ...", memory=WorkerMemory()),
    Interrupted(reason="KeyboardInterrupt"),
]


def test_every_event_crosses_the_pipe_as_its_own_type():
    read, write = os.pipe()
    events = start_reader(read)
    writer = EventWriter(write)
    for event in EVENTS:
        writer.send(event)
    writer._f.close()
    got = [events.get(timeout=10) for _ in EVENTS]
    assert got == EVENTS and [type(e) for e in got] == [type(e) for e in EVENTS]
    assert events.get(timeout=10) is None  # the writer closed: the worker is gone


def test_a_line_that_is_no_event_is_unreadable_with_the_reason():
    assert isinstance(read_event("INFO something an engine printed\n"), Unreadable)
    wrong = read_event('{"type": "load", "load_s": 1.0}')
    assert isinstance(wrong, Unreadable) and wrong.error.startswith("load.info:"), wrong  # which field, of which event
    assert isinstance(read_event('{"type": "failed", "status": "bored", "reason": "x"}'), Unreadable)
    assert isinstance(read_event('{"type": "failed", "status": "interrupted", "reason": "x"}'), Unreadable)  # its own event


class _Reporter:
    def __init__(self) -> None:
        self.said: list[tuple] = []

    def progress(self, name, msg, done, total) -> None:
        self.said.append((name, msg, done, total))


def _follow(*events):
    q: queue.Queue = queue.Queue()
    for e in events:
        q.put(e)
    loads: list[int] = []
    reporter = _Reporter()
    worker = Launched(proc=None, events=q, spawned=0.0)  # type: ignore[arg-type]  # no process: it never dies here
    stage = ReadyStage(StagePlan("t-stage"), Stage, timeout_s=30.0)
    seen = follow(worker, stage, reporter, on_load=lambda: loads.append(1), timeline=Timeline(0.0))
    return seen, reporter.said, loads


def test_the_supervisor_reads_the_load_and_the_result_as_types():
    seen, said, loads = _follow(EVENTS[0], EVENTS[1], EVENTS[2], EVENTS[3])
    assert seen.prefetched == EVENTS[0] and seen.load == EVENTS[2] and seen.final == EVENTS[3] and loads == [1]
    assert said == [("t-stage", "repeat 1/3", 1, 3), ("t-stage", "loaded in 3.2 s", None, None)]


def test_an_unreadable_line_ends_the_stage_as_an_error_that_says_why():
    seen, _, _ = _follow(EVENTS[1], Unreadable(line="garbage", error="Invalid JSON"))
    assert isinstance(seen.final, Failed) and seen.final.status == "error"
    assert "no event (Invalid JSON): garbage" in seen.final.reason
