"""The host seen where it is (analysis/gate/host_signals.py, issue 33): each signal the repeats record
against its range in the other run, in the direction of a busier host, and what compare does
with a moved host: a verdict the host explains is "inconclusive (host)", exit 8, whichever run's
host was the busier; what the host cannot explain stands. The conditions are the issue's own
figures (CPU share 1.99 -> 1.00, preemptions 74-116 -> 812-1607 a repeat), set on the committed
H200 run's real repeats; the real neighbour is tests/integration/test_host_noise.py."""

from __future__ import annotations

import copy

from gatekit import BASELINE, load, only_stages, repeats_run

from llmopt_bench.analysis.gate import host_signals as HS
from llmopt_bench.analysis.gate import host_verdict as HV
from llmopt_bench.analysis.gate.compare import compare_runs
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.compare_text import to_markdown

QUIET = [dict(cpu_share=s, involuntary_switches=n, load1=1.2, cpus=2, wall_s=w, steal_s=0.0)
         for s, n, w in ((1.99, 74, 0.92), (1.98, 116, 0.95), (1.99, 90, 0.93))]
BUSY = [dict(cpu_share=s, involuntary_switches=n, load1=3.1, cpus=2, wall_s=w, steal_s=0.0)
        for s, n, w in ((1.00, 812, 2.9), (1.02, 1607, 3.1), (0.99, 1200, 3.0))]
SLOWER_BUILD = [dict(c, cpu_share=1.87, wall_s=c["wall_s"] * 1.2) for c in QUIET]  # 20% slower, its extra work on one thread


def test_a_busy_neighbour_moves_share_preemptions_and_load():
    moved = {m.signal: m for m in HS.moved(QUIET, BUSY)}
    assert set(moved) == {"cpu_share", "preemptions", "load1"} and all(m.busier == "new" for m in moved.values())
    assert moved["cpu_share"].text() == "CPU share 1.98-1.99 -> 0.99-1.02 (the new run's host busier)"
    assert moved["preemptions"].text().startswith("preempted 80.4-122 -> 280-518 a second")
    assert {m.signal for m in HS.moved(BUSY, QUIET)} == set(moved) and all(m.busier == "baseline" for m in HS.moved(BUSY, QUIET))


def test_what_a_slower_build_does_to_them_is_no_host_move():
    assert HS.moved(QUIET, SLOWER_BUILD) == [] and HS.moved(QUIET, QUIET) == []
    assert HS.moved(QUIET, []) == [] and HS.moved(None, BUSY) == []  # a run that did not record them


def test_counts_a_repeat_where_a_run_lacks_the_wall_time():
    old = [{k: v for k, v in c.items() if k != "wall_s"} for c in QUIET]  # recorded before wall_s
    moved = {m.signal: m for m in HS.moved(old, BUSY)}
    assert moved["preemptions"].unit == "a repeat" and moved["preemptions"].new == (812, 1607)


def pair(factor: float, base_cond: list[dict], new_cond: list[dict]) -> tuple[RunResult, RunResult]:
    """vllm (GPU-bound: the index does not weigh it) from the committed baseline, the new run's
    repeats slowed as a whole by factor, each side's repeats recording the given conditions."""
    base = only_stages(load(BASELINE), ["vllm"])
    new = repeats_run(base, [0, 1, 2], factor=factor)
    for raw, cond in ((base, base_cond), (new, new_cond)):
        raw["stages"][0]["extra"]["conditions"] = copy.deepcopy(cond)
    return RunResult.model_validate(base), RunResult.model_validate(new)


def verdict(cmp, metric="tpot_p50") -> str:
    return next(d.verdict for s in cmp.stages for d in s.metrics if d.metric == metric)


def test_a_slowdown_beside_a_busy_neighbour_is_the_hosts_not_a_regression():
    cmp = compare_runs(*pair(1.3, QUIET, BUSY))
    assert verdict(cmp) == HV.HOST_INCONCLUSIVE and cmp.regressions == []
    d = next(d for s in cmp.stages for d in s.metrics if d.metric == "tpot_p50")
    assert d.raw_verdict == "regressed"
    md = to_markdown(cmp)
    assert "Host of vllm moved: CPU share 1.98-1.99 -> 0.99-1.02 (the new run's host busier); preempted" in md
    assert verdict(cmp, "peak_memory") == "unchanged"  # memory is not the host's to explain


def test_on_the_same_host_the_slowdown_regresses_and_on_a_quieter_one_it_still_does():
    assert verdict(compare_runs(*pair(1.3, QUIET, QUIET))) == "regressed"
    assert verdict(compare_runs(*pair(1.3, QUIET, SLOWER_BUILD))) == "regressed"  # a slower build's own figures
    assert verdict(compare_runs(*pair(1.3, BUSY, QUIET))) == "regressed"  # slower on a quieter host: the build's


def test_a_busy_baseline_cannot_vouch_for_an_unchanged_run():
    """The baseline ran beside a neighbour: an unchanged (or better) new run may hide a regression."""
    cmp = compare_runs(*pair(1.0, BUSY, QUIET))
    assert verdict(cmp) == HV.HOST_INCONCLUSIVE and "(the baseline's host busier)" in to_markdown(cmp)
    assert verdict(compare_runs(*pair(1.0, QUIET, BUSY))) == "unchanged"  # no worse on a busier host: stands


def test_a_repeat_the_host_disturbed_is_flagged_against_its_own_run():
    """Round 0's first A run of the calibration (scripts/gate/gate-pairs.sh, 10 repeats): a neighbour
    came and went; its slow repeats (TPOT 23, 11, 11, 9.5 ms against 2.4) are the ones whose CPU
    share fell, and the ninth, whose share fell to 1.25 (its TPOT 2.55 ms), stands out once those
    four no longer drag the run's typical repeat down."""
    share = [0.663, 0.962, 1.926, 1.891, 1.83, 1.916, 1.089, 0.876, 1.254, 1.966]
    switches = [501, 358, 76, 86, 93, 103, 793, 754, 405, 134]
    walls = [5.3, 3.2, 0.88, 0.9, 0.87, 0.9, 3.0, 2.6, 1.3, 0.92]
    rows = [dict(cpu_share=s, involuntary_switches=n, wall_s=w) for s, n, w in zip(share, switches, walls)]
    assert [i for i, f in enumerate(HS.disturbed(rows)) if f] == [0, 1, 6, 7, 8]
    assert not any(HS.disturbed(QUIET)) and not any(HS.disturbed(SLOWER_BUILD))
    assert HS.disturbed(rows[:2]) == [False, False]  # two repeats: no typical one to stand out from
    assert not any(HS.disturbed([dict(c, wall_s=0.01, cpu_share=0.1 * i) for i, c in enumerate(QUIET)]))  # too short to say


def one_disturbed(raw: dict, rep: int, factor: float) -> dict:
    """The run with repeat `rep` slowed by factor and recorded beside a neighbour."""
    st = raw["stages"][0]
    sm = st["samples"]
    for c in ("ttft_s", "tpot_s", "e2e_s"):
        sm[c] = [v * factor if r == rep and v is not None else v for v, r in zip(sm[c], sm["repeat"])]
    st["metrics"]["output_tok_s_repeats"][rep] /= factor
    st["extra"]["conditions"][rep] = dict(BUSY[0])
    return raw


def test_compare_sets_the_disturbed_repeat_aside_and_judges_the_rest():
    base, new = pair(1.0, QUIET, QUIET)
    new = RunResult.model_validate(one_disturbed(new.model_dump(mode="json"), 1, 3.0))
    cmp = compare_runs(base, new)
    stage = cmp.stages[0]
    assert stage.set_aside == {"new": [1]} and stage.host_moved == [] and verdict(cmp) == "unchanged"
    assert "Set aside in vllm: the new run's repeat(s) 2: the host disturbed them" in to_markdown(cmp)
    cmp = compare_runs(*pair(1.0, QUIET, QUIET))  # the same run without the neighbour: nothing set aside
    assert cmp.stages[0].set_aside == {} and verdict(cmp) == "unchanged"


def test_the_stopping_rule_measures_another_repeat_in_a_disturbed_ones_place():
    from llmopt_bench.analysis.stopping import StoppingRule, stopping_sentence

    rule = StoppingRule(3, 10, 2.0, "tpot_p50")
    figures = {"tpot_p50": 0.020, "e2e_p50": 2.0, "output_tok_s": 50.0}
    stops = [rule.add_figures(dict(figures), 2.0, QUIET[0]), rule.add_figures(dict(figures), 2.0, QUIET[1]),
             rule.add_figures({k: v * 3 for k, v in figures.items()}, 6.0, BUSY[0]),
             rule.add_figures(dict(figures), 2.0, QUIET[2])]
    assert stops == [False, False, False, True] and rule.record.set_aside == [2] and rule.record.stopped == "tight"
    assert "Repeat(s) 3 not counted: the host disturbed them" in stopping_sentence(rule.record)
