"""The stopping rule's decisions from each repeat's figures (analysis/stopping.StoppingRule.add_figures,
what the fixed workload feeds it and scripts/gate/calibrate-gate.py replays), without an engine: the
minimum is always measured, every watched figure must be tight, the maximum and the time budget
end it, a fixed count is fixed, and a repeat the host disturbed is not counted (issue 46: a
mutation pass found these unpinned outside the engine-running tests of test_stopping.py)."""

from __future__ import annotations

import pytest

from llmopt_bench.analysis.stopping import StoppingRule, halfwidth_pct, headline_metric, stopping_sentence

STEADY = {"tpot_p50": 0.010, "e2e_p50": 1.0, "output_tok_s": 100.0}


def noisy(i: int) -> dict:
    return {"tpot_p50": 0.010 * (1.3 if i % 2 else 1.0), "e2e_p50": 1.0 * (1.3 if i % 2 else 1.0), "output_tok_s": 100.0}


def feed(rule: StoppingRule, figures, seconds: float = 1.0, conditions=None, limit: int = 50) -> int:
    for i in range(limit):
        if rule.add_figures(figures(i), seconds, conditions(i) if conditions else None):
            return i + 1
    raise AssertionError("never stopped")


def test_a_steady_stage_stops_at_the_minimum_and_not_before():
    rule = StoppingRule(3, 10, 2.5, "tpot_p50")
    assert not rule.add_figures(STEADY, 1.0) and not rule.add_figures(STEADY, 1.0)  # 2 of the 3 minimum
    assert rule.add_figures(STEADY, 1.0)
    assert rule.record.stopped == "tight" and rule.record.repeats_run == 3 and rule.record.halfwidth_pct == 0


def test_a_noisy_stage_runs_to_the_maximum():
    rule = StoppingRule(2, 6, 2.5, "tpot_p50")
    assert feed(rule, noisy) == 6 and rule.record.stopped == "max_repeats"
    assert rule.record.halfwidths_pct["tpot_p50"] > 2.5 and rule.record.per_repeat == rule.record.watched["tpot_p50"]


def test_every_watched_figure_must_be_tight():
    rule = StoppingRule(2, 5, 2.5, "tpot_p50")
    assert feed(rule, lambda i: {**STEADY, "output_tok_s": 100.0 * (1.3 if i % 2 else 1.0)}) == 5
    assert rule.record.halfwidths_pct["tpot_p50"] == 0 and rule.record.stopped == "max_repeats"


def test_the_time_budget_ends_it_before_the_next_repeat_would_pass_it():
    rule = StoppingRule(2, 10, 2.5, "tpot_p50", max_seconds=90)
    assert feed(rule, noisy, seconds=40.0) == 2 and rule.record.stopped == "budget"  # a third would end at 120 s
    rule = StoppingRule(2, 10, 2.5, "tpot_p50", max_seconds=90)
    assert feed(rule, noisy, seconds=30.0) == 3 and rule.record.stopped == "budget"  # the third ends at 90 s: within it
    assert rule.record.seconds == 90


def test_a_fixed_count_is_fixed():
    rule = StoppingRule(3, 3, 2.5, "tpot_p50")
    assert not rule.adaptive and rule.label() == "3" and StoppingRule(2, 10, 2.5, "tpot_p50").label() == "2..10"
    assert feed(rule, lambda i: STEADY) == 3 and rule.record.stopped == "fixed"


def test_a_disturbed_repeat_is_not_counted_and_another_is_measured():
    quiet = {"cpu_share": 1.95, "involuntary_switches": 10, "wall_s": 1.0}
    rows = [quiet, quiet, {"cpu_share": 0.9, "involuntary_switches": 900, "wall_s": 1.0}, quiet, quiet]
    rule = StoppingRule(4, 10, 2.5, "tpot_p50")
    assert feed(rule, lambda i: STEADY, conditions=lambda i: rows[i]) == 5
    assert rule.record.set_aside == [2] and "Repeat(s) 3 not counted" in stopping_sentence(rule.record)


def test_the_half_width_needs_two_values_and_the_headline_two_tokens():
    assert halfwidth_pct([0.01]) is None and halfwidth_pct([0.01, None, -1]) is None
    assert halfwidth_pct([1.0, 1.0]) == 0 and halfwidth_pct([1.0, 1.1]) == pytest.approx(
        (2.718281828 ** (12.706 * 0.0674 / 2 ** 0.5) - 1) * 100, rel=0.01)
    assert headline_metric(2) == "tpot_p50" and headline_metric(1) == "e2e_p50"


def test_the_maximum_holds_even_when_disturbed_repeats_leave_the_minimum_unmet():
    quiet, busy = {"cpu_share": 1.95, "involuntary_switches": 10, "wall_s": 1.0}, {"cpu_share": 0.5, "involuntary_switches": 900, "wall_s": 1.0}
    rows = [quiet, quiet, busy, busy, busy, busy]
    rule = StoppingRule(3, 4, 2.5, "tpot_p50")
    assert feed(rule, lambda i: STEADY, conditions=lambda i: rows[i]) == 4
    assert rule.record.set_aside == [2, 3] and rule.record.repeats_run == 4


def test_a_figure_a_repeat_could_not_give_is_never_tight():
    rule = StoppingRule(2, 4, 2.5, "tpot_p50")
    assert feed(rule, lambda i: {**STEADY, "output_tok_s": None}) == 4 and rule.record.stopped == "max_repeats"
    assert rule.record.halfwidths_pct["output_tok_s"] is None
