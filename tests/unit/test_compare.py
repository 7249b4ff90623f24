"""analysis/compare.py on a real CPU run (made once per session with the real CLI) and on
modified copies of it: TPOT slowed by 20%, ±2% noise, another device, a missing stage."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from testkit import run_cli
from llmopt_bench.analysis import compare as C
from llmopt_bench.distribution import Distribution
from llmopt_bench.errors import UsageError
from llmopt_bench.results import RunResult

BENCH = ("--stages", "hf-fp16", "--model", "synthetic:tiny", "--num-prompts", "16", "--max-new-tokens", "16",
         "--repeats", "2", "--warmup", "1", "--no-report")


def real_run(tmp_path_factory) -> Path:
    """One real run per session, shared by the compare test modules (same fixed path)."""
    out = tmp_path_factory.getbasetemp() / "compare-real-run"
    if not (out / "run.json").is_file():
        prompts = tmp_path_factory.getbasetemp() / "compare-prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": f"Question {i}: where is parcel {i}? " * (1 + i % 3)}) + "\n"
                                   for i in range(16)))
        r = run_cli("bench", *BENCH, "--prompts", str(prompts), "--output", str(out))
        assert r.returncode == 0, r.stderr
    return out


def mutate_samples(raw: dict, fn) -> dict:
    """A copy where fn(samples) -> {column: values} rewrites each ok stage's samples, with the
    metrics made to agree: distributions from the new samples, ITL moved with TPOT, tok/s and
    QPS per repeat moved with the repeat's total E2E (requests run one after another)."""
    raw = copy.deepcopy(raw)
    for s in raw["stages"]:
        if s["status"] != "ok":
            continue
        sm, m = s["samples"], s["metrics"]
        old_e2e, old_tpot = list(sm["e2e_s"]), [t for t in sm["tpot_s"] if t is not None]
        sm.update(fn(sm))
        for col in ("ttft_s", "tpot_s", "e2e_s"):
            m[col] = Distribution.of([v for v in sm[col] if v is not None]).model_dump()
        tpot_ratio = m["tpot_s"]["mean"] / (sum(old_tpot) / len(old_tpot))
        m["itl_s"] = {k: (v * tpot_ratio if k != "n" else v) for k, v in m["itl_s"].items()}
        m["tpot_p50_repeats_s"] = [v * tpot_ratio for v in m["tpot_p50_repeats_s"]]
        for i, rep in enumerate(sorted(set(sm["repeat"]))):
            idx = [j for j, r in enumerate(sm["repeat"]) if r == rep]
            grow = sum(sm["e2e_s"][j] for j in idx) / sum(old_e2e[j] for j in idx)
            m["output_tok_s_repeats"][i] /= grow
            m["qps_repeats"][i] /= grow
        m["output_tok_s"] = sum(m["output_tok_s_repeats"]) / len(m["output_tok_s_repeats"])
        m["qps"] = sum(m["qps_repeats"]) / len(m["qps_repeats"])
    return raw


def scale_tpot(raw: dict, factor: float) -> dict:
    """Decode slower by `factor`: every TPOT and the decode part of every E2E scaled."""
    return mutate_samples(raw, lambda sm: {
        "tpot_s": [t * factor if t is not None else None for t in sm["tpot_s"]],
        "e2e_s": [a + (e - a) * factor for a, e in zip(sm["ttft_s"], sm["e2e_s"])]})


def add_noise(raw: dict, pct: float, seed: int, shift: float = 0.0) -> dict:
    """Every latency sample times (1 + shift + u), u uniform in [-pct, pct], seeded."""
    rng = random.Random(seed)
    return mutate_samples(raw, lambda sm: {
        col: [x * (1 + shift + rng.uniform(-pct, pct)) if x is not None else None for x in sm[col]]
        for col in ("ttft_s", "tpot_s", "e2e_s")})


def as_run(raw: dict) -> RunResult:
    return RunResult.model_validate(raw)


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> dict:
    return json.loads((real_run(tmp_path_factory) / "run.json").read_text())


def test_the_helper_scales_tpot_and_keeps_metrics_consistent(raw):
    slow = scale_tpot(raw, 1.2)
    a, b = raw["stages"][0], slow["stages"][0]
    assert b["samples"]["tpot_s"] == pytest.approx([t * 1.2 for t in a["samples"]["tpot_s"]])
    assert b["metrics"]["tpot_s"]["p50"] == pytest.approx(a["metrics"]["tpot_s"]["p50"] * 1.2)
    assert b["metrics"]["e2e_s"]["p50"] > a["metrics"]["e2e_s"]["p50"]
    assert b["metrics"]["output_tok_s"] < a["metrics"]["output_tok_s"]
    assert b["samples"]["ttft_s"] == a["samples"]["ttft_s"]


def test_same_run_compared_with_itself_has_no_regression(raw):
    cmp = C.compare_runs(as_run(raw), as_run(raw))
    assert cmp.regressions == [] and cmp.improvements == []
    deltas = {d.metric: d for d in cmp.stages[0].metrics}
    assert set(deltas) == set(C.METRICS)
    for d in deltas.values():
        assert d.ratio == pytest.approx(1.0) and d.verdict == "unchanged"
    assert deltas["tpot_p50"].method == "bootstrap-requests-median-paired"
    assert deltas["tpot_p50"].ci == pytest.approx((1.0, 1.0))


def test_unpaired_bootstrap_when_the_requests_do_not_line_up(raw):
    fewer = copy.deepcopy(raw)
    sm = fewer["stages"][0]["samples"]
    for col in sm:
        sm[col] = sm[col][1:]  # one request dropped: rows no longer pair up
    d = {d.metric: d for d in C.compare_runs(as_run(raw), as_run(fewer)).stages[0].metrics}["tpot_p50"]
    assert d.method == "bootstrap-requests-median-independent"
    assert d.ci[0] < d.ratio < d.ci[1] and d.ci[1] - d.ci[0] > 0.01
    assert d.verdict in ("unchanged", "inconclusive")


def test_tpot_slower_by_20_percent_is_a_regression(raw):
    cmp = C.compare_runs(as_run(raw), as_run(scale_tpot(raw, 1.2)))
    d = {d.metric: d for d in cmp.stages[0].metrics}["tpot_p50"]
    assert d.ratio == pytest.approx(1.2, rel=1e-6)
    assert d.ci[0] > 1.05, d.ci
    assert d.verdict == "regressed"
    assert ("hf-fp16", "tpot_p50") in cmp.regressions
    assert {x.metric: x for x in cmp.stages[0].metrics}["ttft_p50"].verdict == "unchanged"


def test_faster_tpot_is_reported_as_an_improvement_not_a_regression(raw):
    cmp = C.compare_runs(as_run(raw), as_run(scale_tpot(raw, 0.8)))
    assert ("hf-fp16", "tpot_p50") in cmp.improvements
    assert not [r for r in cmp.regressions if r[1] == "tpot_p50"]


def test_two_percent_noise_is_not_flagged(raw):
    for seed in (1, 2, 3):
        cmp = C.compare_runs(as_run(raw), as_run(add_noise(raw, 0.02, seed)))
        assert cmp.regressions == [], (seed, [(d.metric, d.ratio, d.ci) for d in cmp.stages[0].metrics])


def test_a_clear_change_smaller_than_the_threshold_is_not_flagged(raw):
    cmp = C.compare_runs(as_run(raw), as_run(add_noise(raw, 0.02, seed=4, shift=0.03)))
    d = {d.metric: d for d in cmp.stages[0].metrics}["tpot_p50"]
    assert d.ci[0] > 1.0  # the samples show the 3% slowdown clearly...
    assert d.verdict == "unchanged" and cmp.regressions == []  # ...but it is within the 5% allowed


def test_per_metric_threshold_lets_a_change_through(raw):
    cmp = C.compare_runs(as_run(raw), as_run(scale_tpot(raw, 1.2)), C.parse_thresholds(["tpot=60%,e2e=60%,tok_s=60%"]))
    assert cmp.regressions == []
    assert cmp.thresholds["tpot_p50"] == 0.6 and cmp.thresholds["ttft_p50"] == 0.05


def test_parse_thresholds():
    assert C.parse_thresholds(["5%", "tpot=3%", "ttft=10,load_s=30%"]) == {"*": 0.05, "tpot_p50": 0.03, "ttft_p50": 0.10, "load_s": 0.30}
    t = C.parse_thresholds(["2%"])
    assert C.threshold_for("tpot_p50", t) == 0.02 and C.threshold_for("load_s", t) == 0.20
    assert C.threshold_for("peak_memory", {}) == C.DEFAULT_MAX_REGRESSION
    for bad in (["fast"], ["tpot=x"], ["nosuch=3%"], ["-5%"]):
        with pytest.raises(UsageError):
            C.parse_thresholds(bad)


def test_throughput_drop_regresses_and_direction_is_right():
    assert C.verdict(0.8, (0.75, 0.85), 0.05, higher_is_better=True) == "regressed"
    assert C.verdict(1.2, (1.15, 1.25), 0.05, higher_is_better=True) == "improved"
    assert C.verdict(1.2, (1.15, 1.25), 0.05, higher_is_better=False) == "regressed"
    assert C.verdict(1.2, (0.9, 1.5), 0.05, higher_is_better=False) == "inconclusive"
    assert C.verdict(1.06, None, 0.05, higher_is_better=False) == "regressed"


def test_throughput_from_repeats(raw):
    slow = copy.deepcopy(raw)
    m = slow["stages"][0]["metrics"]
    m["output_tok_s_repeats"] = [v * 0.8 for v in m["output_tok_s_repeats"]]
    m["output_tok_s"] *= 0.8
    d = {d.metric: d for d in C.compare_runs(as_run(raw), as_run(slow)).stages[0].metrics}["output_tok_s"]
    assert d.method == "bootstrap-repeats-mean-paired" and d.ratio == pytest.approx(0.8) and d.verdict == "regressed"


def test_bootstrap_is_seeded():
    b, n = [[1.0, 1.1, 0.9, 1.05, 0.95]], [[1.2, 1.3, 1.1, 1.25, 1.15]]
    one = C.bootstrap_ratio(b, n, C._median, 500, 0.95, seed=7)
    assert one == C.bootstrap_ratio(b, n, C._median, 500, 0.95, seed=7)
    assert one != C.bootstrap_ratio(b, n, C._median, 500, 0.95, seed=8)
    assert one[0] == pytest.approx(1.2 / 1.0)


@pytest.mark.parametrize("edit, what", [
    (lambda r: r["env"].update(gpu="NVIDIA H200"), "device"),
    (lambda r: r["model"].update(source="synthetic:llama2-7b"), "model"),
    (lambda r: r["workload"].update(max_new_tokens=99), "workload"),
])
def test_mismatched_runs_are_refused_unless_forced(raw, edit, what):
    other = copy.deepcopy(raw)
    edit(other)
    with pytest.raises(UsageError) as e:
        C.compare_runs(as_run(raw), as_run(other))
    assert what in e.value.message and "--force" in e.value.fix
    cmp = C.compare_runs(as_run(raw), as_run(other), force=True)
    assert any(what in m for m in cmp.mismatches)


def test_stage_missing_on_one_side_is_reported(raw):
    renamed = copy.deepcopy(raw)
    renamed["stages"][0]["name"] = "hf-other"
    cmp = C.compare_runs(as_run(raw), as_run(renamed))
    states = {s.stage: s.state for s in cmp.stages}
    assert states == {"hf-fp16": "only in baseline", "hf-other": "only in new"}
    assert cmp.regressions == []


def test_stage_not_ok_is_reported_and_a_new_failure_regresses(raw):
    for status, regress in (("skipped", False), ("oom", True)):
        bad = copy.deepcopy(raw)
        s = bad["stages"][0]
        s.update(status=status, reason="out of memory" if status == "oom" else "no GPU", metrics=None, samples=None)
        cmp = C.compare_runs(as_run(raw), as_run(bad))
        st = cmp.stages[0]
        assert st.new_status == status and status in st.note
        assert bool(cmp.regressions) is regress
        assert C.compare_runs(as_run(bad), as_run(raw)).regressions == []
