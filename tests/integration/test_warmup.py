"""A transformers stage warms up with one generation of 16 tokens, not the workload's warm-up
requests at full length (2 x 100 tokens: ~20 s at INT8 on an H200); a journey param changes the
length. The real hf-fp16 stage on synthetic:tiny, its engine's serve() watched, not replaced."""

from __future__ import annotations

from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.stages.hf_fp16 import HFFP16Stage, HFParams


def warmed_up(tiny_model, tmp_path, **params) -> tuple[list[tuple[int, int]], str | None]:
    stage = HFFP16Stage()
    ctx = StageContext(run_dir=tmp_path, stage_dir=tmp_path, device="cpu")
    stage.load(tiny_model, HFParams(dtype="float32", **params), ctx)
    served: list[tuple[int, int]] = []
    real = stage.engine.serve

    def watched(requests, max_new_tokens, **kw):
        served.append((len(requests), max_new_tokens))
        return real(requests, max_new_tokens, **kw)

    stage.engine.serve = watched  # type: ignore[method-assign]
    try:
        stage.warmup(WorkloadConfig(warmup=2, max_new_tokens=100, num_prompts=2), ctx)
    finally:
        stage.teardown()
    return served, stage.warmed


def test_transformers_warm_up_is_one_short_generation(tiny_model, tmp_path):
    assert warmed_up(tiny_model, tmp_path) == ([(1, 16)], "1 request x 16 tokens")


def test_the_journey_sets_the_warm_up_length(tiny_model, tmp_path):
    assert warmed_up(tiny_model, tmp_path, warmup_tokens=4) == ([(1, 4)], "1 request x 4 tokens")
