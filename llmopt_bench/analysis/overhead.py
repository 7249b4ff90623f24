"""The per-token clock's overhead, said in one sentence from the measure's record
(engines/hf.instrumentation_overhead)."""

from __future__ import annotations

from typing import Any

from llmopt_bench.fmt import num, pct


def overhead_sentence(inst: dict[str, Any]) -> str:
    line = f"Per-token clock overhead: {num(inst.get('overhead_pct'))}%"
    lo_hi = inst.get("overhead_pct_range")
    if not lo_hi:  # runs recorded before the interleaved pairs
        return line + " (measured once, generation with vs without the per-token timestamps)"
    line += (f", median of {inst.get('pairs')} interleaved pairs with and without the clock (range {num(lo_hi[0])}% "
             f"to {num(lo_hi[1])}%: the host's noise)")
    if inst.get("clock_call_s") is not None:
        line += (f"; the clock's own work costs {num(inst['clock_call_s'] * 1e6)} µs a token, "
                 f"{pct(inst['clock_call_pct'] / 100)} of a step")
    return line + "."
