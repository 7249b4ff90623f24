"""The stopping rule (analysis/stopping.py) and the fixed workload's loop under it
(scenarios/fixed.measure): it stops at the minimum on a steady signal, runs to the maximum on
a noisy one, and keeps a fixed count when no maximum is given.

The engine below is a real FixedEngine whose token times are computed, not slept: each repeat's
TPOT is what the test says, so the rule's decisions are deterministic on a loaded host."""

from __future__ import annotations

import math

import pytest

from llmopt_bench.analysis.stopping import StoppingRule, halfwidth_pct, repeat_value, stopping_sentence
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.scenarios.fixed.run import measure, stopping_rule


class ComputedEngine:
    """Serves every request with the per-token time tpot_of(repeat)."""

    def __init__(self, tpot_of):
        self.tpot_of = tpot_of
        self.repeats_served: list[int] = []

    def encode(self, text):
        return [1 + (ord(c) % 50) for c in text[:16]]

    def serve(self, requests, max_new_tokens, *, batch_size, repeat, tokens_out, progress):
        self.repeats_served.append(repeat)
        step, out = self.tpot_of(repeat), []
        for i, r in enumerate(requests):
            t0 = 100.0 * repeat + i
            times = [t0 + 0.01 + k * step for k in range(max_new_tokens)]
            out.append(RequestSample(request_id=r.id, prompt_id=r.prompt_id, repeat=repeat, prompt_tokens=len(r.token_ids),
                                     output_tokens=max_new_tokens, t_submit=t0, t_first=times[0], t_done=times[-1],
                                     token_times=times))
            if tokens_out is not None:
                tokens_out[r.id] = [7] * max_new_tokens
            progress(i + 1)
        return out


class Meter:
    class Window:
        tokens = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def window(self, name):
        return self.Window()


class Ctx:
    meter = Meter()
    device = "cpu"  # each repeat's conditions measure the host-speed index there

    def __init__(self):
        self.messages: list[str] = []

    def progress(self, message, n, total):
        self.messages.append(message)


def run(tpot_of, **workload):
    cfg = WorkloadConfig(num_prompts=4, max_new_tokens=8, **workload)
    engine, ctx = ComputedEngine(tpot_of), Ctx()
    rule = stopping_rule(cfg)
    _, samples, _ = measure(engine, cfg, ctx, rule)
    return engine, samples, rule.record, ctx


def test_steady_signal_stops_at_the_minimum():
    engine, samples, rec, ctx = run(lambda rep: 0.020 * (1 + 0.001 * (rep % 2)), repeats=3, max_repeats=10, stop_within=2)
    assert engine.repeats_served == [0, 1, 2]
    assert rec.stopped == "tight" and rec.repeats_run == 3
    assert rec.halfwidth_pct is not None and rec.halfwidth_pct <= 2
    assert sorted({s.repeat for s in samples}) == [0, 1, 2]
    assert "repeat 1/3..10" in ctx.messages


def test_noisy_signal_runs_to_the_maximum():
    noisy = [0.020, 0.030, 0.022, 0.033, 0.019, 0.028]
    engine, samples, rec, _ = run(lambda rep: noisy[rep], repeats=2, max_repeats=6, stop_within=2)
    assert engine.repeats_served == list(range(6))
    assert rec.stopped == "max_repeats" and rec.repeats_run == 6
    assert rec.halfwidth_pct > 2
    assert rec.per_repeat == pytest.approx(noisy)


def test_signal_that_settles_stops_when_the_interval_is_tight():
    # two noisy repeats, then steady ones: the rule stops at the first repeat whose interval fits
    values = [0.020, 0.0206] + [0.0203] * 20
    engine, _, rec, _ = run(lambda rep: values[rep], repeats=2, max_repeats=20, stop_within=1)
    assert rec.stopped == "tight"
    first_tight = next(n for n in range(2, 21) if halfwidth_pct(values[:n]) <= 1)
    assert rec.repeats_run == first_tight == len(engine.repeats_served) < 20


def test_without_a_maximum_the_count_is_fixed():
    engine, _, rec, _ = run(lambda rep: 0.02, repeats=3)
    assert engine.repeats_served == [0, 1, 2]
    assert rec.stopped == "fixed" and rec.max_repeats == rec.min_repeats == 3


def test_halfwidth_is_the_t_interval_of_the_log_values():
    values = [0.020, 0.022, 0.021]
    logs = [math.log(v) for v in values]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert halfwidth_pct(values) == pytest.approx((math.exp(4.303 * sd / math.sqrt(3)) - 1) * 100, rel=1e-3)
    assert halfwidth_pct([0.02]) is None


def test_repeat_value_is_the_median_tpot_of_ok_requests():
    def sample(i, step, ok=True):
        times = [0.0 + k * step for k in range(5)]
        return RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=3, output_tokens=5, t_submit=0.0,
                             t_first=times[0], t_done=times[-1], token_times=times, ok=ok)

    samples = [sample(0, 0.01), sample(1, 0.03), sample(2, 0.02), sample(3, 9.0, ok=False)]
    assert repeat_value(samples, "tpot_p50") == pytest.approx(0.02)
    assert repeat_value(samples, "e2e_p50") == pytest.approx(0.08)


def test_one_token_outputs_are_judged_on_e2e():
    rule = stopping_rule(WorkloadConfig(max_new_tokens=1, repeats=2, max_repeats=4))
    assert rule.record.metric == "e2e_p50"
    assert StoppingRule(2, 2, 2.0, "tpot_p50").label() == "2"
    assert StoppingRule(2, 5, 2.0, "tpot_p50").label() == "2..5"


class GappedEngine(ComputedEngine):
    """Steady TPOT, but the gap between requests (what output tok/s sees, not TPOT) is gap_of(repeat)."""

    def __init__(self, tpot_of, gap_of):
        super().__init__(tpot_of)
        self.gap_of = gap_of

    def serve(self, requests, max_new_tokens, *, batch_size, repeat, tokens_out, progress):
        out = super().serve(requests, max_new_tokens, batch_size=batch_size, repeat=repeat, tokens_out=tokens_out,
                            progress=progress)
        for i, s in enumerate(out):
            shift = i * self.gap_of(repeat)
            s.t_submit, s.t_first, s.t_done = s.t_submit + shift, s.t_first + shift, s.t_done + shift
            s.token_times = [t + shift for t in s.token_times]
        return out


def test_every_gated_figure_must_settle_not_only_tpot():
    """TPOT steady to 0.1%, output tok/s scattered by the gaps between requests: the rule goes on
    (the gate judges tok/s too), where a TPOT-only rule stopped at the minimum."""
    gaps = [0.0, 2.0, 0.5, 3.0, 1.0, 2.5]
    cfg = WorkloadConfig(num_prompts=4, max_new_tokens=8, repeats=3, max_repeats=6, stop_within=2)
    engine, ctx = GappedEngine(lambda rep: 0.020 * (1 + 0.001 * (rep % 2)), lambda rep: gaps[rep]), Ctx()
    rule = stopping_rule(cfg)
    measure(engine, cfg, ctx, rule)
    rec = rule.record
    assert rec.halfwidths_pct["tpot_p50"] <= 2 < rec.halfwidths_pct["output_tok_s"]
    assert rec.stopped == "max_repeats" and engine.repeats_served == list(range(6))
    assert set(rec.watched) == {"tpot_p50", "e2e_p50", "output_tok_s"} and len(rec.watched["output_tok_s"]) == 6


def test_the_time_budget_stops_a_noisy_stage_before_the_maximum():
    """Each repeat's window is 3.16 s (4 requests 1 s apart, 8 tokens at 20-33 ms): with a 10 s
    budget the fourth would end past it, so three run; without one, the rule goes to 6."""
    noisy = [0.020, 0.030, 0.022, 0.033, 0.019, 0.028]
    engine, _, rec, _ = run(lambda rep: noisy[rep], repeats=2, max_repeats=6, stop_within=2, repeat_budget_s=10)
    assert rec.stopped == "budget" and rec.repeats_run == 3 == len(engine.repeats_served)
    assert rec.max_seconds == 10 and 9 < rec.seconds < 10
    assert "stopped at the time budget (10 s of repeats)" in stopping_sentence(rec)
    engine, _, rec, _ = run(lambda rep: noisy[rep], repeats=2, max_repeats=6, stop_within=2)
    assert rec.stopped == "max_repeats" and rec.repeats_run == 6
