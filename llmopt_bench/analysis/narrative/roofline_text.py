"""The roofline in the report's words: its table row, the conclusion for a row, the prefill
sentences and the environment's ceilings line (analysis/roofline.py computes the rows)."""

from __future__ import annotations

from typing import Any

from llmopt_bench.analysis.roofline import RooflineRow
from llmopt_bench.core.fmt import ms_text, num, pct
from llmopt_bench.core.host import Ceilings
from llmopt_bench.measure.gpu_busy import HOST_BOUND_BELOW

TABLE_HEADERS = ("stage", "phase", "batch", "context tokens", "weights GB", "KV GB", "ms at measured bandwidth",
                 "compute time ms", "measured ms", "of measured memory ceiling", "of compute ceiling",
                 "compute ceiling", "FLOP/byte", "ridge FLOP/byte", "bound", "GPU busy of a token")


def ceiling_label(r: RooflineRow) -> str:
    """Which compute ceiling a row used: "fp8", or "float16 for int8: why" when one stood in."""
    used = r.ceiling_dtype or "matmul"
    return f"{used} for {r.compute_dtype or '?'}: {r.ceiling_note}" if r.ceiling_note else used


def stand_in_sentence(r: RooflineRow) -> str:
    """When another dtype's ceiling stood in for the stage's, say which and why."""
    if not r.ceiling_note:
        return ""
    return f" The {r.ceiling_dtype} ceiling stands in for the {r.compute_dtype or 'unknown'} one: {r.ceiling_note}."


def table_cells(r: RooflineRow) -> tuple[Any, ...]:
    """One row of the roofline table, in TABLE_HEADERS order (numbers for render's formatter)."""
    GB = 1e9
    return (r.stage, r.phase, r.batch, r.context_tokens, f"{num(r.weight_bytes / GB)} ({r.weight_source})",
            r.kv_bytes / GB, r.memory_s * 1e3, None if r.compute_s is None else r.compute_s * 1e3, r.measured_s * 1e3,
            pct(r.achieved), pct(r.compute_fraction), ceiling_label(r), r.intensity, r.ridge, r.bound, busy_cell(r))


def busy_cell(r: RooflineRow) -> str:
    """The measured share of a decode token the GPU is busy, and what it says (issue 25)."""
    if r.phase != "decode":
        return "-"
    if r.gpu_busy is None:
        return r.gpu_busy_note or "-"
    return f"{pct(r.gpu_busy)}: " + ("host-bound" if r.gpu_busy < HOST_BOUND_BELOW else "not host-bound")


def roofline_sentence(r: RooflineRow) -> str:
    """The conclusion for one row."""
    where = f"{r.phase.capitalize()} in {r.stage} is {r.bound}"
    ceiling = f"the {r.ceiling_dtype or 'matmul'} compute ceiling"
    if r.bound == "memory-bound":
        return (f"{where} at {pct(r.achieved)} of the measured memory ceiling ({ms_text(r.memory_s)} at the measured "
                f"copy bandwidth vs {ms_text(r.measured_s)} measured).")
    if r.bound == "compute-bound":
        return (f"{where}: its FLOPs at {ceiling} take {pct(r.compute_fraction)} of the measured "
                f"{ms_text(r.measured_s)}.{stand_in_sentence(r)}")
    return (f"{where}: it runs at {pct(r.achieved)} of the measured memory ceiling and {pct(r.compute_fraction)} of "
            f"{ceiling} ({r.roof} roof), so most of its {ms_text(r.measured_s)} is neither bytes nor FLOPs.{stand_in_sentence(r)}")


def prefill_sentences(rows: list[RooflineRow]) -> list[str]:
    """Prefill rows grouped by bound, one sentence per bound, naming each stage's ceiling dtype."""
    out = []
    for bound in ("compute-bound", "memory-bound", "overhead-bound"):
        group = [r for r in rows if r.bound == bound]
        if group:
            fr = [r.compute_fraction for r in group if r.compute_fraction is not None]
            span = f"{pct(min(fr))} to {pct(max(fr))}" if fr and min(fr) != max(fr) else pct(fr[0]) if fr else "-"
            names = ", ".join(f"{r.stage} ({r.ceiling_dtype or 'matmul'})" for r in group)
            out.append(f"Prefill is {bound} in {names}: TTFT p50 spends {span} of its time on FLOPs at the measured "
                       "matmul ceiling of each stage's compute dtype (in brackets).")
    return out


def ceilings_line(c: Ceilings | None) -> str | None:
    """The environment section's line: what was measured, per dtype, and how."""
    if c is None:
        return None
    by_dtype = c.matmul_flops_by_dtype or ({c.matmul_dtype or "?": c.matmul_flops} if c.matmul_flops else {})
    mm = ", ".join(f"{k} {num(v / 1e12)} {'TOP/s' if k == 'int8' else 'TFLOP/s'}" for k, v in by_dtype.items()) or "-"
    skipped = "; ".join(f"{k} not measured: {v}" for k, v in (c.matmul_not_measured or {}).items())
    return (f"measured ceilings (not datasheet figures): copy bandwidth {(c.mem_bandwidth_bytes_s or 0) / 1e9:.0f} GB/s; "
            f"dense matmul {mm}" + (f" ({skipped})" if skipped else "") + f"; {c.method or ''}")
