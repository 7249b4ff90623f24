"""What the runner and a stage's supervisor share: the reporter they tell, where the run's quality
reference lives, and the one builder of a stage's result, so that a skipped, failed and measured
result carry the same stage metadata."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from llmopt_bench.core.contract import Stage
from llmopt_bench.core.results import StageResult, Status
from llmopt_bench.run.registry import StagePlan


class Reporter(Protocol):
    def phase(self, msg: str) -> None: ...
    def stage_start(self, name: str, index: int, total: int) -> None: ...
    def progress(self, name: str, msg: str, done: int | None, total: int | None) -> None: ...
    def stage_end(self, result: StageResult) -> None: ...


@dataclass
class Reference:
    """Where the run's quality reference lives, and which result provides it."""

    name: str | None = None
    file: Path | None = None


def stage_result(plan: StagePlan, cls: type[Stage], status: Status, **kw: Any) -> StageResult:
    """A stage's result with its metadata copied from its class; only a measured (ok) result of
    the reference stage is the run's quality reference."""
    return StageResult(name=plan.name, stage=plan.stage if plan.stage != plan.name else None,
                       description=getattr(cls, "description", ""), changes=getattr(cls, "changes", ""),
                       own_workload=getattr(cls, "own_workload", False),
                       quality_reference=status == "ok" and getattr(cls, "quality_reference", False),
                       status=status, params=plan.params, **kw)


def skipped(plan: StagePlan, cls: type[Stage], status: Status, reason: str, fix: str | None = None, **kw: Any) -> StageResult:
    """A result for a stage that did not measure: skipped, failed before a result, interrupted."""
    return stage_result(plan, cls, status, reason=reason, fix=fix, **kw)
