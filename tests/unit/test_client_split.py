"""One load point's schedule dealt to several client processes (core/dispatch.Splittable on
load/dispatchers.py's loops and load/conversations.py's): every part driven here on a simulated
clock (each request answered a fixed time after it is sent), the parts joined back, and the
merged record checked against what one loop does: the offered rate and the arrival process
(a Kolmogorov-Smirnov test of the merged sends' gaps against the asked distribution), every
request sent once, a closed loop's users and ramp, conversations' turns. The same loops with
real worker processes and a real server: tests/integration/test_client_workers.py."""

from __future__ import annotations

import math
import pickle

import pytest
from scipy import stats

from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.load.dispatchers import ClosedLoop, OpenLoop, cycled
from llmopt_bench.load.point import LoadPoint, point_result

REQUESTS = [Request(id=f"r{i}", prompt_id=f"p{i}", token_ids=(1, 2, i)) for i in range(7)]


def simulate(loop, t0: float = 100.0, service_s: float = 0.05) -> None:
    """Drive a loop alone on a simulated clock: every request sent when due, answered service_s later."""
    loop.start(t0)
    live: list[tuple[float, object]] = []
    t = t0
    while not loop.finished():
        for s in loop.due(t):
            sample = RequestSample(request_id=s.id, prompt_id=s.prompt_id, prompt_tokens=3, output_tokens=s.output_len, t_submit=t,
                                   t_first=t + service_s, t_done=t + service_s, token_times=[t + service_s] * s.output_len)
            live.append((t + service_s, (s, sample)))
        wake = loop.wake_at()
        nxt = min([a for a, _ in live] + ([wake] if wake is not None and wake > t else []), default=None)
        if nxt is None:
            break
        t = nxt
        for a, (s, sample) in [x for x in live if x[0] <= t]:
            loop.done(s, sample, t=a)
        live = [x for x in live if x[0] > t]


def dealt(loop, n: int):
    """The loop dealt to n parts, each pickled as it goes to its worker, driven, joined back."""
    parts = [pickle.loads(pickle.dumps(p)) for p in loop.split(n)]
    for p in parts:
        simulate(p)
    loop.join(parts)
    return parts


@pytest.mark.parametrize("burstiness", [1.0, 0.5])
def test_dealt_open_loop_keeps_the_offered_rate_and_the_arrival_process(burstiness):
    rate = 200.0
    point = LoadPoint(rate=rate, burstiness=burstiness, duration_s=20.0, seed=3)
    one = point.dispatcher(cycled(REQUESTS), 4)
    n = len(one.offsets)
    dealt(one, 3)
    assert len(one.timelines) == n and one.t0 == 100.0
    sends = sorted(t.sent for t in one.timelines)
    assert all(math.isclose(a, b) for a, b in zip(sends, sorted(100.0 + o for o in one.offsets)))  # the schedule, exactly
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    offered = (n - 1) / (sends[-1] - sends[0])
    assert abs(offered / rate - 1) < 0.05
    # the asked process: gamma gaps of shape burstiness and mean 1/rate (Poisson at burstiness 1)
    asked = stats.gamma(burstiness, scale=1 / (rate * burstiness))
    assert stats.kstest(gaps, asked.cdf).pvalue > 0.01
    # a worker's own share is not the whole: its gaps are n times longer, which KS tells apart
    part_gaps = [b - a for a, b in zip(sends[::3], sends[3::3])]
    assert stats.kstest(part_gaps, asked.cdf).pvalue < 1e-6
    res = point_result(point, one.timelines, one.t0, 1)
    assert res.sent == n and res.failed == 0 and res.send_delay_s.max == 0.0


def test_each_part_alone_would_miss_the_schedule():
    """What the KS test catches: parts that each start their share at 0 (no common start) send a
    burst at the start and a process that is not the one asked."""
    point = LoadPoint(rate=200.0, duration_s=20.0, seed=3)
    one = point.dispatcher(cycled(REQUESTS), 4)
    parts = one.split(3)
    shifted = [OpenLoop([o - p.offsets[0] for o in p.offsets], p.source, 4) for p in parts]
    for p in shifted:
        simulate(p)
    one.join(shifted)
    sends = sorted(t.sent for t in one.timelines)
    gaps = [b - a for a, b in zip(sends, sends[1:])]
    assert stats.kstest(gaps, stats.expon(scale=1 / 200.0).cdf).pvalue < 0.01


def test_dealt_open_loop_deals_its_max_concurrency():
    one = OpenLoop([0.0] * 10, cycled(REQUESTS), 4, max_concurrency=5)
    parts = one.split(2)
    assert [p.max_concurrency for p in parts] == [3, 2] and [len(p.offsets) for p in parts] == [5, 5]


def test_dealt_closed_loop_keeps_its_users_its_count_and_its_ramp():
    one = ClosedLoop(5, cycled(REQUESTS), 4, num_requests=23)
    parts = dealt(one, 2)
    assert [p.users for p in parts] == [3, 2] and sum(p.num_requests for p in parts) == 23
    ids = [t.sample.request_id for t in one.timelines]
    assert sorted(ids) == sorted(cycled(REQUESTS)(i).id for i in range(23))  # every request of the one loop, once
    assert [t.index for t in one.timelines] == list(range(23))
    ramp = one.timelines[:5]  # every user's first request, at the start, comes first: the point's warm-up
    assert all(t.arrival == 100.0 for t in ramp) and all(t.arrival > 100.0 for t in one.timelines[5:])
    # at most 5 in flight at any moment, as one loop of 5 users
    events = sorted([(t.sent, 1) for t in one.timelines] + [(t.answered, -1) for t in one.timelines], key=lambda e: (e[0], e[1]))
    live = most = 0
    for _, d in events:
        live += d
        most = max(most, live)
    assert most == 5


def test_a_closed_loop_bound_by_duration_alone_is_not_dealt():
    assert "duration" in ClosedLoop(4, cycled(REQUESTS), 4, duration_s=1.0).split_reason()
    assert ClosedLoop(4, cycled(REQUESTS), 4, num_requests=8).split_reason() is None


def test_join_moves_a_part_kept_on_another_clock():
    one = OpenLoop([0.0, 0.01, 0.02, 0.03], cycled(REQUESTS), 4)
    parts = one.split(2)
    for p in parts:
        simulate(p, t0=100.0)
    parts[1].timelines = [type(t)(t.index, t.arrival + 5.0, t.sent + 5.0, t.answered + 5.0,
                                  t.sample.model_copy(update={"t_submit": t.sample.t_submit + 5.0,
                                                              "t_first": t.sample.t_first + 5.0,
                                                              "t_done": t.sample.t_done + 5.0,
                                                              "token_times": [x + 5.0 for x in t.sample.token_times]}),
                                  t.output_len) for t in parts[1].timelines]
    parts[1].t0 = 105.0  # its host's clock reads 5 s ahead of ours
    one.join(parts, shifts=[0.0, -5.0])
    assert [round(t.arrival, 9) for t in one.timelines] == [100.0, 100.01, 100.02, 100.03]
    assert all(round(t.sample.t_submit, 9) == round(t.sent, 9) for t in one.timelines)


def test_dealt_conversations_send_what_one_loop_sends():
    from functools import partial

    from llmopt_bench.load.conversations import ConversationLoop

    conv = partial(_conv_at, 3)
    def requests(loop):
        return sorted((t.sample.request_id, t.sample.turn) for t in loop.timelines)

    closed = lambda: ConversationLoop(conv, _filler, users=4, num_requests=30)  # noqa: E731
    one = closed()
    simulate(one)
    many = closed()
    dealt(many, 2)  # users 0 and 2, 1 and 3: each pair's 15 requests, as the one loop's users send them in turn
    assert requests(many) == requests(one) and len(many.timelines) == 30
    assert all(t.arrival == 100.0 for t in many.timelines[:4])
    three = closed()
    dealt(three, 3)  # uneven: the count holds, and every conversation's turns come in order
    sent = requests(three)
    assert len(sent) == 30 and all((rid.rsplit(".t", 1)[0] + f".t{k - 1}", k - 1) in sent for rid, k in sent if k > 0)
    opened = lambda: ConversationLoop(conv, _filler, starts=[0.0, 0.1, 0.2, 0.3, 0.4], num_requests=15)  # noqa: E731
    one, many = opened(), opened()
    simulate(one)
    dealt(many, 2)
    assert requests(many) == requests(one) and many.conversations_started == 5


def _filler(cid: str, k: int, n: int) -> tuple[int, ...]:
    return (0,) * n


def _conv_at(turns: int, i: int):
    from llmopt_bench.workloads.plan import Conversation, Turn

    return Conversation(id=f"c{i}", turns=tuple(Turn(new_ids=(i, k), output_len=2) for k in range(turns)))
