"""An OpenAI-compatible server as an engine of the load machine (load/engine.LoadEngine): the
dispatcher's requests (core/dispatch.py) become streamed /v1/completions requests from one
client per load point (engines/openai_http.OpenAIClient), each sent the moment it is released.

The loop (drive_async, for any async `send`): release what is due, one task per request; then
sleep until the next arrival or until an answer frees a user (a closed loop's next request goes
the moment its answer came). The client's tally (how tokens were counted, where the usage
disagreed) is kept per point, and its own punctuality (engines/client_health.py): health()."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.records import CacheRecord, RequestSample
from llmopt_bench.engines.client_health import ClientHealth
from llmopt_bench.engines.openai_http import Endpoint, OpenAIClient, Tally
from llmopt_bench.engines.vllm_cache import CacheWatch, server_reader
from llmopt_bench.measure.timing import now

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
    """The server at `endpoint`; prompt_of(send) is what is sent (token ids or text)."""

    endpoint: Endpoint
    prompt_of: Callable[[Send], str | list[int]] = lambda s: list(s.token_ids)
    count_text: Callable[[str], int] | None = None  # token count of streamed text, where the stream has no ids
    tally: Tally = field(default_factory=Tally)  # the last point's
    client: Any = None  # the last point's client, after drive()
    # the server's prefix cache (engines/vllm_cache.py): emptied before each point (vLLM's
    # /reset_prefix_cache, served with VLLM_SERVER_DEV_MODE=1), its /metrics read around and during it
    reset_cache_each_point: bool = False
    watch_cache: bool = False
    last_cache: CacheRecord | None = None

    def drive(self, dispatcher: Dispatcher) -> None:
        if self.reset_cache_each_point:
            reset_server_cache(self.endpoint)
        watch = CacheWatch(server_reader(self.endpoint.base_url, auth(self.endpoint)), "vllm /metrics",
                           interval_s=0.5, reset=self.reset_cache_each_point) if self.watch_cache else None
        if watch:
            watch.run()
        try:
            asyncio.run(self._drive(dispatcher))
        finally:
            if watch:
                self.last_cache = watch.stop()

    async def _drive(self, dispatcher: Dispatcher) -> None:
        async with OpenAIClient(self.endpoint, count_text=self.count_text) as client:
            async def send(s: Send) -> tuple[RequestSample, list[int] | None]:
                prompt = self.prompt_of(s)
                answer: list[int] = []  # the answer's token ids, where the stream carries them
                sample = await client.complete(s.id, s.prompt_id, prompt, s.output_len, repeat=s.repeat, answer=answer,
                                               prompt_tokens=len(prompt) if isinstance(prompt, list) else None)
                return sample, answer or None
            await drive_async(dispatcher, send)
            self.tally, self.client = client.tally, client

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
