"""The bridge between the report and the stages: each result's stage class (through the
registry, the built-ins too), asked for its claims, blocks and charts. A hook that fails costs
its own block, never the report: the failure is said in its place and on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from llmopt_bench.analysis.narrative.claims import claim_overall
from llmopt_bench.core.contract import Stage
from llmopt_bench.core.records import Block, Claim
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.run.registry import presentation_class


def stage_class(result: StageResult) -> type[Stage]:
    """The registered class of the stage that produced the result; the plain Stage (no hooks)
    for a stage not installed here (a plugin's run read on another machine)."""

    return presentation_class(result.stage_name)


def _failed(what: str, result: StageResult, e: Exception) -> str:
    msg = f"{result.name}'s {what} hook failed: {type(e).__name__}: {e}"
    print(f"warning: {msg}", file=sys.stderr)
    return msg


def collect_claims(run: RunResult) -> list[Claim]:
    """The journey's overall claim, then the claims of each stage the run holds (one that did not
    run to completion says "not measured"), in journey order, each key once. Only a stage's
    unlabelled result judges its claims: a labelled twin never stands in for it."""
    out = [claim_overall(run)]
    for s in run.stages:
        if s.name != s.stage_name:
            continue
        try:
            claims = stage_class(s).claims(s, run)
        except Exception as e:  # noqa: BLE001 - a plugin's bug must not cost the report
            _failed("claims", s, e)
            continue
        out += [c for c in claims if all(c.key != o.key for o in out)]
    return out


def stage_blocks(result: StageResult, run: RunResult) -> list[Block]:
    try:
        return stage_class(result).report_blocks(result, run)
    except Exception as e:  # noqa: BLE001
        return [Block(text=f"(not shown: {_failed('report_blocks', result, e)})")]


def stage_charts(result: StageResult, run: RunResult, out_dir: Path) -> list[Path]:
    try:
        return stage_class(result).charts(result, run, out_dir)
    except ImportError:
        raise  # no matplotlib: the caller skips charts as a whole
    except Exception as e:  # noqa: BLE001
        _failed("charts", result, e)
        return []
