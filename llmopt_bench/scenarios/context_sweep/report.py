"""How a context sweep presents itself (Stage hooks of flash-attn and vllm-attn): its rows and
speedups as tables, the story's FlashAttention claim, and the speedup-by-context chart."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.analysis.narrative.claims import HELD_FRACTION
from llmopt_bench.core.fmt import gb, ms, num, spread, times
from llmopt_bench.core.plotting import legend, log2_axis, plt, save  # matplotlib itself loads inside plt()
from llmopt_bench.core.records import Block, Claim, Verdict
from llmopt_bench.scenarios.context_sweep.plan import ContextSweepExtra, SweepSpeedup


def sweep_blocks(x: ContextSweepExtra) -> list[Block]:
    out = []
    if x.sweep:
        # J per output token only where a row has it (a GPU with an energy counter)
        energy = any(r.energy for r in x.sweep)
        out.append(Block(headers=["impl", "effective impl", "context", "batch", "TTFT p50 ms", "TPOT p50 ms", "peak GB",
                                  *(["J/token"] if energy else []), "status"],
                         rows=[[r.impl, r.effective_impl, r.context, r.batch, ms(r.ttft_s.p50) if r.ttft_s else None,
                                ms(r.tpot_s.p50) if r.tpot_s else None, gb(r.peak_bytes),
                                *([num((r.energy or {}).get("joules_per_output_token"))] if energy else []),
                                r.status if r.status == "ok" else f"{r.status}: {r.reason or ''}"] for r in x.sweep]))
    if x.speedups:
        out.append(Block(text=f"Speedups against {x.baseline or 'the first implementation'} (p50 over p50; spread: "
                              "baseline min / impl max to baseline max / impl min over the repeats):",
                         headers=["impl", "context", "batch", "prefill speedup", "decode speedup", "prefill spread", "decode spread"],
                         rows=[[r.impl, r.context, r.batch, times(r.prefill_speedup), times(r.decode_speedup),
                                spread(r.prefill_spread), spread(r.decode_spread)] for r in x.speedups]))
    return out


def best_at(speedups: list[SweepSpeedup], context: int) -> tuple[float | None, str]:
    """Best speedup at `context` over the non-eager implementations, and its phase."""
    best, phase = None, ""
    for row in speedups:
        if row.context != context or row.impl == "eager":
            continue
        for key in ("prefill", "decode"):
            v = getattr(row, f"{key}_speedup")
            if v is not None and (best is None or v > best):
                best, phase = v, f"{key}, {row.impl}" + (f", batch {row.batch}" if row.batch else "")
    return best, phase


def flash_claim(x: ContextSweepExtra | None) -> Claim:
    """The story's "FlashAttention: 2x at 2K context, 4x at 8K", either phase, held at 80%."""
    parts, oks = [], []
    for context, want in ((2048, 2.0), (8192, 4.0)):
        v, phase = best_at(x.speedups if x else [], context)
        oks.append(None if v is None else v >= want * HELD_FRACTION)
        parts.append(f"{context // 1024}K: " + (f"{v:.2f}x ({phase})" if v is not None else "not measured"))
    verdict: Verdict = "not held" if False in oks else "not measured" if None in oks else "held"
    return Claim(key="flash-attention", claim="FlashAttention: 2x at 2K context, 4x at 8K",
                 target=f"2x at 2K and 4x at 8K vs {x.baseline if x and x.baseline else 'eager'} (held at 80%), either phase",
                 measured="; ".join(parts), verdict=verdict,
                 detail="from the sweep's speedups" if x and x.speedups else "needs an ok sweep with speedups")


def speedup_chart(name: str, x: ContextSweepExtra, path: Path) -> Path | None:
    if not x.speedups:
        return None
    fig, ax = plt().subplots(figsize=(7, 4.5))
    series = sorted({(r.impl, r.batch) for r in x.speedups}, key=str)
    for impl, batch in series:
        for phase, style in (("prefill", "-o"), ("decode", "--s")):
            pts = sorted((r.context, getattr(r, f"{phase}_speedup")) for r in x.speedups
                         if (r.impl, r.batch) == (impl, batch) and getattr(r, f"{phase}_speedup"))
            if pts:
                label = f"{impl} {phase}" + (f", batch {batch}" if len(series) > 1 else "")
                ax.plot([c for c, _ in pts], [v for _, v in pts], style, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    log2_axis(ax)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(f"speedup vs {x.baseline or 'the baseline'} (x)")
    ax.set_title(f"{name}: speedup by context and phase")
    legend(ax, fontsize=8)
    return save(fig, path)


class SweepPresentation:
    """The hooks every context-sweep stage shares (mixed into its Stage class)."""

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:
        return sweep_blocks(result.extra_as(ContextSweepExtra))

    @classmethod
    def charts(cls, result, run, out_dir: Path) -> list[Path]:
        path = speedup_chart(result.name, result.extra_as(ContextSweepExtra), out_dir / f"{result.name}-speedups.png")
        return [path] if path else []
