"""`llmopt doctor`: what this machine offers llmopt, and the command that fixes each gap.

GPU, driver and CUDA through NVML (no CUDA context, no torch import: the CLI stays fast);
Python and the engines' versions read from package metadata by a small probe run in llmopt's
interpreter and in LLMOPT_VLLM_PYTHON's; free space under the model cache; every stage with
whether it can run here and, when not, the exact fix (registry.unavailable)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.core.freeform import Json
from llmopt_bench.procs.interpreters import engine_python, look

GB = 1e9


def size(n: float) -> str:
    return f"{n / GB:.1f} GB" if n >= GB else f"{n / 1e6:.0f} MB"


def gpu_section() -> Json:
    from llmopt_bench.measure import nvml
    from llmopt_bench.run.registry import cuda_devices

    reason = nvml.unavailable_reason()
    devices = cuda_devices() if reason is None else []
    return {"nvml": reason is None, "nvml_reason": reason, "driver": nvml.driver_version(),
            "cuda_driver": nvml.cuda_driver_version(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "devices": devices}


def cache_section() -> Json:
    from llmopt_bench.core.models import cache_dir

    path = cache_dir()
    existing = next(p for p in (path, *path.parents) if p.exists())  # free space where it will be written
    used = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) if path.is_dir() else 0
    return {"path": str(path), "set_by": "LLMOPT_CACHE" if os.environ.get("LLMOPT_CACHE") else "default",
            "exists": path.is_dir(), "used_bytes": used, "free_bytes": shutil.disk_usage(existing).free}


def stages_section() -> list[Json]:
    from llmopt_bench.run.registry import stage_names, stage_or_why

    rows = []
    for name in stage_names():
        cls, why = stage_or_why(name)
        rows.append({"name": name, "available": why is None, "reason": why[0] if why else None,
                     "fix": why[1] if why else None, "python": engine_python(cls.requires.engine if cls else None)})
    return rows


def diagnose() -> Json:
    from llmopt_bench import __version__

    interpreters = {"llmopt": look(sys.executable).as_dict()}
    for engine in ("vllm", "awq"):
        python = os.environ.get(f"LLMOPT_{engine.upper()}_PYTHON")
        if python:
            interpreters[engine] = {"env": f"LLMOPT_{engine.upper()}_PYTHON", **look(python).as_dict()}
    return {"llmopt": {"version": __version__, "root": str(Path(__file__).resolve().parents[2])},
            "gpu": gpu_section(), "interpreters": interpreters, "cache": cache_section(), "stages": stages_section()}


def _versions(info: Json) -> str:
    if not info.get("ok"):
        return f"cannot run: {info.get('error')}"
    pk = info["packages"]
    build = ""
    if "torch" in pk:
        build = f" ({'CUDA ' + info['torch_cuda'] if info.get('torch_cuda') else 'CPU'} build)"
    listed = ", ".join(f"{k} {v}" + (build if k == "torch" else "") for k, v in pk.items())
    return f"python {info['python']}: {listed or 'none of the engines'}"


def render(d: Json) -> list[str]:
    g, c = d["gpu"], d["cache"]
    lines = [f"llmopt {d['llmopt']['version']} at {d['llmopt']['root']}", "", "GPU"]
    if not g["nvml"]:
        lines.append(f"  none usable: {g['nvml_reason']}; the CPU journey runs (CUDA-only stages are skipped)")
    else:
        lines.append(f"  NVIDIA driver {g['driver']}, CUDA {g['cuda_driver']} (NVML readable)")
        lines += [f"  GPU {x['index']}: {x['name']}, compute capability {x['compute_capability']}, "
                  f"{x['memory_total_bytes'] / GB:.0f} GB" for x in g["devices"]]
        if not g["devices"]:
            lines.append(f"  no GPU visible (CUDA_VISIBLE_DEVICES={g['cuda_visible_devices']!r})")
    lines += ["", "Python environments"]
    for name, info in d["interpreters"].items():
        where = f"{info['env']}={info['executable']}" if info.get("env") else info["executable"]
        lines += [f"  {name}: {where}", f"    {_versions(info)}"]
    if "vllm" not in d["interpreters"]:
        lines.append("  vllm: LLMOPT_VLLM_PYTHON unset: vLLM stages use llmopt's own interpreter")
    where = "LLMOPT_CACHE" if c["set_by"] == "LLMOPT_CACHE" else "default; set LLMOPT_CACHE to move it"
    lines += ["", "Model cache", f"  {c['path']} ({where}): {size(c['free_bytes'])} free, {size(c['used_bytes'])} used by llmopt"]
    if g["devices"] and c["free_bytes"] < 20 * GB:
        lines.append("  low: synthetic:llama2-7b writes 13.5 GB (a real 7B's AWQ copy ~4 GB more); free space or move LLMOPT_CACHE")
    ok = [s["name"] for s in d["stages"] if s["available"]]
    lines += ["", f"Stages: {len(ok)} of {len(d['stages'])} can run here" + (f" ({', '.join(ok)})" if ok else "")]
    for s in d["stages"]:
        if not s["available"]:
            lines += [f"  {s['name']}: {s['reason']}", f"    fix: {s['fix']}"]
    return lines


@app.command("doctor")
def doctor_cmd(as_json: bool = typer.Option(False, "--json", help="Print the diagnosis as JSON (keep it: llmopt doctor --json > doctor.json).")
               ) -> None:
    """What this machine offers llmopt (GPU, driver, CUDA, engines, cache space) and, for each
    stage that cannot run here, the command that fixes it. The first troubleshooting step."""
    d = diagnose()
    if as_json:
        typer.echo(json.dumps(d, indent=1))
        return
    from llmopt_bench.render.terminal import echo

    echo(render(d))  # wrapped between words at the terminal's width; a fix line whole (render/terminal.py)
