"""Multi-turn conversations as a Dispatcher (core/dispatch.py) any engine drives: turn k+1 of a
conversation is released when turn k's answer came plus the user's think time, and its prompt
is turn k's prompt, the engine's own answer (its token ids; a stand-in of the forced length
where the engine gives none back) and the new message.

- closed loop (users=N): user u owns conversations u, u+N, u+2N, ... (pinned: the sequence each
  user sends is the same every run, only times vary); it sends a turn, waits for the answer,
  thinks, sends the next; after a conversation's last turn it starts its next one at once.
  At most N requests in flight; a thinking user holds its slot.
- open loop (starts=offsets): conversation j starts at t0 + starts[j] (a Poisson schedule at
  rate / mean turns: load/plans.py), its later turns follow their answers whatever the load;
  at most max_concurrency requests in flight, the rest wait on the client.

A failed turn ends its conversation (a history without its answer is not one a user sends).
Each released request has a Timeline (load/dispatchers.py), its sample marked with its turn, so
load/point.summarize computes the point's figures as for any loop."""

from __future__ import annotations

import heapq
import itertools
import math
import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmopt_bench.core.dispatch import Send
from llmopt_bench.core.records import RequestSample
from llmopt_bench.load.dispatchers import Timeline, joined
from llmopt_bench.measure.timing import now as clock
from llmopt_bench.workloads.plan import Conversation

Filler = Callable[[str, int, int], tuple[int, ...]]  # (conversation id, turn, n) -> stand-in answer ids


@dataclass
class _Turn:
    """A turn waiting to be sent, or in flight."""

    index: int  # the conversation's index in the plan
    conv: Conversation
    turn: int
    history: tuple[int, ...]  # every earlier prompt and answer
    user: int | None

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.history + self.conv.turns[self.turn].new_ids


class ConversationLoop:
    """Conversations from `conversation(i)` (a plan's), closed (users) or open (starts): see the
    module doc; bound by a number of requests or a duration, as a LoadPoint is."""

    def __init__(self, conversation: Callable[[int], Conversation], filler: Filler, *, users: int | None = None,
                 starts: Sequence[float] | None = None, num_requests: int | None = None, duration_s: float | None = None,
                 max_concurrency: int | None = None, repeat: int = 0, on_answer: Callable[[int], None] | None = None,
                 user_ids: Sequence[int] | None = None, stride: int | None = None, start_ids: Sequence[int] | None = None):
        """user_ids, stride, start_ids: a dealt part's (split()): its users (of `stride` in all, each
        user u owning conversations u, u + stride, ...), or the conversations its starts begin."""
        if (users is None) == (starts is None):
            raise ValueError("a conversation loop has users (closed) or conversation start times (open)")
        self.conversation, self.filler = conversation, filler
        self.users, self.starts = users, list(starts or [])
        self.user_ids = list(user_ids) if user_ids is not None else list(range(users or 0))
        self.stride = stride or users or 0
        self.start_ids = list(start_ids) if start_ids is not None else list(range(len(self.starts)))
        self.num_requests, self.duration_s, self.max_concurrency = num_requests, duration_s, max_concurrency
        self.repeat, self.on_answer = repeat, on_answer
        self.t0: float | None = None
        self.timelines: list[Timeline] = []
        self.answered = 0
        self.conversations_started = 0
        self._live: dict[str, tuple[Timeline, _Turn]] = {}
        self._ready: list[tuple[float, int, _Turn]] = []  # (release time, order, turn): a heap
        self._order = itertools.count()
        self._next_start = 0  # open loop: the next conversation start not yet due

    # --- what is due ----------------------------------------------------------------------

    def _more(self, arrival: float) -> bool:
        assert self.t0 is not None
        return (self.num_requests is None or len(self.timelines) < self.num_requests) and \
            (self.duration_s is None or arrival - self.t0 < self.duration_s)

    def _start(self, index: int, at: float, user: int | None) -> None:
        self.conversations_started += 1
        turn = _Turn(index, self.conversation(index), 0, (), user)
        if turn.conv.turns:
            heapq.heappush(self._ready, (at, next(self._order), turn))

    def _room(self) -> bool:
        return self.max_concurrency is None or len(self._live) < self.max_concurrency

    def start(self, t0: float) -> None:
        """Every user's first conversation at t0 (default: the first due()): a dealt part starts at
        the instant its workers agreed."""
        self.t0 = t0
        for u in self.user_ids:
            self._start(u, t0, u)

    def due(self, now: float) -> list[Send]:
        if self.t0 is None:
            self.start(now)
        assert self.t0 is not None
        while self._next_start < len(self.starts) and self.t0 + self.starts[self._next_start] <= now:
            self._start(self.start_ids[self._next_start], self.t0 + self.starts[self._next_start], None)
            self._next_start += 1
        out = []
        while self._ready and self._ready[0][0] <= now and self._room():
            arrival, _, turn = heapq.heappop(self._ready)
            if self._more(arrival):
                out.append(self._release(turn, arrival, now))
        return out

    def _release(self, turn: _Turn, arrival: float, now: float) -> Send:
        t = turn.conv.turns[turn.turn]
        tl = Timeline(len(self.timelines), arrival, sent=now, output_len=t.output_len)
        self.timelines.append(tl)
        rid = turn.conv.request_id(turn.turn)
        self._live[rid] = (tl, turn)
        return Send(rid, turn.conv.prompt_id or turn.conv.id, turn.prompt, t.output_len, arrival, self.repeat)

    def wake_at(self) -> float | None:
        if self.t0 is None:
            return -math.inf
        times = []
        if self._ready and self._room():
            times.append(self._ready[0][0])
        if self._next_start < len(self.starts):
            times.append(self.t0 + self.starts[self._next_start])
        times = [t for t in times if self._more(t)]
        return min(times) if times else None

    # --- answers --------------------------------------------------------------------------

    def done(self, send: Send, sample: RequestSample, t: float | None = None,
             answer_ids: Sequence[int] | None = None) -> None:
        tl, turn = self._live.pop(send.id)
        tl.answered = clock() if t is None else t
        tl.sample = sample if sample.turn is not None else sample.model_copy(update={"turn": turn.turn})
        tl.sent = max(tl.sent, sample.t_submit)
        self.answered += 1
        self._follow(turn, sample, tl.answered, answer_ids)
        if self.on_answer:
            self.on_answer(self.answered)

    def _follow(self, turn: _Turn, sample: RequestSample, t: float, answer_ids: Sequence[int] | None) -> None:
        """The conversation's next turn after its think time; at its end (or a failed turn) the
        closed loop's user starts its next conversation."""
        conv, k = turn.conv, turn.turn
        if sample.ok and k + 1 < len(conv.turns):
            out = conv.turns[k].output_len
            answer = tuple(answer_ids) if answer_ids is not None else self.filler(conv.id, k, out)
            nxt = _Turn(turn.index, conv, k + 1, turn.prompt + answer, turn.user)
            heapq.heappush(self._ready, (t + conv.turns[k + 1].think_s, next(self._order), nxt))
        elif self.users is not None and turn.user is not None:
            self._start(turn.index + self.stride, t, turn.user)

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def finished(self) -> bool:
        return self.t0 is not None and not self._live and self.wake_at() is None

    # --- dealt to several client processes (core/dispatch.Splittable) ---------------------

    def split_reason(self) -> str | None:
        if self.t0 is not None:
            return "the conversations have started"
        try:
            pickle.dumps((self.conversation, self.filler))
        except Exception as e:  # noqa: BLE001 - whatever cannot go to another process says why
            return f"its conversations cannot go to another process ({type(e).__name__})"
        return None

    def split(self, n: int) -> list[ConversationLoop]:
        """A closed loop's user u to part u mod n (its conversations with it), an open loop's
        conversation start j to part j mod n; num_requests and max_concurrency dealt in proportion."""
        closed = self.users is not None
        n = max(1, min(n, (self.users or 0) if closed else len(self.starts)))
        shares = [len(range(k, (self.users or 0) if closed else len(self.starts), n)) for k in range(n)]
        total = sum(shares) or 1
        quotas = _proportional(self.num_requests, shares, total)
        caps = _proportional(self.max_concurrency, shares, total)
        parts = []
        for k in range(n):
            cap = caps[k]
            common = dict(num_requests=quotas[k], duration_s=self.duration_s, repeat=self.repeat,
                          max_concurrency=max(1, cap) if cap is not None else None)
            if closed:
                users = list(range(k, self.users or 0, n))
                parts.append(ConversationLoop(self.conversation, self.filler, users=len(users), user_ids=users,
                                              stride=self.users, **common))  # type: ignore[arg-type]
            else:
                mine = range(k, len(self.starts), n)
                parts.append(ConversationLoop(self.conversation, self.filler, starts=[self.starts[j] for j in mine],
                                              start_ids=list(mine), **common))  # type: ignore[arg-type]
        return parts

    def planned(self) -> list[tuple[str, tuple[int, ...]]]:
        """The first turns this part will surely send (each user's first conversation, each
        start's): their prompts go with it; later turns carry answers not given yet."""
        first = self.user_ids if self.users is not None else self.start_ids
        out = []
        for i in first:
            conv = self.conversation(i)
            if conv.turns:
                out.append((conv.request_id(0), conv.turns[0].new_ids))
        return out

    def join(self, parts: Sequence[ConversationLoop], shifts: Sequence[float] | None = None) -> None:
        self.t0, self.timelines, self.answered = joined(parts, shifts, self.t0)
        self.conversations_started = sum(p.conversations_started for p in parts)
        self._live = {}


def _proportional(total: int | None, shares: list[int], whole: int) -> list[int | None]:
    """`total` dealt in proportion to shares (None stays None), every part at least its share's 1."""
    if total is None:
        return [None] * len(shares)
    out: list[int | None] = [max(1 if s else 0, total * s // whole) for s in shares]
    rest = total - sum(x or 0 for x in out)
    for k in range(len(out)):
        if rest <= 0:
            break
        if shares[k]:
            out[k] = (out[k] or 0) + 1
            rest -= 1
    return out
