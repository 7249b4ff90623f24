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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property, partial

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import PlanRecord
from llmopt_bench.core.workload import Request
from llmopt_bench.load.arrivals import arrival_offsets
from llmopt_bench.load.conversations import ConversationLoop
from llmopt_bench.load.dispatchers import ClosedLoop, OpenLoop
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.workloads.plan import Conversation, Plan

WARMUP_START = 1_000_000  # a generated plan's warm-up requests: far past any measured index, never sent measured
Loop = OpenLoop | ClosedLoop | ConversationLoop


def _conversation_at(plan: Plan, start: int, i: int) -> Conversation:
    return plan.conversation(start + i)


@dataclass
class PlanLoad:
    """The plan's requests as load points send them; tag prefixes request ids ("w": warm-up)."""

    plan: Plan
    tag: str = ""
    start: int = 0  # the plan index the first request takes (warm-up draws past the measured ones)

    @classmethod
    def of_requests(cls, requests: Sequence[Request], output_len: int) -> PlanLoad:
        """A given list of requests (cycled), each at output_len unless it carries its own."""
        from llmopt_bench.workloads.synth import RequestsPlan

        return cls(RequestsPlan(spec="fixed", seed=0, items=list(requests), output_len=output_len))

    def request(self, i: int) -> Request:
        return self.plan.request(self.start + i, self.tag)

    @cached_property
    def record(self) -> PlanRecord:
        return self.plan.record()

    def lengths(self) -> tuple[int | None, int | None]:
        """The prompt and output length a row names: the first request's for the prompt file (as
        always), the plan's medians for the other kinds."""
        items = getattr(self.plan, "items", None)
        if items:
            return len(items[0].token_ids), items[0].output_len or getattr(self.plan, "output_len", None)
        r = self.record
        return int(r.input_tokens["p50"]), int(r.output_tokens["p50"])

    def prompt_lengths(self) -> list[int]:
        items = getattr(self.plan, "items", None)
        if items:
            return [len(r.token_ids) for r in items]
        return [int(self.record.input_tokens[k]) for k in ("min", "max")]

    def distinct_prompts(self) -> int | None:
        """The prompt file's distinct prompts; None for a generated plan (every prompt its own)."""
        items = getattr(self.plan, "items", None)
        return len({r.prompt_id for r in items}) if items else None

    def prompts(self, n: int) -> list[tuple[int, ...]]:
        """The token ids of the first n prompts a point sends (a conversation's first turn only:
        the later ones carry answers not given yet)."""
        if self.plan.multi_turn:
            return [self.plan.conversation(self.start + i).turns[0].new_ids for i in range(n)]
        return [self.request(i).token_ids for i in range(n)]

    def warmup(self, n: int) -> list[Request]:
        """n untimed requests: a generated plan's from far past the measured ones (first turns of
        conversations never measured), the prompt file's and a trace's first ones."""
        if self.plan.size is not None:
            return [self.plan.request(i, "w") for i in range(n)]
        out = []
        for i in range(WARMUP_START, WARMUP_START + n):
            c = self.plan.conversation(i)
            out.append(Request("w" + c.request_id(0), c.prompt_id or c.id, c.turns[0].new_ids, c.turns[0].output_len))
        return out

    def dispatcher(self, point: LoadPoint, repeat: int = 0, on_answer: Callable[[int], None] | None = None) -> Loop:
        point.check()
        if self.plan.multi_turn:
            return self._conversations(point, repeat, on_answer)
        if self.plan.own_schedule and point.rate is not None:
            return self._trace(point, point.rate, repeat, on_answer)
        return point.dispatcher(self.request, 1, repeat, on_answer)

    def _conversations(self, point: LoadPoint, repeat: int, on_answer: Callable[[int], None] | None) -> ConversationLoop:
        plan = self.plan
        conv = partial(_conversation_at, plan, self.start)  # picklable: a dealt part carries it to a client worker
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
        schedule: list[tuple[float, Request]] = []
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
