#!/usr/bin/env python3
"""What an HTTP client adds to TTFT: the time from the client's clock start to the server
receiving the request (send) and from the server writing the first chunk to the client reading
it (receive), for llmopt's client (aiohttp itself since issue 47) and plain aiohttp beside it.

    python scripts/client-overhead.py [--requests 200 --rate 8 --concurrency 32 --rounds 2]

A stand-in OpenAI server (aiohttp.web, its own process) streams 128 chunks 5 ms apart after
25 ms and stamps, per request, when it read the request and wrote the first chunk;
time.perf_counter is CLOCK_MONOTONIC, one clock for both processes on Linux. Arrivals are
Poisson at --rate with at most --concurrency in flight, as in the peer check. This is how the
client was chosen (client/openai_http.py): a benchmark, not a test."""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import subprocess
import sys
import time

SERVER = r'''
import asyncio, json, sys, time
from aiohttp import web
stamps = {}
async def completions(req):
    t_in = time.perf_counter()
    body = await req.json()
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(req)
    await asyncio.sleep(0.025)
    n = body["max_tokens"]
    for i in range(n):
        chunk = {"choices": [{"text": "x", "token_ids": [1], "finish_reason": "length" if i == n - 1 else None}]}
        if i == 0:
            stamps[body["prompt"]] = (t_in, time.perf_counter())
        await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(0.005)
    await resp.write(b"data: [DONE]\n\n")
    return resp
async def dump(req):
    out = dict(stamps); stamps.clear(); return web.json_response(out)
app = web.Application(); app.router.add_post("/v1/completions", completions); app.router.add_get("/stamps", dump)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
'''


async def raw_aiohttp(url: str, ids: list[str], args) -> dict[str, tuple[float, float]]:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(rid: str) -> tuple[float, float]:
            t0 = time.perf_counter()
            async with s.post(url + "/v1/completions", json={"prompt": rid, "max_tokens": 128}) as r:
                first = None
                async for _ in r.content.iter_any():
                    first = first or time.perf_counter()
            return t0, first
        return await _drive(one, ids, args)


async def llmopt_client(url: str, ids: list[str], args) -> dict[str, tuple[float, float]]:
    from llmopt_bench.client.openai_http import Endpoint, OpenAIClient

    client = OpenAIClient(Endpoint(url, "m", force_length=False))
    async with client as c:
        async def one(rid: str) -> tuple[float, float]:
            s = await c.complete(rid, rid, rid, 128)
            # when the client read the first token (its time is the kernel's receive time where it has one)
            return s.t_submit, c.clocks[-1].read[0] if s.ok else s.t_first
        return await _drive(one, ids, args)


async def _drive(one, ids: list[str], args) -> dict[str, tuple[float, float]]:
    rng, sem, out = random.Random(0), asyncio.Semaphore(args.concurrency), {}

    async def go(rid: str) -> None:
        async with sem:
            out[rid] = await one(rid)
    tasks = []
    for rid in ids:
        tasks.append(asyncio.create_task(go(rid)))
        await asyncio.sleep(rng.expovariate(args.rate))
    await asyncio.gather(*tasks)
    return out


def main(argv: list[str]) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--requests", type=int, default=200)
    a.add_argument("--rate", type=float, default=8.0)
    a.add_argument("--concurrency", type=int, default=32)
    a.add_argument("--rounds", type=int, default=2)
    args = a.parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(3)
        import httpx
        print("client | send p50 ms | send p90 ms | receive p50 ms | requests")
        for rnd in range(args.rounds):
            for name in ("llmopt", "aiohttp"):
                ids = [f"{name}-{rnd}-{i}" for i in range(args.requests)]
                if name == "aiohttp":
                    seen = asyncio.run(raw_aiohttp(url, ids, args))
                else:
                    seen = asyncio.run(llmopt_client(url, ids, args))
                stamps = httpx.get(url + "/stamps").json()
                send = sorted((stamps[r][0] - seen[r][0]) * 1e3 for r in ids)
                recv = sorted((seen[r][1] - stamps[r][1]) * 1e3 for r in ids)
                print(f"{name} | {statistics.median(send):.3f} | {send[int(0.9 * len(send))]:.3f} | "
                      f"{statistics.median(recv):.3f} | {len(ids)}")
    finally:
        server.terminate()
        server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
