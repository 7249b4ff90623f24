"""A TEST server, no model behind it: an OpenAI-compatible /v1/completions that streams the asked
number of tokens (max_tokens), one server-sent event each, at a fixed interval or as fast as its
loop writes. It measures the client, never a model: `llmopt check client` drives it to find
the requests and streamed events a second the client sustains (docs/serving.md, "The client's
own ceiling"), and the tests run the client's workers against it.

    python -m llmopt_bench.client.test_server --port 8100 [--interval-ms 10] [--first-ms 10]

Each event carries one token (its id in `token_ids` where the request asks for them with vLLM's
`return_token_ids`; its text always), the last one finish_reason "length", then the usage
(include_usage) and [DONE], as vLLM's server streams them. A prompt of token ids counts its
length as prompt_tokens; a text prompt counts its whitespace-separated words (no tokenizer: the
client's prompt check then says the counts differ, which is this server's, not the client's).

How it stays cheaper than the client it measures: one asyncio protocol (no framework), event
bytes made once per token index, and one timer for every stream (a heap of the streams' next
event times): at each wake-up it writes every event that is due. Its own lateness (how long
after its due time each event was written, the worst of each wake-up) and what it wrote are at
GET /stats (JSON; ?reset=1 starts a new tally): a client ceiling measured against a server that
fell behind is the server's, and the ceiling command says so."""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from llmopt_bench.core.freeform import Json

MODEL = "llmopt-test-server"
MAX_HEADER = 64 * 1024


@dataclass
class Pacing:
    """How the server streams: the first event `first_s` after the request, then one every
    `interval_s` (0: every stream gets its next event each time the loop comes round)."""

    interval_s: float = 0.01
    first_s: float = 0.01


@dataclass
class Tally:
    """What the server wrote since the last reset, and how late."""

    requests: int = 0
    events: int = 0
    lateness: list[float] = field(default_factory=list)  # per wake-up: the latest event's delay past its due time
    since: float = field(default_factory=time.perf_counter)

    def summary(self) -> Json:
        late = sorted(self.lateness)

        def q(p: float) -> float | None:
            return late[min(len(late) - 1, int(p / 100 * len(late)))] if late else None
        span = time.perf_counter() - self.since
        return {"requests": self.requests, "events": self.events, "seconds": span,
                "events_per_s": self.events / span if span > 0 else None,
                "late_p50_s": q(50), "late_p99_s": q(99), "late_max_s": late[-1] if late else None, "wakeups": len(late)}


def _chunked(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: Any) -> bytes:
    return _chunked(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class Events:
    """The bytes of every event, made once: token i's event with and without token ids, the last one's."""

    def __init__(self, model: str):
        self.model = model
        self._cache: dict[tuple[int, bool, bool], bytes] = {}

    def token(self, i: int, ids: bool, last: bool) -> bytes:
        key = (i, ids, last)
        out = self._cache.get(key)
        if out is None:
            choice: Json = {"index": 0, "text": f" t{i}", "logprobs": None, "finish_reason": "length" if last else None}
            if ids:
                choice["token_ids"] = [1000 + i % 30000]
            out = self._cache[key] = _event({"id": "cmpl-test", "object": "text_completion", "created": 0,
                                             "model": self.model, "choices": [choice]})
        return out

    def usage(self, prompt: int, completion: int) -> bytes:
        return _event({"id": "cmpl-test", "object": "text_completion", "created": 0, "model": self.model, "choices": [],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                 "total_tokens": prompt + completion}})


DONE = _chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Stream:
    """One request being answered."""

    __slots__ = ("conn", "n", "sent", "ids", "usage", "prompt")

    def __init__(self, conn: Connection, n: int, ids: bool, usage: bool, prompt: int):
        self.conn, self.n, self.sent, self.ids, self.usage, self.prompt = conn, n, 0, ids, usage, prompt


class Pump:
    """Every stream's next event on one heap, written by one timer."""

    def __init__(self, pacing: Pacing, events: Events, tally: Tally):
        self.pacing, self.events, self.tally = pacing, events, tally
        self.heap: list[tuple[float, int, Stream]] = []
        self.order = itertools.count()
        self.handle: asyncio.Handle | None = None
        self.loop = asyncio.get_event_loop()

    def add(self, stream: Stream) -> None:
        self._push(time.perf_counter() + self.pacing.first_s, stream)

    def _push(self, due: float, stream: Stream) -> None:
        heapq.heappush(self.heap, (due, next(self.order), stream))
        if self.handle is None or (self.heap[0][2] is stream and due < self._wake):
            self._arm()

    def _arm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        due = self.heap[0][0]
        self._wake = due
        delay = due - time.perf_counter()
        self.handle = self.loop.call_soon(self._run) if delay <= 0 else self.loop.call_later(delay, self._run)

    def _run(self) -> None:
        self.handle = None
        t = time.perf_counter()
        worst = 0.0
        step = self.pacing.interval_s
        heap, events = self.heap, self.events
        # each stream due now gets ONE event per pass, so that at interval 0 the streams take turns
        batch = []
        while heap and heap[0][0] <= t:
            batch.append(heapq.heappop(heap))
        for due, _, s in batch:
            worst = max(worst, t - due)
            conn = s.conn
            if conn.closed:
                continue
            last = s.sent + 1 == s.n
            out = events.token(s.sent, s.ids, last)
            s.sent += 1
            self.tally.events += 1
            if last:
                if s.usage:
                    out += events.usage(s.prompt, s.n)
                conn.write(out + DONE)
                conn.stream_done()
            else:
                conn.write(out)
                heapq.heappush(heap, (max(due + step, t) if step else t, next(self.order), s))
        if batch:
            self.tally.lateness.append(worst)
        if heap:
            self._arm()


class Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection: requests one after another, each answered in turn."""

    def __init__(self, server: TestServer):
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.busy = False  # a stream is being written: the next request waits in the buffer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > 64 * 1024 * 1024:
            self._respond(413, b"request too large", close=True)
            return
        self._next()

    def stream_done(self) -> None:
        self.busy = False
        self._next()

    def _next(self) -> None:
        while not self.busy and not self.closed:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buf) > MAX_HEADER:
                    self._respond(431, b"headers too large", close=True)
                return
            lines = self.buf[:head_end].decode("latin-1").split("\r\n")
            try:
                method, target, _ = lines[0].split(" ", 2)
            except ValueError:
                self._respond(400, b"bad request line", close=True)
                return
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4:head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length:]
            self.server.route(self, method, target, body)

    def _respond(self, status: int, body: bytes, ctype: str = "text/plain", close: bool = False) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 413: "Payload Too Large", 431: "Headers Too Large"}.get(status, "")
        head = (f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"{'Connection: close' if close else 'Connection: keep-alive'}\r\n\r\n").encode()
        self.write(head + body)
        if close and self.transport is not None:
            self.transport.close()
            self.closed = True

    def json(self, status: int, obj: Any) -> None:
        self._respond(status, json.dumps(obj).encode(), "application/json")

    def start_stream(self) -> None:
        self.busy = True
        self.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                   b"Transfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n")


def prompt_tokens(prompt: Any) -> int:
    if isinstance(prompt, list):
        return len(prompt)
    return len(str(prompt).split())


class TestServer:
    """The routes: POST /v1/completions, GET /v1/models, /health, /stats."""

    def __init__(self, pacing: Pacing, model: str = MODEL):
        self.pacing, self.model = pacing, model
        self.events = Events(model)
        self.tally = Tally()
        self.pump: Pump | None = None

    def route(self, conn: Connection, method: str, target: str, body: bytes) -> None:
        url = urlsplit(target)
        path = url.path.rstrip("/")
        if method == "POST" and path in ("/v1/completions", "/completions"):
            self.complete(conn, body)
        elif method == "GET" and path in ("/v1/models", "/models"):
            conn.json(200, {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "llmopt-test"}]})
        elif method == "GET" and path == "/health":
            conn._respond(200, b"")
        elif method == "GET" and path == "/stats":
            conn.json(200, self.tally.summary())
            if parse_qs(url.query).get("reset"):
                self.tally = Tally()
                if self.pump is not None:
                    self.pump.tally = self.tally
        else:
            conn.json(404, {"error": {"message": f"{method} {path}: not served by the test server", "code": 404}})

    def complete(self, conn: Connection, body: bytes) -> None:
        try:
            req = json.loads(body)
            n = int(req.get("max_tokens") or 16)
        except (ValueError, TypeError, AttributeError):
            conn.json(400, {"error": {"message": "the body is not a completions request", "code": 400}})
            return
        if req.get("model") not in (None, self.model):
            conn.json(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.", "code": 404}})
            return
        self.tally.requests += 1
        prompt = prompt_tokens(req.get("prompt", ""))
        if not req.get("stream"):
            text = "".join(f" t{i}" for i in range(n))
            conn.json(200, {"id": "cmpl-test", "object": "text_completion", "created": 0, "model": self.model,
                            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
                            "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n}})
            return
        if self.pump is None:
            self.pump = Pump(self.pacing, self.events, self.tally)
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        conn.start_stream()
        self.pump.add(Stream(conn, max(1, n), bool(req.get("return_token_ids")), usage, prompt))


async def serve(host: str, port: int, pacing: Pacing, ready: Callable[[int], None] | None = None) -> None:
    """Serve until cancelled; ready(port) once listening (port 0: a free one)."""
    server = TestServer(pacing)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: Connection(server), host, port, reuse_address=True, backlog=4096)
    bound = srv.sockets[0].getsockname()[1]
    if ready is not None:
        ready(bound)
    async with srv:
        await srv.serve_forever()


def _interrupt(signum: int, frame: Any) -> None:  # a kill ends the server as Ctrl-C does
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m llmopt_bench.client.test_server",
                                 description="A TEST server with no model: streams max_tokens events per completion.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100, help="0: a free port (printed on the first line)")
    ap.add_argument("--interval-ms", type=float, default=10.0, help="between a stream's events; 0: as fast as the loop writes")
    ap.add_argument("--first-ms", type=float, default=None, help="request to first event (default: the interval)")
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop (where installed)")
    ap.add_argument("--cpus", default=None, help="the cores it runs on, e.g. 1 or 2,3 (default: any)")
    a = ap.parse_args(argv)
    if a.interval_ms < 0 or (a.first_ms is not None and a.first_ms < 0):
        ap.error("--interval-ms and --first-ms take 0 or more")
    if a.cpus:
        try:
            os.sched_setaffinity(0, {int(c) for c in a.cpus.split(",")})
        except (ValueError, OSError) as e:
            ap.error(f"--cpus {a.cpus}: {e}")
    pacing = Pacing(a.interval_ms / 1e3, (a.first_ms if a.first_ms is not None else a.interval_ms) / 1e3)
    signal.signal(signal.SIGTERM, _interrupt)
    if a.uvloop:
        import uvloop

        uvloop.install()
    try:
        asyncio.run(serve(a.host, a.port, pacing, lambda p: print(f"listening on http://{a.host}:{p}", flush=True)))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
