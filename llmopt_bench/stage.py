"""The Stage contract every plugin implements, its requirements, and the raw sample types.

Stages return raw per-request timestamps and token counts; statistics are computed in one
place (analysis/metrics.py) and renderers only read results. Heavy imports happen in load()."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from llmopt_bench.errors import extra_fix


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoParams(StrictModel):
    pass


@dataclass(frozen=True)
class Requirements:
    """What a stage needs: import name -> the extra that installs it, CUDA, a compute capability."""

    imports: dict[str, str] = field(default_factory=dict)
    cuda: bool = False
    min_compute_capability: tuple[int, int] | None = None
    engine: str | None = None  # "vllm": may run in another interpreter (LLMOPT_VLLM_PYTHON)

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
    implementation that really runs (kernel, attention backend, dtype), engine versions."""

    phases_s: dict[str, float] = Field(default_factory=dict)
    implementation: dict[str, Any] = Field(default_factory=dict)
    versions: dict[str, str] = Field(default_factory=dict)
    weights_bytes: int | None = None
    notes: list[str] = Field(default_factory=list)


class StageRun(StrictModel):
    """What run() returns: raw samples plus anything stage-specific (sweeps, quality, kv cache)."""

    samples: list[RequestSample] = Field(default_factory=list)
    extra: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


@dataclass
class StageContext:
    """Handed to a stage by the worker: where to put artefacts, how to report progress."""

    run_dir: Path
    stage_dir: Path
    device: str  # "cuda" or "cpu"
    log_path: Path | None = None  # this process's stdout/stderr: engines log what they chose there
    progress: Callable[[str, int | None, int | None], None] = lambda msg, done=None, total=None: None
    shared: dict[str, Any] = field(default_factory=dict)


class StageSkipped(Exception):
    """Raised by a stage that finds, once loading, that it cannot run here (shape limits, no FP8)."""

    def __init__(self, reason: str, fix: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


class Stage:
    """Base class for stages. Subclasses set the ClassVars and implement load/run/teardown."""

    name: ClassVar[str]
    description: ClassVar[str]
    changes: ClassVar[str] = ""  # what this stage changes relative to the one before it
    # True for a stage that measures its own workload (a sweep), not the fixed prompt set: its
    # row is kept out of stage-to-stage speedups, the waterfall and the overall claim.
    own_workload: ClassVar[bool] = False
    requires: ClassVar[Requirements] = Requirements()
    Params: ClassVar[type[BaseModel]] = NoParams

    def load(self, model: "ModelInfo", params: BaseModel, ctx: StageContext) -> LoadInfo:  # noqa: F821
        raise NotImplementedError

    def warmup(self, workload: "Workload", ctx: StageContext) -> None:  # noqa: F821
        """Untimed work before measurement (compile, caches, clocks)."""

    def run(self, workload: "Workload", ctx: StageContext) -> StageRun:  # noqa: F821
        raise NotImplementedError

    def teardown(self) -> None:
        """Free the GPU. Must be idempotent."""
