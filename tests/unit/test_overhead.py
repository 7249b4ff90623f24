"""The per-token clock's overhead: the interval, the verdict and the report's sentence, on
figures whose answer is known (the committed H200 run's block among them)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llmopt_bench.analysis import overhead as ov

ROOT = Path(__file__).resolve().parents[2]


def coverage(n: int, k: int) -> float:
    return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n


@pytest.mark.parametrize("n,k", [(6, 1), (8, 1), (9, 2), (10, 2), (12, 3), (20, 6), (40, 14)])
def test_median_interval_is_the_kth_order_statistics_with_exact_coverage(n, k):
    values = [float(v) for v in range(n, 0, -1)]  # unsorted on purpose
    lo, hi, level = ov.median_ci(values)
    assert (lo, hi) == (float(k), float(n - k + 1))
    assert level == pytest.approx(coverage(n, k)) and level >= 0.95
    assert coverage(n, k + 1) < 0.95  # k is the narrowest rank that keeps 95%


def test_no_interval_from_fewer_than_six_pairs():
    assert ov.median_ci([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert ov.overhead_verdict(None) == "unresolved"


@pytest.mark.parametrize("ci,expected", [((-0.5, 1.9), "under_budget"), ((2.1, 5.0), "over_budget"),
                                         ((-3.0, 4.0), "below_noise"), ((0.0, 2.0), "below_noise"),
                                         ((0.4, 3.0), "inconclusive")])
def test_verdict_against_the_two_percent_budget(ci, expected):
    assert ov.overhead_verdict(ci) == expected


def summary(ratios_pct: list[float], step_s: float = 1e-6, per_token: float = 0.01) -> dict:
    without = [per_token] * len(ratios_pct)
    return ov.overhead_estimate(without, [per_token * (1 + r / 100) for r in ratios_pct], [step_s * 0.9, step_s, step_s * 1.2])


def test_summary_of_noisy_pairs_is_below_noise_with_the_bound():
    inst = summary([-7.6, 11.2, 3.0, -2.0, 5.5, -4.1, 0.8, 9.0, -6.3, 1.7])
    assert inst["pairs"] == 10 and inst["verdict"] == "below_noise"
    assert inst["ci_pct"] == pytest.approx([-6.3, 9.0]) and inst["ci_level"] == pytest.approx(coverage(10, 2))
    assert inst["overhead_pct"] == pytest.approx((0.8 + 1.7) / 2)
    assert inst["bound_pct"] == pytest.approx(100 * 1.2e-6 / 0.01)  # the worst round, not the median
    text = ov.overhead_sentence(inst)
    assert text.startswith("Per-token clock overhead: below the noise of this host")
    assert "-6.3% to +9.0%" in text and "10 interleaved pairs" in text and "-7.6% to +11.2%" in text
    assert "costs 1 µs a token (at most 1.2 µs in 3 rounds: 0.012% of a 10 ms token), under the 2% budget: the bound" in text


def test_summary_of_a_clean_host_is_under_budget():
    inst = summary([0.3, -0.2, 0.5, 0.1, 0.0, 0.4, -0.1, 0.2, 0.6, 0.3])
    assert inst["verdict"] == "under_budget"
    assert ov.overhead_sentence(inst).endswith("under the 2% budget.")


def test_a_real_overhead_is_reported_over_budget():
    inst = summary([5.0, 6.0, 4.0, 5.5, 4.5, 6.5, 5.2, 4.8, 5.1, 5.9], step_s=5e-4)
    assert inst["verdict"] == "over_budget"
    text = ov.overhead_sentence(inst)
    assert "over the 2% budget" in text and f"{inst['overhead_pct']:+.1f}%" in text and "+4.5% to +6.0%" in text


def test_committed_h200_block_no_longer_reads_as_an_eleven_percent_overhead():
    """The H200 run recorded 3 pairs (median +11.1%, range -7.6% to +11.2%) before intervals:
    the sentence says the pairs did not resolve it and gives the clock's own cost as the bound."""
    run = json.loads((ROOT / "results/h200/run.json").read_text())
    inst = next(s for s in run["stages"] if s["name"] == "hf-fp16")["extra"]["instrumentation"]
    text = ov.overhead_sentence(inst)
    assert "11.1%" not in text and "below what 3 interleaved pairs can resolve" in text
    assert "-7.6% to +11.2%" in text and "(TokenClock.put), timed apart, costs 0.137 µs a token (0.00045% of a 30.5 ms" in text
    assert "under the 2% budget: the bound on what the clock adds" in text


def test_oldest_blocks_without_a_range_are_unresolved():
    text = ov.overhead_sentence({"overhead_pct": 4.2})
    assert text.startswith("Per-token clock overhead: not resolved: measured once (+4.2%)")


def test_summarize_refuses_unpaired_times():
    with pytest.raises(ValueError):
        ov.overhead_estimate([0.01, 0.01], [0.01], [1e-6])


def test_per_decode_step_takes_out_the_median_one_token_generation():
    from llmopt_bench.engines.hf.generate import decode_per_token

    # 16-token generations of 1.0 and 1.3 s, one-token generations of 0.2, 0.25 and 0.9 s (one
    # stalled): the median 0.25 s is the prefill and first token, 15 steps share the rest
    assert decode_per_token([1.0, 1.3], [0.2, 0.9, 0.25], 16) == [0.75 / 15, 1.05 / 15]
    assert decode_per_token([0.5], [0.2], 1) == [0.5]  # one token: no decode step to isolate
    assert decode_per_token([0.1], [0.3], 4) == [1e-9 / 3]  # noise above the decode: floored, never negative
