"""The report's charts (PNG, matplotlib Agg) from run.json alone. Each chart function returns
the file it wrote, or None when its data is absent; write_charts returns the files written."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from llmopt_bench.render.exports import GB, comparable_stages, ok_stages, peak_memory, quality
from llmopt_bench.results import RunResult

DOWN, UP, BASE, BEST = "#2e7d32", "#c62828", "#757575", "#1565c0"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    return path


def _plain_log2(ax: Any) -> None:
    from matplotlib.ticker import ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ScalarFormatter())


def _xlabels(ax: Any, names: list[str]) -> None:
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=25 if len(names) > 3 else 0, ha="right" if len(names) > 3 else "center")


def _tpot_ms(s: Any) -> float | None:
    return s.metrics.tpot_s.p50 * 1e3 if s.metrics and s.metrics.tpot_s else None


def latency_waterfall(run: RunResult, path: Path) -> Path | None:
    """TPOT p50 per stage in journey order: each bar floats from the previous stage's value."""
    stages = [s for s in comparable_stages(run) if _tpot_ms(s)]
    if not stages:
        return None
    plt = _plt()
    values = [_tpot_ms(s) for s in stages]
    best = min(range(len(values)), key=values.__getitem__)
    names = [s.name for s in stages] + [f"best: {stages[best].name}"]
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(names)), 4.5))
    prev = None
    for i, v in enumerate(values):
        lo, hi = (0, v) if prev is None else (min(prev, v), max(prev, v))
        color = BASE if prev is None else DOWN if v <= prev else UP
        ax.bar(i, max(hi - lo, values[0] * 0.004), bottom=lo, color=color)
        label = f"{v:.3g} ms" if prev is None else f"{v:.3g} ms\n{prev / v:.2f}x"
        ax.annotate(label, (i, hi), ha="center", va="bottom", fontsize=8)
        prev = v
    ax.bar(len(values), values[best], color=BEST)
    ax.annotate(f"{values[best]:.3g} ms\n{values[0] / values[best]:.2f}x baseline", (len(values), values[best]),
                ha="center", va="bottom", fontsize=8)
    _xlabels(ax, names)
    ax.set_ylabel("TPOT p50 (ms per output token)")
    ax.set_ylim(0, max(values) * 1.25)
    ax.set_title("Per-token latency, baseline to best\n(each bar from the stage before: green faster, red slower)", fontsize=10)
    return _save(fig, path)


def throughput(run: RunResult, path: Path) -> Path | None:
    stages = [s for s in comparable_stages(run) if s.metrics.output_tok_s]
    if not stages:
        return None
    plt = _plt()
    vals = [s.metrics.output_tok_s for s in stages]
    lo = [v - min(s.metrics.output_tok_s_repeats or [v]) for s, v in zip(stages, vals)]
    hi = [max(s.metrics.output_tok_s_repeats or [v]) - v for s, v in zip(stages, vals)]
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(stages)), 4.5))
    ax.bar(range(len(vals)), vals, yerr=[lo, hi], capsize=4, color=BEST)
    for i, v in enumerate(vals):
        ax.annotate(f"{v:.3g}", (i, v), ha="center", va="bottom", fontsize=8, xytext=(8, 2), textcoords="offset points")
    _xlabels(ax, [s.name for s in stages])
    ax.set_ylabel("output tokens / s (mean of repeats; bars: min-max)")
    ax.set_title("Output throughput per stage")
    return _save(fig, path)


def memory_parts(s: Any) -> tuple[float, float, float] | None:
    """(weights, KV cache, other) in GB, from memory_split, else weights + kv_cache + peak."""
    x = s.extra or {}
    split = x.get("memory_split")
    if isinstance(split, dict):
        return tuple((split.get(k) or 0) / GB for k in ("weights_bytes", "kv_cache_bytes", "other_bytes"))
    weights = (s.load.weights_bytes or 0) if s.load else 0
    kv = ((x.get("kv_cache") or {}).get("bytes") or 0) if isinstance(x.get("kv_cache"), dict) else 0
    peak = peak_memory(s)[0] or 0
    if not (weights or kv or peak):
        return None
    return weights / GB, kv / GB, max(peak - weights - kv, 0) / GB


def memory(run: RunResult, path: Path) -> Path | None:
    rows = [(s.name, parts) for s in run.stages if (parts := memory_parts(s))]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows)), 4.5))
    bottom = [0.0] * len(rows)
    for j, (label, color) in enumerate((("weights", BEST), ("KV cache", "#f9a825"), ("other (activations, runtime)", BASE))):
        vals = [p[j] for _, p in rows]
        ax.bar(range(len(rows)), vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.3g} GB", (i, total), ha="center", va="bottom", fontsize=8)
    sources = sorted({src for s in run.stages if (src := peak_memory(s)[1])})
    _xlabels(ax, [n for n, _ in rows])
    ax.set_ylabel("GB")
    ax.set_title("Memory per stage" + (f" (peak: {', '.join(sources)})" if sources else ""), fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def distributions(run: RunResult, path: Path) -> Path | None:
    stages = [s for s in ok_stages(run) if s.samples and s.samples.ttft_s]
    if not stages:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(max(10, 1.6 * len(stages) * 2), 4.8))
    fig.suptitle("Per-request latency distributions (box: quartiles, line: median, triangle: mean, o: outliers)", fontsize=10)
    for ax, (attr, title) in zip(axes, (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))):
        data = [[v * 1e3 for v in getattr(s.samples, attr) if v is not None] or [float("nan")] for s in stages]
        ax.boxplot(data, showmeans=True)
        ax.set_xticks(range(1, len(stages) + 1))
        ax.set_xticklabels([s.name for s in stages], rotation=25 if len(stages) > 2 else 0)
        flat = [v for d in data for v in d if v == v and v > 0]
        if flat and max(flat) / min(flat) > 50:
            ax.set_yscale("log")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title} per request" + (" (log scale)" if ax.get_yscale() == "log" else ""))
    return _save(fig, path)


def batching_curve(run: RunResult, path: Path) -> Path | None:
    curves = [(s.name, s.extra["curve"]) for s in ok_stages(run) if isinstance((s.extra or {}).get("curve"), list)]
    if not curves:
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    xlabel = "concurrency (requests in flight)"
    for name, curve in curves:
        for mode, style in (("continuous", "-o"), ("static", "--s")):
            rows = [r for r in curve if r.get("mode") == mode]
            key = "concurrency" if any(r.get("concurrency") for r in rows) else "rate_rps" if any(r.get("rate_rps") for r in rows) else "rate"
            if key != "concurrency":
                xlabel = "arrival rate (requests / s)"
            rows = sorted((r for r in rows if r.get(key) is not None), key=lambda r: r[key])
            if not rows:
                continue
            xs = [r[key] for r in rows]
            axes[0].plot(xs, [r.get("output_tok_s") or float("nan") for r in rows], style, label=f"{name} {mode}")
            axes[1].plot(xs, [(r.get("tpot_p50_s") or float("nan")) * 1e3 for r in rows], style, label=f"{name} {mode}")
    for ax, ylabel, title in ((axes[0], "output tokens / s", "Throughput vs load"),
                              (axes[1], "TPOT p50 (ms)", "Per-token latency vs load")):
        _plain_log2(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.legend(fontsize=8)
    return _save(fig, path)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of points no other point beats on both: lower x (latency), higher y (quality)."""
    return [i for i, (x, y) in enumerate(points)
            if not any((x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)]


def quality_speed(run: RunResult, path: Path) -> Path | None:
    pts = [(s.name, _tpot_ms(s), quality(s).get("token_match_rate")) for s in ok_stages(run) if quality(s)]
    refs = {quality(s).get("reference") for s in ok_stages(run) if quality(s)}
    pts = [(n, x, 1.0 if y is None and n in refs else y) for n, x, y in pts]
    pts = [(n, x, y) for n, x, y in pts if x is not None and y is not None]
    if not pts:
        return None
    plt = _plt()
    front = pareto_front([(x, y) for _, x, y in pts])
    fig, ax = plt.subplots(figsize=(7, 5))
    for i, (n, x, y) in enumerate(pts):
        ax.scatter([x], [y * 100], color=BEST if i in front else BASE, s=60, zorder=3)
        ax.annotate(n, (x, y * 100), xytext=(5, 4), textcoords="offset points", fontsize=8)
    fp = sorted((pts[i][1], pts[i][2] * 100) for i in front)
    ax.step([x for x, _ in fp], [y for _, y in fp], where="post", color=BEST, label="Pareto front")
    ax.set_xlabel("TPOT p50 (ms per output token, lower is faster)")
    ax.set_ylabel("token match with the FP16 reference (%)")
    ax.set_title("Quality vs speed (blue: Pareto front)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def roofline_chart(run: RunResult, path: Path) -> Path | None:
    from llmopt_bench.analysis.roofline import ceilings, roofline

    rows = roofline(run)
    decode = [r for r in rows if r.phase == "decode"]
    if not decode:
        return None
    plt = _plt()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, max(4.5, 0.6 * len(decode) + 2)))
    fig.suptitle("Roofline from the measured ceilings (memory bandwidth, matmul FLOP/s)", fontsize=10)
    ys = range(len(decode))
    ax.barh([y + 0.2 for y in ys], [r.measured_s * 1e3 for r in decode], height=0.4, color=BASE, label="measured TPOT p50")
    ax.barh([y - 0.2 for y in ys], [r.floor_s * 1e3 for r in decode], height=0.4, color=BEST, label="memory floor")
    for y, r in zip(ys, decode):
        ax.annotate(f"{r.achieved * 100:.0f}% of floor, {r.bound}", (r.measured_s * 1e3, y + 0.2), va="center",
                    xytext=(3, 0), textcoords="offset points", fontsize=8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r.stage for r in decode])
    ax.set_ylim(len(decode) - 0.4, -0.6)  # first stage on top
    ax.set_xlabel("ms per decode step")
    ax.set_xlim(0, max(r.measured_s for r in decode) * 1e3 * 1.6)
    ax.set_title("Decode: measured vs memory floor (bytes / bandwidth)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)  # below: bars and labels fill the axes
    bw, peak = ceilings(run.env)
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
    ax2.set_title("Roofline (o decode, ^ prefill)")
    ax2.legend(fontsize=8)
    return _save(fig, path)


def flash_attention(run: RunResult, path: Path) -> Path | None:
    rows = [r for s in ok_stages(run) for r in ((s.extra or {}).get("speedups") or []) if isinstance(r, dict)]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = sorted({(r.get("impl"), r.get("batch")) for r in rows}, key=str)
    for impl, batch in series:
        for phase, style in (("prefill", "-o"), ("decode", "--s")):
            pts = sorted((r["context"], r[f"{phase}_speedup"]) for r in rows
                         if (r.get("impl"), r.get("batch")) == (impl, batch) and r.get("context") and r.get(f"{phase}_speedup"))
            if pts:
                label = f"{impl} {phase}" + (f", batch {batch}" if batch is not None and len(series) > 1 else "")
                ax.plot([c for c, _ in pts], [v for _, v in pts], style, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    _plain_log2(ax)
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("speedup vs eager attention (x)")
    ax.set_title("FlashAttention speedup by context and phase")
    ax.legend(fontsize=8)
    return _save(fig, path)


CHARTS: dict[str, Callable[[RunResult, Path], Path | None]] = {
    "latency_waterfall": latency_waterfall, "throughput": throughput, "memory": memory,
    "distributions": distributions, "batching_curve": batching_curve, "quality_speed": quality_speed,
    "roofline": roofline_chart, "flash_attention": flash_attention,
}


def write_charts(run: RunResult, out_dir: Path) -> list[Path]:
    out_dir = Path(out_dir)
    written = []
    for name, fn in CHARTS.items():
        path = fn(run, out_dir / f"{name}.png")
        if path is not None:
            written.append(path)
    return written
