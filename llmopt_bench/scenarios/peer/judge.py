"""vLLM's client's run judged as llmopt judges its own points: `vllm bench serve --save-detailed`'s
per-request results made llmopt's requests and load point (load/point.point_result over their
timelines), then llmopt's one verdict on a load point (load/record.slo_verdict: the SLO and, at a
rate, the steady state). tune's confirmation, `llmopt check capacity` and `llmopt check peer` read
vLLM's runs through here, never through vLLM's own p99s: a run whose completions fall behind its
arrivals misses whatever its latencies."""

from __future__ import annotations

from llmopt_bench.analysis.slo import Verdict
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.slo import SLO
from llmopt_bench.load.dispatchers import Timeline
from llmopt_bench.load.point import LoadPoint, PointResult, point_result
from llmopt_bench.load.record import slo_verdict


def latency(result: dict, i: int) -> float:
    """Request i's end-to-end latency in vLLM's result: its own `latencies` where the release
    writes them (0.32), else its first token plus its inter-token gaps (0.26 keeps only those);
    0 where a failed request has none."""
    if "latencies" in result:
        return float(result["latencies"][i] or 0.0)
    return float((result["ttfts"][i] or 0.0) + sum(result["itls"][i] or []))


def vllm_samples(result: dict) -> list[RequestSample]:
    """vLLM's per-request results as llmopt's requests: each sent at its start time, its first
    token ttft later, the next ones its inter-token gaps apart (a chunk of several tokens is one
    gap), done its latency later; a request with an error failed. A result kept without its
    inter-token gaps (a committed copy, slimmed) gives each request its first and last token
    only: TTFT, TPOT and E2E are judged the same, ITL not."""
    out = []
    for i, start in enumerate(result["start_times"]):
        error = result["errors"][i] or None
        first = start + (result["ttfts"][i] or 0.0)
        gaps = result["itls"][i] if "itls" in result else [latency(result, i) - (result["ttfts"][i] or 0.0)]
        times = [first]
        for gap in gaps or []:
            times.append(times[-1] + gap)
        out.append(RequestSample(request_id=f"vllm{i:05d}", prompt_id=f"vllm{i:05d}", prompt_tokens=result["input_lens"][i],
                                 output_tokens=result["output_lens"][i], t_submit=start, t_first=first,
                                 t_done=start + latency(result, i), token_times=times, ok=error is None, error=error))
    return out


def vllm_point(result: dict, rate: float | None, warmup_s: float, concurrency: int | None = None) -> PointResult:
    """vLLM's run as a load point of llmopt's: at a request rate an open loop (each request
    arrived when vLLM's client sent it, answered at its latency; the arrivals of the first
    warmup_s seconds not measured, the steady state judged), else a closed loop of `concurrency`
    (all at once: every request)."""
    samples = sorted(vllm_samples(result), key=lambda s: s.t_submit)
    t0 = samples[0].t_submit
    span = samples[-1].t_submit - t0
    timelines = [Timeline(index=i, arrival=s.t_submit, sent=s.t_submit, answered=s.t_done, sample=s)
                 for i, s in enumerate(samples)]
    if rate is not None:
        point = LoadPoint(rate=rate, duration_s=span, warmup_s=min(warmup_s, span / 2))
    else:
        point = LoadPoint(concurrency=concurrency or len(samples), num_requests=len(samples))
    return point_result(point, timelines, t0)


def judge_run(result: dict, slo: SLO, max_failure_rate: float, *, rate: float | None = None, warmup_s: float = 0.0,
              concurrency: int | None = None) -> tuple[Verdict, PointResult]:
    """llmopt's verdict on vLLM's run (load/record.slo_verdict), and the point it judged."""
    point = vllm_point(result, rate, warmup_s, concurrency)
    return slo_verdict(slo, point, max_failure_rate), point


def bench_samples(result: dict) -> list[RequestSample]:
    """vLLM's requests as samples each on its own clock from 0 (TTFT, latency, output tokens), for
    the server clock's reconciliation (client/server_clock.server_clock) of vLLM's client as of llmopt's."""
    out = []
    for i, (ttft, n) in enumerate(zip(result.get("ttfts") or [], result.get("output_lens") or [])):
        failed = bool((result.get("errors") or [""] * (i + 1))[i])
        out.append(RequestSample(request_id=f"vllm{i}", prompt_id=f"vllm{i}", prompt_tokens=(result.get("input_lens") or [0] * (i + 1))[i],
                                 output_tokens=int(n), t_submit=0.0, t_first=float(ttft or 0.0), t_done=latency(result, i),
                                 ok=not failed))
    return out
