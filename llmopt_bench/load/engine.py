"""The one engine interface the load machine drives, and the function that runs a load point on
it. An engine's adapter (engines/vllm/engine.VLLMEngine, engines/hf/static_engine.StaticBatcher,
client/http_load.HTTPLoad) satisfies LoadEngine without importing this package: it speaks
core/dispatch.py's Dispatcher, and the load machine knows nothing of the engine behind it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from llmopt_bench.core.dispatch import Dispatcher
from llmopt_bench.load.conversations import ConversationLoop
from llmopt_bench.load.dispatchers import ClosedLoop, OpenLoop, RequestSource
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.load.point import LoadPoint, PointResult, point_result


class LoadEngine(Protocol):
    def drive(self, dispatcher: Dispatcher) -> None:
        """Send what the dispatcher releases, report every answer, return when it is finished."""
        ...


def run_point(engine: LoadEngine, point: LoadPoint, source: RequestSource, output_len: int, *,
              expected_tokens: int | None = None, repeat: int = 0, progress: Callable[[int], None] | None = None,
              dispatcher: OpenLoop | ClosedLoop | ConversationLoop | None = None) -> PointResult:
    """One load point on `engine`: its loop (point.dispatcher on `source`, or the dispatcher
    given: a schedule of its own), run to the end, and its figures. expected_tokens: the forced
    output length an answer must reach to count as complete (None: any answer counts)."""
    point.check()
    d = dispatcher or point.dispatcher(source, output_len, repeat, on_answer=progress)
    engine.drive(d)
    assert d.t0 is not None, "the engine never asked the dispatcher for a request"
    return point_result(point, d.timelines, d.t0, expected_tokens)


def run_plan(engine: LoadEngine, point: LoadPoint, load: PlanLoad, *, forced: bool = True, repeat: int = 0,
             progress: Callable[[int], None] | None = None) -> PointResult:
    """One load point of a workload plan (load/plans.py): each request judged complete against its
    own forced length (forced=False: any answer counts)."""
    return run_point(engine, point, load.request, 1, expected_tokens=1 if forced else None, repeat=repeat,
                     dispatcher=load.dispatcher(point, repeat, progress))
