"""The journey's section of a run's page: per-stage TTFT, TPOT and tok/s with the 95% interval of
each over its repeats, the speedup waterfall, the memory split, the roofline with the memory floor, and
quality beside speed. The same figures as report.md's (data.stage_figure; the memory parts,
the Pareto front and the quality point of render/charts.py)."""

from __future__ import annotations

from llmopt_bench.analysis.roofline import roofline
from llmopt_bench.analysis.selectors import comparable_stages, ok_stages, speedup_rows
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.charts import agreement_point, memory_parts, pareto_front
from llmopt_bench.render.html.data import stage_figure, whiskers
from llmopt_bench.render.html.page import chart, colour, esc

FIGURES = (("ttft_p50", "TTFT p50"), ("tpot_p50", "TPOT p50"), ("output_tok_s", "output tok/s"))


def figure_chart(run: RunResult, metric: str, label: str) -> dict | None:
    """One figure per ok stage, a bar each, whiskers at the figure's 95% interval over the repeats."""
    rows = [(s.name, stage_figure(s, metric)) for s in ok_stages(run)]
    rows = [(n, f) for n, f in rows if f.value is not None]
    if not rows:
        return None
    unit = rows[0][1].unit
    trace = {"type": "bar", "name": esc(label), "x": [esc(n) for n, _ in rows], "y": [f.value for _, f in rows],
             "marker": {"color": [colour(i) for i in range(len(rows))]},
             "error_y": whiskers([f for _, f in rows]),
             "hovertemplate": "%{x}: %{y:.4g} " + unit + "<extra></extra>"}
    return chart(f"figure-{metric}", f"{label} per stage ({unit}; whiskers: its 95% interval over the repeats)", [trace],
                 {"yaxis": {"title": {"text": f"{label} ({unit})"}}, "showlegend": False},
                 ["stage", f"{label} {unit}", "lowest repeat", "highest repeat", "repeats"],
                 [[n, f.value, f.lo, f.hi, f.repeats] for n, f in rows])


def waterfall(run: RunResult) -> dict | None:
    """TPOT p50 from the baseline to each stage: each step's change, then the best against the baseline."""
    rows = [(s.name, f.value) for s in comparable_stages(run) if (f := stage_figure(s, "tpot_p50")).value]
    if not rows:
        return None
    steps = [rows[0][1]] + [b - a for (_, a), (_, b) in zip(rows, rows[1:])]
    names = [esc(n) for n, _ in rows]
    trace = {"type": "waterfall", "x": names, "y": steps, "measure": ["absolute"] + ["relative"] * (len(rows) - 1),
             "decreasing": {"marker": {"color": "#2e7d32"}}, "increasing": {"marker": {"color": "#c62828"}},
             "totals": {"marker": {"color": "#1565c0"}}, "text": [f"{v:.3g} ms" for _, v in rows], "textposition": "outside",
             "hovertemplate": "%{x}: %{text}<extra></extra>"}
    x_rows = {r.stage: r for r in speedup_rows(run)}
    table = [[n, v, x_rows[n].previous if n in x_rows else None, x_rows[n].tpot_x_previous if n in x_rows else None,
              x_rows[n].tpot_x_baseline if n in x_rows else None] for n, v in rows]
    return chart("waterfall", "Per-token latency, baseline to each stage (TPOT p50 ms; green faster, red slower)", [trace],
                 {"yaxis": {"title": {"text": "TPOT p50 (ms)"}, "rangemode": "tozero"}, "showlegend": False},
                 ["stage", "TPOT p50 ms", "previous ok stage", "x previous", "x baseline"], table)


def memory_chart(run: RunResult) -> dict | None:
    rows = [(s.name, parts) for s in comparable_stages(run) if (parts := memory_parts(s))]
    if not rows:
        return None
    names = [esc(n) for n, _ in rows]
    data = [{"type": "bar", "name": part, "x": names, "y": [p[j] for _, p in rows], "marker": {"color": c},
             "hovertemplate": "%{x}: %{y:.3g} GB " + part + "<extra></extra>"}
            for j, (part, c) in enumerate((("weights", "#1565c0"), ("KV cache", "#f9a825"), ("other", "#757575")))
            if any(p[j] for _, p in rows)]
    return chart("memory", "Memory per stage (GB): weights, KV cache, the rest of the peak", data,
                 {"barmode": "stack", "yaxis": {"title": {"text": "GB"}}},
                 ["stage", "weights GB", "KV cache GB", "other GB", "peak GB"], [[n, *p, sum(p)] for n, p in rows])


def roofline_chart(run: RunResult) -> dict | None:
    """Each decode step measured against its memory floor (the bytes it reads at the measured bandwidth)."""
    decode = [r for r in roofline(run) if r.phase == "decode"]
    if not decode:
        return None
    names = [esc(r.stage) for r in decode]
    data = [{"type": "bar", "orientation": "h", "name": "measured decode step", "y": names, "x": [r.measured_s * 1e3 for r in decode],
             "marker": {"color": "#757575"}, "hovertemplate": "%{y}: %{x:.4g} ms measured<extra></extra>"},
            {"type": "bar", "orientation": "h", "name": "memory floor (bytes / measured bandwidth)", "y": names,
             "x": [r.memory_s * 1e3 for r in decode], "marker": {"color": "#1565c0"},
             "hovertemplate": "%{y}: %{x:.4g} ms at the measured bandwidth<extra></extra>"}]
    return chart("roofline", "Roofline: each decode step against the memory floor (ms)", data,
                 {"barmode": "group", "xaxis": {"title": {"text": "ms per decode step"}},
                  "yaxis": {"autorange": "reversed"}, "height": max(320, 60 * len(decode) + 160)},
                 ["stage", "measured ms", "memory floor ms", "of the ceiling", "bound", "GB a step"],
                 [[r.stage, r.measured_s * 1e3, r.memory_s * 1e3, r.achieved, r.bound, r.bytes_per_step / 1e9] for r in decode])


def quality_speed(run: RunResult) -> dict | None:
    pts: list[tuple[str, float, float]] = []
    for s in comparable_stages(run):
        x, y = stage_figure(s, "tpot_p50").value, agreement_point(s) if s.quality is not None else None
        if x is not None and y is not None:
            pts.append((s.name, x, y))
    if len(pts) < 2:
        return None
    front = set(pareto_front([(x, y) for _, x, y in pts]))
    data = [{"type": "scatter", "mode": "markers+text", "name": "stages", "x": [x for _, x, _ in pts],
             "y": [y * 100 for _, _, y in pts], "text": [esc(n) for n, _, _ in pts], "textposition": "top right",
             "marker": {"size": 11, "color": ["#1565c0" if i in front else "#757575" for i in range(len(pts))]},
             "hovertemplate": "%{text}: TPOT %{x:.4g} ms, match %{y:.1f}%<extra></extra>"}]
    fp = sorted((pts[i][1], pts[i][2] * 100) for i in front)
    if len(fp) > 1:
        data.append({"type": "scatter", "mode": "lines", "name": "Pareto front", "x": [x for x, _ in fp], "y": [y for _, y in fp],
                     "line": {"shape": "hv", "color": "#1565c0"}})
    judged = bool(run.model and run.model.real_weights)
    title = "Quality beside speed: token match with the reference against TPOT p50" + ("" if judged else " (quality not judged: random weights)")
    return chart("quality-speed", title, data,
                 {"xaxis": {"title": {"text": "TPOT p50 (ms, lower is faster)"}},
                  "yaxis": {"title": {"text": "token match with the quality reference (%)"}}},
                 ["stage", "TPOT p50 ms", "token match", "on the Pareto front"],
                 [[n, x, y, i in front] for i, (n, x, y) in enumerate(pts)],
                 note="" if judged else "Random weights judge speed, never quality: quality is not judged here; the token "
                                         "match says only whether two engines agree on the same random model.")


def journey_charts(run: RunResult) -> list[dict]:
    made = [figure_chart(run, m, label) for m, label in FIGURES]
    made += [waterfall(run), memory_chart(run), roofline_chart(run), quality_speed(run)]
    return [c for c in made if c is not None]
