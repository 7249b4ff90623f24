"""How a load scenario presents itself (continuous-batching's hooks): the load curve, the
throughput point, capacity and mixed-length tables, the story's "5x throughput" claim, and the
throughput/latency-vs-load chart."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.analysis.figures import figure_value
from llmopt_bench.analysis.narrative.claims import claim_verdict, holds
from llmopt_bench.analysis.selectors import p50_of, ratio, reference
from llmopt_bench.core.fmt import gb, ms, num, pct, times
from llmopt_bench.core.plotting import legend, log2_axis, plt, save
from llmopt_bench.core.records import Block, Claim
from llmopt_bench.core.results import RunResult
from llmopt_bench.scenarios.batching.record import BatchingExtra, CapacityRow, CurveRow


def curve_block(curve: list[CurveRow]) -> Block:
    return Block(headers=["mode", "concurrency", "rate req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                          "TPOT p99 ms", "goodput req/s", "requests", "steady"],
                 rows=[[r.mode, r.concurrency, r.rate_rps, r.output_tok_s, ms(r.ttft_p50_s), ms(r.ttft_p99_s),
                        ms(r.tpot_p50_s), ms(r.tpot_p99_s), r.goodput_rps, r.requests,
                        r.steady_reason or ("-" if r.steady is None else "yes")] for r in curve])


def capacity_how(row: CapacityRow) -> str:
    """How a transformers capacity row was found: the sizes probed, and those ruled out."""
    how = f"probed {row.probed}" if row.probed else ""
    if row.ruled_out:
        how += f"{'; ' if how else ''}not probed {row.ruled_out.get('batches')}: {row.ruled_out.get('because')}"
    return how


def batching_blocks(x: BatchingExtra) -> list[Block]:
    out = [curve_block(x.curve)] if x.curve else []
    tp = x.throughput_point
    if tp:
        rows = [[mode, r.requests, r.input_len, r.output_len, r.output_tok_s, ms(r.ttft_p50_s), ms(r.tpot_p50_s), r.failed,
                 "OOM" if r.oom else ""] for mode, r in (("continuous", tp.continuous), ("static", tp.static)) if r]
        ref = tp.reference_h200_out_tok_s
        out.append(Block(text=f"Throughput point (all requests at once){f'; H200 reference {num(ref)} output tok/s' if ref else ''}:",
                         headers=["mode", "requests", "in", "out", "out tok/s", "TTFT p50 ms", "TPOT p50 ms", "failed", ""], rows=rows))
    if x.capacity:
        out.append(Block(text="Capacity: concurrent sequences of a context that fit:",
                         headers=["engine", "context", "max batch", "OOM at", "peak GB", "how"],
                         rows=[[r.engine, r.context, r.max_batch, r.oom_at, gb(r.peak_bytes), r.method or r.note or capacity_how(r)]
                               for r in x.capacity]))
    if x.mixed:
        out.append(Block(text="Mixed lengths (long and short requests together):",
                         headers=["config", "status", "out tok/s", "peak GB", "memory at OOM GB", "padding", "all tokens"],
                         rows=[[r.config, r.status, r.output_tok_s, gb(r.peak_bytes), gb(r.memory_at_oom_bytes),
                                pct(r.padding_fraction), r.all_tokens_produced] for r in x.mixed]))
    return out


def _load_key(row: CurveRow) -> tuple[int | None, float | None]:
    return (row.concurrency, row.rate_rps)


def batching_speedup(curve: list[CurveRow]) -> tuple[float | None, str]:
    """Best continuous / static output tok/s at the same load."""
    static = {_load_key(r): r for r in curve if r.mode == "static" and r.output_tok_s}
    best, where = None, ""
    for r in curve:
        s = static.get(_load_key(r))
        if r.mode == "continuous" and s and r.output_tok_s and s.output_tok_s:
            v = r.output_tok_s / s.output_tok_s
            if best is None or v > best:
                c, rate = _load_key(r)
                best, where = v, f"concurrency {c}" if c is not None else f"{rate} req/s"
    return best, where


def batching_claim(x: BatchingExtra, run: RunResult) -> Claim:
    """The story's "continuous batching: 5x throughput": continuous vs static at the same load,
    else (no static replay) the best continuous point against the reference one request at a time."""
    value, where = batching_speedup(x.curve)
    detail = f"continuous vs static at the same load ({where})" if value else ""
    if value is None and x.curve:
        cont = max((r.output_tok_s or 0 for r in x.curve if r.mode == "continuous"), default=0)
        ref = reference(run)
        value = ratio(cont, figure_value(ref, "output_tok_s") if ref and p50_of(ref, "tpot_s") else None)  # the table's figure
        detail = f"best continuous output tok/s vs {ref.name} one request at a time" if value and ref else ""
    if not detail:
        detail = ("its curve has no static replay and the run no quality reference to compare with: run the stage with "
                  "static_replay = true, or the FP16 baseline in the same run" if x.curve else "needs an ok curve")
    return Claim(key="continuous-batching", claim="Continuous batching: 5x throughput", target="5x output tok/s (held at >= 4x)",
                 measured=times(value), value=value, verdict=claim_verdict(holds(value, 5)), detail=detail)


def _load_x(row: CurveRow, by_rate: bool) -> float | None:
    """Where a point sits on the chart's x axis: its arrival rate, or its concurrency."""
    return row.rate_rps if by_rate else row.concurrency


def curve_chart(name: str, curve: list[CurveRow], path: Path) -> Path | None:
    if not curve:
        return None
    fig, axes = plt().subplots(1, 2, figsize=(11, 4.5))
    by_rate = not any(r.concurrency for r in curve if r.mode == "continuous" and r.rate_rps is None)
    for mode, style in (("continuous", "-o"), ("static", "--s")):
        points = sorted(((x, r) for r in curve if r.mode == mode and (x := _load_x(r, by_rate)) is not None),
                        key=lambda point: point[0])
        if not points:
            continue
        xs, rows = [x for x, _ in points], [r for _, r in points]
        axes[0].plot(xs, [r.output_tok_s or float("nan") for r in rows], style, label=mode)
        axes[1].plot(xs, [(r.tpot_p50_s or float("nan")) * 1e3 for r in rows], style, label=mode)
    for ax, ylabel, title in ((axes[0], "output tokens / s", "Throughput vs load"),
                              (axes[1], "TPOT p50 (ms)", "Per-token latency vs load")):
        log2_axis(ax)
        ax.set_xlabel("arrival rate (requests / s)" if by_rate else "concurrency (requests in flight)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name}: {title}")
        legend(ax, fontsize=8)
    return save(fig, path)
