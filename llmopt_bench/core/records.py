"""The records that cross the Stage contract and make up run.json's per-stage parts: a request
as the engine served it, what a load learnt, the quality record, the facts the generic analyses
read, a stage's run, and the presentation records (claims, blocks). Pydantic, extra="forbid"
(StrictModel): a record read back must be exactly what was written."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, with_config
from typing_extensions import TypedDict  # pydantic validates a typing.TypedDict only from Python 3.12

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.slo import SLO


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoParams(StrictModel):
    pass


class OpenExtra(BaseModel):
    """The extra of a stage that declares no model of its own: any JSON object."""

    model_config = ConfigDict(extra="allow")


class QualityRecord(StrictModel):
    """Output quality next to speed (analysis/quality.py): perplexity on the shipped corpus
    (real weights only) and agreement with the run's quality reference, teacher-forced; the
    quality gate's verdict is written in by the runner (analysis/quality_gate.py)."""

    reference: str | None = None  # the result whose outputs this one is compared with
    engine: str | None = None
    perplexity_meaningful: bool = True
    perplexity: float | None = None
    perplexity_note: str | None = None
    perplexity_by_lang: dict[str, float] | None = None
    perplexity_tokens: int | None = None
    token_match_rate: float | None = None
    first_divergence_mean: float | None = None
    kl_mean: float | None = None
    kl_note: str | None = None
    nll_delta_mean: float | None = None
    agreement_positions: int | None = None
    agreement_method: str | None = None
    agreement_note: str | None = None
    gate: str | None = None
    quality_ratio: float | None = None
    quality_regression: bool | None = None
    error: str | None = None  # the quality pass failed: the timing samples are kept, this says why


class RequestSample(StrictModel):
    """One request as the engine served it. Times are seconds on the stage's perf_counter."""

    request_id: str
    prompt_id: str
    repeat: int = 0
    batch: int = 0  # requests generated together share a batch index
    prompt_tokens: int
    output_tokens: int  # tokens actually produced, counted, not requested
    t_submit: float
    t_first: float
    t_done: float
    token_times: list[float] = Field(default_factory=list)  # one per output token
    ok: bool = True
    error: str | None = None
    turn: int | None = None  # a multi-turn conversation's turn (0 first); None: a single-turn workload
    cached_tokens: int | None = None  # prompt tokens the engine served from its prefix cache, where it says
    point: str | None = None  # the load point it was sent in ("sweep: concurrency 4"); None: a workload without points


class LoadInfo(StrictModel):
    """What load() learnt: phases in seconds (weights, quantize, compile, graphs, ...), the
    implementation that really runs (kernel, attention backend, dtype), engine versions, and
    the engine's memory split where it knows it (vLLM preallocates its KV cache)."""

    phases_s: dict[str, float] = Field(default_factory=dict)
    # free-form: what each engine says of itself (kernel, backend, dtype, its own settings) differs
    # by engine and version; the readers ask for the keys they know (analysis/roofline.py)
    implementation: Json = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str | None = None
    notes: list[str] = Field(default_factory=list)


class SLOPoint(StrictModel):
    """One open-loop load point a serving stage measured, kept so that another SLO can judge it
    again (analysis/recommend/choose.py): each successful request's TTFT, TPOT and E2E in seconds (TPOT
    None for a one-token answer), the pooled inter-token gaps' percentiles, and what failed."""

    rate_rps: float  # the arrival rate asked for
    burstiness: float = 1.0
    window_s: float  # the measurement window goodput is counted over
    requests: int  # measured requests sent (warm-up left out)
    failed: int = 0
    ttft_s: list[float] = Field(default_factory=list)
    tpot_s: list[float | None] = Field(default_factory=list)
    e2e_s: list[float] = Field(default_factory=list)
    itl_s: dict[str, float] = Field(default_factory=dict)  # "p50", "p90", "p99" of every gap
    output_tok_s: float | None = None
    slo_ok: bool | None = None  # the stage's own verdict under its SLO (StageFacts.slo)
    goodput_rps: float | None = None
    queued_at_end: int | None = None  # due, not yet sent, when the window closed: a client that fell behind (analysis/slo.client_late)
    steady: bool | None = None  # the steady-state judgement (load/steady.py): False misses any SLO; None: not judged (older runs)
    steady_reason: str | None = None
    hold: bool = False  # the hold of a capacity (load/capacity/hold.py), not a search's short trial


@with_config(ConfigDict(extra="allow"))  # a key a later version adds is kept as it came
class TraceRecord(TypedDict, total=False):
    """The trace a replayed plan read (workloads/traces.py)."""

    file: str
    sha256: str  # of the file's text, first 16 hex digits
    format: str  # its columns: llmopt, mooncake or azure
    rows: int  # the file's
    used: int  # the rows inside the window
    speedup: float
    window_s: list[float | None]  # [start, end] in trace seconds (end None: to the last row)
    span_s: float
    rate_rps: float | None


class PlanRecord(StrictModel):
    """What a stage's workload plan was (workloads/plan.py): its canonical spec and seed, a digest
    of its first conversations (two runs with one digest sent the same requests) and their shape;
    docs/workloads.md defines each field."""

    spec: str
    seed: int
    digest: str  # sha256 over the first digest_of conversations: ids, token ids, lengths, think and send times
    digest_of: int
    multi_turn: bool = False
    conversations: int
    requests: int
    groups: int | None = None
    turns: dict[str, float] = Field(default_factory=dict)  # min, p50, mean, p99, max
    input_tokens: dict[str, float] = Field(default_factory=dict)  # prompt tokens as sent (answers of the forced length)
    output_tokens: dict[str, float] = Field(default_factory=dict)
    think_s: dict[str, float] | None = None
    shareable_fraction: float | None = None  # prompt tokens a prefix cache could serve (16-token blocks)
    trace: TraceRecord | None = None
    notes: list[str] = Field(default_factory=list)


class CacheRecord(StrictModel):
    """The engine's prefix cache and KV-cache use over one load point (client/prefix_cache.py):
    lookups and hits in tokens from its counters, KV-cache usage sampled during the point."""

    source: str  # "llm.get_metrics()", "vllm /metrics", or "per request" (num_cached_tokens, usage.cached_tokens)
    queries: int | None = None  # prompt tokens looked up
    hits: int | None = None  # of them, served from the cache
    hit_rate: float | None = None
    cached_tokens: int | None = None  # the requests' own cached prompt tokens, summed (where the engine says)
    prompt_tokens: int | None = None  # the requests' prompt tokens, summed
    kv_usage_peak: float | None = None  # fraction of the KV cache's blocks in use, 0..1
    kv_usage_mean: float | None = None
    kv_samples: int = 0
    preemptions: int | None = None
    reset: bool = False  # the cache was emptied before the point


class TurnRow(StrictModel):
    """A multi-turn point's requests of one turn: how many, their prompt and cached tokens, TTFT."""

    turn: int
    n: int
    prompt_tokens_p50: float | None = None
    cached_tokens_p50: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None


class StageFacts(StrictModel):
    """What the generic analyses (roofline, tensor-parallel scaling, what to deploy) need from a
    stage's own measurements, typed, so that they read no stage's extra."""

    decode_batch: int | None = None  # sequences decoded together in the samples (default: the workload's batch)
    # the share of a decode token's wall time the GPU is busy (measure/gpu_busy.py); None: not
    # measured (a CPU run, an engine in processes of its own): analysis/hostbound.py falls back
    gpu_busy_share: float | None = None
    batch1_tpot_s: float | None = None  # TPOT at one request in flight, where the stage measured it apart
    batch1_ttft_s: float | None = None  # TTFT at one request in flight, likewise
    saturated_tok_s: float | None = None  # the most output tokens a second it saw
    saturated_how: str | None = None  # how that figure was measured (only like compares with like)
    # serving under an SLO (scenarios/serving/run.py): the highest arrival rate that met it, the
    # interval it is known within ([last passing, first failing]; failing None: never failed),
    # the goodput at that rate, the knee of the latency curve, and every open-loop point measured
    slo: SLO | None = None  # the SLO judged; written as `--slo` takes it: ttft_p99=2s,tpot_p99=100ms
    slo_max_failure_rate: float | None = None
    slo_capacity_rps: float | None = None
    slo_capacity_interval: list[float | None] | None = None
    slo_capacity_converged: bool | None = None
    slo_capacity_known_within: float | None = None  # the precision reached: first failing / capacity - 1 (None: no upper bound, older runs)
    slo_capacity_held: bool | None = None  # the capacity held for slo_hold_s (load/capacity/hold.py); None: not held (no hold, older runs)
    slo_hold_s: float | None = None
    saturation_rps: float | None = None  # the highest completion rate the stage measured: the capacity never exceeds it
    goodput_rps: float | None = None
    knee_rps: float | None = None
    slo_points: list[SLOPoint] = Field(default_factory=list)
    devices: int | None = None  # GPUs the served engine used (tensor x pipeline parallel); None: not known
    serve_command: str | None = None  # the exact `vllm serve ...` line that reproduces the server
    workload: PlanRecord | None = None  # the workload plan the stage sent, where it ran one (not the prompt file's)


class StageRun(StrictModel):
    """What run() returns: raw samples, the quality record, and the stage's own typed extra."""

    samples: list[RequestSample] = Field(default_factory=list)
    # every request the stage measured where that is more than its samples (a serving stage's every
    # load point, each request with its point): requests.jsonl keeps these; empty: the samples
    requests: list[RequestSample] = Field(default_factory=list)
    extra: Json = Field(default_factory=dict)  # free-form here: the stage's own Extra model validates it
    quality: QualityRecord | None = None
    facts: StageFacts = Field(default_factory=StageFacts)
    notes: list[str] = Field(default_factory=list)


Verdict = Literal["held", "not held", "not measured"]  # a claim's, judged on one run


class Claim(StrictModel):
    """One of the story's claims judged on this run's numbers."""

    key: str
    claim: str
    target: str
    measured: str
    value: float | None = None
    verdict: Verdict
    detail: str = ""


class Block(StrictModel):
    """A part of a stage's section in the report: a paragraph, a table, or both."""

    text: str | None = None
    headers: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)
