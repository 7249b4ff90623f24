"""continuous-batching's load curve, declared: which load points to run (closed-loop
concurrencies or Poisson arrival rates, requests per point, the main point, the all-at-once
throughput point), the requests fitted to the engine, and each point's result as a CurveRow.
The points run on the load machine (load/: the same loops, figures and steady-state judgement
as the serving stages), on vLLM and on the static batcher; batching_stage.py runs the phases;
docs/batching.md defines every figure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from pydantic import Field
from typing_extensions import NotRequired, TypedDict

from llmopt_bench.core.records import StageFacts, StrictModel
from llmopt_bench.core.slo import SLO, Target
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests
from llmopt_bench.load.dispatchers import RequestSource, cycled
from llmopt_bench.load.point import LoadPoint, PointResult
from llmopt_bench.load.record import figures
from llmopt_bench.measure.energy import EnergyFigures
from llmopt_bench.scenarios.batching.record import BatchingExtra, CurveRow, H200Reference, SweepSettings

Attn = Literal["eager", "sdpa", "flash_attention_2"]
H200_REFERENCE: H200Reference = {"vllm_fp16_batch1_ms_per_token": 4.63, "vllm_fp16_256x128_out_tok_s": 11311,
                  "vllm_fp16_batch16_out_tok_s": 2998, "transformers_sdpa_batch16_out_tok_s": 606,
                  "model": "Llama-2-7B shape, FP16, one H200"}


class CurveParams(StrictModel):
    """The scenario's own params; a stage adds its engine's (BatchingParams)."""

    # the load curve
    mode: Literal["closed", "poisson"] = "closed"
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 32, 64])
    rates: list[float] = Field(default_factory=lambda: [1.0, 4.0, 16.0])  # requests/s (poisson mode)
    main_concurrency: int = Field(16, ge=1)  # the point whose samples the stage returns
    main_rate: float | None = None  # poisson mode; default: the middle rate
    min_requests: int = Field(32, ge=1)  # measured requests per point: max(min_requests, 4 * concurrency)...
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
    # the same load, statically batched in transformers
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
    # the mixed-length set (scenarios/batching/mixed.py)
    mixed: Literal["auto", "on", "off"] = "auto"  # auto: with --workload mixed, or on CUDA
    mixed_batch: int = 32
    cap_context: int = 1024
    long_len: int | Literal["auto"] | None = "auto"  # long docs forced to N tokens; auto: 3584 on CUDA
    bucket_token_budget: int | None = None  # padded prompt tokens per bucketed batch; default mixed_batch * cap_context
    mixed_attn_implementation: Attn = "eager"
    probe_timeout_s: float = 900.0

    def goodput_slo(self) -> SLO:
        """Goodput's targets: each request's own TTFT and TPOT within the limits."""
        return SLO(targets=(Target(metric="ttft", percentile=99, limit_s=self.slo_ttft_s),
                            Target(metric="tpot", percentile=99, limit_s=self.slo_tpot_s)))


class RowKey(TypedDict):
    """What names a point in its CurveRow (the keys run.json has always had)."""

    mode: str
    concurrency: int | None
    rate_rps: NotRequired[float]  # Poisson arrivals
    input_len: NotRequired[int | None]  # a point off the curve with its own lengths (throughput)
    output_len: NotRequired[int | None]
    static_batch: NotRequired[int]  # the static replay


@dataclass
class CurvePoint:
    """One point of the curve: its load (closed loop, with its ramp left out, or Poisson
    arrivals), its measured requests and the ramp's, and how the static replay batches it."""

    load: LoadPoint
    requests: list[Request]  # the measured ones
    new: int  # output tokens per request (forced: EOS ignored)
    static_batch: int  # N of the static replay at this point
    ramp: list[Request] = field(default_factory=list)  # a closed loop's first request per user, not measured
    main: bool = False  # its continuous samples are the stage's
    name: str | None = None  # a point off the curve ("throughput")
    input_len: int | None = None  # recorded in the row (the throughput point's lengths)
    output_len: int | None = None

    @property
    def concurrency(self) -> int | None:
        return self.load.concurrency

    @property
    def rate_rps(self) -> float | None:
        return self.load.rate

    def source(self) -> RequestSource:
        return cycled(self.ramp + self.requests)

    def row_key(self, mode: str) -> RowKey:
        key: RowKey = {"mode": mode, "concurrency": self.concurrency}
        if self.rate_rps is not None:
            key["rate_rps"] = self.rate_rps
        if self.input_len is not None:
            key["input_len"], key["output_len"] = self.input_len, self.output_len
        if mode == "static":
            key["static_batch"] = self.static_batch
        return key

    def label(self, mode: str) -> str:
        where = f"{self.rate_rps} req/s" if self.rate_rps is not None else f"concurrency {self.concurrency}"
        return f"{mode}: {where}"

    def meter_key(self, mode: str) -> str:
        """The energy meter's key of this point's timed windows: the main point's continuous
        serving is "main" (the stage's headline joules per token), the others name the point."""
        if self.main and mode == "continuous":
            return "main"
        where = self.name or (f"{self.rate_rps:g}rps" if self.rate_rps is not None else f"c{self.concurrency}")
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
class EngineRequests:
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


def main_rate(p: CurveParams) -> float:
    return p.main_rate if p.main_rate is not None else sorted(p.rates)[len(p.rates) // 2]


def requests_per_point(p: CurveParams, concurrency: int) -> int:
    return min(p.max_requests, max(p.min_requests, 4 * concurrency))


def plan_points(p: CurveParams, workload: WorkloadConfig, source: EngineRequests) -> list[CurvePoint]:
    """The curve's points in order: every concurrency (and the main one), each a closed loop
    whose ramp (a first request per user) is left out; or every rate (and the main one), Poisson
    arrivals seeded per point."""
    wl = workload.model_copy(update={"input_len": p.input_len}) if p.input_len else workload
    new = p.output_len or workload.max_new_tokens
    if p.mode == "closed":
        out = []
        for c in sorted(set(p.concurrency) | {p.main_concurrency}):
            n = requests_per_point(p, c)
            out.append(CurvePoint(load=LoadPoint(concurrency=c, num_requests=n + c, warmup_requests=c),
                                  requests=source.make(wl, n, new, "r"), ramp=source.make(wl, c, new, "u"), new=new,
                                  static_batch=p.static_batch_size or c, main=c == p.main_concurrency))
        return out
    main = main_rate(p)
    n = min(p.max_requests, p.poisson_requests)
    return [CurvePoint(load=LoadPoint(rate=rate, num_requests=n, seed=workload.seed + k), requests=source.make(wl, n, new, "r"),
                       new=new, static_batch=p.static_batch_size or p.main_concurrency, main=rate == main)
            for k, rate in enumerate(sorted(set(p.rates) | {main}))]


def plan_throughput_point(p: CurveParams, workload: WorkloadConfig, source: EngineRequests) -> CurvePoint:
    """throughput_requests requests of throughput_input_len tokens, all in flight at once."""
    wl = workload.model_copy(update={"input_len": p.throughput_input_len})
    n = p.throughput_requests
    return CurvePoint(load=LoadPoint(concurrency=n, num_requests=n), requests=source.make(wl, n, p.throughput_output_len, "t"),
                      new=p.throughput_output_len, static_batch=n, name="throughput", input_len=p.throughput_input_len,
                      output_len=p.throughput_output_len)


def sweep_settings(p: CurveParams, workload: WorkloadConfig, output_len: int) -> SweepSettings:
    return {"mode": p.mode, "main_concurrency": p.main_concurrency, "main_rate": main_rate(p) if p.mode == "poisson" else None,
            "slo_ttft_s": p.slo_ttft_s, "slo_tpot_s": p.slo_tpot_s, "output_len": output_len,
            "input_len": p.input_len or workload.input_len, "static_timeout_s": p.static_timeout_s,
            "static_attn_implementation": p.static_attn_implementation,
            "closed_loop_warmup": "each user's first request (the ramp)" if p.mode == "closed" else None}


def point_row(point: CurvePoint, mode: str, res: PointResult | None, p: CurveParams, *,
              energy: EnergyFigures | None = None, oom: bool = False, **more: Any) -> CurveRow:
    """The point's row: its figures (load/record.figures) under its name; an OOM (res None) is a
    row with every request failed and no figure."""
    if res is None:
        row = CurveRow(**point.row_key(mode), requests=len(point.requests), completed=0, failed=len(point.requests),
                       goodput_rps=0.0, oom=oom, **more)
    else:
        row = CurveRow(**point.row_key(mode), **figures(res, p.goodput_slo()), oom=oom, **more)
    if energy:  # set only where measured: a run without an energy counter keeps the row as it was
        row.energy = energy
    return row


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
