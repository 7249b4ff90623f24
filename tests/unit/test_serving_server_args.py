"""The `vllm serve` command line built from an engine config (engines/vllm/server.py): every
field of EngineConfig becomes its flag, booleans their --no- form, and the key never appears.
That vLLM's own parser accepts these flags is checked in tests/integration/test_serving_flags.py."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.engines.vllm import offline as V
from llmopt_bench.engines.vllm.server import (
    CLI_ENTRY,
    MODULE_ENTRY,
    VLLMServer,
    engine_args,
)

FULL = V.EngineConfig(dtype="bfloat16", quantization="fp8", max_model_len=4096, gpu_memory_utilization=0.85,
                      enforce_eager=True, tensor_parallel_size=2, attention_backend="FLASH_ATTN", load_format="dummy",
                      max_num_seqs=128, max_num_batched_tokens=8192, seed=3,
                      extra={"enable_prefix_caching": False, "pipeline_parallel_size": 2})


def pairs(args: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = None
            i += 1
    return out


def test_every_engine_field_becomes_its_flag():
    assert pairs(engine_args(FULL)) == {
        "--dtype": "bfloat16", "--seed": "3", "--load-format": "dummy", "--tensor-parallel-size": "2",
        "--gpu-memory-utilization": "0.85", "--enforce-eager": None, "--quantization": "fp8",
        "--max-model-len": "4096", "--max-num-seqs": "128", "--max-num-batched-tokens": "8192",
        "--attention-backend": "FLASH_ATTN", "--no-enable-prefix-caching": None, "--pipeline-parallel-size": "2"}


def test_unset_fields_are_left_to_vllm():
    args = pairs(engine_args(V.EngineConfig(dtype="float16")))
    assert "--quantization" not in args and "--max-model-len" not in args and "--enforce-eager" not in args
    assert pairs(engine_args(V.EngineConfig(dtype="float16", extra={"enable_prefix_caching": True}))).keys() >= {
        "--enable-prefix-caching"}


def test_command_reproduce_and_the_key(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("LLMOPT_TEST_K", "s3cret")
    server = VLLMServer("/models/m", V.EngineConfig(dtype="float16"), log_path=tmp_path / "log", python="/py",
                        served_model_name="m", api_key_env="LLMOPT_TEST_K", port=8123)
    server.entry = CLI_ENTRY
    assert server.command()[:5] == ["/py", "-m", "vllm.entrypoints.cli.main", "serve", "/models/m"]
    assert server.command()[-4:] == ["--host", "127.0.0.1", "--port", "8123"]
    server.entry = MODULE_ENTRY
    assert server.command()[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
    assert server.reproduce().startswith("vllm serve /models/m --served-model-name m --dtype float16 ")
    assert server.reproduce().endswith('--api-key "$LLMOPT_TEST_K"')
    env = server.environment()
    assert env["VLLM_API_KEY"] == "s3cret" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert "s3cret" not in " ".join(server.command()) + server.reproduce()
