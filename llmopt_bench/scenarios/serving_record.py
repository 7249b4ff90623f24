"""What the serving scenario takes and keeps (scenarios/serving.py), typed: its params, one row
per load point, and the stage's extra. docs/serving.md defines every field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from llmopt_bench.analysis.slo import DEFAULT_SLO
from llmopt_bench.core.records import StrictModel
from llmopt_bench.scenarios.slo_search import Capacity


class ServingParams(StrictModel):
    """The load a serving stage puts on its server (defaults: docs/serving.md)."""

    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 64])  # closed-loop sweep
    rates: list[float] = Field(default_factory=list)  # open-loop points (req/s) measured besides the search
    arrival: Literal["poisson", "gamma"] = "poisson"
    burstiness: float = Field(1.0, gt=0)  # gamma's shape: < 1 bursty, 1 Poisson, > 1 even
    requests_per_point: int = Field(64, ge=2)  # measured requests per load point (warm-up left out)
    warmup_s: float = Field(2.0, ge=0)  # open loop: arrivals in the first warmup_s seconds are not measured
    min_point_s: float = Field(10.0, gt=0)  # open loop: a point lasts at least this long...
    max_point_s: float = Field(120.0, gt=0)  # ...and at most this long (fewer requests at very low rates)
    slo: str = DEFAULT_SLO  # MLPerf Inference's Server limits for Llama-3.1-8B (analysis/slo.py)
    max_failure_rate: float = Field(0.01, ge=0, lt=1)  # a point with more failures misses the SLO
    capacity_search: bool = True
    search_start_rps: float | None = Field(None, gt=0)  # default: half the closed-loop sweep's best QPS
    search_precision: float = Field(0.05, gt=0, lt=1)  # stop when (first failing - last passing) <= this x last passing
    search_max_probes: int = Field(10, ge=2)
    search_min_rps: float | None = Field(None, gt=0)
    search_max_rps: float | None = Field(None, gt=0)
    throughput_point: bool = True  # N requests at once: the saturated throughput, as continuous-batching measures it
    throughput_requests: int = Field(256, ge=1)
    throughput_input_len: int = Field(128, ge=1)
    throughput_output_len: int = Field(128, ge=1)
    main_concurrency: int | None = Field(None, ge=1)  # headline without a capacity: this sweep point (default: the largest)
    request_timeout_s: float = Field(300.0, gt=0)  # one request; a late one fails alone, the point goes on
    prompt_format: Literal["tokens", "text"] = "tokens"  # token ids (exact lengths) or the decoded text


class LoadRow(StrictModel):
    """One measured load point (the fields of continuous-batching's CurveRow, and the load's own)."""

    phase: Literal["sweep", "point", "search", "throughput"]
    mode: Literal["closed", "open"]
    concurrency: int | None = None
    rate_rps: float | None = None
    burstiness: float | None = None
    input_len: int | None = None
    output_len: int | None = None
    requests: int  # measured requests sent
    completed: int
    failed: int = 0
    failure_rate: float = 0.0
    errors: dict[str, int] = Field(default_factory=dict)  # error kind (engines/openai_http.KINDS) -> count
    warmup_excluded: int = 0
    window_s: float | None = None
    achieved_rate: float | None = None
    output_tok_s: float | None = None
    qps: float | None = None
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    e2e_p50_s: float | None = None
    e2e_p99_s: float | None = None
    goodput_rps: float | None = None
    slo_ok: bool | None = None
    slo_reason: str | None = None
    in_flight_at_end: int | None = None  # open loop: sent, not answered, when the window closed
    queued_at_end: int | None = None  # open loop: arrived, not yet sent, when it closed
    drain_s: float | None = None
    send_delay_p50_s: float | None = None  # open loop: when sent - when due (the client's own lateness)
    send_delay_p99_s: float | None = None
    energy: dict[str, Any] | None = None  # J per output token over this point's timed window
    error: str | None = None  # the point itself could not run


class ClientTally(StrictModel):
    """How the client counted tokens across every point, and where the server's usage disagreed."""

    counted_by: dict[str, int] = Field(default_factory=dict)
    usage_agreed: int = 0
    usage_missing: int = 0
    usage_mismatch: list[list[Any]] = Field(default_factory=list)  # [request, counted, usage], first 50
    usage_mismatch_count: int = 0
    short: list[list[Any]] = Field(default_factory=list)  # [request, produced, asked], first 50
    short_count: int = 0


class ServingExtra(StrictModel):
    target: dict[str, Any] = Field(default_factory=dict)  # the server: kind, URL, model name, command (never a key)
    settings: dict[str, Any] = Field(default_factory=dict)  # the load as run: SLO, arrival process, seeds, lengths
    curve: list[LoadRow] = Field(default_factory=list)
    capacity: Capacity | None = None  # the search: probes in order, verdicts, the interval, the knee
    main_point: str | None = None  # which row's requests are the stage's samples
    errors: dict[str, int] = Field(default_factory=dict)  # every point's failed requests by kind
    error_examples: list[str] = Field(default_factory=list)
    tally: ClientTally = Field(default_factory=ClientTally)
    server: dict[str, Any] = Field(default_factory=dict)  # how it stopped: exit, processes left, memory freed
    owns_device: bool = True  # False: a server llmopt did not start; no GPU or engine figures are its
