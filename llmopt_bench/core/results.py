"""The versioned result schema: run.json as pydantic models, read and migrated here.

run.json holds everything a report or a comparison needs (metrics, compact per-request samples,
memory, energy, quality, and each stage's own typed extra); requests.jsonl holds every request
with its per-token timestamps. Writing the run directory is run/rundir.py's job. The schema imports
no analysis: statistics are computed in analysis/ and stored here as plain values."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError

from llmopt_bench import __version__
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.host import Host
from llmopt_bench.core.models import ModelInfo
from llmopt_bench.core.records import LoadInfo, QualityRecord, StageFacts, StrictModel
from llmopt_bench.core.workload import WorkloadConfig

SCHEMA_VERSION = 2  # 2: quality, facts, memory and energy typed; stage extras validated by their Extra model
Status = Literal["ok", "skipped", "oom", "timeout", "error", "interrupted", "killed"]
FAILED: tuple[Status, ...] = ("oom", "timeout", "error", "killed")
T = TypeVar("T", bound=BaseModel)


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def utc_at(epoch_s: float) -> str:
    """A time.time() value in run.json's form (UTC, to the second)."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="seconds")


class Samples(StrictModel):
    """Per-request scalars, column-wise: what compare bootstraps over (analysis/metrics.compact)."""

    ttft_s: list[float] = Field(default_factory=list)
    tpot_s: list[float | None] = Field(default_factory=list)
    e2e_s: list[float] = Field(default_factory=list)
    output_tokens: list[int] = Field(default_factory=list)
    repeat: list[int] = Field(default_factory=list)


class StageMetrics(StrictModel):
    """Statistics of a stage's requests (computed by analysis/metrics.compute)."""

    requests: int
    failed_requests: int = 0
    output_tokens: int
    prompt_tokens: int
    repeats: int
    ttft_s: Distribution | None = None
    tpot_s: Distribution | None = None
    itl_s: Distribution | None = None
    e2e_s: Distribution | None = None
    output_tok_s: float | None = None
    output_tok_s_repeats: list[float] = Field(default_factory=list)
    qps: float | None = None
    qps_repeats: list[float] = Field(default_factory=list)
    tpot_p50_repeats_s: list[float] = Field(default_factory=list)


class MemoryRecord(StrictModel):
    """A stage's memory: NVML sampled from outside (every process of the stage's session, so
    vLLM's engine processes too), torch's allocator in the stage process, the host RSS."""

    nvml: bool | None = None
    note: str | None = None
    cpu_max_rss_bytes: int | None = None
    torch_peak_allocated_bytes: int | None = None
    torch_peak_reserved_bytes: int | None = None
    torch_allocated_bytes: int | None = None
    after_load_allocated_bytes: int | None = None
    device_baseline_bytes: dict[str, int] = Field(default_factory=dict)
    device_peak_bytes: dict[str, int] = Field(default_factory=dict)
    device_peak_delta_bytes: dict[str, int] = Field(default_factory=dict)
    process_peak_bytes: int | None = None
    process_peak_bytes_by_device: dict[str, int] = Field(default_factory=dict)


class EnergyRecord(StrictModel):
    """The NVML energy counter (whole device) over the stage's timed windows only: warm-up,
    quality passes, clock checks and engine start-up are outside them."""

    joules: float
    seconds: float  # the timed windows' total length
    avg_watts: float | None = None
    output_tokens: int | None = None  # the tokens produced inside the windows
    joules_per_output_token: float | None = None
    windows: int | None = None
    scope: str = "timed windows"
    note: str | None = None


class GpuFree(StrictModel):
    """Whether the card was back at its baseline before the next stage started."""

    free: bool
    waited_s: float | None = None
    processes_left: list[int] = Field(default_factory=list)
    used_bytes: dict[str, int] = Field(default_factory=dict)


class StageTiming(StrictModel):
    """Where a stage's wall time (duration_s) went after its load (load_s, load.phases_s), in
    seconds: by the worker's own clocks, then the teardown as the runner saw it. Imports done by
    a worker started ahead (--prefetch) are prefetched_s, in none of the others."""

    warmup_s: float | None = None  # load's end to the measurement's start (Stage.warmup)
    run_s: float | None = None  # Stage.run: the measurement and the untimed work after it (quality, clock check)
    measured_s: float | None = None  # of run_s, the timed windows the figures come from (the meter's)
    teardown_s: float | None = None  # the last event to the stage's end: engine shutdown, exit, the card found free
    prefetched_s: float | None = None  # imports done before its turn, while the previous stage loaded
    prefetch_cuda_initialized: bool | None = None  # True: the early worker's imports initialized CUDA (they must not)
    prefetch_failed: list[str] = Field(default_factory=list)  # imports ahead that failed (done again in its turn)


class StageResult(StrictModel):
    name: str
    stage: str | None = None  # the registered stage, when a journey label renamed its result
    description: str = ""
    changes: str = ""
    own_workload: bool = False  # measured on its own sweep, not the fixed prompt set (Stage.own_workload)
    quality_reference: bool = False  # its outputs are the run's quality reference (Stage.quality_reference)
    status: Status
    reason: str | None = None
    fix: str | None = None
    params: Json = Field(default_factory=dict)  # free-form here: the stage's own Params model validated them
    started_at: str | None = None  # when its process was spawned (runs before 2026-12-05 held its end: fixed in results/)
    duration_s: float | None = None
    load_s: float | None = None  # its worker started (or, started ahead, told to go) to ready
    phases: dict[str, float] = Field(default_factory=dict)  # where duration_s went, by progress phase (durations.Timeline)
    load: LoadInfo | None = None
    timing: StageTiming | None = None  # where duration_s went (the worker's clocks)
    metrics: StageMetrics | None = None
    samples: Samples | None = None
    memory: MemoryRecord = Field(default_factory=MemoryRecord)
    energy: EnergyRecord | None = None
    quality: QualityRecord | None = None
    facts: StageFacts = Field(default_factory=StageFacts)
    extra: Json = Field(default_factory=dict)  # the stage's own record, free-form here: validated by its Extra model
    partial: Json | None = None  # a stage that stopped early: what it had measured (its partial.json)
    notes: list[str] = Field(default_factory=list)
    log: str | None = None
    gpu_free_after: GpuFree | None = None

    @property
    def stage_name(self) -> str:
        """The registered stage that produced this result (its name, unless a label renamed it)."""
        return self.stage or self.name

    def extra_as(self, model: type[T]) -> T:
        """The extra as the stage's typed model (Stage.Extra)."""
        return model.model_validate(self.extra)


# where a stage's peak memory comes from, best first (NVML sees every process, vLLM's too)
MEMORY_SOURCES = (
    ("process_peak_bytes", "NVML, the stage's processes"),
    ("device_peak_delta_bytes", "NVML, device peak minus baseline"),
    ("torch_peak_reserved_bytes", "torch reserved peak"),
    ("cpu_max_rss_bytes", "host RSS peak"),
)


def peak_memory(stage: StageResult) -> tuple[float | None, str | None]:
    for key, source in MEMORY_SOURCES:
        value = getattr(stage.memory, key)
        if isinstance(value, dict):  # per device
            value = sum(v for v in value.values() if v) or None
        if value:
            return float(value), source
    return None, None


class RunResult(StrictModel):
    schema_version: int = SCHEMA_VERSION
    llmopt_version: str = __version__
    run_id: str  # the run directory's name when the run began: with created_at, its key in the history
    # what compare, history and their charts call the run: `llmopt bench --name`, else its directory's
    # name; a run.json from before the field gets the name of the directory it is read from (load_run)
    name: str | None = None
    created_at: str
    finished_at: str | None = None
    wall_s: float | None = None  # the run from start to end, as the user waited for it
    status: Literal["running", "complete", "interrupted", "failed"] = "running"
    failure: str | None = None  # why a failed run stopped
    command: str
    journey: list[Json] = Field(default_factory=list)  # the plans it was started with: --resume finishes these
    # the `llmopt bench --preset` that chose the journey and workload defaults; None: --stages
    # (or a run from before presets); a resumed run keeps the one it was started with
    preset: str | None = None
    env: Host = Field(default_factory=Host)  # the host it ran on (core/host.py)
    model: ModelInfo | None = None
    workload: WorkloadConfig
    min_quality: float = 0.99  # the quality gate (analysis/quality_gate.py)
    stages: list[StageResult] = Field(default_factory=list)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    @property
    def label(self) -> str:
        """The run as compare and history name it: its name, else (a run.json read from the
        history, written before names) its run_id."""
        return self.name or self.run_id

    def put(self, result: StageResult) -> None:
        self.stages = [s for s in self.stages if s.name != result.name] + [result]


NOT_A_RUN_FIX = "pass a run directory written by `llmopt bench`, or its run.json"


def parse_run(raw: Any, where: str) -> RunResult:
    """A run.json's content, migrated from older schema versions, validated."""
    from llmopt_bench.core.migrate import migrate

    if not isinstance(raw, dict) or "schema_version" not in raw:
        what = "an object without schema_version" if isinstance(raw, dict) else f"a JSON {type(raw).__name__}, not an object"
        raise UsageError(f"{where}: not a run.json ({what})", NOT_A_RUN_FIX)
    version = raw.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise UsageError(f"{where}: schema version {version}, this llmopt reads 1 to {SCHEMA_VERSION}",
                         f"use llmopt {raw.get('llmopt_version', 'of that run')} or newer")
    raw = migrate(raw)
    try:
        return RunResult.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        raise UsageError(f"{where}: does not match the result schema: {'.'.join(map(str, first['loc']))} {first['msg']}",
                         NOT_A_RUN_FIX) from None


def load_run(path: str | Path) -> RunResult:
    """A run directory's run.json, or a run.json file (a baseline), read and migrated."""
    p = Path(path)
    if p.is_dir():
        p = p / "run.json"
    if not p.is_file():
        raise UsageError(f"no run.json at {path}", "pass a run directory written by `llmopt bench` or its run.json")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{p}: not valid JSON ({e})", NOT_A_RUN_FIX) from None
    except OSError as e:  # a directory's run.json unreadable, a device
        raise UsageError(f"{p}: cannot read it ({e.strerror or e})", NOT_A_RUN_FIX) from None
    run = parse_run(raw, str(p))
    if run.name is None:  # a run from before names: the directory it lives in now (a baseline file: its stem)
        run.name = p.parent.resolve().name if p.name == "run.json" else p.stem
    return run
