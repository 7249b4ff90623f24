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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llmopt_bench.core.dispatch import Send
from llmopt_bench.core.records import RequestSample
from llmopt_bench.load.dispatchers import Timeline
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
                 max_concurrency: int | None = None, repeat: int = 0, on_answer: Callable[[int], None] | None = None):
        if (users is None) == (starts is None):
            raise ValueError("a conversation loop has users (closed) or conversation start times (open)")
        self.conversation, self.filler = conversation, filler
        self.users, self.starts = users, list(starts or [])
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

    def due(self, now: float) -> list[Send]:
        if self.t0 is None:
            self.t0 = now
            for u in range(self.users or 0):
                self._start(u, now, u)
        while self._next_start < len(self.starts) and self.t0 + self.starts[self._next_start] <= now:
            self._start(self._next_start, self.t0 + self.starts[self._next_start], None)
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
            self._start(turn.index + self.users, t, turn.user)

    @property
    def in_flight(self) -> int:
        return len(self._live)

    def finished(self) -> bool:
        return self.t0 is not None and not self._live and self.wake_at() is None
