"""vLLM-CPU workers for tensor/pipeline parallelism get the allowed cores split between them; a
parallel stage on a host with too few GPUs is skipped, with the count."""

from __future__ import annotations

import pytest

from llmopt_bench.core.contract import StageSkipped
from llmopt_bench.engines.vllm.params import cpu_bind


@pytest.mark.parametrize("ranks, cpus, bind", [
    (2, [0, 1], "0|1"),
    (2, [3, 2, 1, 0], "0,1|2,3"),
    (2, [0, 1, 2, 4, 5], "0,1,2|4,5"),  # uneven, and a core not allowed (3)
    (3, list(range(6)), "0,1|2,3|4,5"),
])
def test_cores_split_between_workers(ranks, cpus, bind):
    assert cpu_bind(ranks, cpus) == bind
    groups = [g.split(",") for g in bind.split("|")]
    assert sorted(int(c) for g in groups for c in g) == sorted(cpus)  # every core once


def test_more_workers_than_cores_is_skipped_with_the_fix():
    with pytest.raises(StageSkipped) as e:
        cpu_bind(4, [0, 1])
    assert "need 4 cores" in str(e.value) and "tensor_parallel_size" in e.value.fix


def test_a_parallel_stage_on_too_few_gpus_is_skipped_with_the_count():
    from llmopt_bench.engines.vllm.params import check_parallel
    from llmopt_bench.stages.batching import BatchingParams
    from llmopt_bench.stages.vllm_attn import VLLMAttnParams
    from llmopt_bench.stages.vllm_stage import VLLMParams

    for params in (VLLMParams(tensor_parallel_size=2), BatchingParams(tensor_parallel_size=2), VLLMAttnParams(tensor_parallel_size=2)):
        with pytest.raises(StageSkipped) as e:
            check_parallel(params, "cuda", visible_gpus=1)
        assert "needs 2 GPUs on this host (1 visible)" in str(e.value) and "ray" in e.value.fix
        check_parallel(params, "cuda", visible_gpus=2)  # enough
    check_parallel(VLLMParams(tensor_parallel_size=2, distributed_executor_backend="ray"), "cuda", visible_gpus=1)  # Ray checks
