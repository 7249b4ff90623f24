"""A continuous-batching server simulated in virtual time, as an engine of the load machine
(load/engine.LoadEngine: drive(dispatcher)). Used by the tests of the steady-state judgement,
the capacity search and the hold, where the answer must be known and a run must take
milliseconds, not minutes.

The model: every step decodes one token for each running request; a step lasts
max(step_s, running / tokens_per_s) (a memory-bound decode until the batch saturates the
device, then the device's token rate shared). At most max_seqs run; the rest wait, first come
first served, and join at the next step. A request's first token comes at the end of its first
step. So the server completes at most tokens_per_s / output_len requests a second, whatever the
load: below that it keeps up; above it the running batch fills, every TPOT stays at
max_seqs / tokens_per_s, and a queue grows in front of it, TTFT with it, slowly enough that a
short window can close before the TTFT limit is crossed (the H200 case of issue 23)."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.records import RequestSample


@dataclass
class _Running:
    send: Send
    times: list[float] = field(default_factory=list)


@dataclass
class SimServer:
    tokens_per_s: float = 900.0  # the device's decode rate at saturation
    step_s: float = 0.01  # a step's length below saturation
    max_seqs: int = 64
    start_s: float = 0.0  # virtual time of the first call (each drive continues where the last ended)
    steps: int = 0

    def rate_for(self, output_len: int) -> float:
        """The most requests of output_len tokens it completes a second."""
        return self.tokens_per_s / output_len

    def step_length(self, running: int) -> float:
        return max(self.step_s, running / self.tokens_per_s)

    def drive(self, dispatcher: Dispatcher) -> None:
        t = self.start_s
        waiting: list[Send] = []
        running: list[_Running] = []
        while not dispatcher.finished():
            waiting += dispatcher.due(t)
            while waiting and len(running) < self.max_seqs:
                running.append(_Running(waiting.pop(0)))
            if not running:
                wake = dispatcher.wake_at()
                assert wake is not None, "nothing running, nothing due: the dispatcher is stuck"
                t = max(t, wake)
                continue
            t += self.step_length(len(running))
            self.steps += 1
            for r in running:
                r.times.append(t)
            for r in [r for r in running if len(r.times) >= r.send.output_len]:
                running.remove(r)
                s = r.send
                dispatcher.done(s, RequestSample(request_id=s.id, prompt_id=s.prompt_id, repeat=s.repeat,
                                                 prompt_tokens=len(s.token_ids), output_tokens=len(r.times),
                                                 t_submit=s.arrival, t_first=r.times[0], t_done=r.times[-1],
                                                 token_times=list(r.times)), t)
        self.start_s = t + 1.0  # the next point starts on an idle server


def vllm_client_run(rate: float, seconds: float, served_rps: float, latencies: bool = True) -> dict:
    """`vllm bench serve --save-detailed`'s result of sending rate a second for `seconds` to a
    server that answers served_rps a second, first come first served, each of 10 tokens in 0.5 s
    at least; latencies=False: as vLLM 0.26 saves it (no per-request `latencies`)."""
    n = int(rate * seconds)
    starts = [i / rate for i in range(n)]
    done, free = [], 0.0
    for t in starts:
        free = max(free, t) + 1 / served_rps
        done.append(max(free, t + 0.5))
    ttfts = [d - t - 0.09 for t, d in zip(starts, done)]
    out = {"num_prompts": n, "start_times": starts, "ttfts": ttfts, "itls": [[0.01] * 9] * n, "output_lens": [10] * n,
           "input_lens": [450] * n, "errors": [""] * n, "completed": n, "failed": 0, "duration": seconds,
           "request_throughput": n / seconds, "p99_ttft_ms": 1e3 * sorted(ttfts)[int(0.99 * n)], "p99_tpot_ms": 10.0}
    if latencies:
        out["latencies"] = [d - t for t, d in zip(starts, done)]
    return out
