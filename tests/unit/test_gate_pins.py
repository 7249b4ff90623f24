"""What a nightly job relies on in `llmopt compare`, each pinned so that breaking it fails here
(issue 46, item 7: a mutation pass over the gate left these alive). On the committed H200
journey's real repeats (tests/gatekit.py), through compare_runs and compare's one exit path
(cli/compare.exit_status), no engine: a regression outside the gated set still exits 5, --allow-missing run
accepts an unfinished run and not a missing stage, one repeat a side never settles, --pass-inconclusive
never silences the host's 8, the exit codes' precedence as docs/regression.md's table has it, a
drift declared for one baseline never applies to another, and the history really gives the noise."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from gatekit import BASELINE, load, only_stages, repeats_run
from testkit import run_cli

from llmopt_bench.analysis.gate import gate_file
from llmopt_bench.analysis.gate.baseline_drift import declared_for, load_drift
from llmopt_bench.analysis.gate.compare import compare_runs, parse_gate, parse_thresholds, parse_watch
from llmopt_bench.analysis.gate.completeness import gaps
from llmopt_bench.analysis.gate.host_verdict import HOST_INCONCLUSIVE
from llmopt_bench.cli.compare import exit_status
from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.results import RunResult


def run(raw: dict) -> RunResult:
    return RunResult.model_validate(raw)


def exit_code(cmp) -> int:
    try:
        exit_status(cmp, BASELINE, Path("new"))
    except LlmoptError as e:
        return int(e.code)
    return 0


def stage_of(raw: dict, name: str) -> dict:
    return next(s for s in raw["stages"] if s["name"] == name)


def scaled(raw: dict, name: str, factor: float, columns=("ttft_s", "tpot_s", "e2e_s"), tok_s: bool = True) -> dict:
    """The run with one stage's `columns` (each request's) times `factor`, its distributions
    recomputed, its windowed tok/s divided by it: a slower stage, measured on real repeats."""
    out = copy.deepcopy(raw)
    st = stage_of(out, name)
    for c in columns:
        st["samples"][c] = [v * factor if v is not None else None for v in st["samples"][c]]
        st["metrics"][c] = Distribution.of([v for v in st["samples"][c] if v is not None]).model_dump()
    if tok_s:
        st["metrics"]["output_tok_s_repeats"] = [v / factor for v in st["metrics"]["output_tok_s_repeats"]]
    return out


def gated_by_file(base: RunResult, new: RunResult, **kw):
    """compare as the CLI runs it on the committed baseline: its gate file's thresholds and watches."""
    gate = gate_file.load(gate_file.beside(BASELINE), BASELINE)
    return compare_runs(base, new, gate.merged({}), watch=gate.watched(), **kw)


@pytest.fixture(scope="module")
def journey() -> dict:
    return load(BASELINE)


def test_a_ttft_regression_outside_the_gated_set_still_exits_5(journey):
    """TTFT is watched, not gated: its inconclusive verdict passes, its regression never does.
    vllm-attn's TTFT (repeats within 0.2%) 1.5x slower, nothing else moved."""
    slow = scaled(journey, "vllm-attn", 1.5, columns=("ttft_s",), tok_s=False)
    for gate in (None, ["tpot"]):
        cmp = compare_runs(run(journey), run(slow), gate=parse_gate(gate))
        assert "ttft_p50" not in cmp.gate
        assert cmp.regressions == [("vllm-attn", "ttft_p50")]
        assert exit_code(cmp) == ExitCode.REGRESSION
    cmp = gated_by_file(run(journey), run(slow))
    assert cmp.regressions == [("vllm-attn", "ttft_p50")] and exit_code(cmp) == ExitCode.REGRESSION


def test_a_watched_figure_that_regressed_still_exits_5(journey):
    """hf-fp16's decode is watched by the gate file: slowed 3x it is beyond any noise of its repeats."""
    cmp = gated_by_file(run(journey), run(scaled(journey, "hf-fp16", 3.0)))
    assert ("hf-fp16", "tpot_p50") in cmp.regressions and exit_code(cmp) == ExitCode.REGRESSION
    tpot = next(d for s in cmp.stages if s.stage == "hf-fp16" for d in s.metrics if d.metric == "tpot_p50")
    assert not tpot.gated


def test_allow_missing_run_accepts_an_unfinished_run_never_a_missing_stage(journey):
    new = copy.deepcopy(journey)
    new["stages"] = [s for s in new["stages"] if s["name"] != "vllm"]
    new["status"] = "interrupted"
    found = gaps(run(journey), run(new), {"run"})
    assert [(g.stage, g.kind) for g in found] == [("vllm", "missing")]
    cmp = gated_by_file(run(journey), run(new), allowed={"run"})
    assert exit_code(cmp) == ExitCode.INCOMPLETE
    assert [(g.stage, g.kind) for g in gaps(run(journey), run(new), {"vllm"})] == [(None, "unfinished")]
    assert exit_code(gated_by_file(run(journey), run(new), allowed={"vllm"})) == ExitCode.INCOMPLETE
    assert exit_code(gated_by_file(run(journey), run(new), allowed={"run", "vllm"})) == ExitCode.OK


def test_one_repeat_a_side_never_counts_as_settled(journey):
    """vllm's one repeat against another: its requests agree to far better than 5%, but nothing
    shows the noise between runs: not judged, inconclusive, exit 9 (gated), however small the change."""
    vllm = only_stages(journey, ["vllm"])
    for picks in ([0], [1]):
        cmp = compare_runs(run(repeats_run(vllm, [0])), run(repeats_run(vllm, picks)))
        tpot = next(d for d in cmp.stages[0].metrics if d.metric == "tpot_p50")
        assert tpot.judged is False and tpot.verdict == "inconclusive" and tpot.gated
        assert tpot.ci is not None and 0.95 < tpot.ci[0] and tpot.ci[1] < 1.05  # the requests alone would say settled
        assert ("vllm", "tpot_p50") in cmp.inconclusive and exit_code(cmp) == ExitCode.INCONCLUSIVE
    three = compare_runs(run(vllm), run(repeats_run(vllm, [1])))  # 3 repeats against 1: judged, the other's spread
    assert next(d for d in three.stages[0].metrics if d.metric == "tpot_p50").judged


def with_index(raw: dict, index: dict[str, list[float]], busy: dict[str, float]) -> dict:
    """Each named stage's host-speed index per repeat (kop/s) and GPU-busy share (the committed run predates them)."""
    out = copy.deepcopy(raw)
    for s in out["stages"]:
        if s["name"] in index:
            s["extra"]["conditions"] = [{"host_kops": k, "host_device": "cuda"} for k in index[s["name"]]]
            s["facts"]["gpu_busy_share"] = busy[s["name"]]
    return out


INDEX = [140.0, 128.0, 135.0]


def precedence_runs(journey: dict, regressed: bool, gap: bool, host: bool) -> tuple[RunResult, RunResult]:
    """hf-fp16 (host-bound) and vllm, vllm-fp8 (GPU-bound) and bnb-int8 (its three repeats cannot
    settle 10%: inconclusive at the default thresholds): `regressed` vllm 1.3x slower, `gap`
    vllm-fp8 missing, `host` hf-fp16 twice as slow on a host half as fast."""
    names = ["hf-fp16", "bnb-int8", "vllm", "vllm-fp8"]
    base = with_index(only_stages(journey, names), {"hf-fp16": INDEX}, {"hf-fp16": 0.16})
    new = copy.deepcopy(base)
    if host:
        new = with_index(scaled(new, "hf-fp16", 2.0), {"hf-fp16": [k / 2 for k in INDEX]}, {"hf-fp16": 0.16})
    if regressed:
        new = scaled(new, "vllm", 1.3)
    if gap:
        new["stages"] = [s for s in new["stages"] if s["name"] != "vllm-fp8"]
    return run(base), run(new)


@pytest.mark.parametrize("regressed, gap, host, code", [
    (True, True, True, ExitCode.REGRESSION),  # 5 wins over every other
    (False, True, True, ExitCode.INCOMPLETE),  # then 6
    (False, False, True, ExitCode.HOST_INCONCLUSIVE),  # then 8
    (False, False, False, ExitCode.INCONCLUSIVE),  # then 9
])
def test_the_exit_codes_take_precedence_as_documented(journey, regressed, gap, host, code):
    cmp = compare_runs(*precedence_runs(journey, regressed, gap, host))
    assert bool(cmp.regressions) == regressed and bool(cmp.incomplete) == gap and bool(cmp.host_inconclusive) == host
    assert ("bnb-int8", "tpot_p50") in cmp.inconclusive  # always there: the weakest finding
    assert exit_code(cmp) == code


def test_pass_inconclusive_never_silences_the_hosts_exit_8(journey):
    cmp = compare_runs(*precedence_runs(journey, False, False, True), pass_inconclusive=True)
    verdict = next(d.verdict for s in cmp.stages if s.stage == "hf-fp16" for d in s.metrics if d.metric == "tpot_p50")
    assert verdict == HOST_INCONCLUSIVE and exit_code(cmp) == ExitCode.HOST_INCONCLUSIVE
    cmp = compare_runs(*precedence_runs(journey, False, False, False), pass_inconclusive=True)
    assert cmp.inconclusive and exit_code(cmp) == ExitCode.OK  # what it does pass: a gated metric left unsettled


def test_a_drift_declared_for_one_baseline_never_applies_to_another(tmp_path, journey):
    new = copy.deepcopy(journey)
    stage_of(new, "vllm")["params"]["max_num_seqs"] = 7
    drift = tmp_path / "drift.toml"
    drift.write_text('[[drift]]\nbaseline = "other-gpu-model.json"\nstage = "vllm"\nparams = ["max_num_seqs"]\n'
                     'reason = "r"\nrefresh = "f"\n')
    drifts = load_drift(drift)
    assert declared_for(drifts, BASELINE) == {}
    cmp = gated_by_file(run(journey), run(new), drift=declared_for(drifts, BASELINE))
    assert exit_code(cmp) == ExitCode.INCOMPLETE and "vllm: not comparable" in cmp.incomplete[0]
    mine = declared_for(drifts, tmp_path / "other-gpu-model.json")
    cmp = gated_by_file(run(journey), run(new), drift=mine)
    assert exit_code(cmp) == ExitCode.OK and list(cmp.accepted_drift) == ["vllm"]


def test_the_history_gives_the_baseline_its_noise_and_is_counted(journey):
    """vllm 8% slower: alone, its repeats (within 0.2%) call it a regression at 5%. Four earlier
    runs whose level moved by +-10% show that whole runs move that much: inconclusive. The
    new run itself, listed in the history, is never one of them."""
    vllm = only_stages(journey, ["vllm"])
    slow = scaled(vllm, "vllm", 1.08)
    past = [run(repeats_run(vllm, [0, 1, 2], f, run_id=f"night-{i}", created_at=f"2026-11-0{i + 1}T00:00:00+00:00"))
            for i, f in enumerate((0.9, 1.1, 0.95, 1.08))]
    alone = compare_runs(run(vllm), run(slow))
    assert alone.history_runs == 0 and alone.regressions == [("vllm", "tpot_p50"), ("vllm", "e2e_p50"), ("vllm", "output_tok_s")]
    new = run(slow)
    cmp = compare_runs(run(vllm), new, history=[*past, new])
    assert cmp.history_runs == 4 and not cmp.regressions
    tpot = next(d for d in cmp.stages[0].metrics if d.metric == "tpot_p50")
    assert tpot.method == "history" and "4 runs in the history" in tpot.noise and tpot.verdict == "inconclusive"


def test_unknown_stage_or_metric_names_are_usage_errors_listing_the_known_ones(journey):
    stages = {s["name"] for s in journey["stages"]}
    with pytest.raises(UsageError) as e:
        parse_watch(["nosuchstage:tpot"], stages)
    assert "nosuchstage" in str(e.value) and "vllm-attn" in e.value.fix and "tpot_p50" in e.value.fix
    for bad in (lambda: parse_watch(["vllm:nosuch"], stages), lambda: parse_gate(["nosuch"]),
                lambda: parse_thresholds(["nosuch=5%"])):
        with pytest.raises(UsageError) as e:
            bad()
        assert "unknown metric 'nosuch'" in str(e.value) and "tpot_p50" in e.value.fix
    assert parse_watch(["vllm:tpot,flash-attn"], stages) == {("vllm", "tpot_p50"), ("flash-attn", "*")}


def test_compare_watch_of_no_such_stage_exits_2(tmp_path):
    r = run_cli("compare", str(BASELINE), str(BASELINE), "--watch", "nosuchstage:tpot",
                env={"LLMOPT_HISTORY_DB": str(tmp_path / "none.sqlite")})
    assert r.returncode == 2 and "--watch 'nosuchstage:tpot': no stage 'nosuchstage'" in r.stderr
    assert "continuous-batching" in r.stderr and "Traceback" not in r.stderr


def test_the_history_is_the_baselines_noise_and_the_new_runs_floor(journey):
    """hf-fp16's repeats spread by 22%; four earlier runs at one level spread by 0.1%. The baseline's
    noise is the history's (what whole runs do), however noisy its own repeats; the new run keeps
    its own where that is wider (a disturbed run keeps its noise)."""
    hf = only_stages(journey, ["hf-fp16"])
    past = [run(repeats_run(hf, [0, 1, 2], f, run_id=f"night-{i}", created_at=f"2026-11-0{i + 1}T00:00:00+00:00"))
            for i, f in enumerate((1.0, 1.001, 0.999, 1.0005))]
    cmp = compare_runs(run(hf), run(hf), history=past)
    tpot = next(d for d in cmp.stages[0].metrics if d.metric == "tpot_p50")
    assert tpot.noise == "baseline: 4 runs in the history; new: 3 repeats" and tpot.method == "history"


def test_a_stage_only_in_the_new_run_is_no_gap(journey):
    """A journey that grew a stage since its baseline: the new stage is not compared, and not a gap."""
    base = copy.deepcopy(journey)
    base["stages"] = [s for s in base["stages"] if s["name"] != "vllm-attn"]
    assert gaps(run(base), run(journey)) == []
    cmp = gated_by_file(run(base), run(journey))
    assert next(s.state for s in cmp.stages if s.stage == "vllm-attn") == "only in new" and exit_code(cmp) == ExitCode.OK


def test_allow_missing_all_accepts_every_gap_the_unfinished_run_included(journey):
    new = copy.deepcopy(journey)
    new["stages"] = [s for s in new["stages"] if s["name"] != "vllm"]
    new["status"] = "interrupted"
    assert gaps(run(journey), run(new), {"all"}) == []
    assert exit_code(gated_by_file(run(journey), run(new), allowed={"all"})) == ExitCode.OK


@pytest.mark.parametrize("entry, said", [
    ('baseline = "b.json"\nstage = "vllm"\nparams = ["x"]\nreason = "r"\n', "missing refresh"),  # a field left out
    ('baseline = "b.json"\nstage = "vllm"\nparams = ["x"]\nreason = "r"\nrefresh = "f"\nwhy = "w"\n', "needs exactly"),  # one more
])
def test_a_drift_entry_must_say_exactly_what_why_and_how_to_end_it(tmp_path, entry, said):
    path = tmp_path / "drift.toml"
    path.write_text("[[drift]]\n" + entry)
    with pytest.raises(UsageError, match=said):
        load_drift(path)
    path.write_text('[[drift]]\nbaseline = "b.json"\nstage = "vllm"\nparams = ["x"]\nreason = "r"\nrefresh = "f"\n')
    assert [d.stage for d in load_drift(path)] == ["vllm"]


def test_a_repeat_without_the_hosts_index_is_not_normalised_and_nothing_crashes(journey):
    from llmopt_bench.analysis.gate.host_verdict import normalised, normalised_inputs

    assert normalised([1.0, 2.0], [0, 1], [100.0, None], 100.0, False) is None
    assert normalised([1.0, 2.0], [0, 1], [100.0, 50.0], 100.0, False) == [1.0, 1.0]
    assert normalised([1.0, 2.0], [0, 1], [100.0, 50.0], 100.0, True) == [1.0, 4.0]  # a throughput: divided
    hf = run(journey).stage("hf-fp16")
    assert normalised_inputs(hf, "output_tok_s", [100.0, 100.0], 100.0) == (None, [])  # 3 repeats, 2 indices


def test_on_one_host_the_normalised_figure_is_the_raw_one(journey):
    """Both runs on hosts of the same index: normalising changes nothing, so the normalised TPOT
    is the raw one, the median of each repeat's requests (one request per repeat made 5x slower
    moves the mean, not the median)."""
    raw = only_stages(journey, ["hf-fp16"])
    slow_tail = copy.deepcopy(raw)
    sm = stage_of(slow_tail, "hf-fp16")["samples"]
    firsts = {r: i for i, r in reversed(list(enumerate(sm["repeat"])))}
    for c in ("tpot_s", "e2e_s"):
        sm[c] = [v * 5 if i in firsts.values() else v for i, v in enumerate(sm[c])]
    base, new = (run(with_index(r, {"hf-fp16": INDEX}, {"hf-fp16": 0.16})) for r in (raw, slow_tail))
    tpot = next(d for d in compare_runs(base, new).stages[0].metrics if d.metric == "tpot_p50")
    assert tpot.normalised_ratio == pytest.approx(tpot.ratio, rel=1e-9) and tpot.ratio == pytest.approx(1.0, abs=0.02)


def test_preemptions_three_times_the_typical_rate_are_a_busier_host():
    from llmopt_bench.analysis.gate.host_signals import moved

    def rows(rate: float) -> list[dict]:
        return [{"involuntary_switches": rate, "wall_s": 1.0, "cpu_share": 1.9} for _ in range(3)]

    assert [(m.signal, m.busier) for m in moved(rows(100), rows(350))] == [("preemptions", "new")]  # beyond 100 + 2 x 100
    assert moved(rows(100), rows(290)) == []


def test_conditions_that_do_not_line_up_with_the_repeats_set_nothing_aside(journey):
    from llmopt_bench.analysis.gate.host_signals import kept_repeats

    quiet, busy = {"cpu_share": 1.95, "involuntary_switches": 10, "wall_s": 1.0}, {"cpu_share": 0.5, "involuntary_switches": 900, "wall_s": 1.0}
    raw = only_stages(journey, ["vllm"])
    stage_of(raw, "vllm")["extra"]["conditions"] = [quiet, quiet, busy, quiet]  # four rows, three repeats
    stage = run(raw).stage("vllm")
    assert kept_repeats(stage) == (stage, [])
    stage_of(raw, "vllm")["extra"]["conditions"] = [quiet, busy, quiet]  # lined up: the busy one is set aside
    kept, aside = kept_repeats(run(raw).stage("vllm"))
    assert aside == [1] and sorted(set(kept.samples.repeat)) == [0, 2]


def test_a_stage_that_failed_in_the_new_run_is_said_so_not_compared(journey):
    new = copy.deepcopy(journey)
    stage_of(new, "vllm").update(status="error", reason="EngineDeadError", metrics=None, samples=None)
    cmp = gated_by_file(run(journey), run(new))
    vllm = next(s for s in cmp.stages if s.stage == "vllm")
    assert (vllm.state, vllm.note, vllm.metrics) == ("failed in new", "new: error (EngineDeadError)", [])
    assert exit_code(cmp) == ExitCode.INCOMPLETE


def test_which_stages_are_host_bound_and_how_the_report_says_it(journey):
    from llmopt_bench.analysis.hostbound import busy_sentence, host_bound

    raw = copy.deepcopy(journey)
    stage_of(raw, "hf-fp16")["facts"]["gpu_busy_share"] = 0.16
    stage_of(raw, "vllm")["facts"]["gpu_busy_share"] = 0.93
    r = run(raw)
    assert host_bound(r.stage("hf-fp16"), r).host_bound is True and host_bound(r.stage("vllm"), r).host_bound is False
    assert busy_sentence(r.stage("hf-fp16"), r) == "hf-fp16: GPU busy 16.0% of each token: host-bound"
    cpu = copy.deepcopy(journey)
    cpu["env"]["device"] = "cpu"
    for s in cpu["stages"]:
        s["load"] = None
    r = run(cpu)
    assert host_bound(r.stage("vllm"), r) == host_bound(r.stage("vllm"), r).__class__(True, "a CPU run: the host is the device")
