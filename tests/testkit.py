"""Helpers the tests share: the real `llmopt` command in a subprocess, a third-party plugin on
PYTHONPATH, a run's run.json. A plain module, not conftest.py: `from conftest import` resolves
to whichever conftest.py pytest put first on sys.path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent

# For a test plugin's module source: `samples(n, tokens)`, requests as an engine would return them
PLUGIN_SAMPLES = """
import time as _time

from llmopt_bench.core.records import RequestSample as _RequestSample


def samples(n=2, tokens=4):
    out, t = [], _time.perf_counter()
    for i in range(n):
        times = [t + 0.01 * (k + 1) for k in range(tokens)]
        out.append(_RequestSample(request_id=f"r{i}", prompt_id=f"p{i}", prompt_tokens=5, output_tokens=tokens,
                                  t_submit=t, t_first=times[0], t_done=times[-1], token_times=times))
    return out
"""


def committed_files(under: str = "results") -> list[Path]:
    """The files under `under` (relative to the checkout) that git tracks, sorted: the committed
    runs and reports, never a user's own (results/runs/ and results/tune/ are gitignored, and `make
    bench` writes there). Outside a git checkout (an unpacked archive), the files there less those two."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--", under], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        mine = (ROOT / "results" / "runs", ROOT / "results" / "tune")
        return sorted(p for p in (ROOT / under).rglob("*") if p.is_file() and not any(p.is_relative_to(m) for m in mine))
    return sorted(path for name in listed.decode().split("\0") if name and (path := ROOT / name).is_file())


def committed_runs() -> list[Path]:
    """Every committed run.json under results/, and the baselines (run.json files by another name)."""
    return [p for p in committed_files() if p.name == "run.json" or (p.parent.name == "baselines" and p.suffix == ".json")]


def run_cli(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = 600,
            preexec_fn: Callable[[], None] | None = None) -> subprocess.CompletedProcess:
    """The real `llmopt` command in a subprocess: exit codes and streams as a user sees them
    (preexec_fn: run in the child before llmopt starts, e.g. to pin it to a core)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "llmopt_bench", *args], capture_output=True, text=True,
                          env=full_env, cwd=cwd or ROOT, timeout=timeout, preexec_fn=preexec_fn)


def write_plugin(tmp: Path, name: str, stages: dict[str, str], module_source: str) -> dict[str, str]:
    """Register stages the way a third party does: a distribution with llmopt.stages entry
    points on PYTHONPATH. Returns the env that makes it visible to a child process."""
    site = tmp / f"{name}-site"
    dist = site / f"{name}-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[llmopt.stages]\n" + "".join(f"{k} = {v}\n" for k, v in stages.items()))
    (site / f"{name}.py").write_text(module_source)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def read_run(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def worktree_stages_env(tmp: Path) -> dict[str, str]:
    """The stages this checkout's pyproject.toml registers that the installed llmopt's metadata
    does not list yet (a branch that adds a stage, before `pip install -e .` runs again), made
    visible to a child process the way a plugin is: the same classes, from this checkout."""
    from importlib.metadata import entry_points

    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["llmopt.stages"]
    installed = {ep.name for ep in entry_points(group="llmopt.stages")}
    missing = {k: v for k, v in declared.items() if k not in installed}
    if not missing:
        return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    site = tmp / "worktree-stages-site"
    dist = site / "llmopt_worktree_stages-0.0.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: llmopt-worktree-stages\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[llmopt.stages]\n" + "".join(f"{k} = {v}\n" for k, v in missing.items()))
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def cli_in_process(argv: list[str]) -> int:
    """The CLI's entry point (llmopt_bench.cli.main: the exit path, the codes, the messages) in
    this process, with the signal handlers it installs put back after: a table of a hundred
    cases without a hundred interpreter start-ups. Output goes to the test's capfd."""
    import faulthandler
    import signal

    from llmopt_bench.cli import main

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return main(argv)
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        faulthandler.unregister(signal.SIGUSR1)
