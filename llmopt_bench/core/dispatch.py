"""What a load generator and an engine say to each other: the engine asks which requests are due,
sends them, and says when each was answered. The load machine (llmopt_bench/load/) implements
the Dispatcher (closed loop, open loop on a schedule, later conversations and traces); the
engines' adapters (offline vLLM's step loop, the static batcher, the HTTP client) drive one.
Both sides import only this module of each other's vocabulary.

The engine's loop, whatever the engine:

    while not dispatcher.finished():
        for send in dispatcher.due(now()):      # released now: the engine takes them
            submit(send)
        ... run, and for each answer: dispatcher.done(send, sample)
        ... with nothing to do, wait until dispatcher.wake_at() (None: until an answer)

Times are seconds on measure.timing.now()'s clock (perf_counter). An in-process engine stamps a
sample's t_submit with send.arrival (the request was submitted when it arrived; a wait for the
engine's next step is the engine's latency); a client over the network stamps the moment it
sent the request (its own lateness is then the send delay the load machine measures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from llmopt_bench.core.records import RequestSample


@dataclass(frozen=True)
class Send:
    """One request released to the engine."""

    id: str  # unique within the load point (a prompt sent again carries a suffix)
    prompt_id: str
    token_ids: tuple[int, ...]
    output_len: int  # forced: ignore EOS, exactly this many tokens
    arrival: float  # when it became due (open loop: its scheduled time; closed loop: when its user was free)
    repeat: int = 0


class Dispatcher(Protocol):
    def due(self, now: float) -> list[Send]:
        """The requests due by `now` that may go (a closed loop's free users, an open loop's
        arrivals within its max_concurrency); each is released once."""
        ...

    def wake_at(self) -> float | None:
        """When the next request falls due; None: none before an answer comes (or none at all)."""
        ...

    def done(self, send: Send, sample: RequestSample, t: float | None = None,
             answer_ids: Sequence[int] | None = None) -> None:
        """`send` was answered (t: when, default now); its sample, failed ones included, and the
        answer's token ids where the engine has them (a conversation's next turn is built on
        them; None: the engine does not keep them)."""
        ...

    def finished(self) -> bool:
        """Nothing left to release and nothing in flight."""
        ...


class Splittable(Protocol):
    """A dispatcher whose schedule can be dealt to several client processes (client/workers.py,
    client/cluster.py): each part a Dispatcher of its own, picklable, that a worker drives
    whole; the parts' records joined back into this one, so that every figure is computed over
    all the point's requests as if one client had sent them."""

    def split_reason(self) -> str | None:
        """Why this dispatcher cannot be dealt out (None: it can)."""
        ...

    def split(self, n: int) -> list[Any]:
        """At most n parts (fewer where there is less to deal: a closed loop's users), not
        started: every worker starts its part with part.start(t0) at one agreed instant t0 (its
        own clock's), so that a worker that starts late shows it as its requests' send delay. A
        part lists its requests (id, token ids) by planned(), so that their prompts go with it."""
        ...

    def join(self, parts: Sequence[Any], shifts: Sequence[float] | None = None) -> None:
        """The parts' records as this dispatcher's, each part's times moved by its shift (a
        worker on another host's clock: minus its offset); a part that never came back is left out."""
        ...
