"""The load machine on a workload plan (load/plans.py, load/conversations.py), driven by an
engine on a simulated clock that answers every request a fixed time after it was sent: turn k+1
is sent when turn k's answer came plus the think time and carries that answer; a closed loop's
users keep their own conversations and never exceed their number; an open loop starts
conversations at rate / mean turns; a trace is sent at its times, scaled to the point's rate."""

from __future__ import annotations

import heapq
import itertools
import math

import pytest

from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.load.point import LoadPoint, point_result
from llmopt_bench.workloads.build import make_plan
from llmopt_bench.workloads.plan import TokenSpace

SPACE = TokenSpace(1024, frozenset({0, 1, 2}))


def plan(spec: str):
    return make_plan(WorkloadConfig(spec=spec), SPACE, 100_000, encode=lambda t: [3])


class SimEngine:
    """Answers each request `service_s` after it was sent with output ids 900, 901, ... (or no ids)."""

    def __init__(self, service_s: float, give_ids: bool = True):
        self.service_s, self.give_ids = service_s, give_ids
        self.sent: list[tuple[float, object]] = []
        self.max_in_flight = 0

    def drive(self, d) -> None:
        now, order, flight = 0.0, itertools.count(), []
        while not d.finished():
            for s in d.due(now):
                self.sent.append((now, s))
                heapq.heappush(flight, (now + self.service_s, next(order), s, now))
            self.max_in_flight = max(self.max_in_flight, len(flight))
            wake = d.wake_at()
            nxt = min(flight[0][0] if flight else math.inf, math.inf if wake is None else wake)
            assert nxt < math.inf, "the dispatcher neither waits for an answer nor has a next time"
            now = max(now, nxt)
            while flight and flight[0][0] <= now:
                t, _, s, t_sent = heapq.heappop(flight)
                ids = list(range(900, 900 + s.output_len))
                times = [t] * s.output_len
                sample = RequestSample(request_id=s.id, prompt_id=s.prompt_id, prompt_tokens=len(s.token_ids),
                                       output_tokens=s.output_len, t_submit=t_sent, t_first=t, t_done=t, token_times=times)
                d.done(s, sample, t, answer_ids=ids if self.give_ids else None)


def sends(engine: SimEngine) -> dict[str, tuple[float, tuple[int, ...]]]:
    return {s.id: (t, s.token_ids) for t, s in engine.sent}


def test_a_closed_loop_user_sends_its_turns_after_each_answer_and_its_think_time():
    p = plan("multi-turn:turns=3,first=10,msg=4,out=2,think=1s")
    engine = SimEngine(0.5)
    d = PlanLoad(p).dispatcher(LoadPoint(concurrency=2, num_requests=12))
    engine.drive(d)
    got = sends(engine)
    # user 0: c0000 turns at 0, 0.5 + 1, 2.0 + 1; then its next conversation (c0002) at once, at 3.5
    assert [got[f"c0000.t{k}"][0] for k in range(3)] == [0.0, 1.5, 3.0]
    assert got["c0002.t0"][0] == 3.5 and got["c0001.t0"][0] == 0.0 and got["c0003.t0"][0] == 3.5
    c = p.conversation(0)
    t0, t1, t2 = (got[f"c0000.t{k}"][1] for k in range(3))
    assert t0 == c.turns[0].new_ids
    assert t1 == t0 + (900, 901) + c.turns[1].new_ids  # the history carries the engine's own answer
    assert t2 == t1 + (900, 901) + c.turns[2].new_ids
    assert engine.max_in_flight <= 2 and len(got) == len(engine.sent) == 12  # no id sent twice
    assert {s.id for _, s in engine.sent if s.id.startswith(("c0000", "c0002", "c0004"))} <= set(got)


def test_the_users_own_their_conversations_u_u_plus_n():
    engine = SimEngine(0.1)
    engine.drive(PlanLoad(plan("multi-turn:turns=1..3,first=5,msg=2,out=1")).dispatcher(LoadPoint(concurrency=3, num_requests=30)))
    order: dict[int, list[int]] = {}
    for t, s in engine.sent:  # a user's conversations start in its order: u, u+3, u+6, ...
        conv = int(s.id[1:5])
        if s.id.endswith(".t0") or "." not in s.id:
            order.setdefault(conv % 3, []).append(conv)
    assert all(seq == sorted(seq) and all(c % 3 == u for c in seq) for u, seq in order.items())


def test_without_answer_ids_the_history_takes_the_plans_stand_in():
    p = plan("multi-turn:turns=2,first=6,msg=3,out=4")
    engine = SimEngine(0.2, give_ids=False)
    engine.drive(PlanLoad(p).dispatcher(LoadPoint(concurrency=1, num_requests=2)))
    got = sends(engine)
    assert got["c0000.t1"][1] == got["c0000.t0"][1] + p.filler("c0000", 0, 4) + p.conversation(0).turns[1].new_ids


def test_an_open_loop_starts_conversations_at_rate_over_mean_turns_and_samples_know_their_turn():
    p = plan("multi-turn:turns=4,first=5,msg=2,out=1,think=500ms")
    point = LoadPoint(rate=8.0, duration_s=30.0, seed=5)
    d = PlanLoad(p).dispatcher(point)
    engine = SimEngine(0.05)
    engine.drive(d)
    firsts = sorted(t for t, s in engine.sent if s.id.endswith(".t0"))
    from llmopt_bench.load.arrivals import arrival_offsets

    assert firsts == pytest.approx(arrival_offsets(2.0, None, 1.0, 5, 30.0))  # 8 req/s over 4 turns: 2 conversations/s
    got = sends(engine)
    for t, s in engine.sent:
        if s.id.endswith(".t1"):
            assert t == pytest.approx(got[s.id[:-1] + "0"][0] + 0.05 + 0.5)
    res = point_result(point, d.timelines, d.t0, expected_tokens=1)
    assert {s.turn for s in res.samples} == {0, 1, 2, 3} and res.failed == 0


def test_single_turn_plans_send_their_own_lengths_and_never_repeat_a_prompt():
    p = plan("shared-prefix:groups=2,per_group=3,prefix=20,suffix=4,out=1..9")
    engine = SimEngine(0.1)
    d = PlanLoad(p).dispatcher(LoadPoint(concurrency=2, num_requests=20))
    engine.drive(d)
    assert [s.output_len for _, s in engine.sent] == [p.conversation(i).turns[0].output_len for i in range(20)]
    assert len({s.token_ids for _, s in engine.sent}) == 20
    res = point_result(LoadPoint(concurrency=2, num_requests=20), d.timelines, d.t0, expected_tokens=1)
    assert res.failed == 0  # each judged against its own length, not one length for the point


def test_a_trace_is_sent_at_its_times_scaled_to_the_points_rate():
    p = plan("trace:file=builtin:example-trace.jsonl")
    times = [p.conversation(i).at_s for i in range(p.size)]
    own = PlanLoad(p).replay_point()
    d = PlanLoad(p).dispatcher(own)
    SimEngine(0.01).drive(d)
    assert [tl.arrival - d.t0 for tl in d.timelines] == pytest.approx(times)
    faster = PlanLoad(p).dispatcher(LoadPoint(rate=own.rate * 2, duration_s=own.duration_s / 2 + 1e-6))
    SimEngine(0.01).drive(faster)
    assert [tl.arrival - faster.t0 for tl in faster.timelines] == pytest.approx([t / 2 for t in times])
    assert PlanLoad(p).speedup_at(own.rate * 2) == pytest.approx(2.0)
