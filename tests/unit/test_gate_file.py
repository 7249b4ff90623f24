"""A baseline's gate file (analysis/gate/gate_file.py, issue 46): each noisy gated figure gated at
the threshold its measured noise supports, or watched, with the arithmetic; the committed one is
what scripts/gate/gate-file.py derives from the committed runs; compare reads it beside the baseline,
and with it the committed H200 baseline against its own run is green, while a 10% slower
GPU-bound stage and a 20% slower host-bound one it gates still exit 5."""

from __future__ import annotations

import copy
import importlib.util
import math
from pathlib import Path

import pytest
from gatekit import BASELINE, ROOT, load, repeats_run, write
from test_gate_pins import exit_code, gated_by_file, run, scaled
from testkit import run_cli

from llmopt_bench.analysis.gate import gate_file
from llmopt_bench.analysis.gate.compare import compare_runs
from llmopt_bench.core.errors import ExitCode, UsageError

GATE = ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.gate.toml"
RUNS = [ROOT / "results" / "h200-20261204" / "run" / "run.json", ROOT / "results" / "h200" / "20261203-batching-vllm-only" / "run.json"]


def spread(sigma: float, repeats: int = 3, runs: int = 1, run_sigma: float = 0.0) -> gate_file.Spread:
    return gate_file.Spread(sigma ** 2, runs * (repeats - 1), runs * repeats, runs, run_sigma ** 2)


def test_the_committed_gate_file_is_what_its_runs_give():
    spec = importlib.util.spec_from_file_location("gate_file_script", ROOT / "scripts" / "gate" / "gate-file.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)  # type: ignore[union-attr]
    assert GATE.read_text() == script.text_for(BASELINE, RUNS, "standard")
    gate = gate_file.load(GATE, BASELINE)
    decisions = {(e.stage, e.metric): (e.decision, e.max_regression) for e in gate.entries}
    gated = ("tpot_p50", "e2e_p50", "output_tok_s")
    for stage in ("vllm", "vllm-fp8", "vllm-attn"):  # GPU-bound: repeats within 0.1-0.7%
        assert all(decisions[(stage, m)] == ("gated", 0.05) for m in gated)
    assert decisions[("continuous-batching", "e2e_p50")] == ("gated", 0.05)
    assert all(decisions[(s, m)][0] == "watched" for s in ("hf-fp16", "bnb-int8", "flash-attn") for m in gated)
    assert decisions[("vllm", "ttft_p50")][0] == "watched" and decisions[("vllm", "ttft_p50")][1] > 0.05  # 29% apart
    assert set(gate_file.NOISY) == {"ttft_p50", *gated}
    assert decisions[("awq-int4", "tpot_p50")] == ("gated", 0.10)
    assert all("repeats vs" in e.why and ("gated at" in e.why or "watched, judged at" in e.why) for e in gate.entries)


@pytest.mark.parametrize("sigma, host_bound, decision, raised", [
    (0.001, False, "gated", False),  # vLLM's TPOT: the class's 5% holds, 10% caught
    (0.012, True, "gated", False),  # awq-int4's: 10% holds, 20% caught
    (0.008, False, "gated", True),  # raised above 5%, a 10% slowdown still caught there
    (0.02, True, "watched", False),  # 10% does not hold; where it would, a 20% slowdown is caught too rarely
    (0.20, True, "watched", True),  # hf-fp16's: nothing a pair can gate, and judged where it does not regress alone
])
def test_decide_gates_at_what_the_noise_supports_or_watches(sigma, host_bound, decision, raised):
    e = gate_file.decide("s", "tpot_p50", spread(sigma), 3, 3, host_bound)
    floor = gate_file.CLASS_THRESHOLD[host_bound]
    assert e.decision == decision and (e.max_regression > floor) == raised, e.why
    pairs = gate_file.simulate(spread(sigma), 3, 3)
    within, false_below = gate_file.shares(pairs, 0.0, False)
    assert (false_below > e.max_regression).mean() <= gate_file.ALARM  # pairs of the same code do not regress
    if decision == "gated":
        assert (within <= e.max_regression).mean() >= 1 - gate_file.ALARM  # ... and settle
        caught = (gate_file.shares(pairs, math.log(1 + gate_file.MUST_CATCH[host_bound]), False)[1] > e.max_regression).mean()
        assert caught >= gate_file.CATCH
    else:
        assert (within <= floor).mean() < 1 - gate_file.ALARM or "under 90%" in e.why


def test_one_repeat_or_a_moving_run_level_is_watched_and_fewer_repeats_need_more():
    assert gate_file.decide("s", "tpot_p50", None, 3, 2, False).decision == "watched"
    assert gate_file.decide("s", "tpot_p50", spread(0.001), 1, 2, False).decision == "watched"
    assert gate_file.decide("s", "tpot_p50", spread(0.01, run_sigma=0.05), 3, 3, True).decision == "watched"
    three, two = (gate_file.decide("s", "tpot_p50", spread(0.012), 3, r, True) for r in (3, 2))
    assert three.decision == "gated" and two.decision == "watched"  # a side of 2 repeats: t on ~1-2 df


def test_the_nightly_takes_the_repeats_its_stopping_rule_would():
    base = run(load(BASELINE))
    rule = {"repeats": 2, "max_repeats": 10, "stop_within": 2.5, "repeat_budget_s": 90}
    tight = [spread(0.001)] * 3
    assert gate_file.nightly_repeats(base.stage("vllm"), tight, rule) == 2
    assert gate_file.nightly_repeats(base.stage("vllm"), [spread(0.006)], rule) == 3
    assert gate_file.nightly_repeats(base.stage("hf-fp16"), [spread(0.2)], rule) == int(90 // gate_file.repeat_seconds(base.stage("hf-fp16")))
    assert gate_file.nightly_repeats(base.stage("bnb-int8"), [spread(0.06)], rule) == 2  # ~85 s a repeat: the minimum
    assert gate_file.nightly_repeats(base.stage("vllm"), [spread(0.2)], {**rule, "repeat_budget_s": None}) == 10


def test_derive_pools_the_same_stage_of_runs_that_compare_would_compare():
    base = run(load(BASELINE))
    other = run(load(RUNS[0]))
    alone = gate_file.pooled_spread([base.stage("vllm")], "tpot_p50")
    both = gate_file.pooled_spread([base.stage("vllm"), other.stage("vllm")], "tpot_p50")
    assert (alone.runs, alone.df, both.runs, both.df) == (1, 2, 2, 4)
    entries = {(e.stage, e.metric): e for e in gate_file.derive(base, [other])}
    assert "6 repeats in 2 run(s)" in entries[("vllm", "tpot_p50")].why
    assert "3 repeats in 1 run(s)" in entries[("continuous-batching", "tpot_p50")].why  # other params: not pooled
    assert "3 repeats vs 3" in entries[("vllm", "tpot_p50")].why and "3 repeats vs 3" in entries[("flash-attn", "tpot_p50")].why
    rule = {"repeats": 2, "max_repeats": 10, "stop_within": 2.5, "repeat_budget_s": 90}
    entries = {(e.stage, e.metric): e for e in gate_file.derive(base, [other], rule)}
    assert "3 repeats vs 2" in entries[("bnb-int8", "tpot_p50")].why and "3 repeats vs 3" in entries[("flash-attn", "tpot_p50")].why
    moved = copy.deepcopy(load(RUNS[0]))
    moved["model"]["source"] = "synthetic:tiny"
    assert "in 1 run(s)" in {(e.stage, e.metric): e for e in gate_file.derive(base, [run(moved)])}[("vllm", "tpot_p50")].why


def test_the_baseline_against_its_own_run_is_green_and_slowdowns_it_gates_are_caught():
    journey = load(BASELINE)
    assert exit_code(compare_runs(run(journey), run(journey))) == ExitCode.INCONCLUSIVE  # the default thresholds
    cmp = gated_by_file(run(journey), run(journey))
    assert exit_code(cmp) == ExitCode.OK and not cmp.inconclusive
    assert ("hf-fp16", "tpot_p50") in cmp.watched_unsettled
    assert not {m for _, m in cmp.watched_unsettled} & {"ttft_p50", "load_s"}  # not gated anyway: not "watched"
    for stage, factor in (("vllm", 1.10), ("vllm-fp8", 1.10), ("vllm-attn", 1.10), ("awq-int4", 1.20)):
        cmp = gated_by_file(run(journey), run(scaled(journey, stage, factor)))
        assert (stage, "tpot_p50") in cmp.regressions and exit_code(cmp) == ExitCode.REGRESSION, stage


def test_a_gate_file_is_checked(tmp_path):
    text = GATE.read_text()
    with pytest.raises(UsageError, match="is the gate file of nvidia-h200-synthetic-llama2-7b.json, not of other.json"):
        gate_file.load(GATE, tmp_path / "other.json")
    for broken, said in ((text.replace('decision = "watched"', 'decision = "maybe"', 1), "decision 'maybe'"),
                         (text.replace('metric = "tpot_p50"', 'metric = "load_s"', 1), "metric 'load_s'"),
                         (text.replace("max_regression = 0.05", "max_regression = -1", 1), "max_regression -1"),
                         (text.replace('why = "', 'because = "', 1), "needs exactly"),
                         (text.replace('baseline = "', 'base = "', 1), "no baseline"),
                         ("[[figure", "not valid TOML")):
        path = tmp_path / "broken.gate.toml"
        path.write_text(broken)
        with pytest.raises(UsageError, match=said.replace("(", r"\(")):
            gate_file.load(path)
    with pytest.raises(UsageError, match="gate file not found"):
        gate_file.load(tmp_path / "none.gate.toml")


def test_the_users_thresholds_win_over_the_files():
    gate = gate_file.load(GATE)
    merged = gate.merged({"tpot_p50": 0.03})
    assert merged["tpot_p50"] == 0.03 and "vllm:tpot_p50" not in merged and merged["vllm:e2e_p50"] == 0.05
    assert gate.merged({"*": 0.2}) == {"*": 0.2}
    assert gate_file.beside(BASELINE) == GATE and gate_file.beside(ROOT / "results" / "h200") is None
    assert gate_file.beside(ROOT / "results" / "h200" / "run.json") is None  # a run's own record has none


def test_compare_reads_the_file_beside_the_baseline_and_refuses_another_baselines(tmp_path):
    env = {"LLMOPT_HISTORY_DB": str(tmp_path / "none.sqlite")}
    copy_of = tmp_path / "other.json"
    copy_of.write_text(BASELINE.read_text())
    r = run_cli("compare", str(copy_of), str(BASELINE), "--gate-file", str(GATE), env=env)
    assert r.returncode == 2 and "not of other.json" in r.stderr
    assert run_cli("compare", str(copy_of), str(BASELINE), env=env).returncode == ExitCode.INCONCLUSIVE  # no file beside it
    r = run_cli("compare", str(BASELINE), str(BASELINE), "--gate-file", str(GATE), "--no-gate-file", env=env)
    assert r.returncode == 2
    one = write(tmp_path / "slow", repeats_run(load(BASELINE), [0, 1, 2], factor=1.1))
    r = run_cli("compare", str(BASELINE), str(one), "--format", "md", env=env)
    assert r.returncode == ExitCode.REGRESSION and "gate file `" in r.stdout and "vllm tpot_p50" in r.stderr


def test_a_gate_file_round_trips(tmp_path):
    entries = gate_file.derive(run(load(BASELINE)))
    path = tmp_path / "x.gate.toml"
    path.write_text(gate_file.to_toml("x.json", entries, ["a"], "3 repeats"))
    assert gate_file.load(path, Path("x.json")).entries == tuple(entries)
