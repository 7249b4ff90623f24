"""The Stage contract every plugin implements, its requirements, and the types that cross it.

A stage is an engine plus a scenario (docs/architecture.md): it loads in a child process,
returns raw per-request samples and a typed `extra` (its own pydantic model, `Stage.Extra`),
and, back in the parent, owns its presentation through three hooks: the story's claims it can
judge, its blocks in the report, and its charts. Statistics are computed in one place
(analysis/metrics.py); renderers lay out what the hooks give them and know no stage by name.
Heavy imports happen in load()."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from llmopt_bench.errors import extra_fix

if TYPE_CHECKING:  # the schema imports this module: types only, no cycle at run time
    from llmopt_bench.models import ModelInfo
    from llmopt_bench.results import RunResult, StageResult
    from llmopt_bench.workload import WorkloadConfig


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


@dataclass(frozen=True)
class Requirements:
    """What a stage needs: import name -> the extra that installs it, CUDA, a compute capability."""

    imports: dict[str, str] = field(default_factory=dict)
    cuda: bool = False
    min_compute_capability: tuple[int, int] | None = None
    engine: str | None = None  # "vllm": may run in another interpreter (LLMOPT_VLLM_PYTHON)
    # False: the engine's imports are checked in its interpreter, but the stage's own process runs
    # in llmopt's (a stage that starts the engine as a server and talks to it over HTTP)
    child_in_engine: bool = True

    def missing_imports(self, find_spec: Callable[[str], Any] = importlib.util.find_spec) -> list[tuple[str, str]]:
        """(reason, fix) for each import this interpreter cannot find."""
        out = []
        for module, extra in self.imports.items():
            try:
                found = find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                out.append((f"{module} not installed", extra_fix(extra)))
        return out


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


class LoadInfo(StrictModel):
    """What load() learnt: phases in seconds (weights, quantize, compile, graphs, ...), the
    implementation that really runs (kernel, attention backend, dtype), engine versions, and
    the engine's memory split where it knows it (vLLM preallocates its KV cache)."""

    phases_s: dict[str, float] = Field(default_factory=dict)
    implementation: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_dtype: str | None = None
    notes: list[str] = Field(default_factory=list)


class SLOPoint(StrictModel):
    """One open-loop load point a serving stage measured, kept so that another SLO can judge it
    again (analysis/recommend.py): each successful request's TTFT, TPOT and E2E in seconds (TPOT
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
    # serving under an SLO (scenarios/serving.py): the highest arrival rate that met it, the
    # interval it is known within ([last passing, first failing]; failing None: never failed),
    # the goodput at that rate, the knee of the latency curve, and every open-loop point measured
    slo: str | None = None  # the SLO judged, as `--slo` takes it: ttft_p99=2s,tpot_p99=100ms
    slo_max_failure_rate: float | None = None
    slo_capacity_rps: float | None = None
    slo_capacity_interval: list[float | None] | None = None
    slo_capacity_converged: bool | None = None
    goodput_rps: float | None = None
    knee_rps: float | None = None
    slo_points: list[SLOPoint] = Field(default_factory=list)
    devices: int | None = None  # GPUs the served engine used (tensor x pipeline parallel); None: not known
    serve_command: str | None = None  # the exact `vllm serve ...` line that reproduces the server


class StageRun(StrictModel):
    """What run() returns: raw samples, the quality record, and the stage's own typed extra."""

    samples: list[RequestSample] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    quality: QualityRecord | None = None
    facts: StageFacts = Field(default_factory=StageFacts)
    notes: list[str] = Field(default_factory=list)


class Claim(StrictModel):
    """One of the story's claims judged on this run's numbers."""

    key: str
    claim: str
    target: str
    measured: str
    value: float | None = None
    verdict: Literal["held", "not held", "not measured"]
    detail: str = ""


class Block(StrictModel):
    """A part of a stage's section in the report: a paragraph, a table, or both."""

    text: str | None = None
    headers: list[str] = Field(default_factory=list)
    rows: list[list[Any]] = Field(default_factory=list)


@dataclass
class StageContext:
    """Handed to a stage by the worker: where to put artefacts, how to report progress, where
    the run's quality reference lives, and the meter that times (and weighs) measured work."""

    run_dir: Path
    stage_dir: Path
    device: str  # "cuda" or "cpu"
    log_path: Path | None = None  # this process's stdout/stderr: engines log what they chose there
    progress: Callable[..., None] = lambda msg, done=None, total=None: None  # (message, done, total)
    reference_file: Path | None = None  # the quality reference: written by its provider, read by the others
    reference_name: str | None = None  # the result that provides it
    provides_reference: bool = False
    keep_partial: Callable[[dict[str, Any]], None] = lambda data: None  # what a long stage measured so far
    meter: Any = None  # measure.energy.TimedMeter: wrap measured work in `with ctx.meter.window(...)`
    shared: dict[str, Any] = field(default_factory=dict)


class StageSkipped(Exception):
    """Raised by a stage that finds, once loading, that it cannot run here (shape limits, no FP8)."""

    def __init__(self, reason: str, fix: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


class Stage:
    """Base class for stages. Subclasses set the ClassVars, implement load/run/teardown in the
    child, and may override the presentation hooks, which run in the parent from run.json alone."""

    name: ClassVar[str]
    description: ClassVar[str]
    changes: ClassVar[str] = ""  # what this stage changes relative to the one before it
    # True for a stage that measures its own workload (a sweep), not the fixed prompt set: its
    # row is kept out of stage-to-stage speedups, the waterfall and the overall claim.
    own_workload: ClassVar[bool] = False
    # True for the stage whose outputs the others' quality is measured against (the FP16
    # baseline in the journey): the run records which result it is, nobody names it.
    quality_reference: ClassVar[bool] = False
    # False: the stage measures a server llmopt did not start (any OpenAI endpoint): no device
    # memory or energy is sampled or claimed for it
    owns_device: ClassVar[bool] = True
    requires: ClassVar[Requirements] = Requirements()
    Params: ClassVar[type[BaseModel]] = NoParams
    Extra: ClassVar[type[BaseModel]] = OpenExtra

    def load(self, model: "ModelInfo", params: BaseModel, ctx: StageContext) -> LoadInfo:
        raise NotImplementedError

    def warmup(self, workload: "WorkloadConfig", ctx: StageContext) -> None:
        """Untimed work before measurement (compile, caches, clocks)."""

    def run(self, workload: "WorkloadConfig", ctx: StageContext) -> StageRun:
        raise NotImplementedError

    def teardown(self) -> None:
        """Free the GPU. Must be idempotent."""

    @classmethod
    def share_key(cls, params: BaseModel) -> str | None:
        """The engine configuration this stage starts, as a key: consecutive stages of one key
        run in one process on one engine (engines/engine_pool.py). None: never shared."""
        return None

    # --- presentation hooks: the parent process, run.json only ----------------------------

    @classmethod
    def claims(cls, result: "StageResult", run: "RunResult") -> list[Claim]:
        """The story's claims this stage can judge (called for the stage's unlabelled result)."""
        return []

    @classmethod
    def report_blocks(cls, result: "StageResult", run: "RunResult") -> list[Block]:
        """The stage's own tables and paragraphs in its section of the report."""
        return []

    @classmethod
    def charts(cls, result: "StageResult", run: "RunResult", out_dir: Path) -> list[Path]:
        """PNG files the stage draws of its own measurements, into out_dir."""
        return []
