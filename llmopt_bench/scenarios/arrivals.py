"""The load scenario's plan and its arithmetic: which load points to run (closed-loop
concurrencies or Poisson arrival rates, requests per point, the main point, the all-at-once
throughput point), the requests fitted to the engine, and each point's requests summarized
into a CurveRow (throughput, latency percentiles, goodput, energy). Nothing here runs an
engine: arrivals_stage.py serves the points; docs/batching.md defines every figure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

from pydantic import Field

from llmopt_bench.analysis.metrics import compute, tpot, ttft
from llmopt_bench.core.records import RequestSample, StageFacts, StrictModel
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests, poisson_arrivals
from llmopt_bench.scenarios.arrivals_record import BatchingExtra, CurveRow

Attn = Literal["eager", "sdpa", "flash_attention_2"]
H200_REFERENCE = {"vllm_fp16_batch1_ms_per_token": 4.63, "vllm_fp16_256x128_out_tok_s": 11311,
                  "vllm_fp16_batch16_out_tok_s": 2998, "transformers_sdpa_batch16_out_tok_s": 606,
                  "model": "Llama-2-7B shape, FP16, one H200"}


class ArrivalsParams(StrictModel):
    """The scenario's own params; a stage adds its engine's (BatchingParams)."""

    # the load curve
    mode: Literal["closed", "poisson"] = "closed"
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 32, 64])
    rates: list[float] = Field(default_factory=lambda: [1.0, 4.0, 16.0])  # requests/s (poisson mode)
    main_concurrency: int = Field(16, ge=1)  # the point whose samples the stage returns
    main_rate: float | None = None  # poisson mode; default: the middle rate
    min_requests: int = Field(32, ge=1)  # requests per point: max(min_requests, 4 * concurrency)...
    max_requests: int = Field(256, ge=1)  # ...capped here
    poisson_requests: int = Field(64, ge=1)
    input_len: int | None = Field(None, ge=1)  # override the workload's prompt length (e.g. 128)
    output_len: int | None = Field(None, ge=1)  # override --max-new-tokens (e.g. 128)
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    # the all-at-once throughput point
    throughput_point: bool = False  # 256 concurrent requests of 128 in / 128 out
    throughput_requests: int = 256
    throughput_input_len: int = 128
    throughput_output_len: int = 128
    # the same arrivals, statically batched in transformers
    static_replay: bool = True
    static_timeout_s: float = 0.05  # a static batch starts when N wait or the oldest waited this long
    static_batch_size: int | None = None  # N; default: the point's concurrency (poisson: main_concurrency)
    static_attn_implementation: Attn = "sdpa"
    # transformers' capacity per context (probes of the probe worker)
    capacity: bool = True
    contexts: list[int] = Field(default_factory=lambda: [2048, 4096])
    max_batch: int = 64  # transformers capacity probe: 1, 2, 4, ... up to this (CUDA)
    capacity_attn_implementation: Attn = "eager"
    capacity_decode_steps: int = 4
    # the mixed-length set (scenarios/mixed.py)
    mixed: Literal["auto", "on", "off"] = "auto"  # auto: with --workload mixed, or on CUDA
    mixed_batch: int = 32
    cap_context: int = 1024
    long_len: int | Literal["auto"] | None = "auto"  # long docs forced to N tokens; auto: 3584 on CUDA
    bucket_token_budget: int | None = None  # padded prompt tokens per bucketed batch; default mixed_batch * cap_context
    mixed_attn_implementation: Attn = "eager"
    probe_timeout_s: float = 900.0


@dataclass
class LoadPoint:
    """One load point: its requests, and how they arrive (arrivals: offsets in s, open loop;
    else at most `concurrency` in flight, closed loop)."""

    requests: list[Request]
    new: int  # output tokens per request (forced: EOS ignored)
    static_batch: int  # N of the static replay at this point
    concurrency: int | None = None
    arrivals: list[float] | None = None
    rate_rps: float | None = None
    main: bool = False  # its continuous samples are the stage's
    name: str | None = None  # a point off the curve ("throughput")
    input_len: int | None = None  # recorded in the row (the throughput point's lengths)
    output_len: int | None = None

    def row_key(self, mode: str) -> dict[str, Any]:
        """What names the point in its CurveRow (the keys run.json has always had)."""
        key: dict[str, Any] = {"mode": mode, "concurrency": self.concurrency}
        if self.arrivals is not None:
            key["rate_rps"] = self.rate_rps
        if self.input_len is not None:
            key.update(input_len=self.input_len, output_len=self.output_len)
        if mode == "static":
            key["static_batch"] = self.static_batch
        return key

    def label(self, mode: str) -> str:
        where = f"{self.rate_rps} req/s" if self.arrivals is not None else f"concurrency {self.concurrency}"
        return f"{mode}: {where}"

    def meter_key(self, mode: str) -> str:
        """The energy meter's key of this point's timed windows: the main point's continuous
        serving is "main" (the stage's headline joules per token), the others name the point."""
        if self.main and mode == "continuous":
            return "main"
        where = self.name or (f"{self.rate_rps:g}rps" if self.arrivals is not None else f"c{self.concurrency}")
        return f"{mode}@{where}"


def fit_requests(reqs: list[Request], new: int, max_model_len: int, notes: list[str]) -> list[Request]:
    """Prompts longer than the engine's max_model_len leave room for the output (keep the tail,
    where the instruction is); a note says how many, once."""
    room = max_model_len - new
    out = [Request(r.id, r.prompt_id, r.token_ids[-room:]) if len(r.token_ids) > room else r for r in reqs]
    cut = sum(1 for a, b in zip(reqs, out) if a is not b)
    note = f"{cut} prompt(s) truncated to {room} tokens to fit max_model_len={max_model_len} with {new} new tokens"
    if cut and note not in notes:
        notes.append(note)
    return out


@dataclass
class RequestSource:
    """The workload's requests as the engine sees them: encoded by its tokenizer, and fitted
    to its max_model_len (notes say what was cut)."""

    encode: Callable[[str], list[int]]
    max_model_len: int
    notes: list[str]

    def build(self, workload: WorkloadConfig, count: int | None = None, tag: str = "r") -> list[Request]:
        return build_requests(workload, self.encode, count=count, tag=tag)

    def fit(self, reqs: list[Request], new: int) -> list[Request]:
        return fit_requests(reqs, new, self.max_model_len, self.notes)

    def make(self, workload: WorkloadConfig, count: int | None, new: int, tag: str = "r") -> list[Request]:
        return self.fit(self.build(workload, count, tag), new)


def main_rate(p: ArrivalsParams) -> float:
    return p.main_rate if p.main_rate is not None else sorted(p.rates)[len(p.rates) // 2]


def requests_per_point(p: ArrivalsParams, concurrency: int) -> int:
    return min(p.max_requests, max(p.min_requests, 4 * concurrency))


def plan_points(p: ArrivalsParams, workload: WorkloadConfig, source: RequestSource) -> list[LoadPoint]:
    """The curve's points in order: every concurrency (and the main one), or every rate (and
    the main one), each with its requests; Poisson arrivals seeded per point."""
    wl = workload.model_copy(update={"input_len": p.input_len}) if p.input_len else workload
    new = p.output_len or workload.max_new_tokens
    if p.mode == "closed":
        return [LoadPoint(requests=source.make(wl, requests_per_point(p, c), new, "r"), new=new, concurrency=c,
                          static_batch=p.static_batch_size or c, main=c == p.main_concurrency)
                for c in sorted(set(p.concurrency) | {p.main_concurrency})]
    main = main_rate(p)
    n = min(p.max_requests, p.poisson_requests)
    return [LoadPoint(requests=source.make(wl, n, new, "r"), new=new, arrivals=poisson_arrivals(rate, n, seed=workload.seed + k),
                      rate_rps=rate, static_batch=p.static_batch_size or p.main_concurrency, main=rate == main)
            for k, rate in enumerate(sorted(set(p.rates) | {main}))]


def plan_throughput_point(p: ArrivalsParams, workload: WorkloadConfig, source: RequestSource) -> LoadPoint:
    """throughput_requests requests of throughput_input_len tokens, all in flight at once."""
    wl = workload.model_copy(update={"input_len": p.throughput_input_len})
    n = p.throughput_requests
    return LoadPoint(requests=source.make(wl, n, p.throughput_output_len, "t"), new=p.throughput_output_len, concurrency=n,
                     static_batch=n, name="throughput", input_len=p.throughput_input_len,
                     output_len=p.throughput_output_len)


def sweep_settings(p: ArrivalsParams, workload: WorkloadConfig, output_len: int) -> dict[str, Any]:
    return {"mode": p.mode, "main_concurrency": p.main_concurrency, "main_rate": main_rate(p) if p.mode == "poisson" else None,
            "slo_ttft_s": p.slo_ttft_s, "slo_tpot_s": p.slo_tpot_s, "output_len": output_len,
            "input_len": p.input_len or workload.input_len, "static_timeout_s": p.static_timeout_s,
            "static_attn_implementation": p.static_attn_implementation}


def summarize(samples: list[RequestSample], *, requested: int, expected_tokens: int, slo_ttft_s: float,
              slo_tpot_s: float, oom: bool = False, energy: dict[str, Any] | None = None, **keys: Any) -> CurveRow:
    """One curve row: throughput, latency percentiles and goodput of a point's complete
    requests (every requested token produced), and its timed window's energy where measured."""
    complete = [s for s in samples if s.ok and s.output_tokens == expected_tokens]
    repeats = max(1, len({s.repeat for s in samples}))
    m = compute(complete) if complete else None
    goodputs = []
    for rep in sorted({s.repeat for s in complete}):
        group = [s for s in complete if s.repeat == rep]
        window = max(s.t_done for s in group) - min(s.t_submit for s in group)
        good = [s for s in group if ttft(s) <= slo_ttft_s and (tpot(s) is None or tpot(s) <= slo_tpot_s)]
        if window > 0:
            goodputs.append(len(good) / window)

    def pct(d: Any, q: str) -> float | None:
        return getattr(d, q) if d is not None else None

    row = CurveRow(**keys, requests=requested, completed=len(complete), repeats=repeats,
                   output_tok_s=m.output_tok_s if m else None, qps=m.qps if m else None,
                   ttft_p50_s=pct(m and m.ttft_s, "p50"), ttft_p99_s=pct(m and m.ttft_s, "p99"),
                   tpot_p50_s=pct(m and m.tpot_s, "p50"), tpot_p99_s=pct(m and m.tpot_s, "p99"),
                   e2e_p50_s=pct(m and m.e2e_s, "p50"), e2e_p99_s=pct(m and m.e2e_s, "p99"),
                   goodput_rps=sum(goodputs) / len(goodputs) if goodputs else (0.0 if samples or oom else None),
                   failed=requested * repeats - len(complete), oom=oom)
    if energy:  # set only where measured: a run without an energy counter keeps the row as it was
        row.energy = energy
    return row


def point_row(point: LoadPoint, mode: str, samples: list[RequestSample], p: ArrivalsParams, *,
              energy: dict[str, Any] | None = None, oom: bool = False, **more: Any) -> CurveRow:
    return summarize(samples, requested=len(point.requests), expected_tokens=point.new, slo_ttft_s=p.slo_ttft_s,
                     slo_tpot_s=p.slo_tpot_s, oom=oom, energy=energy, **point.row_key(mode), **more)


def add_speedups(curve: list[CurveRow]) -> None:
    """Each static row's continuous_speedup: continuous / static output tok/s at the same load."""
    for row in curve:
        if row.mode != "static":
            continue
        match = next((r for r in curve if r.mode == "continuous" and r.concurrency == row.concurrency
                      and r.rate_rps == row.rate_rps), None)
        if match and match.output_tok_s and row.output_tok_s:
            row.continuous_speedup = match.output_tok_s / row.output_tok_s


def facts(extra: BatchingExtra, main_concurrency: int | None) -> StageFacts:
    """What the roofline and the scaling table read of the curve: the decode batch of the
    samples, TPOT at concurrency 1, and the saturated throughput (the all-at-once point, else the
    curve's top)."""
    cont = [r for r in extra.curve if r.mode == "continuous"]
    one = next((r for r in cont if r.concurrency == 1), None)
    tp = extra.throughput_point
    point = tp.continuous.output_tok_s if tp and tp.continuous else None
    top = max((r.output_tok_s or 0 for r in cont), default=0)
    how = "throughput point (all requests at once)" if point else "top of the load curve" if top else None
    return StageFacts(decode_batch=main_concurrency, batch1_tpot_s=one.tpot_p50_s if one else None,
                      saturated_tok_s=point or top or None, saturated_how=how)
