"""flash-attn on a CUDA GPU: the default sweep (journeys/journey.toml: 512, 2048, 8192 tokens,
batch 1) on synthetic:llama2-7b. FlashAttention must pay off where the story says it does:
prefill and peak memory at 8K. Marked gpu: skips without CUDA."""

from __future__ import annotations

import importlib.util

import pytest
from testkit import read_run, run_cli

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    out = tmp_path_factory.mktemp("flash-attn-gpu") / "out"
    r = run_cli("bench", "--stages", "flash-attn", "--model", "synthetic:llama2-7b", "--output", str(out),
                "--no-report", timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    s = read_run(out)["stages"][0]
    assert s["status"] == "ok", (s.get("reason"), s.get("log"))
    return s


def row(stage, impl, context):
    return next(r for r in stage["extra"]["sweep"] if r["impl"] == impl and r["context"] == context and r["batch"] == 1)


def test_sdpa_flash_prefill_faster_than_eager_at_8k(stage):
    eager, flash = row(stage, "eager", 8192), row(stage, "sdpa-flash", 8192)
    assert eager["status"] == flash["status"] == "ok", (eager, flash)
    assert flash["effective_impl"] == "sdpa-flash"
    assert flash["ttft_s"]["p50"] < eager["ttft_s"]["p50"], (flash["ttft_s"], eager["ttft_s"])
    sp = next(s for s in stage["extra"]["speedups"] if s["impl"] == "sdpa-flash" and s["context"] == 8192)
    assert sp["prefill_speedup"] > 1.0


def test_flash_uses_less_memory_at_8k(stage):
    eager, flash = row(stage, "eager", 8192), row(stage, "sdpa-flash", 8192)
    assert isinstance(eager["peak_bytes"], int) and isinstance(flash["peak_bytes"], int)
    assert flash["peak_bytes"] < eager["peak_bytes"]  # eager materialises the 8192x8192 scores


def test_every_kernel_verified_and_agreeing(stage):
    k = {e["impl"]: e for e in stage["extra"]["kernels"]}
    for impl in ("eager", "sdpa-math", "sdpa-flash"):
        assert k[impl]["status"] == "ok" and k[impl]["effective"] == impl, k[impl]
    a = stage["extra"]["agreement"]
    assert a["reference"] == "eager" and a["context"] == 512
    assert {e["impl"] for e in a["impls"]} >= {"sdpa-math", "sdpa-flash"}
    for e in a["impls"]:
        assert e["agree"] and e["max_abs_logit_diff"] <= a["tolerance"], e


def test_flash_attention_2_ran_or_says_why(stage):
    rows = [r for r in stage["extra"]["sweep"] if r["impl"] == "flash_attention_2"]
    assert rows
    if importlib.util.find_spec("flash_attn") is None:
        assert all(r["status"] == "skipped" and "pip install 'llmopt-bench[flash]'" in r["reason"] for r in rows), rows
    else:
        assert all(r["status"] == "ok" and r["effective_impl"] == "flash_attention_2" for r in rows), rows
