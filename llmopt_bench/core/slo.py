"""Latency targets (an SLO), parsed once from the text users type and carried as a type.

`--slo ttft_p99=2s,tpot_p99=100ms`: each target is METRIC_pPCT=VALUE with a unit, METRIC one of
ttft, tpot, itl, e2e (defined once in analysis/metrics.py) and PCT one of 50, 90, 95, 99.

An SLO field of any record (ServingParams.slo, StageFacts.slo) accepts that text and writes it
back (str(slo), the one way an SLO is printed), so the job files, run.json and the journey TOMLs
hold the text users type, and every committed run.json still loads. How a load point is judged
against an SLO is analysis/slo.py's.

The default is MLPerf Inference's Server scenario for Llama-3.1-8B, the class of the story's 7B
model: TTFT p99 <= 2 s and TPOT p99 <= 100 ms (mlcommons/inference, loadgen/mlperf.conf:
llama3_1-8b.Server.ttft_latency = 2000, tpot_latency = 100, in ms, and
*.Server.target_latency_percentile = 99)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, model_serializer, model_validator

from llmopt_bench.core.errors import UsageError

DEFAULT_SLO = "ttft_p99=2s,tpot_p99=100ms"
METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 95, 99)
UNITS = {"s": 1.0, "ms": 1e-3}
FIX = f"write targets like {DEFAULT_SLO}: METRIC_pPCT=VALUE with METRIC in {'/'.join(METRICS)}, " \
      f"PCT in {'/'.join(map(str, PERCENTILES))}, VALUE in s or ms"
_TARGET = re.compile(r"^(?P<metric>[a-z0-9]+)_p(?P<pct>\d+(?:\.\d+)?)$")
_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ms|s)?$")


class Target(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str
    percentile: int
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile}"

    def __str__(self) -> str:
        ms = self.limit_s * 1e3
        return f"{self.name}={ms:g}ms" if ms < 1000 else f"{self.name}={self.limit_s:g}s"


class SLO(BaseModel):
    """The targets; built from the text (`SLO.model_validate("ttft_p99=2s")`, or any record's SLO
    field given text) or from Targets, and written as the text by str() and by every dump."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    targets: tuple[Target, ...]

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        # a bad target raises UsageError (not a ValueError), which pydantic lets through: the
        # user sees the target at fault and the fix, not a validation error about a field
        return {"targets": _parse_targets(value)} if isinstance(value, str) else value

    @model_serializer
    def _as_text(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.targets)


def parse_slo(text: str | None) -> SLO:
    """Parse `ttft_p99=2s,tpot_p99=100ms`; anything else is a UsageError with the fix."""
    return SLO(targets=_parse_targets(text))


def default_slo() -> SLO:
    return parse_slo(DEFAULT_SLO)


def _parse_targets(text: str | None) -> tuple[Target, ...]:
    text = (text or "").strip()
    if not text:
        raise UsageError("the SLO is empty", FIX)
    targets: dict[str, Target] = {}
    for part in (p.strip() for p in text.split(",")):
        if "=" not in part:
            raise UsageError(f"SLO target {part!r} has no value", FIX)
        key, value = (x.strip().lower() for x in part.split("=", 1))
        target = _parse_target(key, value)
        if target.name in targets:
            raise UsageError(f"SLO target {target.name} is given twice", "give each target once")
        targets[target.name] = target
    return tuple(targets.values())


def _parse_target(key: str, value: str) -> Target:
    m = _TARGET.match(key)
    if not m or m["metric"] not in METRICS:
        raise UsageError(f"unknown SLO target {key!r}", FIX)
    pct = float(m["pct"])
    if pct not in PERCENTILES:
        raise UsageError(f"SLO target {key!r}: percentile p{m['pct']} is not one of "
                         f"{', '.join(f'p{p}' for p in PERCENTILES)}", FIX)
    v = _VALUE.match(value)
    if not v:
        raise UsageError(f"SLO target {key}: {value!r} is not a duration", FIX)
    if not v["unit"]:
        raise UsageError(f"SLO target {key}={value}: no unit", f"write {key}={value}s or {key}={value}ms")
    limit = float(v["num"]) * UNITS[v["unit"]]
    if limit <= 0:
        raise UsageError(f"SLO target {key}={value}: a limit must be above zero", FIX)
    return Target(metric=m["metric"], percentile=int(pct), limit_s=limit)
