"""What to deploy (analysis/recommend/choose.py, analysis/recommend/rejudge.py) on constructed runs whose answer
is known by construction, and on the committed H200 run: nothing meets the SLO (and by how
much the nearest misses), the quality gate rules out the fastest, another SLO re-judges the
measured points, each priority picks by its own figure; and re-judging under a run's own SLO
gives the verdicts analysis/slo.judge gives on the same requests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from llmopt_bench.analysis import metrics as M
from llmopt_bench.analysis.recommend.choose import recommend
from llmopt_bench.analysis.recommend.rejudge import judge_point, rejudge
from llmopt_bench.analysis.recommend.text import lines
from llmopt_bench.analysis.slo import judge
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import QualityRecord, RequestSample, SLOPoint, StageFacts
from llmopt_bench.core.results import LoadInfo, RunResult, StageMetrics, StageResult, load_run
from llmopt_bench.core.slo import parse_slo
from llmopt_bench.core.workload import WorkloadConfig

ROOT = Path(__file__).resolve().parents[2]
SLO = "ttft_p99=2s,tpot_p99=100ms"


def point(rate: float, ttft: float, tpot: float, n: int = 10, failed: int = 0) -> SLOPoint:
    """n requests that all have this TTFT and TPOT (so every percentile is that value)."""
    return SLOPoint(rate_rps=rate, window_s=n / rate, requests=n + failed, failed=failed, ttft_s=[ttft] * n, tpot_s=[tpot] * n,
                    e2e_s=[ttft + 9 * tpot] * n, itl_s={"p50": tpot, "p90": tpot, "p99": tpot})


def served(name: str, points: list[SLOPoint], *, tpot1: float = 0.01, weights: float = 1e9, regression: bool | None = False,
           devices: int = 1, energy: float | None = None, held: bool | None = True) -> StageResult:
    ok = [p.rate_rps for p in points if judge_point(p, parse_slo(SLO), 0.01).ok]
    fail = [p.rate_rps for p in points if p.rate_rps > max(ok, default=0) and not judge_point(p, parse_slo(SLO), 0.01).ok]
    facts = StageFacts(batch1_tpot_s=tpot1, batch1_ttft_s=0.02, slo=SLO, slo_max_failure_rate=0.01,
                       slo_capacity_rps=max(ok) if ok else None, slo_capacity_interval=[max(ok) if ok else None, min(fail) if fail else None],
                       goodput_rps=max(ok) if ok else None, slo_points=points, devices=devices, serve_command=f"vllm serve m --name {name}",
                       slo_capacity_held=held if ok else None, slo_hold_s=60.0 if held else None)
    quality = QualityRecord(perplexity=10.0 * (1.05 if regression else 1.0), quality_regression=regression,
                            gate="perplexity within 1% of hf's" if regression is not None else None)
    from llmopt_bench.core.results import EnergyRecord

    return StageResult(name=name, stage="serve-x", status="ok", own_workload=True, facts=facts, quality=quality,
                       metrics=StageMetrics(requests=10, output_tokens=100, prompt_tokens=100, repeats=1),
                       load=LoadInfo(weights_bytes=int(weights)),
                       energy=EnergyRecord(joules=1, seconds=1, joules_per_output_token=energy) if energy else None)


def run_of(*stages: StageResult) -> RunResult:
    return RunResult(run_id="t", created_at="now", command="test", workload=WorkloadConfig(), stages=list(stages))


def curve(capacity: float, step: float = 1.0) -> list[SLOPoint]:
    """Points at 1..6 x step req/s: TTFT grows past 2 s above `capacity`."""
    return [point(r, 0.5 if r <= capacity else 3.0, 0.05) for r in (step * k for k in range(1, 7))]


def test_the_highest_capacity_wins_and_the_runner_up_is_next():
    rec = recommend(run_of(served("a", curve(3)), served("b", curve(5)), served("c", curve(2))))
    assert (rec.winner.name, rec.runner_up.name) == ("b", "a")
    assert rec.winner.capacity_rps == 5 and rec.command == "vllm serve m --name b"
    assert any(t.startswith("Capacity: b 5.00 req/s") for t in rec.tradeoffs)
    text = "\n".join(lines(rec))
    assert "Deploy **b**" in text and "vllm serve m --name b" in text


def test_a_held_capacity_is_the_only_one_ranked_on_capacity():
    rec = recommend(run_of(served("short", curve(5), held=None), served("held", curve(3)), served("failed", curve(4), held=False)))
    assert rec.winner.name == "held" and rec.runner_up is None and rec.basis == "capacity"
    assert rec.winner.deployable_rps == 3 and rec.candidates[0].deployable_rps is None
    text = "\n".join(lines(rec))
    assert "It carries 3.00 req/s, held, known within 33.3% ([3.00, 4.00])" in text
    assert ("Not ranked on a held capacity: short (capacity ~5.00 req/s, not held, known within 20.0% ([5.00, 6.00])); "
            "failed (capacity ~4.00 req/s, not held") in text


def test_a_run_without_a_held_capacity_offers_none():
    """The unheld capacities are shown as such, never what a configuration carries: throughput
    ranks on what else was measured alike (here nothing), cost has no figure at all."""
    run = run_of(served("a", curve(3), held=None), served("b", curve(5), held=False))
    for priority in ("throughput", "cost"):
        rec = recommend(run, priority=priority)
        assert rec.winner is None and "nothing to recommend" in rec.verdict
        assert any(m.startswith("A held capacity under the SLO") and "a, b were searched" in m for m in rec.missing)
    for s in run.stages:
        s.facts.saturated_tok_s, s.facts.saturated_how = {"a": 900.0, "b": 700.0}[s.name], "throughput point (all requests at once)"
    rec = recommend(run)
    assert rec.winner.name == "a" and rec.basis == "saturated"  # a's capacity is lower, but neither is offered
    assert "What it carries under ttft_p99=2s,tpot_p99=100ms is not known: its search's ~3.00 req/s was not held" in rec.verdict
    assert "It carries" not in rec.verdict


def test_a_failed_hold_outweighs_the_short_trials_at_its_rate_and_above():
    pts = [point(r, 0.5, 0.05) for r in (1, 2, 3, 4, 5)]
    pts[3] = pts[3].model_copy(update={"hold": True, "steady": False, "steady_reason": "not steady: completions 3.1/s for 4.0/s arriving"})
    pts.append(point(3, 0.5, 0.05).model_copy(update={"hold": True, "steady": True}))
    judged = rejudge(pts, parse_slo(SLO), 0.01)
    assert judged.capacity_rps == 3 and judged.interval == [3, 4] and judged.held is True
    miss = next(p for p in judged.points if p.rate_rps == 4)
    assert miss.ok is False and miss.reason == "not steady: completions 3.1/s for 4.0/s arriving" and miss.worst is None
    assert any("the hold at 4 req/s missed" in n for n in judged.notes)
    # the short trials alone (a run from before holds: no steady verdict, no hold) say 5
    old = rejudge([point(r, 0.5, 0.05) for r in (1, 2, 3, 4, 5)], parse_slo(SLO), 0.01)
    assert old.capacity_rps == 5 and old.held is None


def test_the_quality_gate_rules_out_the_fastest():
    rec = recommend(run_of(served("fast", curve(6), regression=True), served("good", curve(3)), served("ok", curve(2))))
    assert rec.winner.name == "good" and rec.runner_up.name == "ok"
    assert rec.ruled_out == ["fast: fails the quality gate"]
    assert "Ruled out (under every priority): fast: fails the quality gate." in "\n".join(lines(rec))


def test_nothing_meets_the_slo_and_the_nearest_miss_is_said():
    slow = [point(r, 2.5, 0.05) for r in (1, 2)]  # TTFT p99 2.5 s: 25% over 2 s
    slower = [point(r, 3.0, 0.2) for r in (1, 2)]  # TPOT 200 ms: 100% over
    rec = recommend(run_of(served("slow", slow), served("slower", slower)))
    assert rec.winner is None and rec.command is None
    assert "No result meets the SLO" in rec.verdict and "The nearest, slow, misses by 25%" in rec.verdict
    assert "ttft_p99 2500.0 ms > 2000 ms" in rec.verdict


def test_another_slo_rejudges_the_measured_points():
    # TTFT 0.5 s at 1-3 req/s, 1.5 s at 4-5, 3 s at 6: the run's SLO (2 s) holds to 5 req/s
    pts = [point(r, t, 0.05) for r, t in ((1, 0.5), (2, 0.5), (3, 0.5), (4, 1.5), (5, 1.5), (6, 3.0))]
    run = run_of(served("a", pts))
    assert recommend(run).winner.capacity_rps == 5
    rec = recommend(run, slo=parse_slo("ttft_p99=1s,tpot_p99=100ms"))
    a = rec.candidates[0]
    assert a.capacity_rps == 3 and a.interval == [3, 4]
    assert a.capacity_status == "not held" and rec.winner is None  # short trials re-judged: no hold at 3 req/s
    assert "re-judged from the measured open-loop points" in rec.slo_note and "ttft_p99=2s" in rec.slo_note
    loose = recommend(run, slo=parse_slo("ttft_p99=10s")).candidates[0]
    assert loose.interval == [6, None] and any("at least that" in n for n in loose.notes)
    assert recommend(run, slo=parse_slo("ttft_p99=100ms")).candidates[0].capacity_rps is None
    # a hold that met the re-judged SLO at its rate: held, offered
    run.stages[0].facts.slo_points.append(point(3, 0.5, 0.05).model_copy(update={"hold": True, "steady": True}))
    held = recommend(run, slo=parse_slo("ttft_p99=1s,tpot_p99=100ms"))
    assert held.winner.name == "a" and held.winner.deployable_rps == 3


def test_a_point_whose_client_fell_behind_is_not_judged():
    # 6 req/s meets the SLO on its figures, but 3 of its 10 requests were still unsent when its
    # window closed: the server saw less than 6 req/s, so it says nothing about 6 (5% allowed)
    pts = [point(r, 0.5, 0.05) for r in (2, 4, 6)]
    pts[1].queued_at_end, pts[2].queued_at_end = 0, 3
    judged = rejudge(pts, parse_slo(SLO), 0.01)
    assert [p.ok for p in judged.points] == [True, True, None]
    assert judged.capacity_rps == 4 and judged.interval == [4, None]
    assert "client fell behind" in judged.points[2].reason and any("client fell behind" in n for n in judged.notes)
    # a miss under less load than asked is still a miss
    tight = rejudge(pts, parse_slo("ttft_p99=100ms"), 0.01)
    assert [p.ok for p in tight.points] == [False, False, False] and tight.capacity_rps is None


def test_failures_count_against_a_point():
    pts = [point(1, 0.5, 0.05), point(2, 0.5, 0.05, n=10, failed=1)]  # 1 of 11 failed: 9% > 1%
    judged = rejudge(pts, parse_slo(SLO), 0.01)
    assert judged.capacity_rps == 1 and judged.interval == [1, 2]
    assert "1 of 11 requests failed" in judged.points[1].reason


@pytest.mark.parametrize("priority,winner", [("latency", "quick"), ("memory", "small"), ("cost", "cheap"), ("throughput", "big")])
def test_each_priority_ranks_by_its_own_figure(priority, winner):
    rec = recommend(run_of(served("big", curve(6), devices=4), served("quick", curve(2), tpot1=0.002, devices=1),
                           served("small", curve(2), weights=1e8), served("cheap", curve(5), devices=1)), priority=priority)
    assert rec.winner.name == winner


def test_a_bad_priority_is_a_usage_error():
    with pytest.raises(UsageError) as e:
        recommend(run_of(served("a", curve(3))), priority="speed")
    assert "latency" in e.value.fix


def test_random_weights_are_a_caveat():
    s = served("a", curve(3), regression=None)
    s.quality = QualityRecord(perplexity_meaningful=False, perplexity_note="random weights: perplexity is not meaningful")
    rec = recommend(run_of(s))
    assert rec.winner.quality == "not judged (random weights)"
    assert any(m.startswith("Quality: the weights are random, so the quality gate judges no configuration") for m in rec.missing)


def _samples(seed: int, n: int = 40) -> list[RequestSample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t0, ttft = rng.random(), rng.uniform(0.05, 3.0)
        times = [t0 + ttft]
        for _ in range(7):
            times.append(times[-1] + rng.uniform(0.01, 0.2))
        out.append(RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=4, output_tokens=8, t_submit=t0,
                                 t_first=times[0], t_done=times[-1], token_times=times, ok=rng.random() > 0.02))
    return out


# limits near the constructed requests' own percentiles: some seeds meet them, others miss
@pytest.mark.parametrize("slo", ["ttft_p99=2.93s,tpot_p99=145ms", "ttft_p90=2.7s", "tpot_p50=105ms,e2e_p95=3.6s", "itl_p90=180ms"])
def test_rejudging_agrees_with_the_stage_s_own_judge(slo):
    outcomes = set()
    for seed in range(20):
        samples = _samples(seed)
        ok = [s for s in samples if s.ok]
        itl = [g for s in ok for g in M.itls(s)]
        from llmopt_bench.core.distribution import Distribution

        d = Distribution.of(itl)
        busy = max(s.t_done for s in ok) - min(s.t_submit for s in ok)  # the window a run keeps (load/record.slo_point)
        pt = SLOPoint(rate_rps=1, window_s=busy, requests=len(samples), failed=len(samples) - len(ok),
                      ttft_s=[M.ttft(s) for s in ok], tpot_s=[M.tpot(s) for s in ok], e2e_s=[M.e2e(s) for s in ok],
                      itl_s={"p50": d.p50, "p90": d.p90, "p99": d.p99})
        mine, theirs = judge_point(pt, parse_slo(slo), 0.05), judge(parse_slo(slo), samples, 0.05)
        assert mine.ok == theirs.ok, (seed, mine.reason, theirs.reason)
        outcomes.add(mine.ok)
        assert mine.goodput_rps == pytest.approx(theirs.goodput_rps)  # one goodput, ITL targets included
    assert outcomes == {True, False}  # the limits sit where the verdict changes


def test_the_committed_h200_run_is_ranked_on_what_it_measured():
    run = load_run(ROOT / "results" / "h200")
    rec = recommend(run)
    assert not rec.serving and "no configuration in this run measured a capacity under an SLO" in rec.slo_note
    assert {c.name for c in rec.candidates} == {"awq-int4", "vllm", "vllm-fp8"}  # vLLM's engine on the fixed workload
    fixed = {c.name: run.stage(c.name).metrics.output_tok_s for c in rec.candidates}
    assert rec.basis == "fixed" and rec.winner.name == max(fixed, key=fixed.get)
    latency = recommend(run, priority="latency")
    assert latency.winner.batch1_tpot_s == min(c.batch1_tpot_s for c in latency.candidates if c.batch1_tpot_s)
    assert any(m.startswith("The `vllm serve` line of awq-int4, vllm, vllm-fp8") for m in rec.missing)


# --- issue 28: what recommend says, and what it weighs -------------------------------------------

def test_a_config_fast_at_batch_1_that_misses_the_slo_everywhere_does_not_win_latency():
    misses = [point(r, 3.0, 0.05) for r in (1, 2, 3)]  # TTFT 3 s > 2 s at every rate
    rec = recommend(run_of(served("quick", misses, tpot1=0.001), served("slow", curve(3), tpot1=0.01)), priority="latency")
    assert rec.winner.name == "slow" and rec.runner_up is None


def test_overlapping_capacity_intervals_are_not_a_winner():
    # a: capacity 3 (fails at 6: [3, 6)), b: capacity 2 (fails at 4: [2, 4)): the true capacities may be equal
    a = served("a", [point(1, 0.5, 0.05), point(3, 0.5, 0.05), point(6, 3.0, 0.05)])
    b = served("b", [point(1, 0.5, 0.05), point(2, 0.5, 0.05), point(4, 3.0, 0.05)])
    rec = recommend(run_of(a, b))
    assert not rec.distinct and (rec.winner.name, rec.runner_up.name) == ("a", "b")
    assert rec.verdict.startswith("No single winner on throughput: a and b cannot be told apart")
    assert "Deploy" not in rec.verdict and not any("%)" in t for t in rec.tradeoffs if t.startswith("Capacity"))
    # b failing at 2.5: [2, 2.5) lies below a's [3, 6), a is the better one
    b2 = served("b", [point(1, 0.5, 0.05), point(2, 0.5, 0.05), point(2.5, 3.0, 0.05)])
    apart = recommend(run_of(a, b2))
    assert apart.distinct and apart.verdict.startswith("Deploy a:") and any("(+50%)" in t for t in apart.tradeoffs)


def test_the_verdict_says_what_the_quality_gate_judged():
    judged = recommend(run_of(served("a", curve(3)), served("b", curve(2))))
    assert "among the deployable configurations that pass the quality gate" in judged.verdict
    unjudged = [served(n, curve(c), regression=None) for n, c in (("a", 3), ("b", 2))]
    for s in unjudged:
        s.quality = QualityRecord(perplexity_meaningful=False, perplexity_note="random weights: perplexity is not meaningful")
    rec = recommend(run_of(*unjudged))
    assert "pass the quality gate" not in rec.verdict
    assert "the quality gate judged none of them: random weights" in rec.verdict


def offline(name: str, weights: float, match: float | None, *, reference: bool = False, share: float | None = None,
            tok_s: float = 10.0, engine: str = "vllm") -> StageResult:
    """A fixed-workload result on random weights: no perplexity, a token match with the reference."""
    return StageResult(name=name, status="ok", quality_reference=reference,
                       load=LoadInfo(weights_bytes=int(weights), implementation={"engine": engine}),
                       params={"gpu_memory_utilization": share} if share else {},
                       quality=QualityRecord(perplexity_meaningful=False, perplexity_note="random weights: no perplexity",
                                             token_match_rate=match),
                       metrics=StageMetrics(requests=4, output_tokens=64, prompt_tokens=40, repeats=2, output_tok_s=tok_s))


def test_memory_ranks_on_weights_and_random_weights_judge_no_quality():
    """Issue 46: on random weights the quality gate judges nothing, so no configuration is passed
    over "for quality" on its token match (bnb-nf4 matched 0.78% of the reference's tokens on the
    H200, on weights nobody serves): the smallest weights win, not judged, under every priority."""
    run = run_of(offline("hf-fp16", 2.7e8, 1.0, reference=True, engine="transformers"), offline("vllm", 2.7e8, 0.99),
                 offline("vllm-fp8", 1.6e8, 0.23), offline("awq-int4", 1.1e8, None))
    rec = recommend(run, priority="memory")
    assert rec.winner.name == "awq-int4" and rec.runner_up.name == "vllm-fp8"
    assert "passed over" not in " ".join(lines(rec)) and "token match" not in " ".join(lines(rec))
    assert {c.quality for c in rec.candidates} == {"not judged (random weights)"}
    assert [r.name for r in rec.references] == ["hf-fp16"]


def test_the_gpu_memory_utilization_sentence_belongs_to_stages_that_have_it():
    run = run_of(offline("vllm", 2.7e8, 1.0, tok_s=5), offline("awq-int4", 1.6e8, 0.995, tok_s=4))
    memory = next(t for t in recommend(run, priority="memory").tradeoffs if t.startswith("Memory:"))
    assert "gpu_memory_utilization" not in memory  # neither recorded a share
    run.stages.append(offline("vllm-fp8", 2.7e8, 0.999, share=0.9, tok_s=50))
    memory = next(t for t in recommend(run).tradeoffs if t.startswith("Memory:"))
    assert "vllm-fp8 takes 90% of the card (gpu_memory_utilization)" in memory


def test_a_fixed_workload_figure_is_not_called_saturated():
    rec = recommend(run_of(offline("vllm", 2.7e8, 1.0, tok_s=7.2)))
    assert "saturated output throughput" not in rec.verdict
    assert "the highest output throughput on the fixed workload (not a saturated figure), 7.20 tok/s" in rec.verdict


def test_a_saturated_figure_and_a_fixed_workload_one_make_no_ratio():
    """The re-rendered H200 report said continuous-batching's throughput point was +3641% over
    vllm-fp8's fixed workload: two different measurements, no ratio between them."""
    s, t = served("vllm-serve", curve(3)), served("vllm-serve-fp8", curve(2), weights=5e8)
    s.facts.saturated_tok_s, s.facts.saturated_how = 10974.0, "throughput point (all requests at once)"
    t.facts.saturated_tok_s, t.facts.saturated_how = 293.0, "top of the closed-loop sweep (concurrency 16)"
    rec = recommend(run_of(s, t), priority="memory")
    line = next(t for t in rec.tradeoffs if t.startswith("Throughput:"))
    assert "(measured two ways: no ratio)" in line and "%)" not in line
    # ranked on throughput, only one kind is: the other is named as measured another way
    assert recommend(run_of(s, t), slo=parse_slo("ttft_p99=10s")).not_ranked[0].startswith(
        "vllm-serve-fp8 (its saturated figure was measured another way")
    both_fixed = recommend(run_of(offline("vllm", 1.3e10, 0.99, tok_s=38.5), offline("vllm-fp8", 7.4e9, 0.99, tok_s=293)))
    assert any(t.startswith("Throughput:") and "(+661%)" in t for t in both_fixed.tradeoffs)


def test_the_terminal_gets_no_markdown_and_a_cache_path_it_can_use(monkeypatch, capsys):
    from llmopt_bench.cli.recommend import local_command, print_lines

    rec = recommend(run_of(served("a", curve(3)), served("b", curve(2))))
    assert "Deploy **a**" in "\n".join(lines(rec))  # the report: markdown
    monkeypatch.setenv("COLUMNS", "80")
    print_lines(lines(rec, markdown=False), rec.command)
    assert "**" not in capsys.readouterr().out
    monkeypatch.delenv("LLMOPT_CACHE", raising=False)
    monkeypatch.setenv("HOME", "/home/u")
    assert local_command("vllm serve $LLMOPT_CACHE/models/m --dtype float16") == "vllm serve ~/.cache/llmopt/models/m --dtype float16"
    monkeypatch.setenv("LLMOPT_CACHE", "/data/llmopt")
    assert local_command("vllm serve $LLMOPT_CACHE/models/m") == "vllm serve $LLMOPT_CACHE/models/m"
