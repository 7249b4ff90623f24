"""The winner confirmed by vLLM's own client: `vllm bench serve` on the same server (run by
scenarios/peer/bench_serve.py, the one runner), Poisson arrivals at the held capacity for as long
as the hold, vLLM's random dataset at the trial's prompt and output lengths (the output forced),
every request's figures judged by llmopt's own verdict on a load point (scenarios/peer/judge.py:
the SLO and the steady state), as the hold itself was: a run whose completions fall behind its
arrivals misses, whatever vLLM's p99s say."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from llmopt_bench.core.freeform import Json
from llmopt_bench.tune.record import Confirmation


def confirm(server: Any, shared: Any, rate: float, trial_dir: Path, lengths: tuple[int | None, int | None]) -> Confirmation:
    """`vllm bench serve` at `rate` for hold_s seconds of arrivals on the running server (a
    Served: base_url, name), judged under the tune run's SLO."""
    from llmopt_bench.scenarios.peer.bench_serve import BenchServe, random_args
    from llmopt_bench.scenarios.peer.judge import judge_run

    out = shared.run_dir / trial_dir / "vllm-bench-serve"
    n = max(2, math.ceil(rate * shared.hold_s))
    input_len, output_len = lengths[0] or 1, lengths[1] or shared.workload.max_new_tokens
    args = random_args(server.base_url, server.name, input_len, output_len, n, tokenizer=shared.model.path, rate=rate,
                       seed=shared.workload.seed)
    with BenchServe(out / "process.log") as bench:
        run = bench.run(args, out, timeout_s=shared.hold_s * 4 + 300)
    base = dict(rate_rps=rate, seconds=shared.hold_s, num_prompts=n, command=run.command)
    if run.result is None:
        return Confirmation(**base, verdict="failed", why=run.error or "no result")
    p = shared.load
    v, point = judge_run(run.result, p.slo, p.max_failure_rate, rate=rate, warmup_s=p.warmup_s)
    st = point.steady
    figures: Json = {k: run.result.get(k) for k in ("completed", "failed", "request_throughput", "duration")}
    figures.update({f"{t.target}_ms": None if t.value_s is None else round(t.value_s * 1e3, 3) for t in v.targets})
    figures.update(completion_rps=st.completion_rps if st else None, steady=st.ok if st else None,
                   measured=point.sent, warmup_excluded=point.warmup_excluded)
    return Confirmation(**base, verdict="held" if v.ok else "missed", why=v.reason or "", figures=figures)
