"""The two loops a load point runs, as Dispatchers (core/dispatch.py) any engine can drive, and
the timeline each keeps of its requests:

- ClosedLoop: N users; each sends its next request when its last answer came (its arrival is
  that moment), until a number of requests or a duration;
- OpenLoop: requests arrive on a schedule (offsets from the start: a seeded Poisson or gamma
  draw, load/arrivals.py, or any list, a trace's), whatever the server's state; at most
  max_concurrency in flight, the rest wait on the client.

A request's timeline: when it arrived (became due), when it was sent (released to the engine;
a client that stamps a later send moves it there), when it was answered, and its sample. The
point's figures are computed from these alone (load/point.py).

Requests come from a source, `source(i) -> Request`: the i-th request of the point. cycled()
makes one of a list (a prompt sent again carries ".N" in its id, so ids stay unique); a later
workload can give an endless generated one."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from llmopt_bench.core.dispatch import Send
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.measure.timing import now as clock

RequestSource = Callable[[int], Request]


class Listed:
    """A source of the given requests in order (picklable: a part of a split loop carries it to
    its worker process)."""

    def __init__(self, requests: Sequence[Request]):
        self.requests = list(requests)

    def __call__(self, i: int) -> Request:
        return self.requests[i]


def cycled(requests: Sequence[Request]) -> RequestSource:
    """The list in order, again and again; a prompt's k-th repetition has the id "ID.k"."""
    if not requests:
        raise ValueError("a request source needs at least one request")

    def at(i: int) -> Request:
        r, cycle = requests[i % len(requests)], i // len(requests)
        return r if cycle == 0 else Request(f"{r.id}.{cycle}", r.prompt_id, r.token_ids, r.output_len)
    return at


@dataclass
class Timeline:
    """One request of a load point, as the dispatcher saw it."""

    index: int  # its place in the point's order (warm-up requests first)
    arrival: float
    sent: float = math.nan
    answered: float = math.nan
    sample: RequestSample | None = None
    output_len: int | None = None  # the tokens it asked for (forced): what "complete" is judged against


class _Loop:
    """What both loops keep: the start, every request's timeline, those in flight."""

    def __init__(self, source: RequestSource, output_len: int, repeat: int = 0,
                 on_answer: Callable[[int], None] | None = None):
        self.source, self.output_len, self.repeat, self.on_answer = source, output_len, repeat, on_answer
        self.t0: float | None = None
        self.timelines: list[Timeline] = []
        self.answered = 0
        self._live: dict[str, Timeline] = {}

    def _release(self, arrival: float, now: float) -> Send:
        i = len(self.timelines)
        r = self.source(i)
        n = r.output_len or self.output_len  # a workload plan's request carries its own length
        tl = Timeline(i, arrival, sent=now, output_len=n)
        self.timelines.append(tl)
        self._live[r.id] = tl
        return Send(r.id, r.prompt_id, r.token_ids, n, arrival, self.repeat)

    def done(self, send: Send, sample: RequestSample, t: float | None = None,
             answer_ids: Sequence[int] | None = None) -> None:
        """An answer: its time, its sample; answer_ids are for a dispatcher whose next request
        depends on this one's answer (a conversation's next turn): these loops' do not."""
        tl = self._live.pop(send.id)
        tl.answered = clock() if t is None else t
        tl.sample = sample
        tl.sent = max(tl.sent, sample.t_submit)  # a client that sent it later than it was released
        self.answered += 1
        self._freed(tl.answered)
        if self.on_answer:
            self.on_answer(self.answered)

    def _freed(self, t: float) -> None:
        pass

    @property
    def in_flight(self) -> int:
        return len(self._live)

    # --- dealt to several client processes (core/dispatch.Splittable) ---------------------

    def planned(self) -> list[tuple[str, tuple[int, ...]]]:
        """A part's requests (id, token ids), all known before it starts (its source is Listed)."""
        assert isinstance(self.source, Listed), "planned() is a split part's"
        return [(r.id, r.token_ids) for r in self.source.requests]

    def join(self, parts: Sequence[_Loop], shifts: Sequence[float] | None = None) -> None:
        self.t0, self.timelines, self.answered = joined(parts, shifts, self.t0)
        self._live = {}


def joined(parts: Sequence[Any], shifts: Sequence[float] | None, t0: float | None) -> tuple[float | None, list[Timeline], int]:
    """The parts' start, timelines and answers as one loop's (core/dispatch.Splittable.join): the
    timelines in arrival order (ties: in part order), indexed again, so that a closed loop's ramp
    (every user's first request, at the start) stays the first ones; the start the earliest part's."""
    merged: list[Timeline] = []
    starts = []
    for k, part in enumerate(parts):
        d = shifts[k] if shifts else 0.0
        merged += [shifted(t, d) for t in part.timelines] if d else part.timelines
        if part.t0 is not None:
            starts.append(part.t0 + d)
    merged.sort(key=lambda t: t.arrival)  # stable: ties keep each part's own order
    for i, t in enumerate(merged):
        t.index = i
    return (min(starts) if starts else t0), merged, sum(p.answered for p in parts)


def shifted(t: Timeline, d: float) -> Timeline:
    """A timeline (and its sample) on a clock `d` seconds ahead of the one it was kept on."""
    s = t.sample
    if s is not None:
        s = s.model_copy(update={"t_submit": s.t_submit + d, "t_first": s.t_first + d, "t_done": s.t_done + d,
                                 "token_times": [x + d for x in s.token_times]})
    return Timeline(t.index, t.arrival + d, t.sent + d, t.answered + d, s, t.output_len)


def deal(n: int, parts: int) -> list[int]:
    """n things dealt to `parts` as evenly as can be, the first ones one more."""
    return [n // parts + (k < n % parts) for k in range(parts)]


class OpenLoop(_Loop):
    """Arrivals at t0 + offsets[i] (t0: the first call to due()); offsets sorted."""

    def __init__(self, offsets: Sequence[float], source: RequestSource, output_len: int, *,
                 max_concurrency: int | None = None, repeat: int = 0, on_answer: Callable[[int], None] | None = None):
        super().__init__(source, output_len, repeat, on_answer)
        self.offsets = list(offsets)
        self.max_concurrency = max_concurrency

    @classmethod
    def of(cls, schedule: Sequence[tuple[float, Request]], output_len: int, **kw) -> OpenLoop:
        """A given schedule: (offset, request) pairs, sorted by offset (a trace, a replay)."""
        requests = [r for _, r in schedule]
        return cls([t for t, _ in schedule], requests.__getitem__, output_len, **kw)

    def _room(self) -> bool:
        return self.max_concurrency is None or self.in_flight < self.max_concurrency

    def start(self, t0: float) -> None:
        """Start the schedule at t0 (default: the first due()): a dealt part starts at the instant its workers agreed."""
        self.t0 = t0

    def due(self, now: float) -> list[Send]:
        if self.t0 is None:
            self.start(now)
        assert self.t0 is not None
        out = []
        while len(self.timelines) < len(self.offsets) and self._room():
            arrival = self.t0 + self.offsets[len(self.timelines)]
            if arrival > now:
                break
            out.append(self._release(arrival, now))
        return out

    def wake_at(self) -> float | None:
        if self.t0 is None:
            return -math.inf  # not started: due now
        if len(self.timelines) >= len(self.offsets) or not self._room():
            return None
        return self.t0 + self.offsets[len(self.timelines)]

    def finished(self) -> bool:
        return len(self.timelines) >= len(self.offsets) and not self._live

    def split_reason(self) -> str | None:
        return "the open loop has started" if self.t0 is not None else None

    def split(self, n: int) -> list[OpenLoop]:
        """Arrival i to part i mod n (merged, the parts' arrivals are this schedule, exactly,
        each part's moved by how far its start missed the others'); max_concurrency dealt to the
        parts (each holds its share in flight)."""
        n = max(1, min(n, len(self.offsets)))
        caps: list[int | None] = [max(1, c) for c in deal(self.max_concurrency, n)] if self.max_concurrency is not None \
            else [None] * n
        parts = []
        for k in range(n):
            mine = range(k, len(self.offsets), n)
            parts.append(OpenLoop([self.offsets[i] for i in mine], Listed([self.source(i) for i in mine]), self.output_len,
                                  max_concurrency=caps[k], repeat=self.repeat))
        return parts


class ClosedLoop(_Loop):
    """`users` users from t0 on, until num_requests were sent or a user would send after
    duration_s (at least one of the two)."""

    def __init__(self, users: int, source: RequestSource, output_len: int, *, num_requests: int | None = None,
                 duration_s: float | None = None, repeat: int = 0, on_answer: Callable[[int], None] | None = None):
        if num_requests is None and duration_s is None:
            raise ValueError("a closed loop needs a number of requests or a duration")
        super().__init__(source, output_len, repeat, on_answer)
        self.users, self.num_requests, self.duration_s = users, num_requests, duration_s
        self._free: deque[float] = deque()  # when each idle user became free, oldest first

    def _more(self, arrival: float) -> bool:
        assert self.t0 is not None
        return (self.num_requests is None or len(self.timelines) < self.num_requests) and \
            (self.duration_s is None or arrival - self.t0 < self.duration_s)

    def start(self, t0: float) -> None:
        """Every user free at t0 (default: the first due()): a dealt part starts at the instant its workers agreed."""
        self.t0 = t0
        self._free.extend([t0] * self.users)

    def due(self, now: float) -> list[Send]:
        if self.t0 is None:
            self.start(now)
        out = []
        while self._free and self._free[0] <= now and self._more(self._free[0]):
            out.append(self._release(self._free.popleft(), now))
        return out

    def _freed(self, t: float) -> None:
        self._free.append(t)

    def wake_at(self) -> float | None:
        if self.t0 is None:
            return -math.inf
        return self._free[0] if self._free and self._more(self._free[0]) else None

    def finished(self) -> bool:
        return self.t0 is not None and not self._live and self.wake_at() is None

    def split_reason(self) -> str | None:
        if self.t0 is not None:
            return "the closed loop has started"
        if self.num_requests is None:
            return "a closed loop bound by its duration alone has no list of requests to deal out"
        return None

    def split(self, n: int) -> list[ClosedLoop]:
        """User u to part u mod n, with the requests the one loop would have given its users in
        turn (request i is user i mod users' turn): each part sends its users' share of
        num_requests."""
        assert self.num_requests is not None
        n = max(1, min(n, self.users))
        parts = []
        for k in range(n):
            users = len(range(k, self.users, n))
            mine = [i for i in range(self.num_requests) if (i % self.users) % n == k]
            parts.append(ClosedLoop(users, Listed([self.source(i) for i in mine]), self.output_len, num_requests=len(mine),
                                    duration_s=self.duration_s, repeat=self.repeat))
        return parts
