"""The host's part in compare (analysis/gate/host_verdict.py, analysis/hostbound.py): on the committed
H200 journey's real repeats, a new run on a host half as fast (every latency of the run twice as
long, tests/gatekit.py, and its host-speed index halved) is "inconclusive (host)" for the
host-bound stage, exit 8, never a pass and never a regression; a real slowdown on the same host
still regresses; a faster host that hides one does not pass; a GPU-bound stage is not weighed.

The index values are set per repeat (the committed run predates the index): what is tested is
the verdict given an index, the index itself is measured in tests/unit/test_hostspeed.py."""

from __future__ import annotations

import copy

import pytest
from gatekit import BASELINE, load, only_stages, repeats_run, write
from testkit import run_cli

from llmopt_bench.analysis.gate import host_verdict as HV
from llmopt_bench.analysis.gate.compare import compare_runs
from llmopt_bench.analysis.hostbound import host_bound
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.compare_text import to_markdown

INDEX = [140.0, 128.0, 135.0]  # kop/s, one per repeat: a host's own spread between repeats


def with_host(raw: dict, index: list[float], busy: dict[str, float]) -> dict:
    out = copy.deepcopy(raw)
    for s in out["stages"]:
        s["extra"]["conditions"] = [{"host_kops": k, "host_device": "cuda"} for k in index]
        s["facts"]["gpu_busy_share"] = busy.get(s["name"])
    return out


def pair(factor: float, new_index: list[float], busy=None) -> tuple[RunResult, RunResult]:
    busy = busy or {"hf-fp16": 0.16, "vllm": 0.93}
    base = only_stages(load(BASELINE), ["hf-fp16", "vllm"])
    new = repeats_run(base, [0, 1, 2], factor=factor)  # hf-fp16 slowed as a whole; vllm kept as it was
    new["stages"] = [s if s["name"] == "hf-fp16" else copy.deepcopy(b) for s, b in zip(new["stages"], base["stages"])]
    return RunResult.model_validate(with_host(base, INDEX, busy)), RunResult.model_validate(with_host(new, new_index, busy))


def verdicts(cmp, stage: str) -> dict[str, str]:
    return {d.metric: d.verdict for s in cmp.stages if s.stage == stage for d in s.metrics}


def test_a_host_half_as_fast_explains_a_host_bound_stage_twice_as_slow():
    base, new = pair(2.0, [k / 2 for k in INDEX])
    cmp = compare_runs(base, new)
    hf = verdicts(cmp, "hf-fp16")
    assert hf["tpot_p50"] == hf["e2e_p50"] == hf["output_tok_s"] == HV.HOST_INCONCLUSIVE
    assert cmp.regressions == []  # the old gate: hf-fp16 tpot_p50, e2e_p50, output_tok_s regressed
    assert ("hf-fp16", "tpot_p50") in cmp.host_inconclusive
    stage = next(s for s in cmp.stages if s.stage == "hf-fp16")
    assert stage.host.state == "slower" and stage.host.ratio == pytest.approx(0.5)
    assert stage.host_bound and stage.host_bound_why.startswith("GPU busy 16.0% of each token")
    tpot = next(d for d in stage.metrics if d.metric == "tpot_p50")
    assert tpot.raw_verdict == "regressed" and tpot.normalised_ratio == pytest.approx(1.0, abs=0.01)
    md = to_markdown(cmp)
    assert "Host speed of hf-fp16 (host-bound: GPU busy 16.0% of each token): baseline 134 kop/s (3 repeats), " \
           "new 67.2 kop/s (3 repeats): host 2.00x slower" in md
    assert "Host speed of vllm (not host-bound: GPU busy 93.0% of each token)" in md
    assert "**Inconclusive (host)**: hf-fp16 ttft_p50, hf-fp16 tpot_p50, hf-fp16 e2e_p50, hf-fp16 output_tok_s" in md


def test_a_gpu_bound_stage_is_not_weighed_by_the_host():
    base, new = pair(2.0, [k / 2 for k in INDEX])
    vllm = verdicts(compare_runs(base, new), "vllm")
    assert vllm["tpot_p50"] == "unchanged" and HV.HOST_INCONCLUSIVE not in vllm.values()
    assert not host_bound(new.stage("vllm"), new).host_bound


def test_a_real_slowdown_on_the_same_host_still_regresses():
    base, new = pair(3.0, INDEX)
    cmp = compare_runs(base, new)
    assert verdicts(cmp, "hf-fp16")["tpot_p50"] == "regressed" and cmp.host_inconclusive == []
    assert next(s for s in cmp.stages if s.stage == "hf-fp16").host.state == "same"


def test_a_faster_host_that_hides_a_regression_does_not_pass():
    """The same TPOT on a host three times as fast: as if on the baseline's host, 3x slower."""
    base, new = pair(1.0, [k * 3 for k in INDEX])
    assert verdicts(compare_runs(base, new), "hf-fp16")["tpot_p50"] == HV.HOST_INCONCLUSIVE
    assert verdicts(compare_runs(base, new, host_rule="normalise"), "hf-fp16")["tpot_p50"] == "regressed"


def test_without_the_index_on_one_side_the_verdict_is_the_old_one():
    base, new = pair(2.0, [k / 2 for k in INDEX])
    for s in base.stages:
        s.extra["conditions"] = []
    cmp = compare_runs(base, new)
    assert verdicts(cmp, "hf-fp16")["tpot_p50"] == "regressed"
    assert next(s for s in cmp.stages if s.stage == "hf-fp16").host.text() == "host speed not recorded in the baseline"


def test_the_host_change_needs_more_than_the_index_noise():
    assert HV.host_change([140, 128, 135], [139, 131, 133]).state == "same"
    assert HV.host_change([140, 128, 135], [70, 64, 67.5]).state == "slower"
    assert HV.host_change([140, 128, 135], [280, 256, 270]).state == "faster"
    assert HV.host_change([140, 128, 135], []).state == "not recorded"


def test_compare_exits_8_on_a_host_explained_change(tmp_path):
    base, new = pair(2.0, [k / 2 for k in INDEX])
    a = write(tmp_path / "a", base.model_dump(mode="json"))
    b = write(tmp_path / "b", new.model_dump(mode="json"))
    env = {"LLMOPT_HISTORY_DB": str(tmp_path / "none.sqlite")}
    r = run_cli("compare", "--format", "md", str(a), str(b), env=env)
    assert r.returncode == 8, (r.stdout, r.stderr)
    assert "inconclusive (host): hf-fp16 ttft_p50, hf-fp16 tpot_p50" in r.stderr and "Traceback" not in r.stderr
    assert "| hf-fp16 | TPOT p50 |" in r.stdout and "**inconclusive (host)** (raw: regressed); host 2.00x slower" in r.stdout
    # the same run on both sides: no host moved, but hf-fp16's 3 repeats cannot settle it (exit 9)
    assert run_cli("compare", str(a), str(a), env=env).returncode == 9
    assert run_cli("compare", str(a), str(a), "--pass-inconclusive", env=env).returncode == 0


def test_on_a_slower_host_a_change_within_the_noise_does_not_pass_either():
    """1.3x slower on a host 1.5x slower: the raw interval reaches back inside the threshold
    (hf-fp16's repeats spread by 53%), which alone would pass; on a slower host it is the host's."""
    base, new = pair(1.3, [k / 1.5 for k in INDEX])
    cmp = compare_runs(base, new)
    tpot = next(d for s in cmp.stages if s.stage == "hf-fp16" for d in s.metrics if d.metric == "tpot_p50")
    assert tpot.raw_verdict == "inconclusive" and tpot.verdict == HV.HOST_INCONCLUSIVE
