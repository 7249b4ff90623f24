"""An OpenAI-compatible server as an engine of the load machine (load/engine.LoadEngine): the
dispatcher's requests (core/dispatch.py) become streamed /v1/completions requests from one
client per load point (client/openai_http.OpenAIClient), each sent the moment it is released.

The loop (drive_async, for any async `send`): release what is due, one task per request; then
sleep until the next arrival or until an answer frees a user (a closed loop's next request goes
the moment its answer came). The client's tally (how tokens were counted, where the usage
disagreed) is kept per point, and its own punctuality (client/health.py): health()."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmopt_bench.client.health import ClientHealth
from llmopt_bench.client.openai_http import Endpoint, OpenAIClient, Tally
from llmopt_bench.client.prefix_cache import cache_record, server_counters
from llmopt_bench.client.server_clock import MetricsPage, ServerClock, ServerWatch
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
class HTTPLoad:
    """The server at `endpoint`. What is sent: prompt_of(send) where given, else the text of
    `texts` (of the asked length), else the token ids."""

    endpoint: Endpoint
    prompt_of: Callable[[Send], str | list[int]] | None = None
    texts: PromptTexts | None = None
    count_text: Callable[[str], int] | None = None  # token count of streamed text, where the stream has no ids
    tally: Tally = field(default_factory=Tally)  # the last point's
    client: Any = None  # the last point's client, after drive()
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

    def prepare(self, prompts: Iterable[Sequence[int]]) -> None:
        """Make the texts of the prompts a point is about to send (nothing to do for token ids)."""
        if self.texts is not None and self.prompt_of is None:
            self.texts.prepare(prompts)

    def drive(self, dispatcher: Dispatcher) -> None:
        if self.reset_cache_each_point:
            reset_server_cache(self.endpoint)
        self.samples = []
        watch = ServerWatch(MetricsPage(self.endpoint.base_url, auth(self.endpoint)), interval_s=0.5) \
            if self.watch_server or self.watch_cache else None
        if watch:
            watch.start()
        # what is alive now (the tokenizer, the texts, the server's first /metrics page parsed) is
        # frozen out of the garbage collector's passes: a full pass over it during the point put an
        # open loop's sends 0.14-0.36 s behind their times (p99, 2-core host; vLLM's client does the same)
        gc.collect()
        gc.freeze()
        try:
            asyncio.run(self._drive(dispatcher))
        finally:
            gc.unfreeze()
            if watch:
                self.last_server, after = watch.stop(self.samples)
                self.watch_server = self.watch_server and watch.available  # a server without /metrics is not asked again
                if self.watch_cache:
                    self.last_cache = cache_record(watch.source, server_counters(watch.before), server_counters(after),
                                                   watch.gauges["kv_usage"], self.reset_cache_each_point)

    async def _prompt(self, s: Send) -> str | list[int]:
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
        async with self.client_class(self.endpoint, count_text=self.count_text) as client:
            self.tally = client.tally

            async def send(s: Send) -> tuple[RequestSample, list[int] | None]:
                prompt = await self._prompt(s)
                answer: list[int] = []  # the answer's token ids, where the stream carries them
                sample = await client.complete(s.id, s.prompt_id, prompt, s.output_len, repeat=s.repeat, answer=answer,
                                               prompt_tokens=len(s.token_ids))
                self.samples.append(sample)
                return sample, answer or None
            await drive_async(dispatcher, send)
            self.client = client

    def health(self, request_ids: Collection[str] | None = None) -> ClientHealth | None:
        """The last point's client health over `request_ids` (its measured requests; None: all)."""
        return self.client.health(request_ids) if self.client is not None else None


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
