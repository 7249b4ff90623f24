"""What the run machinery carries from the runner down to each stage's supervisor: the run
session (one invocation of `llmopt bench` on one run directory) and a journey's stage made ready
to run. The runner builds them once; the supervisor's functions take them instead of the run,
its directory, the model, the quality reference, the workers' environment and the reporter one
by one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from llmopt_bench.core.contract import Stage
from llmopt_bench.core.models import ModelInfo
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.run.registry import StagePlan
from llmopt_bench.run.rundir import RunDir


class Reporter(Protocol):
    """Who hears about the run's progress (render/progress.py: the terminal)."""

    def phase(self, msg: str) -> None: ...
    def stage_start(self, name: str, index: int, total: int) -> None: ...
    def progress(self, name: str, msg: str, done: int | None, total: int | None) -> None: ...
    def stage_end(self, result: StageResult) -> None: ...


@dataclass
class Reference:
    """Where the run's quality reference lives, and which result provides it."""

    name: str | None = None
    file: Path | None = None


@dataclass
class RunSession:
    """One invocation of a run: its record (run.json, with the host's fingerprint in `run.env`),
    its directory, the model as prepared on this machine (run.model keeps its portable path),
    where the quality reference lives, the environment every worker starts with, and the
    reporter. Where each group's worker comes from (started ahead or fresh) is its Turn
    (run/prefetch.py)."""

    run: RunResult
    rundir: RunDir
    model: ModelInfo
    reference: Reference
    worker_env: dict[str, str]
    reporter: Reporter


@dataclass
class ReadyStage:
    """A journey's stage made ready to run: its plan, its class, the time it may take, and the
    engine configuration it shares with the later stages of its group (None: a stage that runs
    alone, whose worker starts and stops its own engine)."""

    plan: StagePlan
    cls: type[Stage]
    timeout_s: float
    share_key: str | None = None

    @property
    def name(self) -> str:
        return self.plan.name
