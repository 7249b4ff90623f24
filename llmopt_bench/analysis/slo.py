"""How a load point's requests measure up to an SLO (the SLO itself, parsed once and carried as
a type: core/slo.py), and goodput: the one judge of a point's requests and the one goodput, for
the serving stages' own points, vLLM's client's runs (scenarios/peer/judge.py) and recommend's
re-judging of a run's points under another SLO (analysis/recommend/rejudge.py).

A load point meets the SLO when every target's percentile over its successful requests is
within the limit (ITL: over every gap of every request, as the ITL distribution is defined) and
no more than max_failure_rate of its requests failed. Goodput counts the successful requests
that met each TTFT, TPOT and E2E target on their own, per second of the busy window (first
submit to last token; with repeats, the mean over them): DistServe's definition, and
`vllm bench serve --goodput`'s, whose per-request targets are the same three (ttft, tpot, e2el).
An ITL target is the point's, not a request's: a request has no ITL of its own at a percentile
that its few gaps could say, and a run keeps each request's TTFT, TPOT and E2E, so recommend
counts a run's goodput under any SLO exactly as the run counted it (core/records.SLOPoint)."""

from __future__ import annotations

from collections import defaultdict
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
    good_requests: int  # successful requests that met the per-request targets (request_meets)
    goodput_rps: float | None  # good requests per second of the busy window (goodput_rps)
    reason: str | None = None  # why it failed, in words


PER_REQUEST = {"ttft": M.ttft, "tpot": M.tpot, "e2e": M.e2e}  # the targets a request meets on its own


def _pooled(metric: str, ok: Sequence[RequestSample]) -> list[float]:
    if metric == "itl":  # every gap of every request, as the ITL distribution is defined
        return [g for s in ok for g in M.itls(s)]
    return [v for s in ok if (v := PER_REQUEST[metric](s)) is not None]


def request_meets(slo: SLO, values: dict[str, float | None]) -> bool:
    """Whether a successful request whose TTFT, TPOT and E2E are `values` met each of the SLO's
    targets on those (the goodput test); a value it has none of (TPOT of a one-token answer) is met."""
    return all(v is None or v <= t.limit_s for t in slo.targets if t.metric in PER_REQUEST for v in [values.get(t.metric)])


def meets(slo: SLO, s: RequestSample) -> bool:
    """Whether one request succeeded and met the SLO's per-request targets (request_meets)."""
    return s.ok and request_meets(slo, {m: f(s) for m, f in PER_REQUEST.items()})


def goodput(good: int, window_s: float | None) -> float | None:
    """Good requests per second of the window (None: no window)."""
    return good / window_s if window_s and window_s > 0 else None


def goodput_rps(slo: SLO, samples: Sequence[RequestSample]) -> float | None:
    """The point's goodput: per repeat, its good requests over its busy window (first submit to
    last token of its successful requests), the mean over repeats; 0 where none succeeded."""
    by_repeat: dict[int, list[RequestSample]] = defaultdict(list)
    for s in samples:
        by_repeat[s.repeat].append(s)
    rates = []
    for group in by_repeat.values():
        ok = [s for s in group if s.ok]
        rate = goodput(sum(1 for s in ok if meets(slo, s)), max(s.t_done for s in ok) - min(s.t_submit for s in ok)) if ok else None
        if rate is not None:
            rates.append(rate)
    return sum(rates) / len(rates) if rates else (0.0 if samples else None)


def judge(slo: SLO, samples: Sequence[RequestSample], max_failure_rate: float = 0.01) -> Verdict:
    """The SLO's verdict on a load point's measured requests, with its goodput (goodput_rps)."""
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
    return Verdict(ok=not reasons, targets=verdicts, requests=len(samples), failed=failed, failure_rate=rate,
                   max_failure_rate=max_failure_rate, good_requests=sum(1 for s in samples if meets(slo, s)),
                   goodput_rps=goodput_rps(slo, samples), reason="; ".join(reasons) or None)
