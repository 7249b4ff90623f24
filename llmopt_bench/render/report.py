"""report.md (+ charts/) from run.json alone: the journey's numbers, the story's claims next to
them, conclusions computed from the numbers, and the roofline. Sections: docs/report.md.

The layout is here; what a stage measured on its own (a sweep, a load curve) comes from its
stage's hooks (render/hooks.py), so this module knows no stage by name."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from llmopt_bench.analysis.figures import FIGURE_DEFINITION, stage_figure
from llmopt_bench.analysis.metric_registry import REGISTRY
from llmopt_bench.analysis.narrative.conclusions import conclusions
from llmopt_bench.analysis.narrative.roofline_text import TABLE_HEADERS, ceilings_line, table_cells
from llmopt_bench.analysis.recommend.choose import recommend
from llmopt_bench.analysis.recommend.text import lines
from llmopt_bench.analysis.roofline import roofline
from llmopt_bench.analysis.scaling import scaling_rows
from llmopt_bench.analysis.selectors import GB, ok_stages, peak_memory, speedup_rows, stage_table_rows
from llmopt_bench.core.fmt import num, pct, table, tail, times
from llmopt_bench.core.models import portable_text
from llmopt_bench.core.results import RunResult
from llmopt_bench.render import exports
from llmopt_bench.render.details import details, quality_cell
from llmopt_bench.render.hooks import collect_claims
from llmopt_bench.render.time_split import time_split
from llmopt_bench.run.durations import top_phases

SECTIONS = ("Environment and workload", "Stages", "Speedups", "Stages that did not run", "Where the time went",
            "The story's claims", "Conclusions", "What to deploy", "Roofline", "Stage details", "Metric definitions")


def prompts_read_as(key: str) -> str:
    """How the prompt file was read, where it is not the usual JSONL "text" key."""
    if key == "text":
        return ""
    return "; prompts read as plain text, one a line" if key == "line" else f'; prompts read from the JSONL key "{key}"'


def environment(run: RunResult) -> list[str]:
    env, m, w = run.env, run.model, run.workload
    lines = [f"- run `{run.run_id}`, {run.status}, {run.created_at} to {run.finished_at or '-'}",
             f"- command: `{run.command}`",
             f"- device: {env.machine or '?'} ({env.device or '?'}), "
             f"llmopt {run.llmopt_version} ({env.llmopt_commit or '-'}), python {env.python or '-'}",
             "- versions: " + (", ".join(f"{k} {v}" for k, v in (env.versions or {}).items()) or "-")]
    if env.ceilings:

        lines.append(f"- {ceilings_line(env.ceilings)}")
    if m:
        lines.append(f"- model: {m.source} ({m.architecture or '?'}, {num((m.num_params or 0) / 1e6)} M params, "
                     f"{m.num_layers} layers, {m.num_heads} heads / {m.num_kv_heads} KV heads x {m.head_dim}, "
                     f"checkpoint {m.checkpoint_dtype}, {'real' if m.real_weights else 'synthetic'} weights)")
        lines += [f"  - {n}" for n in m.notes]
    lines.append(f"- workload: {w.num_prompts} prompts from {w.prompts} ({w.kind}), {w.max_new_tokens} new tokens forced, "
                 f"input length {w.input_len or 'as written'}, batch {w.batch_size}, {w.warmup} warm-up, "
                 f"{repeats_text(w)}, seed {w.seed}{prompts_read_as(w.prompt_key)}")
    lines += [f"  - {n}" for n in w.notes]  # defaults chosen for this machine (the lighter CPU workload)
    return lines


def repeats_text(w) -> str:
    if w.max_repeats and w.max_repeats > w.repeats:
        budget = f", at most {w.repeat_budget_s:g} s of them a stage" if w.repeat_budget_s else ""
        return f"{w.repeats} to {w.max_repeats} repeats (until the gated figures' 95% intervals are within ±{w.stop_within:g}%{budget})"
    return f"{w.repeats} repeats"


def stage_table(run: RunResult) -> list[str]:
    figures = ("requests", "load_s", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50", "output_tok_s", "qps",
               "peak_memory")
    headers = ("stage", "status", *(REGISTRY[k].header for k in figures), "quality")
    rows, few = [], False
    for r, s in zip(stage_table_rows(run), run.stages):
        ttft99, tpot99 = (tail(value, tail_requests(s, key, r.requests), 0.99)
                          for key, value in (("ttft_p99", r.ttft_p99_ms), ("tpot_p99", r.tpot_p99_ms)))
        few = few or isinstance(ttft99, str) or isinstance(tpot99, str)  # a marked tail
        rows.append((r.stage, r.status, r.requests, r.load_s, r.ttft_p50_ms, ttft99,
                     r.tpot_p50_ms, tpot99, r.e2e_p50_s, r.output_tok_s, r.qps,
                     r.peak_mem_gb, quality_cell(s.quality, s.quality_reference)))
    sources = sorted({src for s in run.stages if (src := peak_memory(s)[1])})
    out = table(headers, rows) + ["", f"Peak memory source: {', '.join(sources) or 'none recorded'}."]
    out.append(f"Each figure is {FIGURE_DEFINITION} (Metric definitions, below).")
    if few:
        out.append("n: the requests measured. A p99 marked (~max) rests on fewer than 100 requests a repeat: it is "
                   "interpolated from the largest one or two values, not a tail estimate.")
    own = [s.name for s in run.stages if s.own_workload]
    if own:
        out.append(f"{', '.join(own)} measure their own workload (a sweep; see their details), not the fixed prompt "
                   "set: their rows do not compare with the others' and stay out of the speedups.")
    return out


def tail_requests(s, key: str, requests: int | None) -> int | None:
    """The requests a p99 figure rests on: the fewest of a repeat's (analysis/figures.py takes
    each repeat's p99), else the run's."""
    if s.status != "ok" or not s.metrics:
        return requests
    return stage_figure(s, key).per_repeat_requests or requests


def speedups(run: RunResult) -> list[str]:
    rows = [(r.stage, times(r.tpot_x_baseline), times(r.e2e_x_baseline), times(r.output_tok_s_x_baseline),
             r.previous or "-", times(r.tpot_x_previous), times(r.output_tok_s_x_previous), r.changes or "-")
            for r in speedup_rows(run)]
    if not rows:
        return ["No stage on the fixed workload finished: nothing to compare." + (" Stages that measure their own workload stay out."
                if any(st.own_workload for st in ok_stages(run)) else "")]
    return [f"Baseline: {rows[0][0]} (the first ok stage). Latency speedups are baseline / stage, throughput stage / baseline.", ""] + \
        table(("stage", "TPOT vs baseline", "E2E vs baseline", "tok/s vs baseline", "previous ok stage",
               "TPOT vs previous", "tok/s vs previous", "what it changes"), rows)


def not_run(run: RunResult) -> list[str]:
    rows = [(s.name, s.status, s.reason or "-", s.fix or "-", s.log or "-") for s in run.stages if s.status != "ok"]
    if not rows:
        return ["Every stage ran."]
    kept = [f"{s.name} stopped early; what it had measured is in run.json, partial: "
            f"{', '.join(k for k, v in s.partial.items() if v)}."
            for s in run.stages if s.status != "ok" and s.partial]
    return table(("stage", "status", "reason", "fix", "log"), rows) + ([""] + kept if kept else [])


def wall_sentence(run: RunResult, stages_s: float) -> str:
    """The run's end-to-end time, never less than its own stages' (a killed invocation of a
    resumed run recorded no time of its own before run.json kept it stage by stage)."""
    if not run.wall_s:
        return "The run's own wall time was not recorded (a run older than schema 2)."
    resumed = " (over several invocations: --resume adds each one's time)" if "--resume" in run.command else ""
    if stages_s <= run.wall_s:
        return f"The run took {num(run.wall_s)} s end to end ({num(run.wall_s / 60)} min), probe and report included{resumed}."
    span = ""
    if run.finished_at:
        from datetime import datetime

        gone = (datetime.fromisoformat(run.finished_at) - datetime.fromisoformat(run.created_at)).total_seconds()
        span = f"; {num(gone / 60)} min passed from its creation to its end, pauses between invocations included"
    return (f"The run took at least {num(stages_s)} s ({num(stages_s / 60)} min): its stages' own times add up to that, more "
            f"than the {num(run.wall_s)} s llmopt counted end to end, as an invocation stopped from outside (a machine taken "
            f"away) recorded no time of its own{span}.")


def time_section(run: RunResult) -> list[str]:
    """Each stage's wall time (its process, start to end), load time and where the rest went (its
    phases, from its progress messages), and the run's own."""

    timed = [s for s in run.stages if s.duration_s]
    if not timed:
        return ["No stage recorded its duration."]
    total = sum(s.duration_s or 0 for s in timed)
    rows = [(s.name, s.status, s.duration_s, s.load_s, pct((s.duration_s or 0) / total) if total else "-",
             top_phases(s.phases, s.duration_s, 3) or "-") for s in timed]
    shared = [f"{s.name} ran on the engine {s.load.implementation['engine_shared_with']} started (one process, no start "
              "of its own: docs/architecture.md, stage groups)" for s in timed
              if s.load and s.load.implementation.get("engine_shared_with")]
    return [wall_sentence(run, total), ""] + table(("stage", "status", "wall s", "load s", "share of the stages' time",
                                                    "where it went (largest phases)"), rows) + \
        ([""] + [f"- {line}." for line in shared] if shared else []) + time_split(run)


def deploy_section(run: RunResult) -> list[str]:
    """What to deploy (analysis/recommend/choose.py) at the default priority and the run's own SLO."""

    try:
        return lines(recommend(run))
    except Exception as e:  # noqa: BLE001 - a failed recommendation costs its section, never the report
        return [f"(not shown: the recommendation failed: {type(e).__name__}: {e})"]


def roofline_section(run: RunResult) -> list[str]:

    rows = [table_cells(r) for r in roofline(run)]
    if not rows:
        return ["No roofline: it needs ok stages, the model's shape and the measured bandwidth in run.json."]
    return table(TABLE_HEADERS, rows) + \
        ["", "Decode is timed by TPOT p50 (one step), prefill by TTFT p50; the memory time is the step's bytes at the "
         "measured copy bandwidth (a measured ceiling, not a hard floor). Method and bound definitions: docs/report.md."]


def tensor_parallel(run: RunResult) -> list[str]:
    rows = scaling_rows(run)
    if not rows:
        return []
    ms = lambda v: num(v * 1e3) if v else "-"  # noqa: E731
    out = table(("stage", "result", "TP", "vs", "batch-1 TPOT ms", "latency speedup", "saturated out tok/s",
                 "throughput scaling", "per GPU added", "peak per GPU GB"),
                [(r.stage, r.name, r.tp, f"{r.base} (TP {r.base_tp})", f"{ms(r.batch1_tpot_s)} vs {ms(r.base_batch1_tpot_s)}",
                  times(r.latency_speedup), f"{num(r.saturated_tok_s)} vs {num(r.base_saturated_tok_s)}",
                  times(r.throughput_scaling), pct(r.efficiency),
                  ", ".join(f"{num(v / GB)}" for _, v in sorted(r.peak_bytes_per_gpu.items())) or "-") for r in rows])
    hows = sorted({r.saturated_how for r in rows if r.throughput_scaling})
    return out + ["", "Batch-1 TPOT is the concurrency-1 point of a load curve, else the fixed workload's. Saturated: "
                  + ("; ".join(hows) or "not comparable") + ". Per GPU added: throughput scaling / (TP / its base's TP); "
                  "100% is linear. Each TP size is its own engine on the same model, workload and params."]


DEFINITIONS = """\
- **TTFT** (time to first token) = first token - submit: queueing plus prefill.
- **TPOT** (time per output token) = (E2E - TTFT) / (n - 1) per request, n = output tokens produced; p50/p99 over a repeat's requests.
- **ITL** (inter-token latency) = every gap between consecutive tokens of a request (TPOT averages them).
- **E2E** = last token - submit, per request.
- **output tok/s** and **QPS**: output tokens (requests) of one repeat divided by that repeat's window, first submit
  to last token. Output length is forced, so every stage does the same work.
- **a stage's figure** (every table, speedup, claim and conclusion here; stages.csv, report.json, `llmopt compare`,
  `llmopt history` and `llmopt recommend` alike): {definition}.
- **load s**: a fresh process to a ready model (import, weights, quantization, engine start-up, graphs).
- **peak memory**: NVML per-process peak of the stage's whole session when a GPU is visible (vLLM engine processes
  included), else the device peak minus its baseline, else torch's reserved peak, else the host RSS peak (CPU).
- **weights**: the stage's weights at their stored size as load() measured them (quantized sizes for INT8/INT4).
- **energy**: the device's NVML energy counter over the timed run (warm-up excluded), whole device; absent on CPU.
- **speedup**: the ratio of two stages' figures, baseline / stage for latencies, stage / baseline for throughput;
  "previous" is the previous ok stage.
- **claims**: an "N x" claim holds when this run reaches 80% of N; INT8 memory holds at a weights ratio <= 0.55.
"""


def render_markdown(run: RunResult, charts: dict[str, Path], stage_charts: dict[str, list[Path]] | None = None) -> str:
    def img(name: str, alt: str) -> list[str]:
        return ["", f"![{alt}](charts/{charts[name].name})"] if name in charts else []

    m = run.model
    cl = collect_claims(run)
    body = {
        "Environment and workload": environment(run),
        "Stages": stage_table(run) + img("latency_waterfall", "TPOT per stage") + img("throughput", "output tok/s per stage")
        + img("memory", "memory per stage") + img("distributions", "TTFT and TPOT distributions"),
        "Speedups": speedups(run),
        "Stages that did not run": not_run(run),
        "Where the time went": time_section(run),
        "The story's claims": table(("claim", "target", "this run", "verdict", "how"),
                                    [(c.claim, c.target, c.measured, f"**{c.verdict}**", c.detail) for c in cl]),
        "Conclusions": [f"- {c}" for c in conclusions(run, cl)],
        "What to deploy": deploy_section(run),
        "Roofline": roofline_section(run) + img("roofline", "roofline"),
        "Stage details": details(run, stage_charts or {}) + img("quality_speed", "quality vs speed"),
        "Metric definitions": DEFINITIONS.format(definition=FIGURE_DEFINITION).splitlines(),
    }
    lines = [f"# llmopt report: {run.run_id}", "",
             f"{m.source if m else '?'} on {run.env.machine or '?'}; "
             f"{len(ok_stages(run))} of {len(run.stages)} stages ok. Generated from run.json by `llmopt report`."]
    scaling = tensor_parallel(run)
    for title in SECTIONS:
        lines += ["", f"## {title}", "", *body[title]]
        if title == "Speedups" and scaling:  # only in runs that measured a stage at two TP sizes
            lines += ["", "## Tensor parallelism", "", *scaling]
    return "\n".join(lines) + "\n"


DEFAULT_FORMATS = ("md", "html")  # what `llmopt bench` and `llmopt report` write unless told


def write_outputs(run: RunResult, out_dir: Path, formats: Sequence[str] = ("md",), run_dir: Path | None = None) -> list[Path]:
    """Write each format (md: report.md + charts/, html: report.html, csv: stages.csv and points.csv,
    json: report.json and points.json); run_dir holds requests.jsonl (default: out_dir)."""

    from llmopt_bench.render.points_export import write_points

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for fmt in formats:
        if fmt == "md":
            charts, per_stage = draw_charts(run, out_dir / "charts")
            path = out_dir / "report.md"
            # its paths as run.json keeps them ($LLMOPT_CACHE/..., ~/...): `bench` renders the run it holds,
            # `report` the run.json it reads, and the two reports of one run are the same file
            path.write_text(portable_text(render_markdown(run, charts, per_stage)), encoding="utf-8")
            written += [path, *charts.values(), *(p for ps in per_stage.values() for p in ps)]
        elif fmt == "html":
            from llmopt_bench.render.html.write import write_run_html

            written.append(write_run_html(run, out_dir, run_dir))
        elif fmt == "csv":
            written += [exports.write_csv(run, out_dir), *write_points(run, out_dir, ("csv",))]
        elif fmt == "json":
            written += [exports.write_json(run, out_dir), *write_points(run, out_dir, ("json",))]
        else:
            raise ValueError(f"unknown report format {fmt!r}")
    return written


def draw_charts(run: RunResult, out_dir: Path) -> tuple[dict[str, Path], dict[str, list[Path]]]:
    """The charts, or none (with a warning) where matplotlib is not installed: report.md still
    holds every table."""
    try:
        from llmopt_bench.render.charts import write_charts, write_stage_charts

        return {p.stem: p for p in write_charts(run, out_dir)}, write_stage_charts(run, out_dir)
    except ImportError as e:
        import sys

        print(f"warning: no charts ({e}): pip install 'llmopt-bench[charts]'; the report has every table", file=sys.stderr)
        return {}, {}


def write_report(run: RunResult, out_dir: Path, formats: Sequence[str] = ("md",)) -> Path:
    """Write the report; returns its main file (report.md when md is among the formats)."""
    return write_outputs(run, out_dir, formats)[0]
