"""The report's "Where the time went" in detail, from run.json alone: each stage's wall time split
by the worker's own clocks (StageTiming), and each vLLM engine start split by the engine's own
log (engines/vllm/startlog.py, in load.phases_s). Runs recorded before these records show
nothing here. report.py's time_section appends these tables."""

from __future__ import annotations

from llmopt_bench.core.fmt import num, table
from llmopt_bench.core.results import RunResult, StageResult

# a load's engine part, whichever the stage's engine records (the rest of load_s is the worker's
# start: interpreter, imports, llmopt)
ENGINE_PHASES = ("engine_total_s", "server_ready_s", "tokenizer_and_weights_s", "engine_shared_s")
START_COLUMNS = (  # (header, load.phases_s key): a vLLM start in the order its steps come
    ("import vllm", "import_s"), ("model inspection", "inspection_s"), ("engine-core process start", "engine_core_start_s"),
    ("core init", "core_init_s"), ("weights", "weights_s"), ("torch.compile", "compile_s"),
    ("memory profile + KV", "memory_profile_s"), ("graph capture", "graph_capture_s"), ("kernel warm-up", "kernel_warmup_s"),
    ("engine total", "engine_total_s"))


def _s(value: float | None) -> str:
    return "-" if value is None else num(value)


def start_up_s(s: StageResult) -> float | None:
    """The part of load_s before the engine: the worker's process, its imports, llmopt's."""
    if s.load_s is None or s.load is None:
        return None
    engine = next((s.load.phases_s[k] for k in ENGINE_PHASES if k in s.load.phases_s), None)
    return None if engine is None else max(0.0, s.load_s - engine)


def split_row(s: StageResult) -> tuple:
    t = s.timing
    assert t is not None
    extras = t.run_s - t.measured_s if t.run_s is not None and t.measured_s is not None else None
    return (s.name, _s(s.duration_s), _s(t.prefetched_s), _s(s.load_s), _s(start_up_s(s)), _s(t.warmup_s),
            _s(t.measured_s), _s(extras), _s(t.teardown_s))


def split_table(run: RunResult) -> list[str]:
    """Table 1a: each stage's wall time, split."""
    timed = [s for s in run.stages if s.timing is not None]
    if not timed:
        return []
    out = ["Each stage's wall time, split (seconds; the worker's own clocks):", ""]
    out += table(("stage", "wall", "imported ahead (not in wall)", "load", "of load: process + imports", "warm-up",
                  "measured (timed windows)", "quality + extras", "teardown"), [split_row(s) for s in timed])
    out += ["", "wall = load + warm-up + measured + quality + extras + teardown. Measured: the timed windows the figures "
            "come from; quality + extras: the rest of the stage's run (quality pass, clock check, a sweep's untimed work); "
            "teardown: the result to the stage's end (engine shutdown, the worker's exit, the card found free)."]
    ahead = [s for s in timed if s.timing and s.timing.prefetched_s is not None]
    if ahead:
        total = sum(s.timing.prefetched_s or 0 for s in ahead if s.timing)
        out.append(f"Imported ahead (--prefetch): {len(ahead)} stage(s)' workers started while the stage before them "
                   f"loaded, {num(total)} s of imports done before their turn, counted in no load or wall time above.")
    failed = [f"{s.name} ({', '.join(s.timing.prefetch_failed)})" for s in ahead if s.timing and s.timing.prefetch_failed]
    if failed:
        out.append(f"Imports ahead that failed, done again in the stage's turn: {'; '.join(failed)}.")
    cuda = [s.name for s in ahead if s.timing and s.timing.prefetch_cuda_initialized]
    if cuda:
        out.append(f"Warning: the early imports of {', '.join(cuda)} initialized CUDA before their turn (they must not).")
    return out


def compile_cell(phases: dict[str, float]) -> str:
    """torch.compile's time, cold or warm; vLLM-CPU's warm-up (which compiles) where it printed none."""
    if "compile_s" in phases:
        how = " (warm)" if "compile_warm_s" in phases else " (cold)" if "compile_cold_s" in phases else ""
        return _s(phases["compile_s"]) + how
    return _s(phases["cpu_warmup_s"]) + " (CPU warm-up)" if "cpu_warmup_s" in phases else "-"


def start_table(run: RunResult) -> list[str]:
    """Table 1b: each vLLM engine start, phase by phase, from the engine's own log."""
    rows = []
    for s in run.stages:
        phases = s.load.phases_s if s.load else {}
        if "engine_core_start_s" not in phases and "inspection_s" not in phases:
            continue
        rows.append((s.name, *(compile_cell(phases) if k == "compile_s" else _s(phases.get(k)) for _, k in START_COLUMNS)))
    if not rows:
        return []
    return (["Each vLLM engine start, phase by phase (seconds; from the engine's log, 1-second resolution where vLLM "
             "prints no figure of its own):", ""] + table(("stage", *(h for h, _ in START_COLUMNS)), rows)
            + ["", "Model inspection: vLLM inspects the model class in a subprocess unless its cache holds it (the probe "
               "fills it). Compile: warm when read back from the cache under LLMOPT_CACHE."])


def time_split(run: RunResult) -> list[str]:
    """The detailed tables under the time section's own; nothing for runs without the records."""
    out: list[str] = []
    for part in (split_table(run), start_table(run)):
        if part:
            out += ["", *part]
    return out
