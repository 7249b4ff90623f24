"""What continuous-batching's scenario records (its extra), typed: the load curve, the
all-at-once throughput point, KV-cache capacity, and the mixed-length pitfall. docs/batching.md
defines every field."""

from __future__ import annotations

from pydantic import ConfigDict, Field, with_config
from typing_extensions import TypedDict

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.lifecycle import DeviceMemory
from llmopt_bench.engines.vllm.kv import KVCacheRecord
from llmopt_bench.load.record import PointRow

# A record part below read back (validated) comes out with its keys in the order declared here,
# the order run.json has always had. Each is read leniently: every key optional (a run from
# before a key existed, a record a test or a plugin wrote in part) and a key it does not declare
# kept (pydantic would drop it otherwise); mypy still checks every key the code writes.


@with_config(ConfigDict(extra="allow"))
class SweepSettings(TypedDict, total=False):
    """The sweep's settings (scenarios/batching.sweep_settings)."""

    mode: str
    main_concurrency: int
    main_rate: float | None  # poisson mode
    slo_ttft_s: float
    slo_tpot_s: float
    output_len: int
    input_len: int | None
    static_timeout_s: float
    static_attn_implementation: str
    closed_loop_warmup: str | None  # not in the runs recorded before it was added


@with_config(ConfigDict(extra="allow"))
class EngineLimits(TypedDict, total=False):
    """The continuous engine's scheduler limits."""

    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_model_len: int
    dtype: str


@with_config(ConfigDict(extra="allow"))
class H200Reference(TypedDict, total=False):
    """The story's own H200 numbers (scenarios/batching.H200_REFERENCE)."""

    vllm_fp16_batch1_ms_per_token: float
    vllm_fp16_256x128_out_tok_s: int
    vllm_fp16_batch16_out_tok_s: int
    transformers_sdpa_batch16_out_tok_s: int
    model: str


@with_config(ConfigDict(extra="allow"))  # what engines/lifecycle may add is kept
class EngineLifecycle(TypedDict, total=False):
    """Device memory and processes around the engine: before it, with it, after its shutdown,
    and around the static replay's transformers. The memory snapshots are
    engines/lifecycle.device_memory()'s (typed there), as are wait_freed()'s keys below."""

    device: str
    before_engine: DeviceMemory
    processes_before_engine: int
    with_engine: DeviceMemory
    engine_processes: int
    engine_rss_bytes: int
    engine_process_names: list[str]
    after_shutdown: DeviceMemory  # from here to wait_s: engines/lifecycle.Freed's keys
    processes_after_shutdown: int
    t_freed: float
    left_after_shutdown: list[str]
    freed: bool
    wait_s: float
    shutdown_s: float
    t_transformers_load: float
    transformers_loaded: DeviceMemory
    transformers_unloaded: DeviceMemory


@with_config(ConfigDict(extra="allow"))
class RuledOut(TypedDict, total=False):
    """Batches a capacity search did not probe at a context: they ran out at a shorter one."""

    batches: list[int]
    because: str


@with_config(ConfigDict(extra="allow"))
class MixedSetup(TypedDict, total=False):
    """The mixed-length set as it ran (scenarios/batching/mixed.setup)."""

    requests: int
    long_requests: int
    batch: int
    cap_context: int
    bucket_token_budget: int
    attn_implementation: str
    long_len: int


class CurveRow(PointRow):
    """One load point: a mode (continuous or static) at a concurrency or an arrival rate (the
    figures: load/record.PointRow, the same as a serving stage's)."""

    mode: str | None = None
    static_batch: int | None = None
    oom: bool = False
    continuous_speedup: float | None = None


class ThroughputPoint(StrictModel):
    continuous: CurveRow | None = None
    static: CurveRow | None = None
    reference_h200_out_tok_s: float | None = None


class CapacityRow(StrictModel):
    """How many sequences of a context fit at once, in one engine."""

    model_config = ConfigDict(extra="allow")  # a probe's own diagnostics (bytes tried, free at OOM)
    engine: str
    context: int
    max_batch: int | None = None
    oom_at: int | None = None
    peak_bytes: int | None = None
    scheduler_limit: int | None = None
    method: str | None = None
    note: str | None = None
    probed: list[int] | None = None
    ruled_out: RuledOut | None = None
    memory_at_oom_bytes: int | None = None
    attn_implementation: str | None = None
    error: str | None = None


class MixedRow(StrictModel):
    """One configuration of the mixed-length set (static-mixed, cap-context, bucketed, continuous)."""

    model_config = ConfigDict(extra="allow")  # the probe's memory diagnostics
    config: str
    status: str
    requests: int | None = None
    output_tok_s: float | None = None
    peak_bytes: int | None = None
    memory_at_oom_bytes: int | None = None
    padding_fraction: float | None = None
    all_tokens_produced: bool | None = None
    reason: str | None = None


class BatchingExtra(StrictModel):
    sweep: SweepSettings | None = None  # the sweep phase sets these three (every run.json has them)
    engine: EngineLimits | None = None
    h200_reference: H200Reference | None = None
    curve: list[CurveRow] = Field(default_factory=list)
    throughput_point: ThroughputPoint | None = None
    kv_cache: KVCacheRecord | None = None
    capacity: list[CapacityRow] = Field(default_factory=list)
    # free-form: each probe's answer as the probe process wrote it (engines/hf/static_batching's keys)
    capacity_probes: list[Json] = Field(default_factory=list)
    mixed: list[MixedRow] = Field(default_factory=list)
    mixed_setup: MixedSetup | None = None
    lifecycle: EngineLifecycle = Field(default_factory=EngineLifecycle)  # filled in as the engine goes
    # the transformers probes (mixed-length, capacity) through the probe worker: model loads,
    # worker processes, probes, and their wall time (loads included)
    probe_loads: int | None = None
    probe_workers: int | None = None
    probe_count: int | None = None
    probe_wall_s: float | None = None
