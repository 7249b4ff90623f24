"""journeys/journey-cpu.toml (what `make bench` runs on a machine without CUDA) is journey.toml with
only the continuous-batching and vllm-serve loads scaled down: same stages, order, labels and
params otherwise."""

from __future__ import annotations

from llmopt_bench.run.registry import JOURNEY_DIR, parse_journey


def test_cpu_journey_is_the_journey_with_a_smaller_batching_sweep():
    full = {p.name: p for p in parse_journey(JOURNEY_DIR / "journey.toml")}
    cpu = {p.name: p for p in parse_journey(JOURNEY_DIR / "journey-cpu.toml")}
    assert list(cpu) == list(full)
    for name, plan in full.items():
        if name not in ("continuous-batching", "vllm-serve"):
            assert (cpu[name].stage, cpu[name].params, cpu[name].timeout_s) == (plan.stage, plan.params, plan.timeout_s), name
    small, big = cpu["continuous-batching"].params, full["continuous-batching"].params
    assert max(small["concurrency"]) < max(big["concurrency"]) and small["contexts"] == [2048]
    assert small["throughput_point"] is True and small["main_concurrency"] == big["main_concurrency"]
    served, full_served = cpu["vllm-serve"].params, full["vllm-serve"].params
    assert max(served["concurrency"]) < max(full_served["concurrency"])
    assert {k: served[k] for k in ("max_model_len", "max_num_seqs", "max_num_batched_tokens")} == \
        {k: full_served[k] for k in ("max_model_len", "max_num_seqs", "max_num_batched_tokens")}
