"""The continuous-batching stage's transformers probes (mixed-length configurations, KV
capacity) through one worker process that loads the model once.

Loading a 7B model takes ~24 s on an H200, and a fresh process per probe (run_isolated) paid
it for every probe. ModelWorker keeps one child, `python -m llmopt_bench.engines.hf.model_worker
FD`, started like run_isolated's (in the stage's session, so the runner's memory sampler sees
it and a stage timeout kills it). The parent writes one job a line on its stdin; the child
loads the model the first time (again only if a job asks another model, dtype or attention),
runs the probe, writes the answer file (nothing measured is lost if it dies later), and says so
on the pipe FD. A probe's answer is the same as in a fresh process:

- an OOM the probe catches is its answer; then the child frees what the probe left (gc, CUDA's
  cache), checks that a small allocation works and, on CUDA, that memory_allocated() is back
  to about the weights, and takes the next probe with the same model;
- anything it cannot go on from (another exception, a failed check, the child killed or dead,
  a probe past its timeout: the child is killed) ends that probe only: the next probe starts
  a fresh worker, which loads the model again. The probe is recorded as run_isolated records it.

Peak memory is per probe (static_batching.reset_peaks before each). Every answer carries
`worker`: its pid, loads so far, and whether it went on; stats() counts the loads.

The pipe carries two typed events (Loading, Answered); a probe's job and its answer stay JSON
objects: each probe kind (static_batching.PROBES) reads its own job and writes its own answer,
which the scenarios record as they are (free-form here, hence core/freeform.Json)."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import Field, TypeAdapter

from llmopt_bench.core.freeform import Json
from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.hf.static_batching import PROBES, failure, load_for_probes, reset_peaks, write_answer
from llmopt_bench.measure.timing import now
from llmopt_bench.procs import spawn

TIMEOUT = "timeout"


class Loading(StrictModel):
    """The worker starts loading a model (its first probe's, or one a probe asks for anew)."""

    type: Literal["loading"] = "loading"


class Answered(StrictModel):
    """The probe's answer is in its file (`out`): written before this is sent, kept if the worker dies."""

    type: Literal["answer"] = "answer"
    out: str


WorkerEvent = Annotated[Union[Loading, Answered], Field(discriminator="type")]
WORKER_EVENT: TypeAdapter[WorkerEvent] = TypeAdapter(WorkerEvent)


class ModelWorker:
    """probe(kind, job, timeout_s, workdir) like run_isolated, through a long-lived worker (its
    files go to the ModelWorker's own workdir). close() when the probes are done."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.fd: int | None = None  # the read end of the worker's answer pipe
        self.buf = b""
        self.loads = self.workers = self.probes = 0
        self.wall_s = 0.0

    def __call__(self, probe: str, job: Json, timeout_s: float, workdir: Path | None = None) -> Json:
        t0 = now()
        try:
            return self.ask(probe, job, timeout_s)
        finally:
            self.probes += 1
            self.wall_s += now() - t0

    def stats(self) -> dict[str, int | float]:
        """What the stage records: model loads, worker processes, probes and their wall time."""
        return {"probe_loads": self.loads, "probe_workers": self.workers, "probe_count": self.probes,
                "probe_wall_s": round(self.wall_s, 3)}

    def ask(self, probe: str, job: Json, timeout_s: float) -> Json:
        self.workdir.mkdir(parents=True, exist_ok=True)
        name = f"{self.probes + 1:03d}-{probe}"
        job_path, out_path = self.workdir / f"{name}.job.json", self.workdir / f"{name}.out.json"
        job_path.write_text(json.dumps(job))
        proc = self.proc if self.proc is not None and self.proc.poll() is None else self.start()
        before = spawn.oom_kills()
        t0, deadline = now(), time.monotonic() + timeout_s
        try:
            assert proc.stdin is not None  # started with stdin=PIPE
            proc.stdin.write((json.dumps({"kind": probe, "job": str(job_path), "out": str(out_path)}) + "\n").encode())
            proc.stdin.flush()
        except OSError:  # the worker is gone: its exit is the answer, below
            pass
        try:
            while isinstance(event := self.next_event(deadline), (Loading, Answered)):  # else None (gone) or TIMEOUT
                if isinstance(event, Loading):
                    self.loads += 1
                else:
                    return self.answered(out_path, round(now() - t0, 3))
        except BaseException:  # an interrupt of ours (the stage's timeout, Ctrl-C): the worker goes at once
            self.stop()
            raise
        wall = round(now() - t0, 3)
        code = self.stop(grace_s=0.0 if event == TIMEOUT else 10.0)  # at its end the worker has exited, or is exiting
        if event == TIMEOUT:
            return {"status": "timeout", "reason": f"probe exceeded {timeout_s:.0f} s", "wall_s": wall}
        if out_path.is_file():  # answered, then died before it could say so
            return {**json.loads(out_path.read_text()), "wall_s": wall, "exit_code": code}
        status, reason = spawn.Exit(code, oom_killed=spawn.oom_evidence(before)).outcome()
        return {"status": status, "reason": f"probe {reason} (see the stage log)", "wall_s": wall, "exit_code": code}

    def answered(self, out_path: Path, wall: float) -> Json:
        answer = json.loads(out_path.read_text())
        answer.setdefault("wall_s", wall)
        answer["worker"]["index"] = self.workers
        went_on = answer["worker"].get("went_on")
        answer["exit_code"] = None if went_on else self.stop(grace_s=30.0)  # None: the worker went on
        return answer

    def start(self) -> subprocess.Popen:
        self.stop()
        read, write = os.pipe()
        try:
            proc = self.proc = spawn.start([sys.executable, "-m", "llmopt_bench.engines.hf.model_worker", str(write)],
                                    own_session=False, pass_fds=(write,), stdin=subprocess.PIPE)
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        self.fd, self.buf = read, b""
        self.workers += 1
        return proc

    def next_event(self, deadline: float) -> WorkerEvent | str | None:
        """The worker's next line on its pipe; None at its end (the worker is gone), TIMEOUT past deadline."""
        fd = self.fd
        if fd is None:  # stopped: no worker to hear from
            return None
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return TIMEOUT
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return WORKER_EVENT.validate_json(line)

    def stop(self, grace_s: float = 0.0) -> int | None:
        """End the worker: stdin closed (it exits between probes), killed after grace_s (at
        once with 0: a probe past its timeout). Its exit code."""
        proc, self.proc = self.proc, None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if proc is None:
            return None
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        if grace_s > 0:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if proc.returncode is None:
            spawn.stop(proc, own_session=False)
        return proc.returncode

    def close(self) -> None:
        self.stop(grace_s=30.0)


# --- the worker process -----------------------------------------------------------------------

def load_key(job: Json) -> tuple[Any, ...]:
    return job["model_path"], job["device"], job["dtype"], job.get("attn_implementation")


def trim_heap() -> None:
    """Give the heap a probe freed back to the kernel (glibc's malloc_trim), so the next probe's
    RSS starts near the weights' as in a fresh process: its peak is then its own."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the heap keeps what it kept
        pass


def after_probe(m: Any) -> Json:
    """Free what the probe left and check that the model can take the next one: a small
    allocation works and, on CUDA, memory_allocated() is back to about the weights."""
    import gc

    import torch

    gc.collect()
    try:
        if m.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        else:
            trim_heap()
        x = torch.ones(1 << 18, device=m.device)  # 1 MiB: the allocator answers again
        ok = float(x.sum()) == float(1 << 18)
        del x
        if m.device != "cuda":
            return {"ok": ok}
        torch.cuda.synchronize()
        allocated, weights = int(torch.cuda.memory_allocated()), m.weights_allocated_bytes or 0
        return {"ok": ok and allocated <= weights + max(64 << 20, weights // 50), "allocated_bytes": allocated,
                "weights_allocated_bytes": weights}
    except BaseException as e:  # noqa: BLE001 - a CUDA error here: the worker cannot go on
        return {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}


def serve(tell: Callable[[WorkerEvent], None]) -> None:
    """Take jobs from stdin until it closes, or until a probe leaves the process unfit."""
    loaded, key, loads = None, None, 0
    for line in sys.stdin:
        req = json.loads(line)
        job = json.loads(Path(req["job"]).read_text())
        info: Json = {"pid": os.getpid()}
        try:
            if loaded is None or load_key(job) != key:
                loaded = key = None  # the previous model goes before the next one loads
                tell(Loading())
                t0 = now()
                loaded, key, loads = load_for_probes(job), load_key(job), loads + 1
                info["load_s"] = round(now() - t0, 3)
            loaded.peak_method = reset_peaks(loaded.device)
            answer = PROBES[req["kind"]](job, loaded)
            check = after_probe(loaded)
            info.update(went_on=check["ok"], after_probe=check)
        except BaseException as e:  # noqa: BLE001 - the probe's reason, as a fresh process records it
            traceback.print_exc()
            answer = failure(e)
            info["went_on"] = False
        info["loads"] = loads
        answer["worker"] = info
        write_answer(req["out"], answer)
        tell(Answered(out=req["out"]))
        if not info["went_on"]:
            return


def main(argv: list[str]) -> int:
    pipe = os.fdopen(int(argv[0]), "w", buffering=1)

    def tell(event: WorkerEvent) -> None:
        pipe.write(event.model_dump_json() + "\n")

    serve(tell)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
