"""Latency targets (an SLO) and how a load point's requests measure up to them.

`--slo ttft_p99=2s,tpot_p99=100ms`: each target is METRIC_pPCT=VALUE with a unit, METRIC one of
ttft, tpot, itl, e2e (defined once in analysis/metrics.py) and PCT one of 50, 90, 95, 99.

A load point meets the SLO when every target's percentile over its successful requests is
within the limit and no more than max_failure_rate of its requests failed. Goodput counts the
requests that met every target on their own (a request's TTFT, TPOT, E2E within the limits;
for ITL, the request's own percentile of its gaps), per second of the window: DistServe's
definition, which `vllm bench serve --goodput` also uses.

The default is MLPerf Inference's Server scenario for Llama-3.1-8B, the class of the story's 7B
model: TTFT p99 <= 2 s and TPOT p99 <= 100 ms (mlcommons/inference, loadgen/mlperf.conf:
llama3_1-8b.Server.ttft_latency = 2000, tpot_latency = 100, in ms, and
*.Server.target_latency_percentile = 99)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmopt_bench.analysis import metrics as M
from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import RequestSample, StrictModel

DEFAULT_SLO = "ttft_p99=2s,tpot_p99=100ms"
METRICS = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 95, 99)
UNITS = {"s": 1.0, "ms": 1e-3}
FIX = f"write targets like {DEFAULT_SLO}: METRIC_pPCT=VALUE with METRIC in {'/'.join(METRICS)}, " \
      f"PCT in {'/'.join(map(str, PERCENTILES))}, VALUE in s or ms"
_TARGET = re.compile(r"^(?P<metric>[a-z0-9]+)_p(?P<pct>\d+(?:\.\d+)?)$")
_VALUE = re.compile(r"^(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ms|s)?$")


class Target(StrictModel):
    metric: str
    percentile: int
    limit_s: float

    @property
    def name(self) -> str:
        return f"{self.metric}_p{self.percentile}"

    def __str__(self) -> str:
        ms = self.limit_s * 1e3
        return f"{self.name}={ms:g}ms" if ms < 1000 else f"{self.name}={self.limit_s:g}s"


class SLO(StrictModel):
    targets: list[Target]

    def __str__(self) -> str:
        return ",".join(str(t) for t in self.targets)


# An open-loop point measures the server only if the client delivered the load it asked for. A
# client that cannot keep up falls behind cumulatively: requests due in the window are still
# unsent when it closes (queued_at_end), and the server saw less load than asked. A late send that
# goes out before the window closes does not count: a stall (a GC pause, a busy event loop) delays
# some requests and sends them in a burst, which is a harder load, not a lighter one.
CLIENT_BACKLOG_MAX = 0.05


def client_late(queued_at_end: int | None, requests: int | None) -> str | None:
    """Why a load point measured the client rather than the server, None when it kept up."""
    if not queued_at_end or not requests:
        return None
    share = queued_at_end / requests
    if share <= CLIENT_BACKLOG_MAX:
        return None
    return (f"the client fell behind ({queued_at_end} of {requests} requests due in the window were not yet sent "
            f"when it closed: {share:.0%} > {CLIENT_BACKLOG_MAX:.0%})")


class TargetVerdict(StrictModel):
    target: str
    value_s: float | None  # None: no request gave this metric (TPOT of one-token answers)
    limit_s: float
    ok: bool


class Verdict(StrictModel):
    ok: bool
    targets: list[TargetVerdict]
    requests: int
    failed: int
    failure_rate: float
    max_failure_rate: float
    good_requests: int  # requests that met every target on their own
    goodput_rps: float | None  # good requests per second of the window
    reason: str | None = None  # why it failed, in words


def parse_slo(text: str | None) -> SLO:
    """Parse `ttft_p99=2s,tpot_p99=100ms`; anything else is a UsageError with the fix."""
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
    return SLO(targets=list(targets.values()))


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


def _per_request(metric: str, s: RequestSample, pct: int) -> float | None:
    if metric == "ttft":
        return M.ttft(s)
    if metric == "tpot":
        return M.tpot(s)
    if metric == "e2e":
        return M.e2e(s)
    gaps = M.itls(s)
    return percentile(gaps, pct) if gaps else None


def _pooled(metric: str, ok: Sequence[RequestSample]) -> list[float]:
    if metric == "itl":  # every gap of every request, as the ITL distribution is defined
        return [g for s in ok for g in M.itls(s)]
    return [v for s in ok if (v := _per_request(metric, s, 50)) is not None]


def meets(slo: SLO, s: RequestSample) -> bool:
    """Whether one request met every target on its own (the goodput test)."""
    if not s.ok:
        return False
    for t in slo.targets:
        v = _per_request(t.metric, s, t.percentile)
        if v is not None and v > t.limit_s:
            return False
    return True


def judge(slo: SLO, samples: Sequence[RequestSample], window_s: float | None,
          max_failure_rate: float = 0.01) -> Verdict:
    """The SLO's verdict on a load point's measured requests; window_s for goodput."""
    ok = [s for s in samples if s.ok]
    failed = len(samples) - len(ok)
    rate = failed / len(samples) if samples else 1.0
    verdicts = []
    for t in slo.targets:
        values = _pooled(t.metric, ok)
        value = percentile(values, t.percentile) if values else None
        verdicts.append(TargetVerdict(target=t.name, value_s=value, limit_s=t.limit_s,
                                      ok=value is not None and value <= t.limit_s))
    reasons = [f"{v.target} {v.value_s * 1e3:.1f} ms > {v.limit_s * 1e3:g} ms" for v in verdicts
               if not v.ok and v.value_s is not None]
    reasons += [f"no {v.target}: no request gave that metric" for v in verdicts if v.value_s is None]
    if rate > max_failure_rate:
        reasons.append(f"{failed} of {len(samples)} requests failed ({rate:.1%} > {max_failure_rate:.1%})")
    good = sum(1 for s in samples if meets(slo, s))
    return Verdict(ok=not reasons, targets=verdicts, requests=len(samples), failed=failed, failure_rate=rate,
                   max_failure_rate=max_failure_rate, good_requests=good,
                   goodput_rps=good / window_s if window_s and window_s > 0 else None,
                   reason="; ".join(reasons) or None)
