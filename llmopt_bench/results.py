"""The versioned result schema, written atomically as each stage finishes.

run.json holds everything a report or a comparison needs (metrics and compact per-request
samples); requests.jsonl holds every request with its per-token timestamps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from llmopt_bench import __version__
from llmopt_bench.analysis.metrics import StageMetrics, e2e, tpot, ttft
from llmopt_bench.errors import UsageError
from llmopt_bench.models import ModelInfo
from llmopt_bench.stage import LoadInfo, RequestSample, StrictModel
from llmopt_bench.workload import WorkloadConfig

SCHEMA_VERSION = 1
Status = Literal["ok", "skipped", "oom", "timeout", "error", "interrupted"]
FAILED = ("oom", "timeout", "error")


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class Samples(StrictModel):
    """Per-request scalars, column-wise: what compare bootstraps over."""

    ttft_s: list[float] = Field(default_factory=list)
    tpot_s: list[float | None] = Field(default_factory=list)
    e2e_s: list[float] = Field(default_factory=list)
    output_tokens: list[int] = Field(default_factory=list)
    repeat: list[int] = Field(default_factory=list)

    @classmethod
    def of(cls, samples: list[RequestSample]) -> "Samples":
        ok = [s for s in samples if s.ok]
        return cls(ttft_s=[ttft(s) for s in ok], tpot_s=[tpot(s) for s in ok], e2e_s=[e2e(s) for s in ok],
                   output_tokens=[s.output_tokens for s in ok], repeat=[s.repeat for s in ok])


class StageResult(StrictModel):
    name: str
    stage: str | None = None  # the registered stage, when a journey label renamed its result
    description: str = ""
    changes: str = ""
    own_workload: bool = False  # measured on its own sweep, not the fixed prompt set (Stage.own_workload)
    status: Status
    reason: str | None = None
    fix: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    started_at: str | None = None
    duration_s: float | None = None
    load_s: float | None = None  # fresh process to ready
    load: LoadInfo | None = None
    metrics: StageMetrics | None = None
    samples: Samples | None = None
    memory: dict[str, Any] = Field(default_factory=dict)
    energy: dict[str, Any] | None = None
    extra: dict[str, Any] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    log: str | None = None
    gpu_free_after: dict[str, Any] | None = None


# where a stage's peak memory comes from, best first (NVML sees every process, vLLM's too)
MEMORY_SOURCES = (
    ("process_peak_bytes", "NVML, the stage's processes"),
    ("device_peak_delta_bytes", "NVML, device peak minus baseline"),
    ("torch_peak_reserved_bytes", "torch reserved peak"),
    ("cpu_max_rss_bytes", "host RSS peak"),
)


def peak_memory(stage: StageResult) -> tuple[float | None, str | None]:
    mem = stage.memory or {}
    for key, source in MEMORY_SOURCES:
        value = mem.get(key)
        if isinstance(value, dict):  # per device
            value = sum(v for v in value.values() if v) or None
        if value:
            return float(value), source
    return None, None


class RunResult(StrictModel):
    schema_version: int = SCHEMA_VERSION
    llmopt_version: str = __version__
    run_id: str
    created_at: str
    finished_at: str | None = None
    status: Literal["running", "complete", "interrupted"] = "running"
    command: str
    env: dict[str, Any] = Field(default_factory=dict)
    model: ModelInfo | None = None
    workload: WorkloadConfig
    min_quality: float = 0.99  # the quality gate (analysis/quality_gate.py)
    stages: list[StageResult] = Field(default_factory=list)

    def stage(self, name: str) -> StageResult | None:
        return next((s for s in self.stages if s.name == name), None)

    def put(self, result: StageResult) -> None:
        self.stages = [s for s in self.stages if s.name != result.name] + [result]


def save_run(run: RunResult, out_dir: Path) -> Path:
    """Write run.json atomically: a kill at any moment leaves the previous valid file."""
    path = out_dir / "run.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(run.model_dump_json(indent=1))
    os.replace(tmp, path)
    return path


def load_run(path: str | Path) -> RunResult:
    p = Path(path)
    if p.is_dir():
        p = p / "run.json"
    if not p.is_file():
        raise UsageError(f"no run.json at {path}", "pass a run directory written by `llmopt bench` or its run.json")
    try:
        raw = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise UsageError(f"{p}: not valid JSON ({e.msg} at line {e.lineno})") from None
    version = raw.get("schema_version")
    if version != SCHEMA_VERSION:
        raise UsageError(f"{p}: schema version {version}, this llmopt reads {SCHEMA_VERSION}",
                         f"re-run the benchmark, or use llmopt {raw.get('llmopt_version', 'of that run')}")
    try:
        return RunResult.model_validate(raw)
    except ValidationError as e:
        raise UsageError(f"{p}: does not match the result schema: {e.errors()[0]['loc']} {e.errors()[0]['msg']}") from None


def append_requests(out_dir: Path, stage: str, samples: list[RequestSample]) -> None:
    with open(out_dir / "requests.jsonl", "a", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps({"stage": stage, **s.model_dump()}) + "\n")


def drop_requests(out_dir: Path, stage: str) -> None:
    """Remove a stage's lines (a resumed stage is measured again)."""
    path = out_dir / "requests.jsonl"
    if not path.is_file():
        return
    keep = [line for line in path.read_text(encoding="utf-8").splitlines() if json.loads(line).get("stage") != stage]
    path.write_text("".join(line + "\n" for line in keep), encoding="utf-8")


def git_commit() -> str | None:
    """The checkout's commit ("-dirty" with uncommitted changes); LLMOPT_COMMIT where the code
    travelled without its .git (a copy of the tree on a GPU machine, see scripts/device-run.sh)."""
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


def host_fingerprint() -> dict[str, Any]:
    import platform

    return {"python": sys.version.split()[0], "platform": platform.platform(), "llmopt": __version__,
            "llmopt_commit": git_commit(), "cpu_count": os.cpu_count()}
