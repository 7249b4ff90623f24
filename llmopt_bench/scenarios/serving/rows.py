"""What the serving scenario makes of its measured points: the client's tally over every point,
a point's prompts as the server counted them, the headline point, and the stage's facts (the
capacity, held or not, and what it is checked against)."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from llmopt_bench.core.records import SLOPoint, StageFacts
from llmopt_bench.core.slo import SLO
from llmopt_bench.load.capacity.search import Capacity
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.scenarios.serving.record import ClientTally, LoadRow, PromptCount, ServingParams

THROUGHPUT_HOW = "throughput point (all requests at once)"  # as continuous-batching names its own
KEEP = 50  # usage mismatches and short answers kept by example


def count_tally(t: ClientTally, tally: Any) -> None:
    """Add one point's client tally (client/openai_http.Tally) to the stage's."""
    if tally is None:
        return
    for how, n in tally.counted_by.items():
        t.counted_by[how] = t.counted_by.get(how, 0) + n
    t.usage_agreed += tally.usage_agreed
    t.usage_missing += tally.usage_missing
    t.usage_mismatch_count += len(tally.usage_mismatch)
    t.usage_mismatch += [list(m) for m in tally.usage_mismatch][:KEEP - len(t.usage_mismatch)]
    t.short_count += len(tally.short)
    t.short += [list(s) for s in tally.short][:KEEP - len(t.short)]
    t.prompt_checked += tally.prompt_checked
    t.prompt_off_count += len(tally.prompt_off)
    t.prompt_off += [list(s) for s in tally.prompt_off][:KEEP - len(t.prompt_off)]


def prompt_count(tally: Any) -> PromptCount | None:
    """One point's prompts as asked and as the server counted them (client/openai_http.Tally)."""
    if tally is None or not tally.prompt_checked:
        return None
    n = tally.prompt_checked
    return PromptCount(checked=n, asked_mean=round(tally.prompt_asked / n, 3), counted_mean=round(tally.prompt_counted / n, 3),
                       off=len(tally.prompt_off), worst=round(tally.prompt_off_worst, 4), made_sending=tally.texts_made_sending)


MAX_PREPARED = 4096  # prompts made before a point at most (the rest, if sent, while it runs)


def sent_by(point: LoadPoint, requests_per_point: int) -> int:
    """About how many requests a point sends, warm-up included: its count, else its rate over its
    duration with room for Poisson's spread (a closed loop bound by time: twice requests_per_point)."""
    if point.num_requests is not None:
        n = point.num_requests
    elif point.rate is not None and point.duration_s is not None:
        mean = point.rate * point.duration_s
        n = math.ceil(mean + 4 * math.sqrt(mean) + 8)
    else:
        n = 2 * requests_per_point
    return min(n, MAX_PREPARED)


def main_key(samples: Collection[str], capacity: Capacity | None, p: ServingParams, untimed: Collection[str] = ()) -> str | None:
    """The headline point: the hold at the capacity, else the search's trial there, else the
    sweep point at main_concurrency (default: the largest). A point the client could not time
    (`untimed`: its latencies are the client's) is passed over for the largest sweep point it
    timed; where it timed none, the default stays (the report says so)."""
    cap = capacity.capacity_rps if capacity else None
    for key in ([f"hold: {cap:g} req/s", f"search: {cap:g} req/s"] if cap is not None else []):
        hits = [k for k in samples if (k == key or k.startswith(key + ",")) and k not in untimed]  # a gamma point's label carries its burstiness
        if hits:
            return hits[0]
    sweep = sorted(set(p.concurrency))
    c = p.main_concurrency if p.main_concurrency in sweep else (sweep[-1] if sweep else None)
    key = f"sweep: concurrency {c}"
    if key in samples and key not in untimed:
        return key
    timed = [f"sweep: concurrency {n}" for n in reversed(sweep) if f"sweep: concurrency {n}" in samples
             and f"sweep: concurrency {n}" not in untimed]  # not the throughput point: it may fail by design
    return next(iter(timed), key if key in samples else next(iter(samples), None))


def _at_capacity(rows: list[LoadRow], cap: float | None) -> LoadRow | None:
    found = [r for r in rows if r.phase in ("hold", "search") and cap is not None and r.rate_rps == cap]
    return next((r for r in found if r.phase == "hold"), found[0] if found else None)


def facts_of(rows: list[LoadRow], capacity: Capacity | None, points: list[SLOPoint], slo: SLO, max_failure_rate: float,
             main: str | None) -> StageFacts:
    """What the generic analyses read: latency at concurrency 1, the saturated throughput, and
    the capacity under the SLO with its interval, its hold, the saturation ceiling and every
    open-loop point."""
    # a point the client could not time gives no batch-1 fact: its latencies are the client's
    one = next((r for r in rows if r.phase == "sweep" and r.concurrency == 1 and r.completed and not r.client_untimed), None)
    tp = next((r for r in rows if r.phase == "throughput" and r.output_tok_s), None)
    sweep = [r for r in rows if r.phase == "sweep" and r.output_tok_s]
    top = max(sweep, key=lambda r: r.output_tok_s or 0, default=None)
    sat, how = (tp.output_tok_s, THROUGHPUT_HOW) if tp else \
        ((top.output_tok_s, f"top of the closed-loop sweep (concurrency {top.concurrency})") if top else (None, None))
    cap = capacity.capacity_rps if capacity else None
    at_cap = _at_capacity(rows, cap)
    main_c = next((r.concurrency for r in rows if main and main == f"sweep: concurrency {r.concurrency}"), None)
    return StageFacts(
        decode_batch=main_c, batch1_tpot_s=one.tpot_p50_s if one else None, batch1_ttft_s=one.ttft_p50_s if one else None,
        saturated_tok_s=sat, saturated_how=how, slo=slo, slo_max_failure_rate=max_failure_rate, slo_capacity_rps=cap,
        slo_capacity_interval=[capacity.passing_rps, capacity.upper_rps or capacity.failing_rps] if capacity else None,
        slo_capacity_converged=capacity.converged if capacity else None,
        slo_capacity_known_within=capacity.known_within if capacity else None,
        slo_capacity_held=capacity.held if capacity else None, slo_hold_s=capacity.hold_s if capacity else None,
        saturation_rps=capacity.saturation_rps if capacity else None,
        goodput_rps=at_cap.goodput_rps if at_cap else None, knee_rps=capacity.knee_rps if capacity else None,
        slo_points=points)
