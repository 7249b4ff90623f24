"""The Stage contract every plugin implements: its requirements, the context the worker hands
it, the exception that skips it, and the Stage base class.

A stage is an engine plus a scenario (docs/architecture.md): it loads in a child process,
returns raw per-request samples and a typed `extra` (its own pydantic model, `Stage.Extra`),
and, back in the parent, owns its presentation through three hooks: the story's claims it can
judge, its blocks in the report, and its charts. Statistics are computed in one place
(analysis/metrics.py); renderers lay out what the hooks give them and know no stage by name.
Heavy imports happen in load(). Plugins import it as `llmopt_bench.stage`."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from pydantic import BaseModel

from llmopt_bench.core.errors import extra_fix
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import Block, Claim, LoadInfo, NoParams, OpenExtra, StageRun

if TYPE_CHECKING:
    from llmopt_bench.core.models import ModelInfo
    from llmopt_bench.core.results import RunResult, StageResult
    from llmopt_bench.core.workload import WorkloadConfig


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
    keep_partial: Callable[[Json], None] = lambda data: None  # what a long stage measured so far
    meter: Any = None  # measure.energy.TimedMeter: wrap measured work in `with ctx.meter.window(...)`
    shared: dict[str, Any] = field(default_factory=dict)  # free-form: what one worker's stages hand on, by key (engine_pool)


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
    # True for a stage that sends any workload kind (--workload random, shared-prefix,
    # multi-turn, trace: workloads/); single_turn_workload: it sends the kinds whose requests
    # stand alone (random, shared-prefix, trace's rows; the fixed-workload stages), and is
    # skipped with the reason in a multi-turn run; the others measure the prompt file (fixed,
    # mixed) or their own sweep, and are skipped, with the reason, in a run of a generated kind
    any_workload: ClassVar[bool] = False
    single_turn_workload: ClassVar[bool] = False
    # True for the stage whose outputs the others' quality is measured against (the FP16
    # baseline in the journey): the run records which result it is, nobody names it.
    quality_reference: ClassVar[bool] = False
    # False: the stage measures a server llmopt did not start (any OpenAI endpoint): no device
    # memory or energy is sampled or claimed for it
    owns_device: ClassVar[bool] = True
    requires: ClassVar[Requirements] = Requirements()
    # What the stage's worker may import ahead, while the stage before it loads (--prefetch,
    # run/prefetch.py): "module" or "module:attribute" (an attribute of a lazy package imports its
    # module). Imports only: nothing that touches the GPU. Empty: the requirements' imports.
    prefetch: ClassVar[tuple[str, ...]] = ()
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
    def prefetch_imports(cls) -> tuple[str, ...]:
        """The imports a worker started ahead does before its turn (see `prefetch`)."""
        return cls.prefetch or tuple(cls.requires.imports)

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
