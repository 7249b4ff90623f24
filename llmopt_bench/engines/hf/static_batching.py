"""Static batching over transformers generate, and the probes of transformers (capacity, mixed lengths).

static_drive() replays the load a continuous-batching run saw (the same dispatcher: the same
arrivals, or the same closed loop) against a static batcher: a batch forms when N requests wait
or the oldest waiting one has waited `timeout_s`; it is left-padded to its longest prompt and
generated to completion while later arrivals queue. t_submit is each request's arrival, so TTFT
includes the wait behind a running batch.

The probes (a capacity probe, a mixed-length configuration: PROBES) take a loaded model. The
stage runs them through engines/hf/model_worker.ModelWorker, one process that loads the model once;
run_isolated() runs one in a fresh process of this interpreter (load, probe, exit), in the
stage's session (so the runner's memory sampler sees it and a stage timeout kills it):
`python -m llmopt_bench.engines.hf.static_batching PROBE JOB.json OUT.json`. Either way a CUDA OOM,
or the host OOM killer, ends that probe only, and its peak memory is its own (reset_peaks)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import resource
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from llmopt_bench.core.dispatch import Dispatcher, Send
from llmopt_bench.core.errors import describe, is_oom
from llmopt_bench.core.freeform import Json, Kwargs
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.engines.hf import generate as hf
from llmopt_bench.measure.timing import now
from llmopt_bench.procs import spawn

GenFn = Callable[[Sequence[Send], int], list[RequestSample]]


# --- static batching ----------------------------------------------------------------------------

def static_drive(gen: GenFn, dispatcher: Dispatcher, *, batch_size: int, timeout_s: float = 0.05,
                 on_batch: Callable[[int], None] | None = None) -> None:
    """A static batcher under a dispatcher (core/dispatch.py): requests queue as they are
    released, first come first served; a batch runs when batch_size wait, when the oldest has
    waited timeout_s, or when no other request can come before it runs (a closed loop's users
    wait for this batch). gen(batch, batch_index) generates one padded batch to completion; each
    sample counts from its request's arrival, so TTFT includes the wait behind a running batch."""
    queue: list[Send] = []
    batch_no = answered = 0
    while not dispatcher.finished():
        queue += dispatcher.due(now())
        if not queue:
            _sleep_until(dispatcher.wake_at())
            continue
        t, wake = now(), dispatcher.wake_at()
        full, expired = len(queue) >= batch_size, t - queue[0].arrival >= timeout_s
        if not (full or expired or wake is None):
            _sleep_until(min(queue[0].arrival + timeout_s, wake))
            continue
        batch, queue = queue[:batch_size], queue[batch_size:]
        samples = gen(batch, batch_no)
        done_t = max((s.t_done for s in samples), default=now())
        for send, s in zip(batch, samples):
            dispatcher.done(send, s.model_copy(update={"t_submit": send.arrival, "batch": batch_no}), done_t)
        batch_no, answered = batch_no + 1, answered + len(batch)
        if on_batch:
            on_batch(answered)


def _sleep_until(t: float | None) -> None:
    time.sleep(max(0.0, min((t if t is not None else now()) - now(), 0.05)))


def pow2_bucket(length: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, length))))


def plan_batches(lengths: Sequence[int], config: str, batch_size: int, cap_context: int,
                 bucket_token_budget: int) -> list[list[int]]:
    """Indices per batch for one mixed-length configuration.

    static-mixed and cap-context: arrival order, batch_size at a time. bucketed: requests
    grouped by power-of-two length bucket; a batch holds at most batch_size requests and at
    most bucket_token_budget padded prompt tokens, so long documents go in small batches."""
    order = list(range(len(lengths)))
    if config in ("static-mixed", "cap-context"):
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    if config != "bucketed":
        raise ValueError(f"unknown configuration {config!r}")
    buckets: dict[int, list[int]] = {}
    for i in order:
        buckets.setdefault(pow2_bucket(lengths[i]), []).append(i)
    batches = []
    for width in sorted(buckets):
        per_batch = max(1, min(batch_size, bucket_token_budget // width))
        idx = buckets[width]
        batches += [idx[i:i + per_batch] for i in range(0, len(idx), per_batch)]
    return batches


# --- probes ---------------------------------------------------------------------------------

def run_isolated(probe: str, job: Json, timeout_s: float, workdir: Path) -> Json:
    """Run PROBES[probe](job) in a fresh process of this interpreter; its answer, or why not.

    The child inherits stdout/stderr (the stage's log) and the stage's session."""
    workdir.mkdir(parents=True, exist_ok=True)
    fd, job_path = tempfile.mkstemp(prefix=f"{probe}-", suffix=".job.json", dir=workdir)
    os.close(fd)
    out_path = job_path.replace(".job.json", ".out.json")
    Path(job_path).write_text(json.dumps(job))
    t0 = now()
    ended = spawn.run([sys.executable, "-m", "llmopt_bench.engines.hf.static_batching", probe, job_path, out_path],
                      timeout_s=timeout_s, own_session=False)  # the stage's session: its sampler sees the probe
    wall = round(now() - t0, 3)
    if ended.timed_out:
        return {"status": "timeout", "reason": f"probe exceeded {timeout_s:.0f} s", "wall_s": wall}
    if Path(out_path).is_file():
        answer = json.loads(Path(out_path).read_text())
        answer.setdefault("wall_s", wall)
        answer["exit_code"] = ended.code
        return answer
    status, reason = ended.outcome()
    return {"status": status, "reason": f"probe {reason} (see the stage log)", "wall_s": wall, "exit_code": ended.code}


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _vm_hwm_bytes() -> int | None:
    """The kernel's high-water mark of this process's RSS (VmHWM), since it was last reset."""
    try:
        with open("/proc/self/status") as f:
            line = next(x for x in f if x.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError, StopIteration):
        return None


PEAK_SINCE_RESET = "VmHWM, reset before the probe"
PEAK_LIFETIME = "ru_maxrss: the process's lifetime peak (its load, and any earlier probe in it, included)"


def reset_peaks(device: str) -> str:
    """Start this probe's peak memory from now, so that a process that runs several probes
    reports each one's own: on CUDA torch's peak counters; on the host the kernel's RSS
    high-water mark (writing 5 to /proc/self/clear_refs, Linux >= 4.0). Returns how the host
    peak is measured: where the reset fails, ru_maxrss, which never goes down."""
    if device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return PEAK_LIFETIME
    return PEAK_SINCE_RESET if _vm_hwm_bytes() is not None else PEAK_LIFETIME


def _rss_bytes(method: str) -> int:
    hwm = _vm_hwm_bytes() if method == PEAK_SINCE_RESET else None
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _memory(device: str, method: str) -> Json:
    out: Json = {"peak_rss_bytes": _rss_bytes(method), "peak_rss_method": method}
    if device == "cuda":
        import torch

        out.update(peak_bytes=int(torch.cuda.max_memory_allocated()), allocated_bytes=int(torch.cuda.memory_allocated()),
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved()))
    else:
        out["peak_bytes"] = out["peak_rss_bytes"]  # the host is the device: peak RSS of this probe
    return out


def _oom_details(exc: BaseException, device: str, method: str) -> Json:
    """Memory when the allocation failed: taken inside the except block, while the failed
    step's tensors are still referenced by the traceback."""
    d: Json = {"status": "oom", "reason": describe(exc, 300)}
    m = re.search(r"Tried to allocate ([\d.]+) (GiB|MiB|KiB)", str(exc))
    if m:
        d["tried_to_allocate_bytes"] = int(float(m.group(1)) * {"GiB": 1024**3, "MiB": 1024**2, "KiB": 1024}[m.group(2)])
    elif m := re.search(r"you tried to allocate (\d+) bytes", str(exc)):  # torch's CPU allocator
        d["tried_to_allocate_bytes"] = int(m.group(1))
    if device == "cuda":
        import torch

        d["memory_at_oom_bytes"] = int(torch.cuda.memory_allocated())
        d["peak_bytes"] = int(torch.cuda.max_memory_allocated())
        free, total = torch.cuda.mem_get_info()
        d["device_free_at_oom_bytes"], d["device_total_bytes"] = int(free), int(total)
    else:
        d["memory_at_oom_bytes"] = _current_rss_bytes()
        d["peak_bytes"], d["peak_rss_method"] = _rss_bytes(method), method
    return d


def load_model(path: str, device: str, dtype: str, attn: str | None) -> tuple[Any, Any]:
    """engines.hf.load_model where accelerate is installed; else (vLLM's virtualenv has
    transformers but not accelerate, which device_map needs) load, move, and apply the same
    generation settings: EOS off, a pad id, left padding."""
    if importlib.util.find_spec("accelerate") is not None:
        model, tok, _ = hf.load_model(path, device, dtype, attn)
        return model, tok
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    kwargs: Kwargs = {"dtype": getattr(torch, dtype)}
    if attn:
        kwargs["attn_implementation"] = attn
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.to(device)  # type: ignore[arg-type]  # transformers declares .to as functools.wraps(Module.to): mypy reads it unbound
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "left"
    return model, tok


@dataclass
class Loaded:
    """A model loaded for probes, and how the current probe's host peak is measured."""

    model: Any
    tok: Any
    device: str
    rss_after_load_bytes: int | None = None
    weights_allocated_bytes: int | None = None  # CUDA: memory_allocated() right after the load
    peak_method: str = PEAK_LIFETIME


def load_for_probes(job: Json) -> Loaded:
    device = job["device"]
    model, tok = load_model(job["model_path"], device, job["dtype"], job.get("attn_implementation"))
    loaded = Loaded(model, tok, device, rss_after_load_bytes=_current_rss_bytes())
    if device == "cuda":
        import torch

        loaded.weights_allocated_bytes = int(torch.cuda.memory_allocated())
    return loaded


def probe_capacity(job: Json, m: Loaded) -> Json:
    """A batch of `batch` sequences of `context` tokens: prefill context - decode_steps, then
    decode_steps tokens. ok with the peak memory, or oom with the memory when it failed."""
    batch, context, steps = int(job["batch"]), int(job["context"]), int(job["decode_steps"])
    vocab = int(m.model.config.vocab_size)
    reqs = [Request(id=f"c{i}", prompt_id="capacity",
                    token_ids=tuple((7 + 31 * i + 13 * j) % (vocab - 1) + 1 for j in range(context - steps)))
            for i in range(batch)]
    base = {"batch": batch, "context": context, "rss_after_load_bytes": m.rss_after_load_bytes}
    if m.device == "cuda":
        import torch

        base["weights_allocated_bytes"] = int(torch.cuda.memory_allocated())
    t0 = now()
    try:
        samples = hf.generate_batch(m.model, m.tok.pad_token_id, reqs, steps, m.device, streamer=False)
    except BaseException as e:  # noqa: BLE001 - an OOM is the answer, anything else is reported
        if not is_oom(e):
            raise
        return {**base, **_oom_details(e, m.device, m.peak_method)}
    return {**base, "status": "ok", "seconds": round(now() - t0, 4), "output_tokens": samples[0].output_tokens,
            **_memory(m.device, m.peak_method)}


def probe_mixed(job: Json, m: Loaded) -> Json:
    """One mixed-length configuration (static-mixed, cap-context, bucketed) through static
    batches: padded widths, throughput, peak memory, or the OOM and the memory it hit."""
    config = job["config"]
    cap = int(job["cap_context"])
    ids = [list(x) for x in job["requests"]]
    if config == "cap-context":  # keep the last cap tokens: the question sits at the end
        ids = [x[-cap:] for x in ids]
    reqs = [Request(id=f"m{i:04d}", prompt_id=f"m{i}", token_ids=tuple(x)) for i, x in enumerate(ids)]
    lengths = [len(x) for x in ids]
    batches = plan_batches(lengths, config, int(job["batch_size"]), cap, int(job["bucket_token_budget"]))
    widths = [max(lengths[i] for i in b) for b in batches]
    info: Json = {
        "config": config, "requests": len(reqs), "batches": len(batches), "batch_sizes": [len(b) for b in batches],
        "max_padded_len": max(widths), "prompt_tokens": sum(lengths),
        "padded_prompt_tokens": sum(w * len(b) for w, b in zip(widths, batches)),
        "rss_after_load_bytes": m.rss_after_load_bytes, "attn_implementation": job.get("attn_implementation"),
    }
    info["padding_fraction"] = round(1 - info["prompt_tokens"] / info["padded_prompt_tokens"], 4)
    if m.device == "cuda":
        import torch

        info["weights_allocated_bytes"] = int(torch.cuda.memory_allocated())
    new = int(job["max_new_tokens"])
    produced = 0
    t0 = now()
    try:
        for b, idx in enumerate(batches):
            samples = hf.generate_batch(m.model, m.tok.pad_token_id, [reqs[i] for i in idx], new, m.device, batch=b)
            produced += sum(s.output_tokens for s in samples)
            info["batches_done"] = b + 1
    except BaseException as e:  # noqa: BLE001
        if not is_oom(e):
            raise
        info.update(_oom_details(e, m.device, m.peak_method))
        info["failed_batch_width"] = widths[info.get("batches_done", 0)]
        info["failed_batch_size"] = len(batches[info.get("batches_done", 0)])
        return info
    wall = now() - t0
    info.update(status="ok", seconds=round(wall, 4), output_tokens=produced,
                all_tokens_produced=produced == new * len(reqs),
                output_tok_s=produced / wall if wall > 0 else None, memory_at_oom_bytes=None,
                **_memory(m.device, m.peak_method))
    return info


PROBES: dict[str, Callable[[Json, Loaded], Json]] = {"capacity": probe_capacity, "mixed": probe_mixed}


def failure(exc: BaseException) -> Json:
    """The answer of a probe that raised: an OOM outside the probe's own guard, or an error."""
    return {"status": "oom" if is_oom(exc) else "error", "reason": f"{type(exc).__name__}: {str(exc)[:300]}"}


def write_answer(out_path: str, answer: Json) -> None:
    tmp = out_path + ".tmp"
    Path(tmp).write_text(json.dumps(answer))
    os.replace(tmp, out_path)


def main(argv: list[str]) -> int:
    """One probe in this fresh process: load, then the probe (run_isolated's child)."""
    probe, job_path, out_path = argv
    job = json.loads(Path(job_path).read_text())
    try:
        loaded = load_for_probes(job)
        loaded.peak_method = reset_peaks(loaded.device)
        answer = PROBES[probe](job, loaded)
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        answer = failure(e)
    write_answer(out_path, answer)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
