"""AWQ 4-bit checkpoints: use the user's, or make one from the FP16 model by activation-aware
calibration on the shipped calibration text, once, into the model cache.

The library is GPTQModel's AWQ (docs/awq.md says why: AutoAWQ is archived; GPTQModel writes
the AutoAWQ "gemm" layout, quant_method "awq", that vLLM serves with its INT4 kernels on GPU
and CPU and transformers loads through gptqmodel; on SmolLM2-135M it also kept more quality
than llm-compressor's AWQ). Calibration runs in its own process (`python -m llmopt_bench.engines.awq.checkpoint`)
under the interpreter that has gptqmodel, which need not be vLLM's.

For synthetic models on CUDA, speed is measured on an AWQ-shaped checkpoint of random weights
(config only; vLLM load_format=dummy): calibrating random weights would measure nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.models import cache_dir
from llmopt_bench.procs import spawn
from llmopt_bench.procs.interpreters import engine_python, has_modules

GROUP_SIZES = (128, 64, 32)
RECIPE = "gptqmodel-awq-v2"  # bump when the calibration changes, so caches are rebuilt
SHARD_FILES = ("*.safetensors", "*.bin")


class AWQUnavailable(Exception):
    def __init__(self, reason: str, fix: str):
        super().__init__(reason)
        self.reason, self.fix = reason, fix


def quant_method(path: str | Path) -> str | None:
    cfg = json.loads((Path(path) / "config.json").read_text())
    return (cfg.get("quantization_config") or {}).get("quant_method")


def input_sizes(config: Json) -> set[int]:
    """The input sizes of the layers AWQ quantizes: q/k/v/gate/up take hidden_size, o_proj
    heads x head_dim, down_proj intermediate_size."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    return {hidden, heads * head_dim, config["intermediate_size"]}


def pick_group_size(config: Json) -> int | None:
    """128 where every quantized layer's input size allows it, else the largest of 64 and 32
    that does; None when none does (the INT4 kernels cannot take the model)."""
    sizes = input_sizes(config)
    return next((g for g in GROUP_SIZES if all(s % g == 0 for s in sizes)), None)


def shape_problem(config: Json) -> str | None:
    """Why vLLM's INT4 kernels cannot take this model, or None. Every quantized layer's input
    and output size must be a multiple of 32 (the CPU kernel's limit; the GPU's Marlin is no
    stricter for these shapes)."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    kv = config.get("num_key_value_heads", heads) * head_dim
    dims = {"hidden_size": hidden, "q/o size": heads * head_dim, "k/v size": kv, "intermediate_size": config["intermediate_size"]}
    bad = {k: v for k, v in dims.items() if v % 32}
    return ", ".join(f"{k} {v} is not a multiple of 32" for k, v in bad.items()) or None


def _digest(src: Path) -> str:
    h = hashlib.sha256(RECIPE.encode())
    for f in sorted(p for pat in SHARD_FILES for p in src.glob(pat)):
        h.update(f"{f.name}:{f.stat().st_size}:{int(f.stat().st_mtime)}".encode())
    h.update((src / "config.json").read_bytes())
    return h.hexdigest()[:10]


def calibrated_dir(src: Path, group_size: int, samples: int, seq_len: int) -> Path:
    return cache_dir() / "models" / f"{src.name}-awq-g{group_size}-n{samples}x{seq_len}-{_digest(src)}"


def quantizer_python() -> str:
    """The interpreter that has gptqmodel: LLMOPT_AWQ_PYTHON, else the one llmopt runs in
    (the runner passes it as LLMOPT_PYTHON to stage children in other interpreters)."""
    return os.environ.get("LLMOPT_AWQ_PYTHON") or os.environ.get("LLMOPT_PYTHON") or engine_python("awq")


def ensure_calibrated(src: Path, group_size: int, samples: int, seq_len: int, timeout_s: float,
                      log_path: Path | None = None) -> tuple[Path, Json]:
    """The AWQ checkpoint of src, calibrating it first if the cache has none. Returns its
    directory and what the calibration recorded (cached, seconds, library versions): free-form, as
    the cache's llmopt_awq.json holds it, written by whichever version calibrated the checkpoint."""
    out = calibrated_dir(src, group_size, samples, seq_len)
    meta_path = out / "llmopt_awq.json"
    if meta_path.is_file():
        return out, {**json.loads(meta_path.read_text()), "cached": True}
    python = quantizer_python()
    if "gptqmodel" not in has_modules(python, ("gptqmodel",)):
        raise AWQUnavailable(f"gptqmodel not installed in {python} (AWQ calibration)",
                             "pip install 'llmopt-bench[awq]', or pass a pre-quantized AWQ checkpoint as the stage's "
                             "checkpoint param, or point LLMOPT_AWQ_PYTHON at a python that has gptqmodel")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [python, "-m", "llmopt_bench.engines.awq.checkpoint", str(src), str(tmp), str(group_size), str(samples), str(seq_len)]
    work = out.with_name(out.name + ".work")  # gptqmodel writes logs/ into its working directory
    work.mkdir(parents=True, exist_ok=True)
    try:
        with open(log_path or os.devnull, "a") as log:
            ended = spawn.run(cmd, timeout_s=timeout_s, log=log, env=spawn.child_env(), cwd=work, own_session=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if ended.code != 0 or not (tmp / "llmopt_awq.json").is_file():
        raise RuntimeError(f"AWQ calibration failed ({ended.outcome()[1] if ended.code else 'no checkpoint written'}); "
                           f"see {log_path or 'the stage log'}")
    tmp.rename(out)
    return out, {**json.loads(meta_path.read_text()), "cached": False}


def write_dummy(src: Path, group_size: int) -> Path:
    """An AWQ-shaped checkpoint without weights (config + tokenizer) for vLLM load_format=dummy."""
    out = cache_dir() / "models" / f"{src.name}-awq-dummy-g{group_size}"
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and not any(f.match(p) for p in SHARD_FILES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, tmp / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
                                  "version": "gemm"}
    cfg["dtype"] = "float16"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    tmp.rename(out)
    return out


def calibration_windows(tok: Any, samples: int, seq_len: int) -> list[list[int]]:
    """`samples` windows of seq_len tokens, evenly spaced over the shipped calibration text."""
    from importlib import resources

    text = resources.files("llmopt_bench.data").joinpath("calibration.txt").read_text(encoding="utf-8")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    if len(ids) < seq_len:
        ids = (ids * (seq_len // max(1, len(ids)) + 1))[:seq_len * 2]
    step = max((len(ids) - seq_len) // max(samples - 1, 1), 1)
    return [ids[i * step:i * step + seq_len] for i in range(samples) if len(ids[i * step:i * step + seq_len]) == seq_len]


def _calibrate(src: str, out: str, group_size: int, samples: int, seq_len: int) -> None:
    # gptqmodel sizes its CPU worker pool as (cores + 1) // 2 and then asks for 2 workers: on
    # 2 cores that fails ("requests 2 workers but parent 'cpu' only has 1")
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, (os.cpu_count() or 2) // 2)))
    import gptqmodel
    import torch
    from gptqmodel import BACKEND, GPTQModel
    from gptqmodel.quantization.config import AWQConfig
    from transformers import AutoTokenizer

    cuda = torch.cuda.is_available()
    tok = AutoTokenizer.from_pretrained(src)
    windows = calibration_windows(tok, samples, seq_len)
    t0 = time.perf_counter()
    # offload_to_disk (its default) writes every finished layer out and reads it back: slow, and
    # pointless where the model fits in memory
    qcfg = AWQConfig(bits=4, group_size=group_size, sym=False, offload_to_disk=False)
    model = GPTQModel.load(src, qcfg, device="cuda" if cuda else "cpu")
    # the default AWQ backend needs CUDA; the torch packer writes the same gemm layout anywhere
    model.quantize([{"input_ids": w, "attention_mask": [1] * len(w)} for w in windows], batch_size=1, tokenizer=tok,
                   backend=BACKEND.AUTO if cuda else BACKEND.AWQ_TORCH)
    t1 = time.perf_counter()
    model.save(out)
    tok.save_pretrained(out)
    meta = {"library": "gptqmodel", "version": gptqmodel.__version__, "method": "awq", "bits": 4,
            "group_size": group_size, "zero_point": True, "calibration": "llmopt_bench/data/calibration.txt",
            "samples": len(windows), "seq_len": seq_len, "calibrate_s": round(t1 - t0, 2),
            "save_s": round(time.perf_counter() - t1, 2), "device": "cuda" if cuda else "cpu", "calibrated_from": src}
    (Path(out) / "llmopt_awq.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    _calibrate(a[0], a[1], int(a[2]), int(a[3]), int(a[4]))
