"""One metric judged between two runs: the metrics compare gates on, and the verdict on a metric
from each side's per-repeat groups (the interval of analysis/gate/noise.py): a regression only when
the whole interval lies beyond the threshold, "unchanged" only when it lies wholly within it,
and otherwise "inconclusive", with the change the pair could detect and the repeats that would
settle it. analysis/gate/compare.py applies it stage by stage; scripts/gate/calibrate-gate.py measures it;
analysis/gate/host_verdict.py judges normalised figures with it. Pure functions; numpy is imported
inside."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from llmopt_bench.analysis.gate import noise
from llmopt_bench.analysis.metric_registry import Metric, judged

# the metrics compare judges, from the one registry (analysis/metric_registry.py)
METRICS: dict[str, Metric] = judged()
# a judged latency's per-request samples column (the bootstrap draws from it)
SAMPLE_COLUMNS = {k: col for k, m in METRICS.items() if (col := m.distribution)}
# The metrics whose verdict must be settled for a comparison to pass (`llmopt compare --gate`):
# an "inconclusive" one exits INCONCLUSIVE, never 0. The decode figures, which the stopping rule
# settles in a nightly's time (analysis/stopping.py), and peak memory, judged on its value. TTFT
# (on the default prompt set a median over prompts of different lengths: H200 vLLM's moved 29%
# between repeats) and load time (one value a run) are watched: a regression of theirs exits 5,
# an inconclusive one is reported and does not fail.
GATED = tuple(k for k, m in METRICS.items() if m.gated)


@dataclass
class MetricDelta:
    metric: str
    label: str
    unit: str
    higher_is_better: bool
    baseline: float | None
    new: float | None
    ratio: float | None
    ci: tuple[float, float] | None
    threshold: float
    method: str  # repeats (t over their log figures) | bootstrap-requests (one repeat) | history | single value | no data
    verdict: str  # regressed | improved | unchanged | inconclusive | inconclusive (host) | n/a
    mde: float | None = None  # the smallest change in the bad direction caught 80% of the time
    noise: str = ""  # where each side's noise came from
    settle_repeats: int | None = None  # inconclusive: the repeats a side that would settle it (noise.settling_repeats)
    judged: bool = True  # False: no between-run information (one repeat a side, or one value a run): never settled
    gated: bool = True  # an inconclusive verdict fails the comparison (GATED, compare --gate)
    # a host-bound stage where both runs recorded the host-speed index (analysis/gate/host_verdict.py):
    # the verdict before the host was weighed, and the figures as if run on the baseline's host
    raw_verdict: str | None = None
    normalised_ratio: float | None = None
    normalised_ci: tuple[float, float] | None = None
    normalised_verdict: str | None = None

    @property
    def change(self) -> float | None:
        return None if self.ratio is None else self.ratio - 1


def change_verdict(ratio: float | None, ci: tuple[float, float] | None, threshold: float, higher_is_better: bool) -> str:
    """Regressed/improved only when the whole interval lies beyond the threshold, unchanged only
    when it lies wholly within +-threshold, else inconclusive. Without an interval (a figure
    judged on its value: peak memory) the value itself is the interval."""
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    lo, hi = ci if ci else (ratio, ratio)
    above, below = lo > 1 + threshold, hi < 1 - threshold  # the whole interval beyond the threshold
    if above or below:
        return "regressed" if above != higher_is_better else "improved"
    return "unchanged" if 1 - threshold <= lo and hi <= 1 + threshold else "inconclusive"


def _method(b: noise.SideNoise, n: noise.SideNoise) -> str:
    if "history" in b.source:
        return "history"
    return "bootstrap-requests" if "request" in b.source + n.source else "repeats"


def judge(key: str, b_val: float | None, n_val: float | None, b_groups: list[list[float]], n_groups: list[list[float]],
          statistic: str, threshold: float, resamples: int = 2000, confidence: float = 0.95, seed: int = 0,
          history: Sequence[float] = ()) -> MetricDelta:
    """The verdict on one metric from each side's per-repeat groups (noise_groups): each side's
    value is the geometric mean of its repeats' figures (noise.centre), or, without groups, the
    value given. compare_metric's core, and what scripts/gate/calibrate-gate.py measures."""
    import numpy as np

    m = METRICS[key]
    b_val = noise.centre(b_groups, statistic) or b_val
    n_val = noise.centre(n_groups, statistic) or n_val
    out = MetricDelta(key, m.label, m.unit, m.higher_is_better, b_val, n_val, None, None, threshold, "no data", "n/a")
    if not (b_val and n_val is not None and b_val > 0 and n_val >= 0):
        return out
    out.ratio, out.method = n_val / b_val, "single value"
    rng = np.random.default_rng(seed)
    b_own, n_own = (noise.side_noise(g, statistic, resamples, rng) for g in (b_groups, n_groups))
    b_own, n_own = noise.fill_in(b_own, n_own, len(b_groups)), noise.fill_in(n_own, b_own, len(n_groups))
    past = noise.history_noise(history)
    b_noise, n_noise = noise.with_history(b_own, past, new_side=False), noise.with_history(n_own, past, new_side=True)
    one_repeat_each = False
    if b_noise and n_noise and out.ratio > 0:
        one_repeat_each = all("(1 repeat)" in side.source for side in (b_noise, n_noise))
        iv = noise.combine(out.ratio, b_noise, n_noise, confidence)
        out.ci, out.method = (iv.lo, iv.hi), _method(b_noise, n_noise)
        out.mde = noise.min_detectable(iv, threshold, m.higher_is_better)
        out.noise = f"baseline: {b_noise.source}; new: {n_noise.source}"
    out.verdict = change_verdict(out.ratio, out.ci, threshold, m.higher_is_better)
    # without any between-run information the interval holds the requests' scatter only, and
    # a shift of a whole run passes for a change (or for none): report it, never settle it
    out.judged = not ((out.ci is None and m.needs_noise) or one_repeat_each)
    if not out.judged:
        out.verdict, out.mde = "inconclusive", None
        out.method += " (not judged: one repeat per side)" if out.ci else " (not judged: no repeats or history to show its noise)"
    elif out.verdict == "inconclusive" and b_noise and n_noise:
        out.settle_repeats = noise.settling_repeats(out.ratio, b_noise, n_noise, threshold, confidence)
    return out
