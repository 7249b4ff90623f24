"""What the serving scenario takes and keeps (scenarios/serving/run.py), typed: its params, one row
per load point, and the stage's extra. docs/serving.md defines every field."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, PlainSerializer, SkipValidation
from typing_extensions import TypedDict

from llmopt_bench.client.health import ClientHealth
from llmopt_bench.client.server_clock import ServerClock
from llmopt_bench.core.records import StrictModel
from llmopt_bench.core.workload import Sampling
from llmopt_bench.engines.vllm.server import ServerStop
from llmopt_bench.load.capacity.params import SearchParams
from llmopt_bench.load.capacity.search import Capacity
from llmopt_bench.load.record import PointRow


class ServingParams(SearchParams, Sampling):
    """The load a serving stage puts on its server (defaults: docs/serving.md); the requests'
    sampling (temperature, top_p, top_k: core/workload.Sampling) is part of it."""

    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 64])  # closed-loop sweep
    rates: list[float] = Field(default_factory=list)  # open-loop points (req/s) measured besides the search
    throughput_point: bool = True  # N requests at once: the saturated throughput, as continuous-batching measures it
    throughput_requests: int = Field(256, ge=1)
    throughput_input_len: int = Field(128, ge=1)
    throughput_output_len: int = Field(128, ge=1)
    main_concurrency: int | None = Field(None, ge=1)  # headline without a capacity: this sweep point (default: the largest)
    request_timeout_s: float = Field(300.0, gt=0)  # one request; a late one fails alone, the point goes on
    # text: what users send, of the asked length on the server's tokenizer (workloads/text.py);
    # tokens: the ids themselves, which skip the server's tokenization (docs/serving.md)
    prompt_format: Literal["text", "tokens"] = "text"
    # the client past one process (docs/serving.md, "The client past one process"): each point's
    # schedule dealt to client_workers processes on this host, or to Ray actors (client_cluster:
    # ray://HEAD:10001, HEAD:6379, auto, or "env" for RAY_ADDRESS), one on each of client_nodes
    # (a node's custom resource, or node:ID); every figure from the merged records
    client_workers: int = Field(1, ge=1)
    client_cluster: str | None = None
    client_nodes: list[str] = Field(default_factory=list)
    kernel_clock: bool = True  # False: the cheaper record, chunks timed when read (client/openai_http.Endpoint)

    def sampling(self) -> Sampling:
        return Sampling(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


T = TypeVar("T")
# A record part kept exactly as it was built (or read back): a TypedDict names its keys for mypy,
# but pydantic would reorder them, turn an int into a float, drop the keys it does not know, and,
# as the stages dump their extra with exclude_none, drop its None values ("prompts": null says
# something): so it is neither validated nor reshaped, as the dict it replaced was not
AsBuilt = Annotated[T, SkipValidation, PlainSerializer(lambda part: part, return_type=Any)]
# the client's punctuality, read back as the dataclass; written whole, its None figures too
# (pydantic's own dump would drop them under the stages' exclude_none)
ClientHealthField = Annotated[ClientHealth, PlainSerializer(asdict, return_type=Any)]


class ServingSettings(TypedDict, total=False):
    """The load as run (ServingRun.settings), in the order it is written; runs from before a key
    existed lack it."""

    slo: str  # as the SLO reads (core/slo.SLO's str)
    max_failure_rate: float
    arrival: str
    burstiness: float
    seed: int
    requests_per_point: int
    warmup_s: float
    hold_s: float | None
    output_len: int | None
    prompt_format: str
    sampling: dict[str, float | int | None]  # core/workload.Sampling's fields, dumped
    server_metrics: bool | None  # read the server's /metrics around each point (None: the engine has no such switch)
    client: str  # the client's processes (client/http_load.HTTPLoad.describe): one, workers, Ray actors, and why a point was not dealt
    workload: str  # the canonical spec (workloads/spec.py)
    prompts: int | None  # distinct prompts sent
    input_tokens: list[int] | None  # [shortest, longest]
    closed_loop_warmup: str
    open_loop_warmup: str


class PromptCount(StrictModel):
    """A point's prompts: the lengths asked beside the server's count (its usage.prompt_tokens)."""

    checked: int  # requests whose usage gave the server's count (warm-up included)
    asked_mean: float
    counted_mean: float
    off: int = 0  # requests counted at another length
    worst: float = 0.0  # the largest |counted / asked - 1| of one request
    made_sending: int = 0  # text prompts made while the point ran (not before it)

    @property
    def difference(self) -> float:
        """counted / asked - 1 over the point's requests."""
        return self.counted_mean / self.asked_mean - 1 if self.asked_mean else 0.0


# replay: a trace on its own schedule; ceiling: the workload's requests all at once, under which the search starts
Phase = Literal["sweep", "point", "replay", "ceiling", "search", "hold", "throughput"]


class LoadRow(PointRow):
    """One measured load point of a serving stage (the figures: load/record.PointRow)."""

    phase: Phase
    mode: Literal["closed", "open"]
    burstiness: float | None = None
    slo_ok: bool | None = None
    slo_reason: str | None = None
    client: ClientHealthField | None = None  # the client's own punctuality (client/health.py)
    client_untimed: str | None = None  # why the client could not time this point (its latencies are not the server's)
    prompt_count: PromptCount | None = None  # the prompts' lengths as asked and as the server counted them
    server_clock: AsBuilt[ServerClock] | None = None  # the server's own figures beside the client's (client/server_clock.server_clock)
    replica_clocks: list[AsBuilt[ServerClock] | None] | None = None  # several replicas: each one's clock, in the endpoints' order


class ClientTally(StrictModel):
    """How the client counted tokens across every point, and where the server's usage disagreed."""

    counted_by: dict[str, int] = Field(default_factory=dict)
    usage_agreed: int = 0
    usage_missing: int = 0
    usage_mismatch: list[list[Any]] = Field(default_factory=list)  # [request, counted, usage], first 50
    usage_mismatch_count: int = 0
    short: list[list[Any]] = Field(default_factory=list)  # [request, produced, asked], first 50
    short_count: int = 0
    prompt_checked: int = 0  # requests whose prompt the server counted (usage.prompt_tokens)
    prompt_off: list[list[Any]] = Field(default_factory=list)  # [request, asked, counted] where they differ, first 50
    prompt_off_count: int = 0


class CachingArm(StrictModel):
    """One arm of the prefix-caching stage: the server with prefix caching off or on, its load points."""

    enable_prefix_caching: bool
    curve: list[LoadRow] = Field(default_factory=list)
    capacity_rps: float | None = None
    capacity_held: bool | None = None
    main_point: str | None = None
    command: str | None = None  # the server, as `vllm serve ...`


class PrefixCachingRecord(StrictModel):
    """The prefix-caching stage's two arms on one workload, everything else equal (off first)."""

    workload: str  # the canonical spec both arms sent (workloads/spec.py)
    arms: list[CachingArm] = Field(default_factory=list)


class ServingExtra(StrictModel):
    # the server as the stage that started or found it names it (stages/vllm_serve.py, openai_endpoint.py,
    # tune/trial.py): kind, url, model, then its own (command and entry, or api_key_env: a name, never a key)
    target: dict[str, str | None] = Field(default_factory=dict)
    settings: AsBuilt[ServingSettings] = Field(default_factory=ServingSettings)  # the load as run: SLO, arrival process, seeds, lengths
    curve: list[LoadRow] = Field(default_factory=list)
    capacity: Capacity | None = None  # the search: trials in order, verdicts, the interval, the knee, the hold
    main_point: str | None = None  # which row's requests are the stage's samples
    main_untimed: bool | None = None  # the client could not time it either (every point was so): its latencies are the client's
    errors: dict[str, int] = Field(default_factory=dict)  # every point's failed requests by kind
    error_examples: list[str] = Field(default_factory=list)
    tally: ClientTally = Field(default_factory=ClientTally)
    prefix_caching: PrefixCachingRecord | None = None  # the prefix-caching stage: both arms (the rest is the "on" arm's)
    server: AsBuilt[ServerStop] = Field(default_factory=ServerStop)  # how it stopped: exit, processes left, memory freed
    owns_device: bool = True  # False: a server llmopt did not start; no GPU or engine figures are its

