"""Speedups and claims against the baseline carry their interval over the repeats, and the report
says when the baseline is host-bound (issue 25), on the committed H200 journey: hf-fp16's TPOT
repeats at 21, 33 and 24 ms make "vllm 5.7x" an interval of about 3-10x: with three repeats, t on 2
degrees of freedom (4.30) is the width, whatever the statistic (docs/regression.md, "Which
statistic"); the stopping rule is what narrows it, by running more."""

from __future__ import annotations

from gatekit import BASELINE, load, repeats_run

from llmopt_bench.analysis.narrative.conclusions import conclusions
from llmopt_bench.analysis.selectors import speedup_rows
from llmopt_bench.analysis.speedup_interval import speedup_interval
from llmopt_bench.core.results import RunResult, load_run
from llmopt_bench.render.hooks import collect_claims


def test_each_speedup_against_the_baseline_has_its_interval():
    run = load_run(BASELINE)
    rows = {r.stage: r for r in speedup_rows(run)}
    lo, hi = rows["vllm"].tpot_x_baseline_interval
    assert lo < rows["vllm"].tpot_x_baseline < hi and 2.5 < lo and hi < 12
    assert rows["hf-fp16"].tpot_x_baseline_interval is None  # the baseline against itself
    # one repeat a side: only the requests' scatter, and it says so
    single = RunResult.model_validate(repeats_run(load(BASELINE), [0]))
    assert not speedup_interval(single.stage("vllm"), single.stage("hf-fp16")).between_repeats


def test_the_claims_and_conclusions_carry_the_interval_and_the_host_caveat():
    run = load_run(BASELINE)
    claims = {c.key: c for c in collect_claims(run)}
    vllm = claims["vllm-latency"]
    # the claim's figure is the conclusions' and the Speedups table's: one ratio of the two stages' figures
    assert vllm.measured.startswith("5.68x [") and "95% interval over the repeats" in vllm.detail
    assert "hf-fp16 is host-bound: the ratio depends on this host's CPU" in vllm.detail
    assert "it reaches the 12x the claim is held at, another run may hold it" in claims["overall"].detail
    said = conclusions(run, list(claims.values()))
    assert any(c.startswith("TPOT speedups against hf-fp16 with their 95% intervals over the repeats: ") and "vllm 5.68x [3.28-9.83x]" in c
               for c in said)
    assert any(c.startswith("The baseline hf-fp16 is host-bound (roofline: decode overhead-bound") and
               "depends on this host's CPU" in c for c in said)
