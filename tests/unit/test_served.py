"""One served configuration (engines/vllm/served.py), without vLLM: the engine params made a
server's command line and environment as the stage, tune and the checks all get them, and a
server that does not start said with its root cause, the line of its log that says why (the
server here is a stand-in interpreter that writes what vLLM writes when it refuses a
configuration, and exits)."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmopt_bench.core.contract import StageSkipped
from llmopt_bench.engines.vllm.params import VLLMEngineParams
from llmopt_bench.engines.vllm.served import CannotStart, Served

MODEL = SimpleNamespace(path="/models/tiny", source="synthetic:tiny", max_position_embeddings=1024, num_params=1000,
                        real_weights=False)
REFUSED = ("(APIServer pid=7) INFO 12-05 20:51:09 [api_server.py:1] vLLM API server version 0.32.0\n"
           "(APIServer pid=7) ERROR 12-05 20:51:10 [core.py:700] ValueError: max_num_batched_tokens (2) must be greater "
           "than or equal to max_num_seqs (4)\n")


@pytest.fixture(autouse=True)
def cpu_env(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # what prepare_engine_env would set, put back after


def test_the_configuration_is_the_server_s_flags_and_environment(tmp_path):
    plain = Served(MODEL, VLLMEngineParams(dtype="float32", max_model_len=4096, max_num_seqs=4), device="cpu",
                   log_path=tmp_path / "s.log", python="/py")
    args = plain.server.args()
    assert plain.name == "synthetic-tiny" and args[args.index("--max-model-len") + 1] == "1024"  # capped at the model's
    assert args[args.index("--max-num-seqs") + 1] == "4" and "--no-enable-prefix-caching" in args
    assert "--enable-prompt-tokens-details" not in args and "VLLM_SERVER_DEV_MODE" not in plain.server.env
    assert plain.reproduce().startswith("vllm serve /models/tiny --served-model-name synthetic-tiny --dtype float32")
    caching = Served(MODEL, VLLMEngineParams(enable_prefix_caching=True), device="cpu", log_path=tmp_path / "c.log",
                     python="/py", env={"MARK": "1"})
    assert "--enable-prompt-tokens-details" in caching.server.args()  # each answer's cached tokens in its usage
    assert caching.server.env == {"VLLM_SERVER_DEV_MODE": "1", "MARK": "1"}  # the cache's reset, and the caller's marker


def test_fp8_weights_without_a_gpu_are_skipped_with_the_reason(tmp_path):
    with pytest.raises(StageSkipped) as e:
        Served(MODEL, VLLMEngineParams(quantization="fp8"), device="cpu", log_path=tmp_path / "s.log", python="/py")
    assert "compute capability 8.9+" in e.value.reason


def test_a_server_that_does_not_start_says_why_from_its_log(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{REFUSED}EOF\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    served = Served(MODEL, VLLMEngineParams(max_num_seqs=4, max_num_batched_tokens=2), device="cpu",
                    log_path=tmp_path / "server.log", python=str(fake))
    with pytest.raises(CannotStart) as e:
        served.start(timeout_s=60)
    assert e.value.kind == "invalid combination"
    assert e.value.said == "ValueError: max_num_batched_tokens (2) must be greater than or equal to max_num_seqs (4)"
    assert e.value.message.startswith("vllm serve did not start (invalid combination): ValueError: max_num_batched")
    assert e.value.fix == f"see {tmp_path / 'server.log'}" and Path(tmp_path / "server.log").is_file()
