"""The flash-attn stage through the real CLI on synthetic:tiny (CPU): eager, SDPA-math and
SDPA-flash at 128 and 512 tokens, each kernel verified by the profiler, outputs agreeing to
rounding; SDPA-efficient forced where it cannot run fails loudly as a row, flash_attention_2 is
skipped with its fix, contexts over the CPU cap are measured at the cap and those over the model's positions dropped,
with a note. The pure helpers and the sweep's loop on its own: tests/unit/test_context_sweep*.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import read_run, run_cli

MEASURED = ["eager", "sdpa-math", "sdpa-flash"]
CONTEXTS = [128, 512]
JOURNEY = """
[[stage]]
name = "flash-attn"
params = {{ implementations = {impls}, dtype = "float32", contexts = [128, 512, 2048, 99999], decode_tokens = 8, repeats = 2, cpu_max_context = 512 }}
"""


def _cuda() -> bool:
    from llmopt_bench.run.registry import cuda_devices

    return bool(cuda_devices())


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if _cuda():
        pytest.skip("the CPU flavour of this stage: on CUDA see tests/gpu/test_flash_attn_gpu.py")
    tmp = tmp_path_factory.mktemp("flash-attn")
    impls = '["eager", "sdpa-math", "sdpa-flash", "sdpa-efficient", "flash_attention_2"]'
    (tmp / "fa.toml").write_text(JOURNEY.format(impls=impls))
    r = run_cli("bench", "--stages", str(tmp / "fa.toml"), "--model", "synthetic:tiny", "--output", str(tmp / "out"),
                "--no-report", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    data = read_run(tmp / "out")
    stage = data["stages"][0]
    assert stage["name"] == "flash-attn" and stage["status"] == "ok", (stage.get("reason"), (tmp / "out").as_posix())
    assert stage["own_workload"] is True  # a sweep: kept out of stage-to-stage speedups
    return stage


def rows(stage, impl):
    return [r for r in stage["extra"]["sweep"] if r["impl"] == impl]


def test_sweep_measures_each_kernel_at_each_context(run):
    for impl in MEASURED:
        got = rows(run, impl)
        assert sorted(r["context"] for r in got) == CONTEXTS, impl
        for r in got:
            assert r["status"] == "ok" and r["reason"] is None, r
            assert r["effective_impl"] == impl, r
            assert r["batch"] == 1
            for key in ("ttft_s", "tpot_s"):
                d = r[key]
                assert d["n"] == 2 and 0 < d["min"] <= d["p50"] <= d["max"], (impl, key, d)
            assert r["peak_bytes"] is None  # CPU: no allocator peak, said in the notes
            assert "energy" not in r  # no energy counter on this host: no joules per token to show


def test_extra_holds_what_flash_attn_records(run):
    assert set(run["extra"]) == {"sweep", "speedups", "claims", "agreement", "kernels", "baseline"}
    assert run["extra"]["baseline"] == "eager" and run["energy"] is None  # no energy counter here


def test_kernel_really_used(run):
    k = {e["impl"]: e for e in run["extra"]["kernels"]}
    assert k["sdpa-flash"]["effective"] == "sdpa-flash"
    assert any("_scaled_dot_product_flash_attention" in op for op in k["sdpa-flash"]["ops"]), k["sdpa-flash"]
    assert not any("attention_math" in op for op in k["sdpa-flash"]["ops"])
    assert any("_scaled_dot_product_attention_math" in op for op in k["sdpa-math"]["ops"]), k["sdpa-math"]
    assert not any("scaled_dot_product" in op for op in k["eager"]["ops"]), k["eager"]
    assert k["eager"]["attn_implementation"] == "eager" and k["sdpa-flash"]["attn_implementation"] == "sdpa"


def test_forced_backend_that_cannot_run_fails_loudly(run):
    got = rows(run, "sdpa-efficient")  # no memory-efficient SDPA kernel on CPU
    assert len(got) == len(CONTEXTS)
    for r in got:
        assert r["status"] == "failed" and r["ttft_s"] is None, r
        assert "No viable backend" in r["reason"], r


def test_flash_attention_2_skipped_with_fix(run):
    got = rows(run, "flash_attention_2")
    assert len(got) == len(CONTEXTS)
    for r in got:
        assert r["status"] == "skipped" and r["ttft_s"] is None and r["effective_impl"] is None
        assert "CUDA" in r["reason"] and "pip install 'llmopt-bench[flash]'" in r["reason"], r


def test_outputs_agree_to_rounding(run):
    a = run["extra"]["agreement"]
    assert a["reference"] == "eager" and a["context"] == 128 and a["dtype"] == "float32"
    assert sorted(e["impl"] for e in a["impls"]) == ["sdpa-flash", "sdpa-math"]
    for e in a["impls"]:
        assert e["max_abs_logit_diff"] < 1e-4, e
        assert e["tokens_match"] and e["token_match_fraction"] == 1.0 and e["first_mismatch"] is None, e
        assert e["agree"] and e["same_argmax"]
    assert a["all_agree"] is True


def test_speedups_are_eager_over_impl(run):
    sweep = run["extra"]["sweep"]
    sp = run["extra"]["speedups"]
    assert sorted((s["impl"], s["context"]) for s in sp) == sorted((i, c) for i in ("sdpa-math", "sdpa-flash") for c in CONTEXTS)
    for s in sp:
        base = next(r for r in sweep if r["impl"] == "eager" and r["context"] == s["context"])
        mine = next(r for r in sweep if r["impl"] == s["impl"] and r["context"] == s["context"])
        assert s["prefill_speedup"] == pytest.approx(base["ttft_s"]["p50"] / mine["ttft_s"]["p50"])
        assert s["decode_speedup"] == pytest.approx(base["tpot_s"]["p50"] / mine["tpot_s"]["p50"])
        for phase in ("prefill", "decode"):
            lo, hi = s[f"{phase}_spread"]
            assert lo <= s[f"{phase}_speedup"] <= hi, s


def test_claims_not_measured_on_cpu(run):
    c = {e["claim"]: e for e in run["extra"]["claims"]}
    assert set(c) == {"2x at 2K", "4x at 8K"}
    assert (c["2x at 2K"]["context"], c["2x at 2K"]["target"]) == (2048, 2.0)
    assert (c["4x at 8K"]["context"], c["4x at 8K"]["target"]) == (8192, 4.0)
    for e in c.values():  # 2048 is capped to 512 here and 8192 never asked for
        assert e["prefill"] == e["decode"] == "not measured" and e["measured_prefill"] is None, e
        assert e["impl"] == "sdpa-flash"  # flash_attention_2 did not run


def test_dropped_contexts_and_samples(run):
    notes = " | ".join(run["notes"])
    assert "context 2048 capped to 512 on CPU (cpu_max_context=512)" in notes, notes
    assert "context 99999 dropped" in notes and "max_position_embeddings (8192)" in notes, notes
    assert "sdpa-flash, batch 1, context 512" in notes, notes
    assert not any(r["context"] in (2048, 99999) for r in run["extra"]["sweep"])
    assert len(run["samples"]["ttft_s"]) == 2  # 2 repeats x batch 1
    assert run["samples"]["output_tokens"] == [9, 9]  # the first token plus decode_tokens=8
    assert run["metrics"] is not None


def test_unknown_param_is_a_usage_error(tmp_path: Path):
    (tmp_path / "bad.toml").write_text('[[stage]]\nname = "flash-attn"\nparams = { context = [128] }\n')
    r = run_cli("bench", "--stages", str(tmp_path / "bad.toml"), "--model", "synthetic:tiny",
                "--output", str(tmp_path / "out"), timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "bad param 'context'" in r.stdout + r.stderr
