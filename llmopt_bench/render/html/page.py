"""The HTML file: plotly.js inlined once, the page's data as JSON in a script block that no
browser parses as markup, and the viewer (app.js, style.css) beside it; a content security
policy that allows no request at all and no script but these. What a run recorded (prompts,
errors, paths, stage names) is data: app.js sets it with textContent, and a chart's labels reach
plotly entity-escaped (`esc`), where plotly would otherwise read a tag in them."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#393b79", "#e7ba52", "#637939", "#ad494a", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363"]


def esc(text: Any) -> str:
    """A run's text as a chart label: plotly reads a subset of HTML in labels, entities decoded,
    so `<` is written `&lt;` to be shown as itself and never taken for a tag."""
    return html.escape(str(text), quote=False)


def colour(i: int) -> str:
    """Twenty distinct colours before one repeats (plotly's default has ten)."""
    return PALETTE[i % len(PALETTE)]


def clean(value: Any) -> Any:
    """JSON that JSON.parse reads: NaN and infinities become null, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def text(body: str) -> dict:
    return {"kind": "text", "text": body}


def bullets(lines: list[str]) -> dict:
    return {"kind": "list", "items": list(lines)}


def table(headers: list[str], rows: list[list[Any]], title: str = "") -> dict:
    return {"kind": "table", "title": title, "headers": list(headers), "rows": [list(r) for r in rows]}


def chart(cid: str, title: str, data: list[dict], layout: dict, headers: list[str], rows: list[list[Any]], note: str = "") -> dict:
    """One chart and the table of its numbers (the page's table view)."""
    layout = {"margin": {"t": 32, "l": 64, "r": 24, "b": 64}, "hovermode": "closest", "legend": {"orientation": "h", "y": -0.2},
              **layout}
    for axis in [k for k in layout if k.startswith(("xaxis", "yaxis"))]:  # long stage names push the margin, not get cut
        layout[axis] = {"automargin": True, **layout[axis]}
    return {"kind": "chart", "id": cid, "title": title, "note": note, "figure": {"data": data, "layout": layout},
            "table": {"headers": list(headers), "rows": [list(r) for r in rows]}}


def script_json(data: Any) -> str:
    """The data as the body of <script type="application/json">: nothing in it can end the block
    or open markup (<, >, & escaped), and the line separators JavaScript once rejected in strings."""
    body = json.dumps(clean(data), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for raw, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        body = body.replace(raw, escaped)
    return body


def _asset(name: str) -> str:
    return resources.files("llmopt_bench.render.html").joinpath(name).read_text(encoding="utf-8")


def _sha(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode() + "'"


def render_page(title: str, page: dict) -> str:
    """The whole file. The policy names each script by its hash: an injected script or event
    handler would not run even if markup got in; nothing may be fetched (default-src 'none')."""
    from plotly.offline import get_plotlyjs

    plotly_js, app_js = get_plotlyjs(), _asset("app.js")
    policy = ("default-src 'none'; img-src data: blob:; style-src 'unsafe-inline'; font-src data:; "
              f"script-src {_sha(plotly_js)} {_sha(app_js)}")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{policy}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">', f"<title>{html.escape(title)}</title>",
        f"<style>{_asset('style.css')}</style>", "</head>", "<body>",
        '<noscript>This report draws its charts and tables with JavaScript; report.md holds the same tables.</noscript>',
        '<div id="app"></div>',
        f'<script type="application/json" id="llmopt-data">{script_json(page)}</script>',
        f"<script>{plotly_js}</script>", f"<script>{app_js}</script>", "</body>", "</html>", ""])


def write_page(path: Path, title: str, page: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_page(title, page), encoding="utf-8")
    return path
