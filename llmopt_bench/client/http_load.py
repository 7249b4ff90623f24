"""An OpenAI-compatible server as an engine of the load machine (load/engine.LoadEngine): the
dispatcher's requests (core/dispatch.py) become streamed /v1/completions requests, each sent the
moment it is released.

The loop (drive_async, for any async `send`): release what is due, one task per request; then
sleep until the next arrival or until an answer frees a user (a closed loop's next request goes
the moment its answer came). The client's tally (how tokens were counted, where the usage
disagreed) is kept per point, and its own punctuality (client/health.py): health().

Past one process and one server: `workers` > 1 deals each point's schedule to that many client
processes (client/workers.py), `cluster` to Ray actors on the nodes named (client/cluster.py);
`replicas` adds endpoints, the requests dealt round-robin over all of them, each one's /metrics
read (last_servers). A dispatcher that cannot be dealt out runs in this process, said in notes."""

from __future__ import annotations

import asyncio
import gc
import itertools
import pickle
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from llmopt_bench.client.health import ClientHealth, RequestClock, health_of
from llmopt_bench.client.openai_http import Endpoint, OpenAIClient, Tally
from llmopt_bench.client.prefix_cache import cache_record, server_counters
from llmopt_bench.client.server_clock import MetricsPage, ServerClock, ServerWatch
from llmopt_bench.client.workers import ONE_PROCESS, Job, LocalWorkers, WorkerConfig, WorkerLost, wait_until
from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.records import CacheRecord, RequestSample
from llmopt_bench.measure.timing import now
from llmopt_bench.workloads.text import PromptTexts

SendFn = Callable[[Send], Awaitable[RequestSample | tuple[RequestSample, list[int] | None]]]


async def drive_async(dispatcher: Dispatcher, send: SendFn) -> None:
    """Run the dispatcher's requests through `send`, each in its own task, until it is finished;
    `send` returns the sample, or the sample and the answer's token ids (a conversation's next
    turn carries them)."""
    answered = asyncio.Event()
    tasks: set[asyncio.Task] = set()

    async def one(s: Send) -> None:
        t, ids = now(), None
        try:
            got = await send(s)
            sample, ids = got if isinstance(got, tuple) else (got, None)
        except Exception as e:  # noqa: BLE001 - a request that cannot be sent fails alone; the point must end
            sample = RequestSample(request_id=s.id, prompt_id=s.prompt_id, repeat=s.repeat, prompt_tokens=0, output_tokens=0,
                                   t_submit=t, t_first=now(), t_done=now(), ok=False, error=f"protocol: {type(e).__name__}: {e}")
        dispatcher.done(s, sample, answer_ids=ids)
        answered.set()

    while not dispatcher.finished():
        for s in dispatcher.due(now()):
            task = asyncio.create_task(one(s))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        answered.clear()  # no task has run since due(): no answer is missed
        wake = dispatcher.wake_at()
        if wake is not None and wake <= now():
            await asyncio.sleep(0)
            continue
        await _wait(answered, None if wake is None else wake - now())


async def _wait(event: asyncio.Event, timeout: float | None) -> None:
    """Until the event is set or `timeout` seconds have passed (None: the event only)."""
    if timeout is None:
        await event.wait()
        return
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter}, timeout=timeout)
    finally:
        waiter.cancel()


@dataclass
class ClientView:
    """What one client process kept of a point: its requests' clocks, its loop's lag, each
    request's send delay (sent minus due), and its clock's offset from the parent's (a Ray actor)."""

    name: str | None  # None: the one process of a client that is not dealt out
    clocks: list[RequestClock]
    lag: list[float]
    send_delays: dict[str, float]
    offset_s: float | None = None
    offset_measured: tuple[float, float] | None = None
    start_skew_s: float | None = None

    def health(self, request_ids: Collection[str] | None = None) -> ClientHealth:
        clocks = self.clocks if request_ids is None else [c for c in self.clocks if c.request_id in request_ids]
        delays = list(self.send_delays.values()) if request_ids is None else \
            [d for r, d in self.send_delays.items() if r in request_ids]
        return health_of(clocks, self.lag, delays, worker=self.name, clock_offset_s=self.offset_s,
                         clock_offset_measured=self.offset_measured, start_skew_s=self.start_skew_s)


@dataclass
class HTTPLoad:
    """The server at `endpoint` (and its `replicas`). What is sent: prompt_of(send) where given,
    else the text of `texts` (of the asked length), else the token ids."""

    endpoint: Endpoint
    prompt_of: Callable[[Send], str | list[int]] | None = None
    texts: PromptTexts | None = None
    count_text: Callable[[str], int] | None = None  # token count of streamed text, where the stream has no ids
    tally: Tally = field(default_factory=Tally)  # the last point's
    client: Any = None  # the last point's client (the first endpoint's), after drive() in this process
    samples: list[RequestSample] = field(default_factory=list)  # the last point's answers, warm-up included
    # the server's /metrics read around and during each point (client/server_clock.py): its clock
    # beside the client's (last_server) and, with watch_cache, its prefix cache's figures (last_cache);
    # reset_cache_each_point empties the cache first (vLLM's /reset_prefix_cache, VLLM_SERVER_DEV_MODE=1)
    watch_server: bool = True
    reset_cache_each_point: bool = False
    watch_cache: bool = False
    last_server: ServerClock | None = None
    last_cache: CacheRecord | None = None
    client_class: type[OpenAIClient] = OpenAIClient  # the client that sends (a test puts a faulty one here)
    # several replicas of the server: requests round-robin over endpoint + replicas (from
    # first_endpoint), each one's clock read (last_servers, in that order; last_server stays None)
    replicas: list[Endpoint] = field(default_factory=list)
    first_endpoint: int = 0
    last_servers: list[ServerClock | None] = field(default_factory=list)
    sent_to: dict[str, int] = field(default_factory=dict)  # the last point's request id -> endpoint index
    # the client's processes: workers on this host (worker_cpus: their cores), or a Ray cluster's actors
    workers: int = 1
    worker_cpus: tuple[int, ...] | None = None
    cluster: Any = None  # a client/cluster.RayWorkers, started (by the stage: this module imports no Ray)
    dealt: int = 1  # how many processes the last point's schedule was dealt to
    views: list[ClientView] = field(default_factory=list)  # the last point's, one per client process
    start_at: float | None = None  # a worker's part starts at this instant (client/workers.py)
    given: dict[str, str | list[int]] = field(default_factory=dict)  # a worker's prompts by request id, made in the parent
    notes: list[str] = field(default_factory=list)
    _pool: Any = None

    @property
    def endpoints(self) -> list[Endpoint]:
        return [self.endpoint, *self.replicas]

    def prepare(self, prompts: Iterable[Sequence[int]]) -> None:
        """Make the texts of the prompts a point is about to send (nothing to do for token ids)."""
        if self.texts is not None and self.prompt_of is None:
            self.texts.prepare(prompts)

    def drive(self, dispatcher: Dispatcher) -> None:
        endpoints = self.endpoints
        if self.reset_cache_each_point:
            for e in endpoints:
                reset_server_cache(e)
        self.samples, self.sent_to, self.views = [], {}, []
        watches = [ServerWatch(MetricsPage(e.base_url, auth(e)), interval_s=0.5) for e in endpoints] \
            if self.watch_server or self.watch_cache else []
        for w in watches:
            w.start()
        try:
            pool = self._processes(dispatcher)
            if pool is None:
                self.dealt = 1
                self._drive_here(dispatcher)
            else:
                self._drive_dealt(pool, dispatcher)
        finally:
            self._read(watches)

    def _read(self, watches: list[ServerWatch]) -> None:
        """Each endpoint's clock over the requests it answered."""
        if not watches:
            return
        clocks, afters = [], []
        for k, watch in enumerate(watches):
            mine = self.samples if len(watches) == 1 else [s for s in self.samples if self.sent_to.get(s.request_id) == k]
            clock, after = watch.stop(mine)
            clocks.append(clock)
            afters.append(after)
        self.watch_server = self.watch_server and any(w.available for w in watches)  # a server without /metrics is not asked again
        self.last_server, self.last_servers = (clocks[0], []) if len(watches) == 1 else (None, clocks)
        if self.watch_cache and len(watches) == 1:
            w = watches[0]
            self.last_cache = cache_record(w.source, server_counters(w.before), server_counters(afters[0]),
                                           w.gauges["kv_usage"], self.reset_cache_each_point)

    # --- in this process ------------------------------------------------------------------

    def _drive_here(self, dispatcher: Dispatcher) -> None:
        # what is alive now (the tokenizer, the texts, the server's first /metrics page parsed) is
        # frozen out of the garbage collector's passes: a full pass over it during the point put an
        # open loop's sends 0.14-0.36 s behind their times (p99, 2-core host; vLLM's client does the same)
        gc.collect()
        gc.freeze()
        try:
            # asyncio's own loop, whatever the process's policy: uvloop (which Ray installs in its
            # workers where it is importable) reads sockets in C, past rx_clock's StampedSocket,
            # and the kernel's receive times would be lost without a word
            with asyncio.Runner(loop_factory=asyncio.SelectorEventLoop) as runner:
                runner.run(self._drive(dispatcher))
        finally:
            gc.unfreeze()

    async def _prompt(self, s: Send) -> str | list[int]:
        given = self.given.get(s.id)
        if given is not None:
            return given
        if self.prompt_of is not None:
            return self.prompt_of(s)
        if self.texts is None:
            return list(s.token_ids)
        ready = self.texts.ready(s.token_ids)
        if ready is not None:
            return ready
        self.tally.texts_made_sending += 1
        return await asyncio.to_thread(self.texts.text, s.token_ids)  # the tokenizer's batch call runs outside the GIL

    async def _drive(self, dispatcher: Dispatcher) -> None:
        async with AsyncExitStack() as stack:
            clients = [await stack.enter_async_context(self.client_class(e, count_text=self.count_text)) for e in self.endpoints]
            self.client = clients[0]
            self.tally = clients[0].tally
            for c in clients[1:]:
                c.tally = self.tally  # one tally for the point, whichever replica answered
            delays: dict[str, float] = {}
            turn = itertools.count(self.first_endpoint)

            async def send(s: Send) -> tuple[RequestSample, list[int] | None]:
                k = next(turn) % len(clients)
                prompt = await self._prompt(s)
                answer: list[int] = []  # the answer's token ids, where the stream carries them
                sample = await clients[k].complete(s.id, s.prompt_id, prompt, s.output_len, repeat=s.repeat, answer=answer,
                                                   prompt_tokens=len(s.token_ids))
                delays[s.id] = sample.t_submit - s.arrival
                self.sent_to[s.id] = k
                self.samples.append(sample)
                return sample, answer or None
            skew = None
            if self.start_at is not None:  # a worker's part: started at the instant the workers agreed
                await asyncio.sleep(max(0.0, self.start_at - now() - 0.01))
                wait_until(self.start_at)
                skew = now() - self.start_at
                start = getattr(dispatcher, "start", None)  # a dealt part (core/dispatch.Splittable)
                if start is not None:
                    start(self.start_at)
            await drive_async(dispatcher, send)
            self.views = [ClientView(None, [c for cl in clients for c in cl.clocks], clients[0].lag_samples, delays,
                                     start_skew_s=skew)]

    def health(self, request_ids: Collection[str] | None = None) -> ClientHealth | None:
        """The last point's client health over `request_ids` (its measured requests; None: all);
        a client of several processes: over all their requests, with each one's own (workers)."""
        if not self.views:
            return None
        if len(self.views) == 1:
            return self.views[0].health(request_ids)
        each = [v.health(request_ids) for v in self.views]
        merged = ClientView(None, [c for v in self.views for c in v.clocks], [x for v in self.views for x in v.lag],
                            {r: d for v in self.views for r, d in v.send_delays.items()})
        whole = merged.health(request_ids)
        return replace(whole, start_skew_s=max((w.start_skew_s or 0.0) for w in each), workers=each)

    # --- dealt to several processes -------------------------------------------------------

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _processes(self, dispatcher: Dispatcher) -> Any:
        """The pool the point's schedule is dealt to; None: this process sends it (and why, in notes)."""
        if self.cluster is None and self.workers <= 1:
            return None
        split_reason = getattr(dispatcher, "split_reason", None)
        why = split_reason() if split_reason is not None else "its load cannot be dealt to several processes"
        if why is None and self.count_text is not None and not _picklable(self.count_text):
            why = "its tokens are counted by a function of this process (count_text) that cannot go to another"
        if why is None and self.prompt_of is not None:
            why = "its prompts come from a function of this process (prompt_of)"
        if why is not None:
            self._note(f"a point sent by one client process: {why}")
            return None
        if self.cluster is not None:
            return self.cluster
        if self._pool is None:
            self._pool = LocalWorkers(self.workers, WorkerConfig(tuple(self.endpoints), self.worker_cpus, self.texts,
                                                                 self.count_text))
        return self._pool

    def _drive_dealt(self, pool: Any, dispatcher: Any) -> None:
        parts = dispatcher.split(pool.size)
        jobs = []
        for k, part in enumerate(parts):
            planned = part.planned()
            jobs.append(Job(part, {rid: self._prompt_now(ids) for rid, ids in planned}, first_endpoint=k % len(self.endpoints)))
        results, lost = pool.run(jobs)
        kept = [r for r in results if r is not None]
        shifts = [-r.offset_s for r in kept]
        dispatcher.join([r.part for r in kept], shifts)
        self.dealt = len(parts)
        self.tally = Tally()
        for r, d in zip(kept, shifts):
            self.samples += [shift_sample(s, d) for s in r.samples] if d else r.samples
            self.tally.add(r.tally)
            self.sent_to.update(r.sent_to)
            self.views.append(ClientView(r.name, [c.shifted(d) for c in r.clocks] if d else r.clocks, r.lag, r.send_delays,
                                         r.offset_s if r.offset_measured is not None else None, r.offset_measured,
                                         r.start_skew_s))
        self.client = None
        if lost:
            if self._pool is pool:  # a pool that lost a worker is not used again: the next point starts a fresh one
                pool.close()
                self._pool = None
            raise WorkerLost("; ".join(lost) + f"; the other {len(kept)} workers' {len(self.samples)} requests are kept",
                             "see the host's memory and the kernel's log (dmesg) for why it ended; the next point starts "
                             "fresh workers")

    def _prompt_now(self, ids: tuple[int, ...]) -> str | list[int]:
        """A request's prompt as this process would send it: made here, where the tokenizer is."""
        if self.texts is None:
            return list(ids)
        ready = self.texts.ready(ids)
        return ready if ready is not None else self.texts.text(ids)

    def describe(self) -> str:
        """The client's processes as a run states them, and why a point was not dealt (notes)."""
        if self.cluster is not None:
            how = f"{self.cluster.size} Ray actors ({', '.join(map(str, self.cluster.placements))}) at {self.cluster.address}"
        elif self.workers > 1:
            how = f"{self.workers} worker processes" + (f" on cores {','.join(map(str, self.worker_cpus))}" if self.worker_cpus else "")
        else:
            how = ONE_PROCESS
        if len(self.endpoints) > 1:
            how += f", requests round-robin over {len(self.endpoints)} endpoints"
        return "; ".join([how, *self.notes])

    def close(self) -> None:
        """End the worker processes and the Ray actors (kept from point to point)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
        if self.cluster is not None:
            self.cluster.close()


def _picklable(obj: Any) -> bool:
    try:
        pickle.dumps(obj)
    except Exception:  # noqa: BLE001 - whatever cannot be pickled stays in this process
        return False
    return True


def shift_sample(s: RequestSample, d: float) -> RequestSample:
    """A sample on a clock `d` seconds ahead of the one it was kept on."""
    return s.model_copy(update={"t_submit": s.t_submit + d, "t_first": s.t_first + d, "t_done": s.t_done + d,
                                "token_times": [x + d for x in s.token_times]})


def auth(endpoint: Endpoint) -> dict[str, str]:
    key = endpoint.api_key()
    return {"Authorization": f"Bearer {key}"} if key else {}


def reset_server_cache(endpoint: Endpoint) -> None:
    """Empty a vLLM server's prefix cache (POST /reset_prefix_cache: only with VLLM_SERVER_DEV_MODE=1)."""
    import httpx

    url = endpoint.base_url.rstrip("/").removesuffix("/v1") + "/reset_prefix_cache"
    r = httpx.post(url, headers=auth(endpoint), timeout=30.0)
    if r.status_code != 200:
        raise RuntimeError(f"POST {url}: HTTP {r.status_code}: the server cannot empty its prefix cache "
                           "(vLLM serves it with VLLM_SERVER_DEV_MODE=1)")
