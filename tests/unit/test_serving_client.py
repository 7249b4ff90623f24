"""The HTTP client (client/openai_http.py) against small real HTTP servers (the standard
library's, on loopback) that behave as some OpenAI-compatible servers do and vLLM does not: one
that answers JSON to a streaming request, one whose usage field disagrees with what it
streamed, one that streams text chunks with neither token ids nor usage, one that closes the
stream early. vLLM's own server is tested in tests/integration/test_serving_vllm.py."""

from __future__ import annotations

import asyncio
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llmopt_bench.client.errors import error_kind
from llmopt_bench.client.openai_http import Endpoint, OpenAIClient
from llmopt_bench.core.errors import UsageError


def chunk(text: str = "a", finish: str | None = None, **extra) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}]}


SCRIPTS = {
    "json": None,  # not a stream at all
    "lying_usage": [chunk(token_ids=[1]), chunk(token_ids=[2, 3]), chunk(finish="length", token_ids=[4]),
                    {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7}}],
    "text_only": [chunk("x"), chunk("y"), chunk("z", finish="length")],
    "cut_short": [chunk(token_ids=[1]), chunk(token_ids=[2])],
    "error_event": [chunk(token_ids=[1]), {"error": {"message": "engine died", "code": 500}}],
}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        script = SCRIPTS[body["model"]]
        if script is None:
            out = json.dumps({"choices": [{"text": "abc", "finish_reason": "length"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for event in script:
            self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.flush()
        if body["model"] != "cut_short":
            self.wfile.write(b"data: [DONE]\n\n")

    def do_GET(self):
        out = json.dumps({"data": [{"id": m} for m in SCRIPTS]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.bodies = []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def complete(server, model: str, n: int = 4, count_text=None, **endpoint):
    async def go():
        async with OpenAIClient(Endpoint(f"http://127.0.0.1:{server.server_port}", model, **endpoint), count_text=count_text) as c:
            return await c.complete("q1", "p1", [5, 6, 7], n), c.tally
    return asyncio.run(go())


def test_a_server_that_does_not_stream_fails_the_request_with_its_reason(server):
    s, _ = complete(server, "json")
    assert not s.ok and error_kind(s) == "not_streaming"
    assert "application/json" in s.error


def test_the_request_asks_for_a_forced_greedy_stream_with_usage(server):
    complete(server, "text_only", n=3)
    body = server.bodies[-1]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["max_tokens"] == body["min_tokens"] == 3 and body["ignore_eos"] is True
    assert body["prompt"] == [5, 6, 7] and body["return_token_ids"] is True
    complete(server, "text_only", n=3, force_length=False, return_token_ids=False)
    assert not {"min_tokens", "ignore_eos", "return_token_ids"} & set(server.bodies[-1])


def test_tokens_counted_from_the_stream_and_a_usage_mismatch_is_kept(server):
    s, tally = complete(server, "lying_usage")
    assert s.ok and s.output_tokens == 4 and len(s.token_times) == 4
    assert s.token_times[1] == s.token_times[2]  # one chunk, two tokens: the chunk's time twice
    assert tally.usage_mismatch == [("q1", 4, 7)] and tally.usage_agreed == 0
    assert tally.counted_by == {"token_ids": 1}
    assert s.prompt_tokens == 3  # from the request


def test_without_token_ids_each_chunk_counts_one_token(server):
    s, tally = complete(server, "text_only", n=5)
    assert s.ok and s.output_tokens == 3
    assert tally.counted_by == {"chunks": 1} and tally.usage_missing == 1
    assert tally.short == [("q1", 3, 5)]  # the server stopped before the length asked


def test_with_a_tokenizer_each_chunk_counts_its_own_tokens(server):
    """Text without ids or usage: the tokenizer's count of each chunk's text (here: 2 per letter,
    "xyz" streamed as x, y, z), each token at its chunk's time."""
    s, tally = complete(server, "text_only", n=6, count_text=lambda text: 2 * len(text))
    assert s.ok and s.output_tokens == 6 and s.token_times[0] == s.token_times[1]
    assert tally.counted_by == {"tokenizer": 1} and not tally.short


def test_a_stream_cut_short_or_an_error_event_fails_the_request(server):
    s, _ = complete(server, "cut_short")
    assert not s.ok and error_kind(s) == "protocol" and s.output_tokens == 2
    s, _ = complete(server, "error_event")
    assert not s.ok and error_kind(s) == "server" and "engine died" in s.error


def test_an_unset_key_variable_is_a_usage_error(monkeypatch):
    monkeypatch.delenv("LLMOPT_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(UsageError) as e:
        OpenAIClient(Endpoint("http://127.0.0.1:1", "m", api_key_env="LLMOPT_TEST_NO_SUCH_KEY"))
    assert "LLMOPT_TEST_NO_SUCH_KEY" in e.value.message and "export" in e.value.fix
