"""What the per-token clock costs, and what the measurement can honestly say about it.

The clock is a generate() streamer (engines/hf/generate.py TokenClock). Its cost is measured two ways:

- end to end: interleaved pairs of the same generation with and without the streamer; each
  pair gives a ratio (with / without - 1, in % of a token's time). The overhead is the median
  ratio, with a distribution-free confidence interval for the median (order statistics: the
  binomial sign-test interval, exact for any distribution of the host's noise).
- apart: the streamer's own per-step work (copying the step's tokens to the host, then
  TokenClock.put) timed in a tight loop, in a few rounds; its share of a token's time bounds
  what the clock can add, free of the generation's noise. transformers synchronises every
  decode step with or without a streamer (its stopping check reads a device flag), so the
  streamer adds no synchronisation of its own, only that work.

The verdict against the budget (2% of a token's time):
    under_budget   the end-to-end interval lies below the budget
    over_budget    the whole interval lies above it
    below_noise    the interval holds zero and reaches the budget: this host's noise is larger
                   than the effect; the bound (the work measured apart) decides
    inconclusive   the interval lies above zero and holds the budget
    unresolved     too few pairs for an interval (runs recorded before this module)
Pure functions; nothing here imports torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

from llmopt_bench.core.freeform import Json

BUDGET_PCT = 2.0
CI_LEVEL = 0.95
CI_METHOD = "distribution-free interval of the median (order statistics, binomial sign test)"


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if not n:
        raise ValueError("median of no values")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _binom_cdf_half(k: int, n: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def median_ci(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float, float] | None:
    """(lo, hi, coverage): the k-th smallest and k-th largest values, k the largest rank whose
    interval still covers the median with probability >= level (coverage is that probability,
    exact for continuous data). None when no interval reaches level (fewer than 6 values at 95%)."""
    s, n = sorted(values), len(values)
    alpha = 1.0 - level
    k = 0
    while k + 1 <= n // 2 and _binom_cdf_half(k, n) <= alpha / 2:
        k += 1
    if k == 0:
        return None
    return s[k - 1], s[n - k], 1.0 - 2.0 * _binom_cdf_half(k - 1, n)


def overhead_verdict(ci: tuple[float, float] | None, budget_pct: float = BUDGET_PCT) -> str:
    if ci is None:
        return "unresolved"
    lo, hi = ci
    if hi < budget_pct:
        return "under_budget"
    if lo > budget_pct:
        return "over_budget"
    return "below_noise" if lo <= 0 else "inconclusive"


class OverheadEstimate(TypedDict):
    """extra["instrumentation"]'s figures: the pairs' ratios, their interval and verdict, and the
    clock's own work timed apart (the bound)."""

    per_token_s_without: float
    per_token_s_with: float
    overhead_pct: float  # the median ratio, with vs without, in %
    overhead_pct_range: list[float]  # [min, max] of the ratios
    pairs: int
    ratios_pct: list[float]
    ci_pct: list[float] | None  # [lo, hi]; None: too few pairs for an interval
    ci_level: float | None
    ci_method: str
    budget_pct: float
    verdict: str  # overhead_verdict's
    clock_call_s: float
    clock_call_s_max: float
    clock_call_rounds: int
    clock_call_pct: float
    bound_pct: float
    clock_call_method: str


def overhead_estimate(without_s: Sequence[float], with_s: Sequence[float], step_costs_s: Sequence[float],
              budget_pct: float = BUDGET_PCT) -> OverheadEstimate:
    """extra["instrumentation"] from the pairs' per-token times (without[i] and with[i] are one
    pair) and the streamer's per-step work timed apart (one figure per round)."""
    if not without_s or len(without_s) != len(with_s):
        raise ValueError("pairs need one time with and one without the clock each")
    ratios = [100.0 * (w / wo - 1.0) for w, wo in zip(with_s, without_s)]
    per_token = median(without_s)
    ci = median_ci(ratios)
    call = median(step_costs_s)
    return {"per_token_s_without": per_token, "per_token_s_with": median(with_s),
            "overhead_pct": median(ratios), "overhead_pct_range": [min(ratios), max(ratios)],
            "pairs": len(ratios), "ratios_pct": ratios,
            "ci_pct": [ci[0], ci[1]] if ci else None, "ci_level": ci[2] if ci else None, "ci_method": CI_METHOD,
            "budget_pct": budget_pct, "verdict": overhead_verdict(ci[:2] if ci else None, budget_pct),
            "clock_call_s": call, "clock_call_s_max": max(step_costs_s), "clock_call_rounds": len(step_costs_s),
            "clock_call_pct": 100.0 * call / per_token, "bound_pct": 100.0 * max(step_costs_s) / per_token,
            "clock_call_method": "the streamer's work per step timed apart: the step's tokens copied to the host, "
                                 "then TokenClock.put"}


# --- the report's sentence -------------------------------------------------------------------

def _p(v: float) -> str:
    return f"{v:+.1f}%" if abs(v) >= 0.1 else f"{v:+.2g}%"


def _bound_clause(inst: Json, budget: float) -> str:
    """The clock's own work, timed apart, as the bound; "" when it was not measured."""
    call, per_token = inst.get("clock_call_s"), inst.get("per_token_s_without")
    if call is None or not per_token:
        return ""
    what = "the token copy and TokenClock.put" if inst.get("clock_call_method") else "TokenClock.put"
    bound = inst.get("bound_pct", inst.get("clock_call_pct", 100.0 * call / per_token))
    worst = (f"at most {inst['clock_call_s_max'] * 1e6:.3g} µs in {inst['clock_call_rounds']} rounds: "
             if inst.get("clock_call_s_max") and inst.get("clock_call_rounds") else "")
    side = "under" if bound < budget else "over"
    return (f"; the clock's own work ({what}), timed apart, costs {call * 1e6:.3g} µs a token ({worst}{bound:.2g}% "
            f"of a {per_token * 1e3:.3g} ms token), {side} the {budget:g}% budget: the bound on what the clock adds")


def overhead_sentence(inst: Json) -> str:
    """One sentence for the report, for runs of every age: the verdict, never a noisy median
    presented as a measured overhead. inst: the record as dumped, free-form here as runs of every
    age wrote it (the oldest have one measure and none of the interval's keys)."""
    budget = inst.get("budget_pct", BUDGET_PCT)
    pairs, rng = inst.get("pairs"), inst.get("overhead_pct_range")
    bound = _bound_clause(inst, budget)
    if not rng:  # the oldest runs: one generation with and one without
        return (f"Per-token clock overhead: not resolved: measured once ({_p(inst.get('overhead_pct') or 0.0)}), "
                f"which cannot separate it from the host's noise{bound}.")
    lo, hi = rng
    ci = inst.get("ci_pct")
    if not ci:
        return (f"Per-token clock overhead: below what {pairs} interleaved pairs can resolve on this host "
                f"(with vs without the clock ranged {_p(lo)} to {_p(hi)}: noise, no interval){bound}.")
    ci_text = (f"{inst.get('ci_level', CI_LEVEL):.0%} interval of the median {_p(ci[0])} to {_p(ci[1])}, "
               f"{pairs} interleaved pairs with and without the clock")
    v = inst.get("verdict") or overhead_verdict((ci[0], ci[1]), budget)
    if v == "under_budget":
        return f"Per-token clock overhead: {_p(inst['overhead_pct'])} of a token's time ({ci_text}): under the {budget:g}% budget."
    if v == "over_budget":
        return f"Per-token clock overhead: {_p(inst['overhead_pct'])} of a token's time ({ci_text}): over the {budget:g}% budget."
    if v == "below_noise":
        return (f"Per-token clock overhead: below the noise of this host ({ci_text}, which holds zero; "
                f"pairs ranged {_p(lo)} to {_p(hi)}){bound}.")
    return (f"Per-token clock overhead: {_p(inst['overhead_pct'])} of a token's time ({ci_text}): above zero, "
            f"and the interval does not rule out the {budget:g}% budget{bound}.")
