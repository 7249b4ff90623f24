"""The builders of a stage's result, one for each way a stage ends, so that a measured, skipped,
failed and interrupted result carry the same stage metadata (copied from its class by
stage_result, the one place that makes a StageResult)."""

from __future__ import annotations

from typing import Any

from llmopt_bench.core.contract import Stage
from llmopt_bench.core.results import StageResult, Status
from llmopt_bench.procs.events import FailedStatus
from llmopt_bench.run.registry import StagePlan


def stage_result(plan: StagePlan, cls: type[Stage], status: Status, **fields: Any) -> StageResult:
    """A stage's result with its metadata copied from its class; only a measured (ok) result of
    the reference stage is the run's quality reference. fields: StageResult's own."""
    return StageResult(name=plan.name, stage=plan.stage if plan.stage != plan.name else None,
                       description=getattr(cls, "description", ""), changes=getattr(cls, "changes", ""),
                       own_workload=getattr(cls, "own_workload", False),
                       quality_reference=status == "ok" and getattr(cls, "quality_reference", False),
                       status=status, params=plan.params, **fields)


def measured(plan: StagePlan, cls: type[Stage], **fields: Any) -> StageResult:
    """A stage that ran and returned its samples (status ok, unless its record proves otherwise)."""
    return stage_result(plan, cls, "ok", **fields)


def skipped(plan: StagePlan, cls: type[Stage], reason: str, fix: str | None = None, **fields: Any) -> StageResult:
    """A stage that could not run here: the runner found it so before starting it, or the stage
    itself while loading (StageSkipped)."""
    return stage_result(plan, cls, "skipped", reason=reason, fix=fix, **fields)


def failed(plan: StagePlan, cls: type[Stage], status: FailedStatus, reason: str, fix: str | None, **fields: Any) -> StageResult:
    """A stage that ended without a result: an error, an out-of-memory, its timeout, or a kill
    from outside (`--resume` runs a killed one again)."""
    return stage_result(plan, cls, status, reason=reason, fix=fix, **fields)


def interrupted(plan: StagePlan, cls: type[Stage], reason: str, fix: str | None, **fields: Any) -> StageResult:
    """A stage stopped before it finished by Ctrl-C or SIGTERM (`--resume` runs it again)."""
    return stage_result(plan, cls, "interrupted", reason=reason, fix=fix, **fields)
