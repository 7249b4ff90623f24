"""A workload plan (workloads/plan.py) as the load of a point: the dispatcher a LoadPoint runs
on it, whatever the kind.

- single-turn plans (fixed, mixed, random, shared-prefix): the point's own loop (closed or open,
  load/dispatchers.py) on plan.request(i): each request with its own forced length; a generated
  plan never repeats a prompt, the prompt file's list is cycled as it always was;
- multi-turn: the conversation loop (load/conversations.py); an open point at r requests/s starts
  conversations at r / mean turns a second, so rates stay requests a second across kinds;
- a trace: an open point replays the trace's schedule scaled to the point's rate (the trace at
  r / its own rate times its speed: "the trace at 3.2x"), a closed one sends its rows' lengths in
  order; replay() is the trace on its own schedule (its speedup).

Every dispatcher is seeded by the point (LoadPoint.seed) and the plan (its seed): a point sends
the same requests at the same offsets every run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from llmopt_bench.core.errors import UsageError
from llmopt_bench.load.arrivals import arrival_offsets
from llmopt_bench.load.conversations import ConversationLoop
from llmopt_bench.load.dispatchers import ClosedLoop, OpenLoop
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.workloads.plan import Plan

Loop = OpenLoop | ClosedLoop | ConversationLoop


@dataclass
class PlanLoad:
    """The plan's requests as load points send them; tag prefixes request ids ("w": warm-up)."""

    plan: Plan
    tag: str = ""
    start: int = 0  # the plan index the first request takes (warm-up draws past the measured ones)

    def request(self, i: int):
        return self.plan.request(self.start + i, self.tag)

    def dispatcher(self, point: LoadPoint, repeat: int = 0, on_answer: Callable[[int], None] | None = None) -> Loop:
        point.check()
        if self.plan.multi_turn:
            return self._conversations(point, repeat, on_answer)
        if self.plan.own_schedule and point.rate is not None:
            return self._trace(point, point.rate, repeat, on_answer)
        return point.dispatcher(self.request, 1, repeat, on_answer)

    def _conversations(self, point: LoadPoint, repeat: int, on_answer: Callable[[int], None] | None) -> ConversationLoop:
        plan = self.plan

        def conv(i: int):
            return plan.conversation(self.start + i)
        if point.concurrency is not None:
            return ConversationLoop(conv, plan.filler, users=point.concurrency, num_requests=point.num_requests,
                                    duration_s=point.duration_s, repeat=repeat, on_answer=on_answer)
        assert point.rate is not None
        starts = arrival_offsets(point.rate / plan.mean_turns, point.num_requests, point.burstiness, point.seed, point.duration_s)
        return ConversationLoop(conv, plan.filler, starts=starts, num_requests=point.num_requests, duration_s=point.duration_s,
                                max_concurrency=point.max_concurrency, repeat=repeat, on_answer=on_answer)

    def speedup_at(self, rate: float) -> float:
        """How many times faster than recorded a trace runs at `rate` requests/s."""
        own = getattr(self.plan, "rate_rps", None)
        if not own:
            raise UsageError("the trace has all its rows at one instant: it has no rate to scale",
                             "replay it on its own schedule, or use a trace whose rows are spread in time")
        return rate / own * getattr(getattr(self.plan, "params", None), "speedup", 1.0)

    def _trace(self, point: LoadPoint, rate: float, repeat: int, on_answer: Callable[[int], None] | None) -> OpenLoop:
        """The trace's rows at their times (as replayed: after the spec's speed-up) scaled to `rate`,
        as many as the point's duration or number of requests holds."""
        plan = self.plan
        own = getattr(plan, "rate_rps", None) or rate
        scale = own / rate
        schedule = []
        for i in range(plan.size or 0):
            at = (plan.conversation(i).at_s or 0.0) * scale
            if (point.duration_s is not None and at >= point.duration_s) or \
                    (point.num_requests is not None and len(schedule) >= point.num_requests):
                break
            schedule.append((at, plan.request(i, self.tag)))
        return OpenLoop.of(schedule, 1, max_concurrency=point.max_concurrency, repeat=repeat, on_answer=on_answer)

    def replay_point(self, warmup_s: float = 0.0) -> LoadPoint:
        """The trace on its own schedule: a point at its own rate, lasting its span."""
        rate = getattr(self.plan, "rate_rps", None)
        span = getattr(self.plan, "span_s", 0.0)
        if not rate:
            raise UsageError("the trace has all its rows at one instant: no schedule to replay", "use a trace spread in time")
        return LoadPoint(rate=rate, duration_s=span + 1e-6, warmup_s=min(warmup_s, span / 2))
