"""The report's cross-stage charts (PNG, matplotlib Agg) from run.json alone. Each chart
function returns the file it wrote, or None when its data is absent; write_charts returns the
files written. Charts of one stage's own measurements (a sweep, a load curve) come from that
stage's hook (Stage.charts), drawn by write_stage_charts."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from llmopt_bench.analysis.figures import stage_figure
from llmopt_bench.analysis.roofline import roofline
from llmopt_bench.analysis.selectors import GB, comparable_stages, peak_memory
from llmopt_bench.core.fmt import pct
from llmopt_bench.core.host import Ceilings
from llmopt_bench.core.plotting import ALT, BASE, BEST, DOWN, UP, legend
from llmopt_bench.core.plotting import plt as _plt
from llmopt_bench.core.plotting import save as _save
from llmopt_bench.core.plotting import xlabels as _xlabels
from llmopt_bench.core.results import RunResult, StageResult
from llmopt_bench.render.hooks import stage_charts


def _tpot_ms(s: StageResult) -> float | None:
    return stage_figure(s, "tpot_p50").value


def latency_waterfall(run: RunResult, path: Path) -> Path | None:
    """TPOT p50 per stage in journey order: each bar floats from the previous stage's value."""
    timed = [(s, v) for s in comparable_stages(run) if (v := _tpot_ms(s))]
    if not timed:
        return None
    plt = _plt()
    stages, values = [s for s, _ in timed], [v for _, v in timed]
    best = min(range(len(values)), key=lambda i: values[i])
    show_best = best != 0  # the best bar repeats nothing when the baseline is the best (or the only) stage
    names = [s.name for s in stages] + ([f"best: {stages[best].name}"] if show_best else [])
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    prev: float | None = None
    for i, v in enumerate(values):
        lo, hi = (0, v) if prev is None else (min(prev, v), max(prev, v))
        color = BASE if prev is None else DOWN if v <= prev else UP
        ax.bar(i, max(hi - lo, values[0] * 0.004), bottom=lo, color=color)
        label = f"{v:.3g} ms" if prev is None else f"{v:.3g} ms\n{prev / v:.2f}x"
        ax.annotate(label, (i, hi), ha="center", va="bottom", fontsize=8)
        prev = v
    if show_best:
        ax.bar(len(values), values[best], color=BEST)
        ax.annotate(f"{values[best]:.3g} ms\n{values[0] / values[best]:.2f}x baseline", (len(values), values[best]),
                    ha="center", va="bottom", fontsize=8)
    _xlabels(ax, names)
    ax.set_ylabel("TPOT p50 (ms per output token)")
    ax.set_ylim(0, max(values) * 1.25)
    ax.set_title("Per-token latency, baseline to best\n(each bar from the stage before: green faster, red slower)", fontsize=10)
    return _save(fig, path)


def throughput(run: RunResult, path: Path) -> Path | None:
    measured: list[tuple[str, float, tuple[float, float]]] = []
    for s in comparable_stages(run):  # each bar the stage's figure, its whisker the figure's 95% interval
        f = stage_figure(s, "output_tok_s")
        if f.value:
            measured.append((s.name, f.value, f.interval or (f.value, f.value)))
    if not measured:
        return None
    plt = _plt()
    vals = [v for _, v, _ in measured]
    lo = [v - iv[0] for _, v, iv in measured]
    hi = [iv[1] - v for _, v, iv in measured]
    stages = [name for name, _, _ in measured]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(stages)), 4.5))
    ax.bar(range(len(vals)), vals, yerr=[lo, hi], capsize=4, color=BEST)
    for i, v in enumerate(vals):
        ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=8, xytext=(8, 2), textcoords="offset points")
    _xlabels(ax, stages)
    ax.set_ylabel("output tokens / s (geometric mean of repeats; bars: its 95% interval)")
    ax.set_title("Output throughput per stage")
    return _save(fig, path)


def memory_parts(s: StageResult) -> tuple[float, float, float] | None:
    """(weights, KV cache, other) in GB: the weights and KV cache the load recorded, the rest of the peak."""
    weights = (s.load.weights_bytes or 0) if s.load else 0
    kv = (s.load.kv_cache_bytes or 0) if s.load else 0
    peak = peak_memory(s)[0] or 0
    if not (weights or kv or peak):
        return None
    return weights / GB, kv / GB, max(peak - weights - kv, 0) / GB


def memory(run: RunResult, path: Path) -> Path | None:
    rows = [(s.name, parts) for s in comparable_stages(run) if (parts := memory_parts(s))]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4.5))
    bottom = [0.0] * len(rows)
    for j, (label, color) in enumerate((("weights", BEST), ("KV cache", ALT), ("other (activations, runtime)", BASE))):
        vals = [p[j] for _, p in rows]
        if not any(vals):  # no legend entry for a part no stage has
            continue
        ax.bar(range(len(rows)), vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.3g} GB", (i, total), ha="center", va="bottom", fontsize=8)
    sources = sorted({src for s in comparable_stages(run) if (src := peak_memory(s)[1])})
    _xlabels(ax, [n for n, _ in rows])
    ax.set_ylabel("GB")
    ax.set_title("Memory per stage" + (f" (peak: {', '.join(sources)})" if sources else ""), fontsize=10)
    legend(ax, fontsize=8)
    return _save(fig, path)


def distributions(run: RunResult, path: Path) -> Path | None:
    stages = [s for s in comparable_stages(run) if s.samples and s.samples.ttft_s]
    if not stages:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 1.6 * len(stages) * 2), 4.8))
    fig.suptitle("Per-request latency distributions (box: quartiles, line: median, triangle: mean, o: outliers)", fontsize=10)
    for ax, (attr, title) in zip(axes, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))):
        data = [[v * 1e3 for v in getattr(s.samples, attr) if v is not None] or [float("nan")] for s in stages]
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(stages) + 1))
        # n under each name: a box of 8 requests is not a distribution of 800
        ax.set_xticklabels([f"{s.name}\nn={sum(v == v for v in d)}" for s, d in zip(stages, data)],
                           rotation=25 if len(stages) > 2 else 0)
        flat = [v for d in data for v in d if v == v and v > 0]
        if flat and max(flat) / min(flat) > 50:
            ax.set_yscale("log")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title} per request" + (" (log scale)" if ax.get_yscale() == "log" else ""))
    return _save(fig, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both: lower x (latency), higher y (quality)."""
    return [i for i, (x, y) in enumerate(points)
            if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)]


def agreement_point(s: StageResult) -> float | None:
    """A stage's token match with the reference as measured; the reference's own is its match
    with its own re-run (97.7% where the engine is not deterministic), not a 100% by definition.
    Only a reference that did not measure it (schema-1 runs) stands at 100%."""
    if s.quality is not None and s.quality.token_match_rate is not None:
        return s.quality.token_match_rate
    return 1.0 if s.quality_reference else None


def quality_speed(run: RunResult, path: Path) -> Path | None:
    """TPOT against token match with the reference: the trade-off each stage makes."""
    named = [(s.name + (" (reference, vs its own re-run)" if s.quality_reference else ""), _tpot_ms(s), agreement_point(s))
             for s in comparable_stages(run) if s.quality is not None]
    pts = [(n, x, y) for n, x, y in named if x is not None and y is not None]
    if len(pts) < 2:  # one point is no trade-off
        return None
    plt = _plt()
    front = pareto_front([(x, y) for _, x, y in pts])
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (n, x, y) in enumerate(pts):
        ax.scatter([x], [y * 100], color=BEST if i in front else BASE, s=60, zorder=3)
        ax.annotate(n, (x, y * 100), xytext=(5, 4), textcoords="offset points", fontsize=8)
    fp = sorted((pts[i][1], pts[i][2] * 100) for i in front)
    if len(fp) > 1:
        ax.step([x for x, _ in fp], [y for _, y in fp], where="post", color=BEST, label="Pareto front")
    ax.set_xlabel("TPOT p50 (ms per output token, lower is faster)")
    ax.set_ylabel("token match with the quality reference (%)")
    ax.set_title("Quality vs speed (blue: Pareto front)")
    legend(ax, fontsize=8)
    return _save(fig, path)


def roofline_chart(run: RunResult, path: Path) -> Path | None:
    rows = roofline(run)
    decode = [r for r in rows if r.phase == "decode"]
    bw, peak = (run.env.ceilings or Ceilings()).roof()
    if not decode or not bw:  # no row without the measured bandwidth
        return None
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, max(4.5, 0.6 * len(decode) + 2)))
    fig.suptitle("Roofline from the measured ceilings (memory bandwidth, matmul FLOP/s)", fontsize=10)
    ys = range(len(decode))
    ax.barh([y + 0.2 for y in ys], [r.measured_s * 1e3 for r in decode], height=0.4, color=BASE, label="measured TPOT p50")
    ax.barh([y - 0.2 for y in ys], [r.memory_s * 1e3 for r in decode], height=0.4, color=BEST, label="bytes at the measured bandwidth")
    for y, r in zip(ys, decode):
        ax.annotate(f"{pct(r.achieved)} of the memory ceiling, {r.bound}", (r.measured_s * 1e3, y + 0.2), va="center",
                    xytext=(3, 0), textcoords="offset points", fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r.stage for r in decode])
    ax.set_ylim(len(decode) - 0.4, -0.6)  # first stage on top
    ax.set_xlabel("ms per decode step")
    ax.set_xlim(0, max(r.measured_s for r in decode) * 1e3 * 1.6)
    # two lines, at the suptitle's size: one line is wider than the axes and was cut at the figure's edge
    ax.set_title("Decode: measured vs the memory ceiling\n(bytes / measured copy bandwidth)", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)  # below: bars and labels fill the axes
    xs = [r.intensity for r in rows if r.intensity > 0]
    lo, hi = min(xs + [0.1]) / 4, max(xs + [(peak or 0) / bw * 4 if peak else 10])
    grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
    ax2.plot(grid, [min(bw * x, peak or float("inf")) for x in grid], color="black", label="roof (measured ceilings)")
    colors = {name: f"C{i % 10}" for i, name in enumerate(dict.fromkeys(r.stage for r in rows))}
    for r in rows:
        ax2.scatter([r.intensity], [r.flops_per_step / r.measured_s], marker="o" if r.phase == "decode" else "^", s=50,
                    zorder=3, color=colors[r.stage], label=r.stage if r.phase == "decode" else None)
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    ax2.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax2.set_ylabel("achieved FLOP / s")
    ax2.set_title("Roofline (o decode, ^ prefill)", fontsize=10)
    ax2.legend(fontsize=8)
    return _save(fig, path)


CHARTS: dict[str, Callable[[RunResult, Path], Path | None]] = {
    "latency_waterfall": latency_waterfall, "throughput": throughput, "memory": memory,
    "distributions": distributions, "quality_speed": quality_speed, "roofline": roofline_chart,
}


def write_charts(run: RunResult, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    written = []
    for name, fn in CHARTS.items():
        path = fn(run, out_dir / f"{name}.png")
        if path is not None:
            written.append(path)
    return written


def write_stage_charts(run: RunResult, out_dir: Path) -> dict[str, list[Path]]:
    """Each ok stage's own charts (Stage.charts), by result name."""
    return {s.name: paths for s in run.stages if s.status == "ok" and (paths := stage_charts(s, run, Path(out_dir)))}
