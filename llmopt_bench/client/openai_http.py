"""A streaming client for an OpenAI-compatible /v1/completions endpoint, timed on the client.

Each request streams (server-sent events over aiohttp, split by SSEEvents); a chunk is
timed when it reached the host, by the kernel's receive clock (client/rx_clock.py), else when
the client read it, and a chunk that carries k tokens gives its time to each of them, as the
in-process vLLM engine does (engines/vllm/offline.py serve()). The client watches its own punctuality
per client (client/health.py: event-loop lag, read delays, bursts): health(). Tokens are counted from what arrived:
the chunk's `token_ids` (vLLM's `return_token_ids`), else the growth of the streamed usage
(`continuous_usage_stats`), else the chunk's text through the tokenizer the caller gives (a
chunk's own tokens; merges across chunk edges can move a count by one), else one token per chunk. The server's final `usage` is checked
against that count and every disagreement is kept (Tally), and so is its count of the prompt
(usage.prompt_tokens) against the length the caller asked for (a text prompt's tokens are the
server's tokenizer's to count: workloads/text.py makes them exact). Every request states its
sampling (core/workload.Sampling, the endpoint's).

A request that fails comes back as a sample with ok=False and error "KIND: detail" (openai_errors.KINDS),
never as an exception: the load point goes on and the caller reports the failure rate. The
API key is read from an environment variable the caller names; it is sent as a header and
never stored anywhere else."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmopt_bench.client import rx_clock
from llmopt_bench.client.endpoint import Endpoint
from llmopt_bench.client.errors import RequestFailed, classify_status, error_message, fix_for, transport_error
from llmopt_bench.client.health import ClientHealth, LoopLag, RequestClock, health_of
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import RequestSample
from llmopt_bench.measure.timing import now


@dataclass
class Tally:
    """What the client saw across requests: how tokens were counted and where the server's
    usage field disagreed with the count (request id, counted, usage); the prompts' lengths as
    asked and as the server counted them (usage.prompt_tokens), and those it counted otherwise."""

    counted_by: dict[str, int] = field(default_factory=dict)
    usage_agreed: int = 0
    usage_missing: int = 0
    usage_mismatch: list[tuple[str, int, int]] = field(default_factory=list)
    short: list[tuple[str, int, int]] = field(default_factory=list)  # (id, tokens, requested)
    prompt_checked: int = 0  # requests with an asked length whose usage gave the server's count
    prompt_asked: int = 0  # their asked prompt tokens, summed
    prompt_counted: int = 0  # the server's count of them, summed
    prompt_off: list[tuple[str, int, int]] = field(default_factory=list)  # (id, asked, counted) where they differ
    prompt_off_worst: float = 0.0  # the largest |counted / asked - 1| of one request
    texts_made_sending: int = 0  # text prompts made while the point ran (not prepared before it)

    def add(self, other: Tally) -> None:
        """Another client's tally (a worker's) counted in this one."""
        for how, n in other.counted_by.items():
            self.counted_by[how] = self.counted_by.get(how, 0) + n
        self.usage_agreed += other.usage_agreed
        self.usage_missing += other.usage_missing
        self.usage_mismatch += other.usage_mismatch
        self.short += other.short
        self.prompt_checked += other.prompt_checked
        self.prompt_asked += other.prompt_asked
        self.prompt_counted += other.prompt_counted
        self.prompt_off += other.prompt_off
        self.prompt_off_worst = max(self.prompt_off_worst, other.prompt_off_worst)
        self.texts_made_sending += other.texts_made_sending

    def check_prompt(self, request_id: str, asked: int | None, counted: int | None) -> None:
        if asked is None or counted is None:
            return
        self.prompt_checked += 1
        self.prompt_asked += asked
        self.prompt_counted += counted
        if counted != asked:
            self.prompt_off.append((request_id, asked, counted))
            self.prompt_off_worst = max(self.prompt_off_worst, abs(counted / asked - 1) if asked else 1.0)


class TokenCounter:
    """A chunk's text counted by a tokenizer (OpenAIClient's count_text), picklable: a client worker
    process counts with it too."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def __call__(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class _Stream:
    """One request's stream as it arrives."""

    t_submit: float
    times: list[float] = field(default_factory=list)
    usage_tokens: int | None = None
    usage_prompt: int | None = None
    streamed_usage: int = 0  # completion_tokens of the last chunk that carried usage
    counted_by: str | None = None
    finished: bool = False
    count_text: Callable[[str], int] | None = None  # the tokenizer's count of a chunk's text
    answer_ids: list[int] = field(default_factory=list)  # the answer's token ids, where the stream carries them
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server reports it
    clock: RequestClock = field(default_factory=RequestClock)  # its chunks as timed and as read

    def __post_init__(self) -> None:
        self.clock.sent = self.t_submit


def _chunk_tokens(data: Json, state: _Stream) -> int:
    """How many output tokens this chunk carries, and how they were counted."""
    choices = data.get("choices") or []
    usage = data.get("usage")
    if usage and usage.get("completion_tokens") is not None:
        state.usage_tokens = int(usage["completion_tokens"])
        state.usage_prompt = int(usage["prompt_tokens"]) if usage.get("prompt_tokens") is not None else None
    if not choices:
        return 0
    choice = choices[0]
    if choice.get("finish_reason"):
        state.finished = True
    if isinstance(choice.get("token_ids"), list):
        state.counted_by = "token_ids"
        return len(choice["token_ids"])
    if usage and usage.get("completion_tokens") is not None:  # continuous usage: a running total
        k = int(usage["completion_tokens"]) - state.streamed_usage
        state.streamed_usage = int(usage["completion_tokens"])
        state.counted_by = "continuous_usage"
        return max(k, 0)
    text = choice.get("text")
    if state.count_text is not None and isinstance(text, str):
        state.counted_by = "tokenizer"
        return state.count_text(text)
    state.counted_by = "chunks"
    return 1 if (text or choice.get("finish_reason") is None) else 0


def _keep_answer(data: Json, state: _Stream) -> None:
    """What a multi-turn workload needs of a chunk: the answer's token ids (a next turn carries
    them) and the prompt tokens the server served from its prefix cache (OpenAI's usage field;
    vLLM's with --enable-prompt-tokens-details)."""
    choices = data.get("choices")
    if choices:
        ids = choices[0].get("token_ids")
        if isinstance(ids, list):
            state.answer_ids.extend(ids)  # JSON's integers, as they came (a generator of int() cost 5% of the client's CPU)
    usage = data.get("usage")
    details = usage.get("prompt_tokens_details") if usage else None
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        state.cached_tokens = int(details["cached_tokens"])


class SSEEvents:
    """Server-sent events from a stream's bytes as they arrive: each event's data (its data: lines
    joined by newlines; comments, event names, ids and retries dropped, as are events without
    data). Lines end with LF, CRLF or CR (the SSE spec's three)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[str]:
        buf = self._buf + data
        if b"\r" in buf:
            if buf.endswith(b"\r") and not buf.endswith(b"\r\r"):  # a CR that a LF may follow: wait for the next read
                self._buf = buf
                return []
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        *blocks, self._buf = buf.split(b"\n\n")
        out = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:  # the usual event: one data line
                out.append(block[6:].decode())
                continue
            lines = [ln[5:] for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if lines:
                out.append(b"\n".join(ln[1:] if ln.startswith(b" ") else ln for ln in lines).decode())
        return out


class OpenAIClient:
    """async with OpenAIClient(endpoint) as c: sample = await c.complete(...)."""

    def __init__(self, endpoint: Endpoint, max_connections: int | None = None,
                 count_text: Callable[[str], int] | None = None):
        self.endpoint = endpoint
        self.count_text = count_text  # where the stream carries neither token ids nor usage
        self.tally = Tally()
        self._key = endpoint.api_key()
        self._max_connections = max_connections
        self._http: Any = None
        self.clocks: list[RequestClock] = []  # every finished request's, in order
        self._lag = LoopLag()
        if endpoint.kernel_clock:
            rx_clock.keep_stamping()

    async def __aenter__(self) -> OpenAIClient:
        import aiohttp

        e = self.endpoint
        headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
        # aiohttp itself, as vLLM's client: httpx's own transport spent ~2 ms sending each request
        # on a busy host against ~0.5 ms for aiohttp (scripts/client-overhead.py), and httpx's API
        # over aiohttp with httpx-sse's parser still cost the client half its requests a second
        # (issue 47). No pool limit by default (limit=0): a request waiting for a free connection
        # would count the client's queue as the server's latency. Reads wait up to the request's
        # own timeout (complete()'s).
        limit = self._max_connections or 0
        self._http = aiohttp.ClientSession(
            headers=headers, connector=aiohttp.TCPConnector(limit=limit, socket_factory=rx_clock.socket_factory if e.kernel_clock else None),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=e.connect_timeout_s))
        self._lag.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._lag.stop()
        await self._http.close()

    @property
    def lag_samples(self) -> list[float]:
        """How late its loop's lag monitor woke, each time (client/health.LoopLag)."""
        return self._lag.samples

    def health(self, request_ids: Collection[str] | None = None) -> ClientHealth:
        """The client's punctuality since it opened: its loop's lag, and its requests' clocks
        (those of `request_ids` only, where given: a load point's measured requests)."""
        clocks = self.clocks if request_ids is None else [c for c in self.clocks if c.request_id in request_ids]
        return health_of(clocks, self._lag.samples)

    def payload(self, prompt: str | Sequence[int], max_tokens: int) -> Json:
        body: Json = {"model": self.endpoint.model, "prompt": prompt if isinstance(prompt, str) else list(prompt),
                                "max_tokens": max_tokens, **self.endpoint.sampling.body(), "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.endpoint.force_length:
            body.update(ignore_eos=True, min_tokens=max_tokens)
        if self.endpoint.return_token_ids:
            body["return_token_ids"] = True
        return body

    async def complete(self, request_id: str, prompt_id: str, prompt: str | Sequence[int], max_tokens: int,
                       *, prompt_tokens: int | None = None, repeat: int = 0, answer: list[int] | None = None) -> RequestSample:
        """Send one streaming completion; returns its sample, failed ones included; `answer`, when
        given, receives the answer's token ids (where the stream carries them). prompt_tokens:
        the length asked (checked against the server's count, which the sample keeps where the
        server gives one; a token-id prompt's is its length)."""
        state = _Stream(t_submit=now(), count_text=self.count_text)
        try:
            await asyncio.wait_for(self._stream(prompt, max_tokens, state), self.endpoint.request_timeout_s)
            error = None
        except asyncio.TimeoutError:
            error = RequestFailed("timeout", f"no complete answer within {self.endpoint.request_timeout_s:g} s "
                                             f"({len(state.times)} tokens had arrived)")
        except RequestFailed as e:
            error = e
        except Exception as e:  # noqa: BLE001 - any transport failure is this request's, recorded
            error = transport_error(e, self.endpoint)
        if error is None and not state.times:
            error = RequestFailed("no_tokens", "the stream ended without an output token")
        t_end = state.times[-1] if state.times else now()
        asked = prompt_tokens if prompt_tokens is not None else (None if isinstance(prompt, str) else len(prompt))
        n_prompt = state.usage_prompt if state.usage_prompt is not None else (asked or 0)
        if error is None:
            self._check(request_id, state, max_tokens)
            self.tally.check_prompt(request_id, asked, state.usage_prompt)
            state.clock.request_id = request_id
            self.clocks.append(state.clock)
        if answer is not None:
            answer.extend(state.answer_ids)
        return RequestSample(request_id=request_id, prompt_id=prompt_id, repeat=repeat, prompt_tokens=n_prompt,
                             output_tokens=len(state.times), t_submit=state.t_submit,
                             t_first=state.times[0] if state.times else t_end, t_done=t_end,
                             token_times=state.times, ok=error is None, error=str(error) if error else None,
                             cached_tokens=state.cached_tokens)

    async def _stream(self, prompt: str | Sequence[int], max_tokens: int, state: _Stream) -> None:
        url = self.endpoint.api_root + "/completions"
        sending = rx_clock.track()  # this coroutine runs as its own task (wait_for): the mark stays with it
        async with self._http.post(url, json=self.payload(prompt, max_tokens)) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                raise classify_status(response.status, body, self.endpoint.model)
            ctype = response.headers.get("content-type", "?")
            if not ctype.startswith("text/event-stream"):
                raise RequestFailed("not_streaming", f"the server answered {ctype}, not an event stream")
            sock = sending.sock
            if sending.sent_at is not None:
                state.clock.send_s = sending.sent_at - state.t_submit
            last = None  # the end of the last token-carrying event
            events = SSEEvents()
            async for data in response.content.iter_any():
                t = now()
                for event in events.feed(data):
                    end = rx_clock.arrival(sock, event, state.t_submit, t) if sock is not None else None
                    done = event.strip() == "[DONE]"
                    if not done and self._on_chunk(event, t, state, end):
                        last = end
                    elif state.finished and last is not None and end is not None and last.read == end.read:
                        # the last token read with the answer's tokenless tail (usage, [DONE], after
                        # the finish_reason): its read's time is the tail's, written right behind it
                        state.clock.trust_last()
                    if done:
                        return
        if not state.finished:
            raise RequestFailed("protocol", f"the stream ended after {len(state.times)} tokens without a finish_reason")

    def _on_chunk(self, text: str, read: float, state: _Stream, end: rx_clock.End | None) -> int:
        """One event, read at `read`, whose end reached the host as `end` says (None: not known);
        how many tokens it carried."""
        try:
            data = json.loads(text)
        except ValueError:
            raise RequestFailed("protocol", f"a chunk is not JSON: {text[:80]!r}") from None
        if not isinstance(data, dict):
            raise RequestFailed("protocol", f"a chunk is not a JSON object: {text[:80]!r}")
        if "error" in data:
            raise RequestFailed("server", error_message(text) or text[:200])
        k = _chunk_tokens(data, state)
        if k:
            if end is None or end.stamp is None:  # the kernel clock did not time it
                state.clock.add(read, False)
            else:
                state.clock.add(read, True, end.stamp, end.exact, end.segments, end.since)
            state.times.extend([state.clock.timed[-1]] * k)
        _keep_answer(data, state)
        return k

    def _check(self, request_id: str, state: _Stream, requested: int) -> None:
        t = self.tally
        n = len(state.times)
        t.counted_by[state.counted_by or "none"] = t.counted_by.get(state.counted_by or "none", 0) + 1
        if state.usage_tokens is None:
            t.usage_missing += 1
        elif state.usage_tokens == n:
            t.usage_agreed += 1
        else:
            t.usage_mismatch.append((request_id, n, state.usage_tokens))
        if n < requested:
            t.short.append((request_id, n, requested))

    async def models(self) -> list[str]:
        """The model names the endpoint serves (GET /v1/models); a UsageError says what is wrong."""
        import aiohttp

        url = self.endpoint.api_root + "/models"
        try:
            async with self._http.get(url, timeout=aiohttp.ClientTimeout(total=self.endpoint.request_timeout_s,
                                                                          sock_connect=self.endpoint.connect_timeout_s)) as r:
                status, text = r.status, await r.text(errors="replace")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            err = transport_error(e, self.endpoint)
            raise UsageError(err.detail, fix_for(err.kind, self.endpoint)) from None
        if status != 200:
            err = classify_status(status, text, self.endpoint.model)
            raise UsageError(f"GET {url}: {err.detail}", fix_for(err.kind, self.endpoint))
        try:
            return [m["id"] for m in json.loads(text)["data"]]
        except (ValueError, KeyError, TypeError):
            raise UsageError(f"GET {url} did not answer an OpenAI model list: {text[:120]!r}",
                             "point --endpoint at an OpenAI-compatible server (its /v1/models lists the models)") from None

    async def check_model(self) -> list[str]:
        """The served models, after checking that ours is one of them."""
        served = await self.models()
        if self.endpoint.model not in served:
            raise UsageError(f"{self.endpoint.base_url} does not serve a model named {self.endpoint.model!r}; "
                             f"it serves: {', '.join(served) or 'none'}", f"pass --model with one of: {', '.join(served)}")
        return served
