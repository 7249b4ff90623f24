"""The winner confirmed by vLLM's own client: `vllm bench serve` on the same server, Poisson
arrivals at the held capacity for as long as the hold, vLLM's random dataset at the trial's
prompt and output lengths (the output forced), its p99s judged against the same SLO."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
from pathlib import Path
from typing import Any, Literal

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.slo import SLO
from llmopt_bench.tune.record import Confirmation

VLLM_METRIC = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}  # llmopt's name -> vllm bench serve's


def judge(result: Json, slo: SLO, requests: int, max_failure_rate: float) -> tuple[Literal["held", "missed"], str, Json]:
    """vLLM's client's figures against the SLO: (verdict, why, the figures)."""
    figures: Json = {k: result.get(k) for k in ("completed", "failed", "request_throughput", "duration")}
    misses = []
    for t in slo.targets:
        key = f"p{t.percentile}_{VLLM_METRIC[t.metric]}_ms"
        got = result.get(key)
        figures[key] = got
        if got is None:
            misses.append(f"{key} not reported")
        elif got > t.limit_s * 1e3:
            misses.append(f"{t.name} {got:.1f} ms > {t.limit_s * 1e3:g} ms")
    failed = result.get("failed") or 0
    if failed > max_failure_rate * requests:
        misses.append(f"{failed} of {requests} requests failed")
    return ("missed" if misses else "held"), "; ".join(misses), figures


def confirm(server: Any, shared: Any, rate: float, trial_dir: Path, lengths: tuple[int | None, int | None]) -> Confirmation:
    """`vllm bench serve` at `rate` for hold_s seconds of arrivals on the running server."""
    from llmopt_bench.engines.vllm.server import vllm_cli_works, vllm_python
    from llmopt_bench.scenarios import peer

    out = shared.run_dir / trial_dir / "vllm-bench-serve"
    out.mkdir(parents=True, exist_ok=True)
    n = max(2, math.ceil(rate * shared.hold_s))
    input_len, output_len = lengths[0] or 1, lengths[1] or shared.workload.max_new_tokens
    python = vllm_python()
    args = peer.bench_serve_random_command(server.base_url, server.served_model_name, input_len, output_len, n,
                                           tokenizer=shared.model.path, rate=rate, seed=shared.workload.seed, result_dir=out)
    args += ["--metric-percentiles", "50,90,95,99"]  # every percentile an SLO may name (the last flag wins)
    argv = peer.bench_serve_argv(python, args, vllm_cli_works(python))
    command = "vllm " + shlex.join(args)
    (out / "command.txt").write_text(command + "\n")
    timeout = shared.hold_s * 4 + 300
    try:
        with open(out / "stdout.log", "w") as log:
            proc = subprocess.run(argv, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return Confirmation(rate_rps=rate, seconds=shared.hold_s, num_prompts=n, command=command, verdict="failed",
                            why=f"vllm bench serve ran past {timeout:g} s")
    saved = sorted(out.glob("*.json"), key=lambda p: p.stat().st_mtime)
    if proc.returncode != 0 or not saved:
        return Confirmation(rate_rps=rate, seconds=shared.hold_s, num_prompts=n, command=command, verdict="failed",
                            why=f"vllm bench serve exited {proc.returncode}: see {out / 'stdout.log'}")
    verdict, why, figures = judge(json.loads(saved[-1].read_text()), shared.load.slo, n, shared.load.max_failure_rate)
    return Confirmation(rate_rps=rate, seconds=shared.hold_s, num_prompts=n, command=command, verdict=verdict, why=why,
                        figures=figures)
