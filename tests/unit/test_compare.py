"""analysis/gate/compare.py on real runs only: the committed H200 journey (and runs holding one of its
repeats), the H200 continuous-batching run of another session, and 12 independent CPU runs
(results/cpu/gate-calibration). A slowdown is a shift of a whole run (tests/gatekit.py)."""

from __future__ import annotations

import copy
import itertools

import pytest
from gatekit import (
    BASELINE,
    CPU_RUNS,
    H200,
    H200_BATCHING,
    load,
    only_stages,
    repeats_run,
)

from llmopt_bench.analysis.gate import compare as C
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.results import RunResult


def run(raw: dict) -> RunResult:
    return RunResult.model_validate(raw)


@pytest.fixture(scope="module")
def journey() -> dict:
    return load(BASELINE)


@pytest.fixture(scope="module")
def cpu_runs() -> list[RunResult]:
    assert len(CPU_RUNS) == 12, CPU_RUNS
    return [run(load(p)) for p in CPU_RUNS]


def deltas(cmp: C.Comparison, stage: str) -> dict[str, C.MetricDelta]:
    return {d.metric: d for d in next(s for s in cmp.stages if s.stage == stage).metrics}


def test_one_repeat_of_a_run_against_another_is_not_a_regression(journey):
    """The issue's case: hf-fp16's repeats give TPOT p50 21.3 / 32.7 / 24.0 ms in one run; the
    request bootstrap read repeat 0 -> repeat 1 as a +53% regression."""
    rep = [run(repeats_run(journey, [k])) for k in range(3)]
    for a, b in itertools.permutations(range(3), 2):
        cmp = C.compare_runs(rep[a], rep[b])
        assert cmp.regressions == [], (a, b, cmp.regressions)
    tpot = deltas(C.compare_runs(rep[0], rep[1]), "hf-fp16")["tpot_p50"]
    assert tpot.change == pytest.approx(32.7 / 21.3 - 1, abs=0.01) and tpot.verdict == "inconclusive"
    assert "not judged: one repeat per side" in tpot.method and tpot.mde is None  # nothing shows the run-to-run noise


def test_the_baseline_against_itself_and_each_of_its_repeats(journey):
    same = C.compare_runs(run(journey), run(journey))
    assert same.regressions == [] and same.improvements == [] and same.incomplete == []
    assert all(d.ratio == pytest.approx(1) for s in same.stages for d in s.metrics)
    # no change at all, yet host-bound hf-fp16's 3 repeats (TPOT 21.3 / 32.7 / 24.0 ms) cannot show it
    assert deltas(same, "hf-fp16")["tpot_p50"].verdict == "inconclusive" and deltas(same, "vllm")["tpot_p50"].verdict == "unchanged"
    for k in range(3):
        cmp = C.compare_runs(run(journey), run(repeats_run(journey, [k])))
        assert cmp.regressions == [] and cmp.incomplete == [], (k, cmp.regressions)


def test_an_interval_reaching_past_the_threshold_is_never_unchanged(journey):
    """Issue 33's first defect: vllm-fp8's TTFT +4.5% with an interval of -34.7% ... +67.5% read
    "unchanged". Every row of the committed H200 journey against itself and against each of its
    repeats: unchanged exactly when the whole interval lies within +-threshold, regressed or
    improved only when it lies wholly beyond, and inconclusive otherwise, with the repeats that
    would settle it."""
    base = run(journey)
    rows = [d for other in (base, *(run(repeats_run(journey, [k])) for k in range(3)), run(repeats_run(journey, [0, 2])))
            for s in C.compare_runs(base, other).stages for d in s.metrics if d.ci]
    within = [d for d in rows if 1 - d.threshold <= d.ci[0] and d.ci[1] <= 1 + d.threshold]
    assert within and all(d.verdict == "unchanged" for d in within)
    across = [d for d in rows if d not in within]
    assert len(across) > 20 and all(d.verdict == "inconclusive" for d in across), [(d.metric, d.ci, d.verdict) for d in across]
    assert all(d.settle_repeats is None or d.settle_repeats >= 2 for d in across)
    assert any(d.settle_repeats for d in across)


def test_independent_cpu_runs_judged_with_their_history_rarely_raise_a_false_alarm(cpu_runs):
    """All 132 ordered pairs of 12 independent runs of one command on a shared 2-core host whose
    load rose during the hour (run TPOT p50 from 26 to 474 ms). The other runs as the history
    give the whole-run spread that one run cannot show: false alarms within the 5% target (the
    request bootstrap flagged 37 of the TPOT pairs, the repeats alone 14: docs/regression.md)."""
    for key in ("tpot_p50", "ttft_p50"):
        alone = with_history = 0
        for i, j in itertools.permutations(range(12), 2):
            a, b = cpu_runs[i].stage("hf-fp16"), cpu_runs[j].stage("hf-fp16")
            past = C.fingerprint_values([r for k, r in enumerate(cpu_runs) if k != j], a, key)
            alone += C.compare_metric(key, a, b, 0.05).verdict == "regressed"
            with_history += C.compare_metric(key, a, b, 0.05, history=past).verdict == "regressed"
        assert with_history / 132 <= 0.05, (key, with_history, alone)


def test_two_h200_sessions_agree_and_a_whole_run_slowdown_is_caught():
    """continuous-batching measured in two device sessions; the second slowed as a whole. The
    second session ran without the phases that follow the compared load sweep (capacity probes,
    static replay, the mixed-length point): as recorded, the pair is not comparable (issue 28:
    its peak memory is another measurement); with those params aligned, its sweep is."""
    a = run(only_stages(load(H200), ["continuous-batching"]))
    b_raw = load(H200_BATCHING)
    as_recorded = C.compare_runs(a, run(b_raw)).stages[0]
    assert as_recorded.state == "not comparable" and as_recorded.metrics == []
    assert as_recorded.note == "params differ (capacity True vs False; mixed 'auto' vs 'off'; static_replay True vs False)"
    b_raw["stages"][0]["params"] = a.stage("continuous-batching").params
    same = deltas(C.compare_runs(a, run(b_raw)), "continuous-batching")
    assert all(same[k].verdict in ("unchanged", "inconclusive") for k in ("ttft_p50", "tpot_p50", "e2e_p50", "output_tok_s"))
    slow = deltas(C.compare_runs(a, run(repeats_run(b_raw, [0, 1, 2], factor=1.2))), "continuous-batching")
    for k in ("tpot_p50", "e2e_p50", "output_tok_s"):
        assert slow[k].verdict == "regressed", (k, slow[k].ratio, slow[k].ci)
        assert slow[k].mde < 0.2  # the pair could see it, and says so


def test_the_detectable_change_is_where_the_verdict_turns(journey):
    """A whole-run slowdown of the stage's own repeats by (1 + mde) is flagged; by a hair less
    than (1 + threshold) x exp(t x SE) it is not (the interval's width is the same: only the
    point moves)."""
    base = run(journey)
    for stage in ("hf-fp16", "vllm", "bnb-nf4"):
        d = deltas(C.compare_runs(base, base), stage)["tpot_p50"]
        edge = (1 + d.threshold) * d.ci[1]  # ci of an identical pair is exp(+-t SE)
        assert d.mde > edge - 1
        caught = deltas(C.compare_runs(base, run(repeats_run(journey, [0, 1, 2], 1 + d.mde))), stage)["tpot_p50"]
        missed = deltas(C.compare_runs(base, run(repeats_run(journey, [0, 1, 2], edge * 0.99))), stage)["tpot_p50"]
        assert caught.verdict == "regressed" and missed.verdict in ("inconclusive", "unchanged"), stage
    noisy, steady = (deltas(C.compare_runs(base, base), s)["tpot_p50"].mde for s in ("hf-fp16", "vllm"))
    assert noisy > 0.5 and steady < 0.1  # host-bound hf-fp16 needs many more repeats than vLLM


def test_one_repeat_throughput_is_the_windowed_figure(journey):
    """16 requests in flight: per-request tokens / E2E is a twentieth of the stage's throughput."""
    one = run(repeats_run(only_stages(journey, ["continuous-batching"]), [1]))
    st = one.stage("continuous-batching")
    d = deltas(C.compare_runs(one, one), "continuous-batching")["output_tok_s"]
    assert d.baseline == pytest.approx(st.metrics.output_tok_s) == pytest.approx(st.metrics.output_tok_s_repeats[0])
    assert d.baseline > 10 * sum(st.samples.output_tokens) / sum(st.samples.e2e_s)


def test_history_gives_the_baseline_its_noise(cpu_runs):
    a, b, earlier = cpu_runs[-2], cpu_runs[-1], cpu_runs[:-2]
    alone = deltas(C.compare_runs(a, b), "hf-fp16")
    judged = deltas(C.compare_runs(a, b, history=earlier), "hf-fp16")
    for k in ("ttft_p50", "tpot_p50", "output_tok_s"):
        assert judged[k].method == "history" and "10 runs in the history" in judged[k].noise
        assert alone[k].method == "repeats"
    assert judged["load_s"].ci is not None and alone["load_s"].ci is None  # one value per run: only the history knows its spread
    other = copy.deepcopy(earlier[0])
    other.stage("hf-fp16").params["attn_implementation"] = "sdpa"  # another stage config: not the same fingerprint
    assert C.fingerprint_values([other], a.stage("hf-fp16"), "tpot_p50") == []
    assert len(C.fingerprint_values(earlier, a.stage("hf-fp16"), "tpot_p50")) == 10
    assert C.compare_runs(a, b, history=[*earlier, b]).history_runs == 10  # the new run is not its own baseline


def test_load_time_alone_never_fails_the_gate(cpu_runs):
    """Load moves by 2.8x between runs of the same code (page cache, host load)."""
    loads = sorted(cpu_runs, key=lambda r: r.stage("hf-fp16").load_s)
    d = deltas(C.compare_runs(loads[0], loads[-1]), "hf-fp16")["load_s"]
    assert d.ratio > 2 and d.verdict == "inconclusive" and "history" in d.method


@pytest.mark.parametrize("edit, gap, allowed", [
    (lambda r: r["stages"].pop(4), "vllm: missing from the new run", {"vllm"}),
    (lambda r: r["stages"][4].update(status="error", reason="engine died", metrics=None, samples=None),
     "vllm: error in the new run (engine died)", {"vllm"}),
    (lambda r: r["stages"][4].update(status="skipped", reason="no vllm", metrics=None, samples=None),
     "vllm: skipped in the new run", {"vllm"}),
    (lambda r: r.update(status="interrupted"), "the new run is interrupted", {"run"}),
    (lambda r: r.update(stages=[]), "hf-fp16: missing from the new run", {"all"}),
])
def test_an_incomplete_new_run_is_named(journey, edit, gap, allowed):
    new = copy.deepcopy(journey)
    edit(new)
    cmp = C.compare_runs(run(journey), run(new))
    assert any(g.startswith(gap) for g in cmp.incomplete), cmp.incomplete
    assert cmp.regressions == []
    assert C.compare_runs(run(journey), run(new), allowed=allowed).incomplete == []
    if allowed != {"all"}:
        assert C.compare_runs(run(journey), run(new), allowed={"hf-fp16"}).incomplete != []  # another name relaxes nothing


def test_what_is_not_a_gap_and_what_always_is(journey):
    both = copy.deepcopy(journey)
    both["stages"][5].update(status="skipped", reason="needs Hopper", metrics=None, samples=None)
    assert C.incomplete(run(both), run(both)) == []  # skipped on both sides: the same outcome
    crashed = copy.deepcopy(journey)
    crashed["stages"][5].update(status="oom", reason="CUDA out of memory", metrics=None, samples=None)
    assert C.incomplete(run(crashed), run(crashed)) == ["vllm-fp8: oom in the new run (CUDA out of memory)"]
    extra = copy.deepcopy(journey)
    extra["stages"].append({**extra["stages"][0], "name": "hf-extra", "status": "timeout", "metrics": None, "samples": None})
    assert C.incomplete(run(journey), run(extra)) == ["hf-extra: timeout in the new run"]


@pytest.mark.parametrize("edit, what", [
    (lambda r: r["env"].update(gpu="NVIDIA A100"), "device"),
    (lambda r: r["model"].update(source="synthetic:tiny"), "model"),
    (lambda r: r["workload"].update(max_new_tokens=99), "workload"),
])
def test_mismatched_runs_are_refused_unless_forced(journey, edit, what):
    other = copy.deepcopy(journey)
    edit(other)
    with pytest.raises(UsageError) as e:
        C.compare_runs(run(journey), run(other))
    assert what in e.value.message and "--force" in e.value.fix
    assert any(what in m for m in C.compare_runs(run(journey), run(other), force=True).mismatches)


def test_more_repeats_is_the_same_measurement(journey):
    assert C.mismatches(run(journey), run(repeats_run(journey, [0, 1, 2, 0, 1, 2]))) == []


def test_parse_thresholds_and_allowed_names():
    assert C.parse_thresholds(["5%", "tpot=3%", "ttft=10,load_s=30%"]) == {"*": 0.05, "tpot_p50": 0.03, "ttft_p50": 0.10, "load_s": 0.30}
    t = C.parse_thresholds(["2%"])
    assert C.threshold_for("tpot_p50", t) == 0.02 and C.threshold_for("load_s", t) == 0.20
    for bad in (["fast"], ["tpot=x"], ["nosuch=3%"], ["-5%"]):
        with pytest.raises(UsageError):
            C.parse_thresholds(bad)
    assert C.parse_allowed(["vllm,vllm-fp8", " run "]) == {"vllm", "vllm-fp8", "run"}


def test_verdict_direction():
    assert C.change_verdict(0.8, (0.75, 0.85), 0.05, higher_is_better=True) == "regressed"
    assert C.change_verdict(1.2, (1.15, 1.25), 0.05, higher_is_better=True) == "improved"
    assert C.change_verdict(1.2, (1.15, 1.25), 0.05, higher_is_better=False) == "regressed"
    assert C.change_verdict(1.2, (0.9, 1.5), 0.05, higher_is_better=False) == "inconclusive"
    assert C.change_verdict(1.06, None, 0.05, higher_is_better=False) == "regressed"


def test_three_repeats_against_one_are_still_judged():
    """A side with one repeat borrows the other's between-repeat spread; only one repeat on BOTH
    sides leaves a change unjudged (issue 28: judging "one repeat each" with any() survived)."""
    raw = load(BASELINE)
    d = C.compare_metric("tpot_p50", run(raw).stage("vllm"), run(repeats_run(raw, [1], factor=1.2)).stage("vllm"), 0.05)
    assert d.noise == "baseline: 3 repeats; new: 8 requests (1 repeat)"
    assert d.verdict == "regressed" and "not judged" not in d.method and d.mde is not None


def test_stages_whose_params_differ_are_not_compared():
    """Other settings measure other things: never a verdict, and the comparison is not complete
    unless the stage is allowed, as `history show` calls the same pair "not comparable"."""
    base = run(load(BASELINE))
    other = load(BASELINE)
    next(s for s in other["stages"] if s["name"] == "vllm")["params"]["max_num_seqs"] = 8
    cmp = C.compare_runs(base, run(other))
    vllm = next(s for s in cmp.stages if s.stage == "vllm")
    assert vllm.state == "not comparable" and vllm.metrics == [] and vllm.note == "params differ (max_num_seqs None vs 8)"
    assert cmp.incomplete == ["vllm: not comparable, params differ (max_num_seqs None vs 8)"]
    assert C.compare_runs(base, run(other), allowed={"vllm"}).incomplete == []
