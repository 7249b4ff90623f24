"""What can go wrong with one request to an OpenAI-compatible server, in words a user can act on:
the kinds a failed sample's error starts with, the HTTP status and transport errors mapped to
them, and the fix for each (client/openai_http.py's client uses them)."""

from __future__ import annotations

import asyncio
import json

from llmopt_bench.client.endpoint import Endpoint
from llmopt_bench.core.records import RequestSample

# What can go wrong with one request; RequestSample.error starts with one of these and a colon.
KINDS = ("connection", "unauthorized", "unknown_model", "http", "not_streaming", "timeout", "protocol", "server",
         "no_tokens")


def error_kind(sample: RequestSample) -> str | None:
    """The KIND of a failed sample's error, None for a sample that succeeded."""
    if sample.ok or not sample.error:
        return None
    return sample.error.split(":", 1)[0]


class RequestFailed(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def classify_status(status: int, body: str, model: str) -> RequestFailed:
    detail = error_message(body) or body[:200]
    if status in (401, 403):
        return RequestFailed("unauthorized", f"HTTP {status}: {detail}")
    if status == 404 and ("model" in detail.lower() or model in detail):
        return RequestFailed("unknown_model", f"HTTP 404: {detail}")
    return RequestFailed("http", f"HTTP {status}: {detail}")


def error_message(body: str) -> str | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail"))
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err is not None:
            return str(err)
    return None


def transport_error(e: Exception, endpoint: Endpoint) -> RequestFailed:
    import aiohttp

    chain = _chain(e)
    # a refused or unreachable host is aiohttp's ClientConnectorError, found in the chain; the
    # reason is the OS error at its end ("Cannot connect to host" hides "refused")
    if any(isinstance(x, (aiohttp.ClientConnectorError, ConnectionRefusedError)) for x in chain):
        cause = chain[-1]
        reason = "connection refused" if isinstance(cause, ConnectionRefusedError) else str(cause) or type(cause).__name__
        return RequestFailed("connection", f"cannot connect to {endpoint.base_url}: {reason}")
    if isinstance(e, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
        return RequestFailed("timeout", f"{type(e).__name__} after the client's limit ({endpoint.request_timeout_s:g} s)")
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientOSError, ConnectionError)):
        return RequestFailed("protocol", f"the connection broke mid-answer: {e or type(e).__name__}")
    return RequestFailed("protocol", f"{type(e).__name__}: {e}")


def _chain(e: BaseException) -> list[BaseException]:
    """e and the exceptions it was raised from, outermost first."""
    chain = [e]
    while (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None and nxt not in chain:
        chain.append(nxt)
    return chain


def fix_for(kind: str, endpoint: Endpoint) -> str:
    if kind == "connection":
        return "start the server, or check the endpoint's host and port"
    if kind == "unauthorized":
        if endpoint.api_key_env:
            return f"the key in {endpoint.api_key_env} was refused: set it to the server's key"
        return ("the server wants an API key: put it in an environment variable and name it with --api-key-env "
                "(a stage's api_key_env param)")
    if kind == "timeout":
        return "the server did not answer in time: check that it is up and not overloaded"
    if kind == "unknown_model":
        return "pass the model name the server answers to (its /v1/models lists them)"
    if kind == "not_streaming":
        return "llmopt times every token from a stream: use a server (or a setting of it) that streams /v1/completions"
    return "check that the endpoint is an OpenAI-compatible server"
