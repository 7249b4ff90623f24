"""Is the server keeping up? The steady-state judgement of an open-loop load point, from its
requests' timelines alone (load/dispatchers.Timeline). docs/serving.md, "Steady state", says why
each threshold is what it is; in short, a point is steady when:

1. completions keep up with arrivals: over the window's later half, completions >= KEEP_UP (95%)
   of arrivals, less the backlog's own jitter. In that half, completions = arrivals - (growth of
   the backlog), exactly, so this is also "the backlog does not grow". A stable queue's backlog
   jitters by about sqrt(2 L) between two instants (L = rate x mean time in system, Little's
   law), so NOISE_SIGMAS (3) of that are allowed below the 95%: a short window at a modest rate
   is noise, not a verdict (on the simulated server of tests/simserver.py, 8-s windows at 80% of
   capacity: 0 of 40 seeds judged unsteady by the four criteria; at 110%: 27 of 40, at 120%: 40
   of 40). The allowance grows with the time in system, queueing included, so in a short window
   under heavy overload this criterion alone is lenient (on the same server, 6-s windows at 130%:
   3 of 30): there the trend and the window's length say it, and over a hold's window (60 s) the
   shortfall, growing with the window, outgrows the allowance;
2. the backlog is what Little's law gives: the requests in flight (or queued on the client) when
   the window closes are at most LITTLE_FACTOR (2) x rate x the mean time in system of the
   window's first third, plus LITTLE_SIGMAS of its jitter. A queue that grew before the
   window's second half shows here;
3. latency does not trend: the median wait from arrival to first token (TTFT with the client's
   own queue) of the window's last third is at most TREND_RATIO x the first third's, or not by
   more than TREND_FLOOR (the larger of 20 ms and a quarter of the first third's time in system);
4. the window is long enough to see a queue form: at least WINDOW_E2E x the point's median time
   in system.

A closed loop is not judged (ok None): its arrivals wait for its answers, it cannot fall behind."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean

from pydantic import Field

from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.records import StrictModel
from llmopt_bench.load.dispatchers import Timeline

KEEP_UP = 0.95
NOISE_SIGMAS = 3.0
LITTLE_FACTOR = 2.0
LITTLE_SIGMAS = 3.0
TREND_RATIO = 1.5
TREND_FLOOR_S = 0.02
TREND_FLOOR_E2E = 0.25
WINDOW_E2E = 5.0
MIN_PER_THIRD = 3  # requests a third of the window needs for its latency to be compared


class Steady(StrictModel):
    """The verdict and the figures it was reached on (times in s, rates per s)."""

    ok: bool | None  # None: not judged
    reasons: list[str] = Field(default_factory=list)
    arrival_rps: float | None = None  # over the window's later half
    completion_rps: float | None = None  # answers over the window's later half
    backlog_at_end: int | None = None  # arrived, not yet answered (in flight or queued on the client) at the window's end
    little_in_flight: float | None = None  # rate x mean time in system of the first third
    first_token_first_s: float | None = None  # median arrival-to-first-token, first third
    first_token_last_s: float | None = None  # ... last third
    time_in_system_p50_s: float | None = None  # answered - arrival, median of the measured requests
    min_window_s: float | None = None

    @property
    def reason(self) -> str | None:
        return f"not steady: {'; '.join(self.reasons)}" if self.reasons else None


def _p50(xs: Sequence[float]) -> float | None:
    return percentile(xs, 50) if xs else None


def _third(tls: Sequence[Timeline], lo: float, hi: float) -> list[Timeline]:
    return [t for t in tls if lo <= t.arrival <= hi and t.sample is not None and t.sample.ok]


def keep_up(tls: Sequence[Timeline], start: float, end: float, rate: float, mean_in_system: float) -> tuple[float, float, str | None]:
    """Criterion 1: arrivals and answers per second over the later half, and the reason it failed."""
    mid, half = (start + end) / 2, (end - start) / 2
    arrived = sum(1 for t in tls if mid < t.arrival <= end)
    answered = sum(1 for t in tls if mid < t.answered <= end)
    allowance = NOISE_SIGMAS * math.sqrt(2 * rate * mean_in_system + 1)
    late = arrived > 0 and answered < KEEP_UP * arrived - allowance
    a_rps, c_rps = arrived / half, answered / half
    return a_rps, c_rps, f"completions {c_rps:.1f}/s for {a_rps:.1f}/s arriving" if late else None


def little(tls: Sequence[Timeline], start: float, end: float, rate: float) -> tuple[int, float | None, str | None]:
    """Criterion 2: in flight at the window's end against Little's law on the first third."""
    at_end = sum(1 for t in tls if t.arrival <= end < t.answered)  # queued on the client too: the backlog
    first = _third(tls, start, start + (end - start) / 3)
    if len(first) < MIN_PER_THIRD:
        return at_end, None, None
    mean = fmean(t.answered - t.arrival for t in first)
    expected = rate * mean
    limit = LITTLE_FACTOR * expected + LITTLE_SIGMAS * math.sqrt(expected) + 1
    why = (f"{at_end} in flight or queued at the window's end, {at_end / max(expected, 1e-9):.1f}x the {expected:.0f} Little's law "
           f"gives ({rate:.1f}/s x {mean:.2f} s)") if at_end > limit else None
    return at_end, expected, why


def trend(tls: Sequence[Timeline], start: float, end: float) -> tuple[float | None, float | None, str | None]:
    """Criterion 3: the median wait from arrival to first token, first third against last third."""
    third = (end - start) / 3
    first, last = _third(tls, start, start + third), _third(tls, end - third, end)
    if len(first) < MIN_PER_THIRD or len(last) < MIN_PER_THIRD:
        return None, None, None
    a = _p50([t.sample.t_first - t.arrival for t in first if t.sample])
    b = _p50([t.sample.t_first - t.arrival for t in last if t.sample])
    in_system = _p50([t.answered - t.arrival for t in first]) or 0.0
    floor = max(TREND_FLOOR_S, TREND_FLOOR_E2E * in_system)
    assert a is not None and b is not None
    rose = b > TREND_RATIO * a and b - a > floor
    return a, b, f"TTFT from arrival rose from {a * 1e3:.0f} ms to {b * 1e3:.0f} ms across the window" if rose else None


def judge_steady(tls: Sequence[Timeline], measured: Sequence[Timeline], start: float, end: float,
                 rate: float | None) -> Steady:
    """The verdict on an open-loop window [start, end] at the achieved `rate` (measured: its requests)."""
    done = [t for t in measured if t.sample is not None and t.sample.ok]
    if end <= start or not done or not rate:
        return Steady(ok=None, reasons=[])
    in_system = [t.answered - t.arrival for t in done]
    p50 = _p50(in_system)
    assert p50 is not None
    a_rps, c_rps, late = keep_up(tls, start, end, rate, fmean(in_system))
    at_end, expected, backlog = little(tls, start, end, rate)
    first, last, rose = trend(tls, start, end)
    short = (f"the window ({end - start:.1f} s) is under {WINDOW_E2E:g}x its median time in system ({p50:.2f} s): "
             "too short to see a queue form") if end - start < WINDOW_E2E * p50 else None
    reasons = [r for r in (late, backlog, rose, short) if r]
    return Steady(ok=not reasons, reasons=reasons, arrival_rps=a_rps, completion_rps=c_rps, backlog_at_end=at_end,
                  little_in_flight=expected, first_token_first_s=first, first_token_last_s=last,
                  time_in_system_p50_s=p50, min_window_s=WINDOW_E2E * p50)
