"""The run directory: every path in it, and every write to it.

    run.json          the record (core/results.py), rewritten atomically after every stage
    requests.jsonl    one line per request; a torn last line (a kill, a full disk) is skipped with a warning
    probe.job.json, probe.json, logs/probe.log
    logs/<name>.log   a stage's stdout and stderr
    stages/<name>/    job.json, partial.json (what a long stage measured so far), artefacts

Writes go to a uniquely named temporary file, flushed to disk, then renamed over the target,
so a kill at any moment leaves the previous valid file. The directory is locked while a run
writes it: a second `llmopt bench` on the same --output gets a clear error."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable

from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.models import portable_text
from llmopt_bench.core.results import RunResult, load_run

RUN_JSON, REQUESTS = "run.json", "requests.jsonl"


def disk_full(path: Path, needed: int) -> LlmoptError:
    return LlmoptError(f"no space left on the device writing {path} (about {needed / 1e6:.1f} MB needed)",
                       f"free space under {path.parent} (df -h {path.parent}); run.json still holds what finished",
                       code=ExitCode.DISK_FULL)


def atomic_write(path: Path, text: str) -> None:
    """Write text to path: a unique temporary file beside it, fsync'd, then renamed over it."""
    data = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        if e.errno == errno.ENOSPC:
            raise disk_full(path, len(data)) from None
        raise


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class RunDir:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._lock_fd: int | None = None

    # --- paths -------------------------------------------------------------------------------
    @property
    def run_json(self) -> Path:
        return self.root / RUN_JSON

    @property
    def requests(self) -> Path:
        return self.root / REQUESTS

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def stage_dir(self, name: str) -> Path:
        return self.root / "stages" / name

    def job(self, name: str) -> Path:
        return self.stage_dir(name) / "job.json"

    def partial(self, name: str) -> Path:
        return self.stage_dir(name) / "partial.json"

    def relative(self, path: Path) -> str:
        return str(Path(path).relative_to(self.root))

    # --- the directory -----------------------------------------------------------------------
    def create(self) -> None:
        """Make the directory (and logs/), or say why it cannot be a run directory."""
        if self.root.exists() and not self.root.is_dir():
            raise UsageError(f"--output {self.root}: a file, not a directory", "pass a new directory name, or the path of a run directory")
        try:
            self.logs.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--output {self.root}: cannot create it ({e.strerror})",
                             "pass a directory you can write to, e.g. --output results/runs/mine") from None
        if not os.access(self.root, os.W_OK):
            raise UsageError(f"--output {self.root}: not writable", "pass a directory you can write to")

    def lock(self) -> None:
        """Hold the directory for this process until it exits (flock on the directory itself)."""
        fd = os.open(self.root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise UsageError(f"another llmopt is writing {self.root} right now",
                             "wait for it to finish, or pass another --output") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # --- run.json ------------------------------------------------------------------------------
    def save(self, run: RunResult) -> Path:
        """run.json, atomically, with the machine's paths in portable form ($LLMOPT_CACHE/..., ~/...)."""

        atomic_write(self.run_json, portable_text(run.model_dump_json(indent=1)))
        return self.run_json

    def load(self) -> RunResult:
        return load_run(self.run_json)

    def scrub(self, path: Path) -> None:
        """A log or artefact rewritten with the machine's paths in portable form (engines print
        the model's path, the cache's, the home's)."""

        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return
        clean = portable_text(text)
        if clean != text:
            atomic_write(path, clean)

    def write_json(self, path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(data, indent=1, default=str))

    # --- requests.jsonl ------------------------------------------------------------------------
    def request_lines(self) -> list[Json]:
        """Every whole line; a torn one (the last line of a killed write) is skipped, with a warning."""
        if not self.requests.is_file():
            return []
        out, torn = [], 0
        for line in self.requests.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                torn += 1
        if torn:
            print(f"warning: {self.requests}: {torn} torn line(s) skipped (a write was cut off)", file=sys.stderr)
        return out

    def put_requests(self, stage: str, samples: Iterable[Any]) -> None:
        """Replace a stage's lines with these samples' (a rewrite: nothing is appended in place)."""
        keep = [r for r in self.request_lines() if r.get("stage") != stage]
        keep += [{"stage": stage, **s.model_dump()} for s in samples]
        atomic_write(self.requests, "".join(json.dumps(r) + "\n" for r in keep))

    # --- partial.json --------------------------------------------------------------------------
    def read_partial(self, name: str, since: float) -> Json | None:
        """This attempt's partial.json (written at or after `since`), or None; a torn one is reported."""
        path = self.partial(name)
        try:
            if path.stat().st_mtime < since:
                return None
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            print(f"warning: {path}: not readable ({e}); the stage's partial measurements are lost", file=sys.stderr)
            return None
