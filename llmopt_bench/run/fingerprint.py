"""Which code and which machine made a run: the checkout's commit, Python, platform, cores."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from llmopt_bench import __version__
from llmopt_bench.core.freeform import Json


def git_commit() -> str | None:
    """The checkout's commit ("-dirty" with uncommitted changes); LLMOPT_COMMIT where the code
    travelled without its .git (a copy of the tree on a GPU machine, see scripts/device/device-run.sh)."""
    here = Path(__file__).resolve().parent
    if os.environ.get("LLMOPT_COMMIT"):
        return os.environ["LLMOPT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip() + ("-dirty" if dirty else "")) if out.returncode == 0 else None


def host_fingerprint() -> Json:
    import platform

    return {"python": sys.version.split()[0], "platform": platform.platform(), "llmopt": __version__,
            "llmopt_commit": git_commit(), "cpu_count": os.cpu_count()}
