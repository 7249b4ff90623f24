"""How a load point's requests measure up to an SLO (the SLO itself, parsed once and carried as
a type: core/slo.py).

A load point meets the SLO when every target's percentile over its successful requests is
within the limit and no more than max_failure_rate of its requests failed. Goodput counts the
requests that met every target on their own (a request's TTFT, TPOT, E2E within the limits;
for ITL, the request's own percentile of its gaps), per second of the window: DistServe's
definition, which `vllm bench serve --goodput` also uses."""

from __future__ import annotations

from collections.abc import Sequence

from llmopt_bench.analysis import metrics as M
from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.records import RequestSample, StrictModel
from llmopt_bench.core.slo import SLO

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
