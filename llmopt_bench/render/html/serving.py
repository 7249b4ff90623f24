"""A load stage's section of a run's page: latency percentiles against the offered load with the
SLO's lines, the capacity and the ceiling marked; completed and good requests a second against
the offered rate; the server's clock beside the client's; and each load point's requests over
time (TTFT, TPOT, requests in flight), where warm-up, steady state and saturation show. Read from
the stage's extra and requests.jsonl as they are written (data.py)."""

from __future__ import annotations

import math
from typing import Any

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Json
from llmopt_bench.core.results import StageResult
from llmopt_bench.core.slo import parse_slo
from llmopt_bench.render.html.data import load_curves, number, point_key, requests_by_point
from llmopt_bench.render.html.page import chart, colour, esc

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"))
MS = 1e3


def slo_limits(result: StageResult) -> dict[str, float]:
    """The SLO's limits in ms by target name ("ttft_p99"), from the stage's settings."""
    text = ((result.extra or {}).get("settings") or {}).get("slo")
    try:
        return {t.name: t.limit_s * MS for t in parse_slo(text).targets} if text else {}
    except UsageError:
        return {}


def marks(result: StageResult) -> dict[str, float]:
    """The rates marked on the offered-load axis: the capacity, the ceiling, the knee."""
    c = (result.extra or {}).get("capacity")
    if not isinstance(c, dict):  # continuous-batching's "capacity" is its KV-cache probes, not a search
        return {}
    found = {"capacity": number(c.get("capacity_rps")), "ceiling": number(c.get("ceiling_rps")) or number(c.get("saturation_rps")),
             "knee": number(c.get("knee_rps"))}
    return {k: v for k, v in found.items() if v}


def _vline(x: float, label: str, dash: str, color: str) -> tuple[dict, dict]:
    shape = {"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
             "line": {"dash": dash, "color": color, "width": 1.5}}
    note = {"xref": "x", "yref": "paper", "x": x, "y": 1.02, "text": f"{label} {x:.4g}", "showarrow": False,
            "font": {"size": 10, "color": color}}
    return shape, note


def latency_chart(cid: str, title: str, rows: list[Json], x_key: str, x_label: str, limits: dict[str, float],
                  rate_marks: dict[str, float]) -> dict | None:
    """TTFT (top) and TPOT (bottom) p50 and p99 against x, each with its SLO line."""
    rows = sorted((r for r in rows if number(r.get(x_key)) is not None), key=lambda r: r[x_key])
    if not rows:
        return None
    groups: dict[str, list[Json]] = {}
    for r in rows:  # continuous-batching's curve holds a continuous and a static series
        mode = r.get("mode")
        groups.setdefault(mode if mode in ("continuous", "static") else "", []).append(r)
    data: list[dict] = []
    shapes: list[dict] = []
    notes: list[dict] = []
    for i, (key, label) in enumerate(LATENCIES):
        axis = "y" if i == 0 else "y2"
        for g, (group, kept) in enumerate(groups.items()):
            for j, stat in enumerate(("p50", "p99")):
                name = f"{label} {stat}" + (f" ({group})" if group else "")
                data.append({"type": "scatter", "mode": "lines+markers", "name": name, "x": [r[x_key] for r in kept], "yaxis": axis,
                             "y": [v * MS if (v := number(r.get(f"{key}_{stat}_s"))) is not None else None for r in kept],
                             "line": {"color": colour(4 * g + 2 * i + j), "dash": "solid" if stat == "p99" else "dot"},
                             "hovertemplate": f"{name} %{{y:.4g}} ms at %{{x:.4g}}<extra></extra>"})
        for name, limit in limits.items():
            if name.startswith(key + "_"):
                shapes.append({"type": "line", "xref": "paper", "yref": axis, "x0": 0, "x1": 1, "y0": limit, "y1": limit,
                               "line": {"color": "#c62828", "dash": "dash", "width": 1.5}})
                # a note on a log axis is placed by the log10 of its value (a shape by the value)
                notes.append({"xref": "paper", "yref": axis, "x": 1, "y": math.log10(limit), "xanchor": "right", "yanchor": "bottom",
                              "text": f"SLO {name} {limit:g} ms", "showarrow": False, "font": {"size": 10, "color": "#c62828"}})
    for (name, x), (dash, c) in zip(rate_marks.items(), (("solid", "#2e7d32"), ("dash", "#000"), ("dot", "#6a1b9a"))):
        s, n = _vline(x, name, dash, c)
        shapes.append(s)
        notes.append(n)
    layout = {"xaxis": {"title": {"text": x_label}, "anchor": "y2"}, "height": 560, "shapes": shapes, "annotations": notes,
              "yaxis": {"title": {"text": "TTFT (ms)"}, "domain": [0.55, 1], "type": "log"},
              "yaxis2": {"title": {"text": "TPOT (ms)"}, "domain": [0, 0.45], "type": "log"}}
    headers = [x_label, "phase or mode", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "SLO", "steady"]
    table = [[r[x_key], r.get("phase") or r.get("mode"), *(v * MS if (v := number(r.get(k))) is not None else None
              for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")),
              _verdict(r.get("slo_ok")), _verdict(r.get("steady"))] for r in rows]
    return chart(cid, title, data, layout, headers, table)


def _verdict(v: Any) -> str:
    return "-" if v is None else "yes" if v else "no"


def rate_chart(cid: str, title: str, rows: list[Json], rate_marks: dict[str, float]) -> dict | None:
    """Completed and good requests a second against the offered rate (open loop), the diagonal
    where every offered request completes."""
    rows = sorted((r for r in rows if number(r.get("rate_rps")) is not None), key=lambda r: r["rate_rps"])
    if not rows:
        return None
    xs = [r["rate_rps"] for r in rows]
    done = [number(r.get("completion_rps")) or number(r.get("qps")) for r in rows]
    good = [number(r.get("goodput_rps")) for r in rows]
    top = max([*xs, *(v for v in done + good if v)])
    data = [{"type": "scatter", "mode": "lines", "name": "offered = completed", "x": [0, top], "y": [0, top],
             "line": {"color": "#bbb", "dash": "dot"}, "hoverinfo": "skip"},
            {"type": "scatter", "mode": "lines+markers", "name": "completed req/s", "x": xs, "y": done, "line": {"color": colour(0)}},
            {"type": "scatter", "mode": "lines+markers", "name": "goodput req/s (met the SLO)", "x": xs, "y": good,
             "line": {"color": colour(2)}}]
    shapes, notes = [], []
    for (name, x), (dash, c) in zip(rate_marks.items(), (("solid", "#2e7d32"), ("dash", "#000"), ("dot", "#6a1b9a"))):
        s, n = _vline(x, name, dash, c)
        shapes.append(s)
        notes.append(n)
    return chart(cid, title, data, {"xaxis": {"title": {"text": "offered rate (req/s)"}},
                                    "yaxis": {"title": {"text": "req/s"}}, "shapes": shapes, "annotations": notes},
                 ["offered req/s", "phase", "completed req/s", "goodput req/s", "output tok/s"],
                 [[x, r.get("phase"), d, g, number(r.get("output_tok_s"))] for x, r, d, g in zip(xs, rows, done, good)])


def clock_chart(cid: str, title: str, rows: list[Json]) -> dict | None:
    """The client's mean TTFT and E2E beside the server's own (/metrics), point by point."""
    kept = [(point_key(r), r["server_clock"]) for r in rows if isinstance(r.get("server_clock"), dict)]
    kept = [(k, sc) for k, sc in kept if sc.get("client")]
    if not kept:
        return None
    names = [esc(k) for k, _ in kept]
    data = []
    table = []
    for i, (fig, label) in enumerate((("ttft", "TTFT"), ("e2e", "E2E"))):
        client = [number((sc.get("client") or {}).get(f"{fig}_mean_s")) for _, sc in kept]
        server = [number((sc.get(fig) or {}).get("mean_s")) for _, sc in kept]
        data.append({"type": "bar", "name": f"{label} mean, client", "x": names, "y": [v * MS if v else None for v in client],
                     "marker": {"color": colour(2 * i)}})
        data.append({"type": "bar", "name": f"{label} mean, server", "x": names, "y": [v * MS if v else None for v in server],
                     "marker": {"color": colour(2 * i + 1)}})
        table += [[k, label, c * MS if c else None, s * MS if s else None, sc.get("verdict")]
                  for (k, sc), c, s in zip(kept, client, server)]
    return chart(cid, title, data, {"barmode": "group", "yaxis": {"title": {"text": "ms"}, "type": "log"}},
                 ["point", "figure", "client mean ms", "server mean ms", "reconciled"], table)


def request_charts(cid: str, point: str, reqs: list[Json]) -> list[dict]:
    """One point's requests over time from its first submit: TTFT and TPOT each request, and the
    requests in flight (sent, not finished)."""
    timed = sorted((r for r in reqs if number(r.get("t_submit")) is not None), key=lambda r: r["t_submit"])
    if not timed:
        return []
    t0 = timed[0]["t_submit"]
    ok = [r for r in timed if r.get("ok", True)]
    at = [r["t_submit"] - t0 for r in ok]
    ttft = [(r["t_first"] - r["t_submit"]) * MS for r in ok]
    tpot = [((r["t_done"] - r["t_first"]) / (r["output_tokens"] - 1) * MS) if r.get("output_tokens", 0) > 1 else None for r in ok]
    events = sorted([(r["t_submit"] - t0, 1) for r in timed] + [(r["t_done"] - t0, -1) for r in timed if number(r.get("t_done"))])
    steps_x, steps_y, n = [], [], 0
    for t, d in events:
        n += d
        steps_x.append(t)
        steps_y.append(n)
    failed = len(timed) - len(ok)
    data = [{"type": "scatter", "mode": "markers", "name": "TTFT ms", "x": at, "y": ttft, "marker": {"size": 5, "color": colour(0)}},
            {"type": "scatter", "mode": "markers", "name": "TPOT ms", "x": at, "y": tpot, "yaxis": "y2",
             "marker": {"size": 5, "color": colour(2)}},
            {"type": "scatter", "mode": "lines", "name": "in flight", "x": steps_x, "y": steps_y, "yaxis": "y3",
             "line": {"shape": "hv", "color": colour(4)}}]
    layout = {"height": 620, "xaxis": {"title": {"text": "seconds since the point's first request"}, "anchor": "y3"},
              "yaxis": {"title": {"text": "TTFT ms"}, "domain": [0.7, 1]},
              "yaxis2": {"title": {"text": "TPOT ms"}, "domain": [0.36, 0.64]},
              "yaxis3": {"title": {"text": "in flight"}, "domain": [0, 0.3]}}
    title = f"{point}: {len(ok)} requests over time" + (f" ({failed} failed, not drawn)" if failed else "")
    return [chart(cid, title, data, layout, ["request", "sent s", "TTFT ms", "TPOT ms", "output tokens"],
                  [[r.get("request_id"), a, f, p, r.get("output_tokens")] for r, a, f, p in zip(ok, at, ttft, tpot)])]


def serving_items(result: StageResult, lines: list[Json], n: int) -> list[dict]:
    """The charts of one load stage (n: its place in the page, for unique ids)."""
    limits, rate_marks = slo_limits(result), marks(result)
    items: list[dict] = []
    for arm, rows in load_curves(result):
        tag, where = f"s{n}{'-' + arm.split()[-1] if arm else ''}", f"{result.name}{' (' + arm + ')' if arm else ''}"
        opened = [r for r in rows if r.get("mode") == "open" or (r.get("rate_rps") is not None and r.get("concurrency") is None)]
        closed = [r for r in rows if r not in opened and r.get("phase") in ("sweep", None)]
        slo = ", ".join(f"{k} {v:g} ms" for k, v in limits.items()) or "none recorded"
        made = [latency_chart(f"{tag}-open", f"{where}: latency against the offered rate (SLO: {slo})", opened, "rate_rps",
                              "offered rate (req/s)", limits, rate_marks),
                rate_chart(f"{tag}-rate", f"{where}: completed and good requests a second against the offered rate", opened, rate_marks),
                latency_chart(f"{tag}-closed", f"{where}: latency against concurrency (closed loop)", closed, "concurrency",
                              "concurrent users", limits, {}),
                clock_chart(f"{tag}-clock", f"{where}: the server's clock beside the client's (means, ms)", rows)]
        items += [c for c in made if c is not None]
    by_point = requests_by_point(result, lines)
    if by_point:
        named = (result.extra or {}).get("main_point")  # a prefix-caching stage's points carry their arm first
        main = next((k for k in by_point if named and (k == named or k.endswith(": " + named))), None)
        order = sorted(by_point, key=lambda k: (k != main, list(by_point).index(k)))
        options = [{"name": k + (" (headline)" if k == main else ""), "items": request_charts(f"s{n}-req{i}", k, by_point[k])}
                   for i, k in enumerate(order)]
        items.append({"kind": "picker", "id": f"s{n}-requests", "label": f"{result.name}: a load point's requests over time",
                      "options": [o for o in options if o["items"]]})
    return items
