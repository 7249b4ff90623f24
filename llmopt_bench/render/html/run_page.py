"""A run's page (report.html): the sections, in the order a reader asks their questions: what ran
and where, the journey's figures, the story's claims and conclusions, what to deploy, the load
stages, tune's trials, each stage's details. Each section's numbers come from the modules the
other outputs use (selectors, hooks, recommend, conclusions), laid out as data for app.js."""

from __future__ import annotations

import re
from pathlib import Path

from llmopt_bench.analysis.narrative.conclusions import conclusions
from llmopt_bench.analysis.recommend.choose import recommend
from llmopt_bench.analysis.recommend.text import lines as recommend_lines
from llmopt_bench.analysis.selectors import stage_table_rows
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.hooks import collect_claims, stage_blocks
from llmopt_bench.render.html.data import load_curves, request_lines, stage_figure, tune_record
from llmopt_bench.render.html.journey import journey_charts
from llmopt_bench.render.html.page import bullets, table, text
from llmopt_bench.render.html.serving import serving_items
from llmopt_bench.render.html.tune import tune_items


def plain(line: str) -> str:
    """A markdown line as plain text: the emphasis marks and code ticks dropped."""
    return re.sub(r"\*\*|`", "", line)


def header(run: RunResult) -> dict:
    m, env, w = run.model, run.env, run.workload
    return {"run_id": run.run_id, "status": run.status, "created_at": run.created_at, "command": run.command,
            "device": f"{env.machine or '?'} ({env.device or '?'})", "model": m.source if m else "?",
            "weights": ("real" if m.real_weights else "synthetic (random): speed is judged, quality is not") if m else "?",
            "workload": f"{w.num_prompts} prompts ({w.kind}), {w.max_new_tokens} new tokens forced, batch {w.batch_size}, "
                        f"{w.repeats} repeats, seed {w.seed}", "llmopt": f"{run.llmopt_version} ({env.llmopt_commit or '-'})"}


def stage_table(run: RunResult) -> dict:
    """Every stage with its figures and their intervals (the table view of the figure charts)."""
    rows = []
    for s, r in zip(run.stages, stage_table_rows(run)):
        figs = [stage_figure(s, k) if s.status == "ok" and s.metrics else None for k in ("ttft_p50", "tpot_p50", "output_tok_s")]
        cells = [[f.value, f"{f.lo:.4g}-{f.hi:.4g}" if f.lo is not None and f.hi is not None else "-"] if f else [None, "-"]
                 for f in figs]
        rows.append([s.name, s.status, r.requests, *cells[0], *cells[1], *cells[2], r.peak_mem_gb, r.reason or ""])
    return table(["stage", "status", "n", "TTFT p50 ms", "interval", "TPOT p50 ms", "interval", "out tok/s", "interval",
                  "peak mem GB", "reason"], rows, "Stages (each figure as every output shows it; interval: its 95% interval over the repeats)")


def deploy_items(run: RunResult) -> list[dict]:
    try:
        rec = recommend(run)
    except Exception as e:  # noqa: BLE001 - a failed recommendation costs its section, never the report
        return [text(f"(not shown: the recommendation failed: {type(e).__name__}: {e})")]
    items = [bullets([plain(x) for x in recommend_lines(rec) if x.strip() and not x.strip().startswith("vllm serve")])]
    if rec.command:
        items.append({"kind": "code", "text": rec.command})
    return items


def details_items(run: RunResult) -> list[dict]:
    items: list[dict] = []
    for s in run.stages:
        if s.status != "ok":
            continue
        items.append({"kind": "heading", "text": s.name})
        for b in stage_blocks(s, run):
            if b.text:
                items.append(text(plain(b.text)))
            if b.headers:
                items.append(table(b.headers, b.rows))
    return items


def run_page(run: RunResult, run_dir: Path | None) -> dict:
    claims = collect_claims(run)
    sections = [
        {"id": "journey", "title": "The journey", "items": [stage_table(run), *journey_charts(run)]},
        {"id": "claims", "title": "The story's claims and the conclusions", "items": [
            table(["claim", "target", "this run", "verdict", "how"], [[c.claim, c.target, c.measured, c.verdict, c.detail] for c in claims]),
            bullets([plain(c) for c in conclusions(run, claims)])]},
        {"id": "deploy", "title": "What to deploy", "items": deploy_items(run)},
    ]
    lines = request_lines(run_dir)
    loaded = [s for s in run.stages if s.status == "ok" and load_curves(s)]
    for n, s in enumerate(loaded):
        sections.append({"id": f"load-{n}", "title": f"Under load: {s.name}", "items": serving_items(s, lines, n)})
    record = tune_record(run_dir)
    if record is not None and (items := tune_items(record)):
        sections.append({"id": "tune", "title": "llmopt tune's trials", "items": items})
    not_run = [[s.name, s.status, s.reason or "-", s.fix or "-"] for s in run.stages if s.status != "ok"]
    if not_run:
        sections.append({"id": "not-run", "title": "Stages that did not run", "items": [table(["stage", "status", "reason", "fix"], not_run)]})
    sections.append({"id": "details", "title": "Stage details", "items": details_items(run)})
    return {"kind": "run", "header": header(run), "sections": sections}
