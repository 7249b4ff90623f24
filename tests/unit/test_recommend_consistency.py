"""recommend never contradicts itself and never answers above its evidence (issue 46, items 4
and 5), on the committed runs and on constructed ones: the same candidates, the same quality
verdict per candidate and the same results ruled out under every priority; no reference point
(transformers generate, a comparison on a workload of its own) ever recommended; a capacity
offered only where it was held and lies under the server's measured ceiling; cost one figure;
the report's "What to deploy" the same as `llmopt recommend`."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_recommend import curve, offline, run_of, served
from testkit import cli_in_process

from llmopt_bench.analysis.recommend.candidates import ABOVE_CEILING, HELD, served_rps
from llmopt_bench.analysis.recommend.choose import PRIORITIES, recommend
from llmopt_bench.analysis.recommend.text import lines
from llmopt_bench.core.records import SLOPoint
from llmopt_bench.core.results import load_run

ROOT = Path(__file__).resolve().parents[2]
# the committed runs a user asks first; results/h200: no serving stage; results/h200-20261204: two
# served configurations whose capacities were never held and lie above their servers' ceilings
COMMITTED = ["h200", "h200-20261204/run", "h200-20261205/prefix-caching", "cpu/20261203-smollm2-quantization",
             "h200/20261203-smollm2-quantization", "h200/20261203-transformers", "h200/20261203-batching-vllm-only"]
# what is never a configuration to deploy: transformers generate and the comparisons
REFERENCES = {"hf-fp16", "bnb-int8", "bnb-nf4", "hf-compiled", "flash-attn", "vllm-attn", "continuous-batching"}


def _answers(run_dir: str) -> dict:
    run = load_run(ROOT / "results" / run_dir)
    return {p: recommend(run, priority=p) for p in PRIORITIES}


@pytest.mark.parametrize("run_dir", COMMITTED)
def test_one_answer_under_every_priority(run_dir):
    answers = _answers(run_dir)
    for p, r in answers.items():
        assert r.winner is None or r.winner.name not in REFERENCES, (p, r.winner.name)
        assert not {c.name for c in r.candidates} & REFERENCES, (p, [c.name for c in r.candidates])
        text = " ".join(lines(r, markdown=False))
        assert "for quality" not in text and "passed over" not in text, (p, text)
    seen = {p: ([c.name for c in r.candidates], {c.name: c.quality for c in r.candidates}, r.ruled_out,
                [(x.name, x.why) for x in r.references], r.missing) for p, r in answers.items()}
    assert len({repr(v) for v in seen.values()}) == 1, seen


@pytest.mark.parametrize("run_dir", ["h200", "h200-20261204/run"])
def test_random_weights_are_not_judged_for_every_candidate(run_dir):
    for p, r in _answers(run_dir).items():
        assert r.candidates and {c.quality for c in r.candidates} == {"not judged (random weights)"}, p
        assert "the quality gate judged none of them: random weights" in r.verdict or r.winner is None, (p, r.verdict)


def test_the_h200_journey_deploys_no_comparison_stage():
    """Issue 46: "Deploy continuous-batching" on throughput, hf-fp16 on memory."""
    answers = _answers("h200")
    assert {p: r.winner.name if r.winner else None for p, r in answers.items()} == \
        {"throughput": "vllm-fp8", "latency": "vllm-fp8", "memory": "awq-int4", "cost": None}
    assert answers["throughput"].basis == "fixed" and "not a saturated figure" in answers["throughput"].verdict
    assert answers["cost"].verdict.startswith("No deployable configuration has the figure the cost priority ranks on")
    refs = {r.name for r in answers["throughput"].references}
    assert refs == {"hf-fp16", "bnb-int8", "bnb-nf4", "flash-attn", "vllm-attn", "continuous-batching"}


def test_no_capacity_above_its_ceiling_is_offered():
    """results/h200-20261204: ~125 req/s "met" at FP16 and ~161 at FP8 (short trials, never held)
    where the same servers completed at most ~53 and ~70 requests a second."""
    answers = _answers("h200-20261204/run")
    for p, r in answers.items():
        assert "It carries" not in r.verdict and "carries ~" not in r.verdict, (p, r.verdict)
        assert all(c.deployable_rps is None for c in r.candidates), p
        if r.winner is not None and r.winner.served:
            assert "is not known: its search's ~" in r.verdict and "not a figure to size a deployment by" in r.verdict
    assert answers["cost"].winner is None
    cands = {c.name: c for c in answers["throughput"].candidates}
    fp16, fp8 = cands["vllm-serve"], cands["vllm-serve-fp8"]
    assert fp16.capacity_status == fp8.capacity_status == ABOVE_CEILING
    assert fp16.ceiling_rps == pytest.approx(52.8, abs=0.5) and fp8.ceiling_rps == pytest.approx(70.1, abs=0.5)


def test_a_held_capacity_above_the_recorded_ceiling_is_not_offered():
    high, low = served("high", curve(5)), served("low", curve(3))
    high.facts.saturation_rps = 4.0  # the server completed 4 a second at most: 5 "held" cannot be sustained
    for p in ("throughput", "cost"):
        rec = recommend(run_of(high, low), priority=p)
        assert rec.winner.name == "low", p
        h = next(c for c in rec.candidates if c.name == "high")
        assert h.capacity_status == ABOVE_CEILING and h.deployable_rps is None and h.gpu_s_per_request is None
        assert any(n.startswith("high (capacity ~5.00 req/s, above the server's measured ceiling of 4.00 req/s") for n in rec.not_ranked)
    low.facts.saturation_rps = 3.0  # at the ceiling: offered
    assert recommend(run_of(low)).winner.capacity_status == HELD


@pytest.mark.parametrize("priority", PRIORITIES)
def test_an_unheld_capacity_is_never_recommended_on_it(priority):
    short = served("short", curve(6), held=None, weights=5e8, tpot1=0.001)
    held = served("held", curve(2), weights=5e8, tpot1=0.001)
    rec = recommend(run_of(short, held), priority=priority)
    assert "It carries ~" not in rec.verdict and "carries ~6" not in rec.verdict, rec.verdict
    if priority in ("throughput", "cost"):
        assert rec.winner.name == "held" and rec.runner_up is None
    if rec.winner.name == "short":
        assert "What it carries under ttft_p99=2s,tpot_p99=100ms is not known" in rec.verdict


def test_cost_is_gpu_seconds_per_request_in_the_help_and_the_answer(capfd, monkeypatch):
    """Issue 46: --help said GPU-seconds per request, the answer "the least energy per output token"."""
    monkeypatch.setenv("COLUMNS", "400")
    assert cli_in_process(["recommend", "--help"]) == 0
    help_text = " ".join(capfd.readouterr().out.split())
    assert "cost (GPU-seconds per request at the held capacity" in help_text and "energy" not in help_text
    # energy would choose "frugal", GPU-seconds choose "dense": energy never decides
    frugal = served("frugal", curve(2), energy=0.1)
    dense = served("dense", curve(5), energy=0.5)
    rec = recommend(run_of(frugal, dense), priority="cost")
    assert rec.winner.name == "dense" and rec.verdict.startswith("Deploy dense: the fewest GPU-seconds per request at its held "
                                                                  "capacity, 0.2 GPU-s per request (1 GPU / 5.00 req/s)")
    assert "energy" not in rec.verdict.split("It costs:")[0]


def test_reference_points_are_never_deployed():
    batching = offline("continuous-batching", 1.3e10, None, tok_s=50.0)
    batching.own_workload = True
    batching.facts.saturated_tok_s, batching.facts.saturated_how = 10974.0, "throughput point (all requests at once)"
    hf = offline("hf-fp16", 1.3e10, 1.0, reference=True, tok_s=38.5, engine="transformers")
    hf.facts.batch1_tpot_s = 0.001  # faster than anything: still a reference point
    run = run_of(hf, offline("bnb-nf4", 3.8e9, 0.01, engine="transformers"), batching, offline("vllm", 1.3e10, 0.98, tok_s=212))
    for p in PRIORITIES:
        rec = recommend(run, priority=p)
        assert [c.name for c in rec.candidates] == ["vllm"], p
        assert rec.winner is None or rec.winner.name == "vllm", p
    text = "\n".join(lines(recommend(run)))
    assert ("Reference points, not configurations to deploy: hf-fp16, bnb-nf4 (transformers generate, not a server); "
            "continuous-batching (a comparison on a workload of its own, not one configuration).") in text
    # beside a configuration served under the SLO, the offline engine is what the server adds: whether it
    # meets the SLO is not measured, so it is not ranked against the served one, under any priority
    run.stages.append(served("vllm-serve", curve(3), weights=1.3e10))
    for p in PRIORITIES:
        rec = recommend(run, priority=p)
        assert [c.name for c in rec.candidates] == ["vllm-serve"] and rec.winner.name == "vllm-serve", p
        assert ("vllm", "vLLM's offline engine, beside the served configurations: not served under the SLO") in \
            [(r.name, r.why) for r in rec.references]
        assert any(m.startswith("Whether vllm meets the SLO: it ran on vLLM's offline engine only") for m in rec.missing)


def test_a_served_rate_is_the_output_rate_over_the_mean_output_length():
    # 100 tokens each: E2E = TTFT + 99 TPOT; 5000 output tok/s in the window is 50 requests a second
    p = SLOPoint(rate_rps=125, window_s=2, requests=4, ttft_s=[1.0] * 4, tpot_s=[0.02] * 4, e2e_s=[1.0 + 99 * 0.02] * 4,
                 output_tok_s=5000.0)
    assert served_rps(p) == pytest.approx(50.0)
    one_token = p.model_copy(update={"tpot_s": [None] * 4, "e2e_s": [1.0] * 4, "output_tok_s": 40.0})
    assert served_rps(one_token) == pytest.approx(40.0)
    assert served_rps(p.model_copy(update={"output_tok_s": None})) is None


def test_distinct_offline_figures_need_their_interval_over_the_repeats_to_exclude_1():
    a, b = offline("vllm", 1.3e10, None, tok_s=100.0), offline("vllm-fp8", 7e9, None, tok_s=101.0)
    a.metrics.output_tok_s_repeats, b.metrics.output_tok_s_repeats = [90.0, 110.0, 100.0], [91.0, 111.0, 101.0]
    rec = recommend(run_of(a, b))
    assert not rec.distinct and rec.verdict.startswith("No single winner on throughput: vllm-fp8 and vllm cannot be told apart")
    b.metrics.output_tok_s_repeats = [150.0, 151.0, 149.0]
    b.metrics.output_tok_s = 150.0
    assert recommend(run_of(a, b)).distinct


@pytest.mark.parametrize("run_dir", ["h200", "h200-20261204/run"])
def test_the_report_says_what_llmopt_recommend_says(run_dir, capfd, monkeypatch):
    """The committed report's "What to deploy" section and the command's output, line by line
    (the report's markdown bold and its note on $LLMOPT_CACHE aside)."""
    monkeypatch.setenv("COLUMNS", "100000")  # one line a paragraph: no wrapping to compare around
    monkeypatch.setenv("LLMOPT_CACHE", "/cache")  # the command keeps $LLMOPT_CACHE as the report writes it
    assert cli_in_process(["recommend", str(ROOT / "results" / run_dir)]) == 0
    said = capfd.readouterr().out.splitlines()
    report = (ROOT / "results" / run_dir / "report.md").read_text(encoding="utf-8").splitlines()
    start = report.index("## What to deploy") + 2
    end = next(i for i in range(start, len(report)) if report[i].startswith("## "))
    section = [line.replace("**", "").replace(" ($LLMOPT_CACHE: llmopt's model cache, ~/.cache/llmopt unless the variable is set)", "")
               for line in report[start:end]]
    while section and not section[-1]:
        section.pop()
    assert section == said


def test_a_simulated_server_s_held_capacity_is_offered_and_its_ceiling_estimate_agrees():
    """The serving scenario's own facts (tests/simserver.py: at most 45 requests of 20 tokens a
    second, virtual time), not hand-built ones: the held capacity is offered, under the recorded
    ceiling, and the estimate older runs get from their points reads what the server completed."""
    from test_capacity_from_ceiling import LOOSE, SERVER_RPS, serving

    from llmopt_bench.core.results import LoadInfo, StageMetrics, StageResult

    _, _, facts = serving(LOOSE)
    result = StageResult(name="served", status="ok", own_workload=True, facts=facts, load=LoadInfo(weights_bytes=10**9),
                         metrics=StageMetrics(requests=1, output_tokens=1, prompt_tokens=1, repeats=1))
    for p in PRIORITIES:
        w = recommend(run_of(result), priority=p).winner
        assert w.capacity_status == HELD and w.deployable_rps == facts.slo_capacity_rps <= facts.saturation_rps <= SERVER_RPS * 1.01
    estimated = [r for pt in facts.slo_points if (r := served_rps(pt))]
    assert estimated and max(estimated) <= SERVER_RPS * 1.02 and max(estimated) >= 0.9 * facts.slo_capacity_rps
