"""A stage figure's one definition (analysis/figures.py), computed apart here from run.json's
samples: the geometric mean of the repeats' own figures, the repeats the host disturbed set aside
as compare sets them aside, with the t interval over the repeats; one value a run otherwise."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.analysis.gate.compare import compare_runs
from llmopt_bench.core.distribution import percentile
from llmopt_bench.core.results import load_run

ROOT = Path(__file__).resolve().parents[2]
DISTURBED = ROOT / "results" / "cpu" / "gate-pairs" / "hf-fp16-round0-a1"  # the host disturbed 5 of its 10 repeats
QUIET = ROOT / "results" / "cpu" / "gate-pairs" / "hf-fp16-round0-a2"
SERVING = ROOT / "results" / "h200-20261204" / "run"
T_975 = {2: 4.302652729911275, 4: 2.7764451051977987}  # Student's t, 97.5%, by degrees of freedom


def by_repeat(stage, column: str, keep=None) -> list[list[float]]:
    groups: dict[int, list[float]] = {}
    for v, r in zip(getattr(stage.samples, column), stage.samples.repeat):
        if v is not None and (keep is None or r in keep):
            groups.setdefault(r, []).append(v)
    return [groups[r] for r in sorted(groups)]


def test_a_latency_is_the_geometric_mean_of_the_repeats_statistic_with_its_t_interval():
    stage = load_run(ROOT / "results" / "h200").stage("hf-fp16")
    medians = [statistics.median(g) for g in by_repeat(stage, "tpot_s")]
    f = stage_figure(stage, "tpot_p50")
    assert len(medians) == 3 and f.n_repeats == 3 and f.unit == "ms" and f.set_aside == ()
    assert f.value == pytest.approx(statistics.geometric_mean(medians) * 1e3, rel=1e-12)
    logs = [math.log(v) for v in medians]
    reach = math.exp(T_975[2] * statistics.stdev(logs) / math.sqrt(3))
    assert f.interval == pytest.approx((f.value / reach, f.value * reach), rel=1e-4)
    p99 = stage_figure(stage, "ttft_p99")  # each repeat's own p99, not the pooled requests'
    assert p99.value == pytest.approx(statistics.geometric_mean(percentile(g, 99) for g in by_repeat(stage, "ttft_s")) * 1e3)
    assert p99.per_repeat_requests == 8
    tok_s = stage_figure(stage, "output_tok_s")
    assert tok_s.value == pytest.approx(statistics.geometric_mean(stage.metrics.output_tok_s_repeats), rel=1e-12)
    assert tok_s.value != pytest.approx(stage.metrics.output_tok_s, rel=1e-6)  # not the arithmetic mean run.json keeps


def test_the_repeats_the_host_disturbed_are_set_aside_as_compare_sets_them_aside():
    base, new = load_run(DISTURBED), load_run(QUIET)
    stage = base.stage("hf-fp16")
    f = stage_figure(stage, "tpot_p50")
    assert f.set_aside == (0, 1, 6, 7, 8) and f.n_repeats == 5 and "set aside" in f.how
    medians = [statistics.median(g) for g in by_repeat(stage, "tpot_s", {2, 3, 4, 5, 9})]
    assert f.value == pytest.approx(statistics.geometric_mean(medians) * 1e3, rel=1e-12)
    reach = math.exp(T_975[4] * statistics.stdev(math.log(v) for v in medians) / math.sqrt(5))
    assert f.interval == pytest.approx((f.value / reach, f.value * reach), rel=1e-4)
    cmp = compare_runs(base, new, resamples=100)
    tpot = next(d for s in cmp.stages for d in s.metrics if s.stage == "hf-fp16" and d.metric == "tpot_p50")
    assert tpot.baseline == pytest.approx(f.recorded, rel=1e-12)  # compare judges the figure the report shows
    assert tpot.new == pytest.approx(stage_figure(new.stage("hf-fp16"), "tpot_p50").recorded, rel=1e-12)


def test_a_figure_recorded_once_a_run_is_that_value():
    run = load_run(SERVING)
    serve = run.stage("vllm-serve")
    cap = stage_figure(serve, "capacity_rps")
    assert cap.value == serve.facts.slo_capacity_rps and cap.unit == "req/s" and cap.n_repeats == 0
    assert cap.interval == tuple(serve.facts.slo_capacity_interval)
    mem = stage_figure(serve, "peak_memory")
    assert mem.unit == "GB" and mem.interval is None and mem.value == pytest.approx(mem.recorded / 1e9)
    one = stage_figure(serve, "tpot_p50")  # one repeat: its figure, no interval over repeats
    assert one.n_repeats == 1 and one.interval is None
    assert one.value == pytest.approx(statistics.median(v for v in serve.samples.tpot_s if v is not None) * 1e3, rel=1e-12)
