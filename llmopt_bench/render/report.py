"""report.md (+ charts/) from run.json alone: the journey's numbers, the story's claims next to
them, conclusions computed from the numbers, and the roofline. Sections: docs/report.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Sequence

from llmopt_bench.analysis.quality import NOT_SAME_WEIGHTS
from llmopt_bench.analysis.scaling import per_gpu, scaling_rows
from llmopt_bench.render.exports import (GB, p50_of, baseline, claims, comparable_stages, num, ok_stages, peak_memory, pct, quality, ratio, spread,
                                         speedup_rows, stage_rows, times)
from llmopt_bench.results import RunResult, StageResult

SECTIONS = ("Environment and workload", "Stages", "Speedups", "Stages that did not run", "The story's claims",
            "Conclusions", "Roofline", "Stage details", "Metric definitions")


# --- formatting ----------------------------------------------------------------------------

def cell(v: Any) -> str:
    return num(v).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out


# --- conclusions ---------------------------------------------------------------------------

def roofline_sentence(r: Any) -> str:
    where = f"{r.phase.capitalize()} in {r.stage} is {r.bound}"
    if r.bound == "memory-bound":
        return f"{where} at {pct(r.achieved)} of the memory floor ({num(r.floor_s * 1e3)} ms floor vs {num(r.measured_s * 1e3)} ms measured)."
    if r.bound == "compute-bound":
        return f"{where}: the FLOPs at the matmul ceiling take {pct(r.compute_fraction)} of the measured {num(r.measured_s * 1e3)} ms."
    return (f"{where}: it runs at {pct(r.achieved)} of the memory floor and {pct(r.compute_fraction)} of the compute "
            f"ceiling ({r.roof} roof), so most of its {num(r.measured_s * 1e3)} ms is neither bytes nor FLOPs.")


def prefill_sentences(rows: list[Any]) -> list[str]:
    """Prefill rows grouped by bound, one sentence per bound."""
    out = []
    for bound in ("compute-bound", "memory-bound", "overhead-bound"):
        group = [r for r in rows if r.bound == bound]
        if group:
            fr = [r.compute_fraction for r in group if r.compute_fraction is not None]
            span = f"{pct(min(fr))} to {pct(max(fr))}" if fr and min(fr) != max(fr) else pct(fr[0]) if fr else "-"
            out.append(f"Prefill is {bound} in {', '.join(r.stage for r in group)}: TTFT p50 spends {span} of its time "
                       "on FLOPs at the matmul ceiling.")
    return out


def conclusions(run: RunResult) -> list[str]:
    from llmopt_bench.analysis.roofline import roofline

    out: list[str] = []
    every, ok, base = ok_stages(run), comparable_stages(run), baseline(run)
    timed = [s for s in ok if s is not base and p50_of(s, "tpot_s")]
    if timed and base and p50_of(base, "tpot_s"):
        f = min(timed, key=lambda s: p50_of(s, "tpot_s"))
        x = ratio(p50_of(base, "tpot_s"), p50_of(f, "tpot_s"))
        lead = "The fastest decode is" if x >= 1 else f"No stage decodes faster than the baseline ({base.name}); the fastest other is"
        out.append(f"{lead} {f.name} at {num(p50_of(f, 'tpot_s') * 1e3)} ms/token, {times(x)} the baseline"
                   + (f" ({base.name})." if x >= 1 else "."))
    tput = [s for s in ok if s is not base and s.metrics.output_tok_s]
    if tput and base and base.metrics.output_tok_s:
        t = max(tput, key=lambda s: s.metrics.output_tok_s)
        x = ratio(t.metrics.output_tok_s, base.metrics.output_tok_s)
        lead = "The highest output throughput is" if x >= 1 else "No stage beats the baseline's output throughput; the best other is"
        out.append(f"{lead} {t.name} at {num(t.metrics.output_tok_s)} tok/s, {times(x)} the baseline.")
    weighed = [s for s in ok if s.load and s.load.weights_bytes]
    if len(weighed) > 1 and base in weighed:
        w = min(weighed, key=lambda s: s.load.weights_bytes)
        out.append(f"The smallest weights are {w.name}'s at {num(w.load.weights_bytes / GB)} GB, "
                   f"{pct(w.load.weights_bytes / base.load.weights_bytes)} of the baseline's.")
    rows = roofline(run)
    out += [roofline_sentence(r) for r in rows if r.phase == "decode"]
    out += prefill_sentences([r for r in rows if r.phase == "prefill"])
    for s in every:
        q = quality(s)
        if q.get("quality_regression"):
            out.append(f"{s.name} fails its quality gate ({q.get('gate') or 'see its quality block'}).")
        reps = s.metrics.tpot_p50_repeats_s
        if len(reps) > 1 and min(reps) > 0 and max(reps) / min(reps) > 1.5:
            out.append(f"{s.name}'s TPOT p50 varies {max(reps) / min(reps):.1f}x between repeats: the machine was "
                       "noisy, read its numbers with care.")
    missed = [s.name for s in run.stages if s.status != "ok"]
    if missed:
        out.append(f"{len(missed)} stage(s) did not run to completion: {', '.join(missed)}.")
    cs = claims(run)
    counts = {v: sum(c.verdict == v for c in cs) for v in ("held", "not held", "not measured")}
    out.append(f"Of the story's {len(cs)} claims, {counts['held']} held, {counts['not held']} did not, "
               f"{counts['not measured']} could not be measured in this run.")
    return out


# --- sections ------------------------------------------------------------------------------

def environment(run: RunResult) -> list[str]:
    env, m, w = run.env or {}, run.model, run.workload
    c = env.get("ceilings") or {}
    lines = [f"- run `{run.run_id}`, {run.status}, {run.created_at} to {run.finished_at or '-'}",
             f"- command: `{run.command}`",
             f"- device: {env.get('gpu') or env.get('cpu') or '?'} ({env.get('device', '?')}), "
             f"llmopt {run.llmopt_version} ({env.get('llmopt_commit') or '-'}), python {env.get('python', '-')}",
             "- versions: " + (", ".join(f"{k} {v}" for k, v in (env.get("versions") or {}).items()) or "-")]
    if c:
        lines.append(f"- measured ceilings: memory bandwidth {num((c.get('mem_bandwidth_bytes_s') or 0) / 1e9)} GB/s, "
                     f"matmul {num((c.get('matmul_flops') or 0) / 1e12)} TFLOP/s ({c.get('matmul_dtype', '?')}); {c.get('method', '')}")
    if m:
        lines.append(f"- model: {m.source} ({m.architecture or '?'}, {num((m.num_params or 0) / 1e6)} M params, "
                     f"{m.num_layers} layers, {m.num_heads} heads / {m.num_kv_heads} KV heads x {m.head_dim}, "
                     f"checkpoint {m.checkpoint_dtype}, {'real' if m.real_weights else 'synthetic'} weights)")
        lines += [f"  - {n}" for n in m.notes]
    lines.append(f"- workload: {w.num_prompts} prompts from {w.prompts} ({w.kind}), {w.max_new_tokens} new tokens forced, "
                 f"input length {w.input_len or 'as written'}, batch {w.batch_size}, {w.warmup} warm-up, "
                 f"{w.repeats} repeats, seed {w.seed}")
    return lines


def stage_table(run: RunResult) -> list[str]:
    headers = ("stage", "status", "load s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "E2E p50 s",
               "out tok/s", "QPS", "peak mem GB", "quality")
    rows = []
    for r, s in zip(stage_rows(run), run.stages):
        q = quality(s)
        qual = "-" if not q else ("; ".join(x for x in (
            f"match {pct(q['token_match_rate'])}" if q.get("token_match_rate") is not None else "",
            f"KL {num(q['kl_mean'])}" if q.get("kl_mean") is not None else "",
            f"ppl {num(q['perplexity'])}" if q.get("perplexity") is not None and q.get("perplexity_meaningful", True) else "",
            "REGRESSION" if q.get("quality_regression") else "",
            "n/a: engine's random weights" if q.get("agreement_note") == NOT_SAME_WEIGHTS else "")
            if x) or "-")
        rows.append((r["stage"], r["status"], r["load_s"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["tpot_p50_ms"],
                     r["tpot_p99_ms"], r["e2e_p50_s"], r["output_tok_s"], r["qps"], r["peak_mem_gb"], qual))
    sources = sorted({src for s in run.stages if (src := peak_memory(s)[1])})
    out = table(headers, rows) + ["", f"Peak memory source: {', '.join(sources) or 'none recorded'}."]
    own = [s.name for s in run.stages if s.own_workload]
    if own:
        out.append(f"{', '.join(own)} measure their own workload (a sweep; see their details), not the fixed prompt "
                   "set: their rows do not compare with the others' and stay out of the speedups.")
    return out


def speedups(run: RunResult) -> list[str]:
    rows = [(r["stage"], times(r["tpot_x_baseline"]), times(r["e2e_x_baseline"]), times(r["output_tok_s_x_baseline"]),
             r["previous"] or "-", times(r["tpot_x_previous"]), times(r["output_tok_s_x_previous"]), r["changes"] or "-")
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
    kept = [f"{s.name} stopped early; what it had measured is in run.json, extra.partial: "
            f"{', '.join(k for k, v in s.extra['partial'].items() if v)}."
            for s in run.stages if s.status != "ok" and isinstance(s.extra.get("partial"), dict)]
    return table(("stage", "status", "reason", "fix", "log"), rows) + ([""] + kept if kept else [])


def roofline_section(run: RunResult) -> list[str]:
    from llmopt_bench.analysis.roofline import roofline

    rows = [(r.stage, r.phase, r.batch, r.context_tokens, f"{num(r.weight_bytes / GB)} ({r.weight_source})",
             r.kv_bytes / GB, r.floor_s * 1e3, None if r.compute_s is None else r.compute_s * 1e3, r.measured_s * 1e3,
             pct(r.achieved), pct(r.compute_fraction), r.intensity, r.ridge, r.bound) for r in roofline(run)]
    if not rows:
        return ["No roofline: it needs ok stages, the model's shape and the measured bandwidth in run.json."]
    return table(("stage", "phase", "batch", "context tokens", "weights GB", "KV GB", "memory floor ms",
                  "compute time ms", "measured ms", "of memory floor", "of compute ceiling", "FLOP/byte",
                  "ridge FLOP/byte", "bound"), rows) + \
        ["", "Decode is timed by TPOT p50 (one step), prefill by TTFT p50. Method and bound definitions: docs/report.md."]


def _ms(d: Any) -> float | None:
    return d.get("p50") * 1e3 if isinstance(d, dict) and d.get("p50") is not None else None


def extra_blocks(s: StageResult) -> list[str]:
    """The documented extra blocks a stage may carry, each rendered when present."""
    x, out = s.extra or {}, []
    q = quality(s)
    if q.get("agreement_note") == NOT_SAME_WEIGHTS:  # nothing to show but why
        out += [f"Quality: {NOT_SAME_WEIGHTS}", ""]
    elif q:
        out += [f"Quality vs {q.get('reference', 'hf-fp16')}: token match {pct(q.get('token_match_rate'))}, first divergence "
                f"at token {num(q.get('first_divergence_mean'))} on average, KL {num(q.get('kl_mean'))}, perplexity "
                f"{num(q.get('perplexity')) if q.get('perplexity_meaningful') else 'not meaningful (random weights)'}; "
                f"gate: {q.get('gate') or '-'}" + (" — **quality regression**" if q.get("quality_regression") else ""), ""]
    if isinstance(x.get("sweep"), list) and x["sweep"]:
        out += table(("impl", "effective impl", "context", "batch", "TTFT p50 ms", "TPOT p50 ms", "peak GB"),
                     [(r.get("impl"), r.get("effective_impl"), r.get("context"), r.get("batch"), _ms(r.get("ttft_s")),
                       _ms(r.get("tpot_s")), (r.get("peak_bytes") or 0) / GB or None) for r in x["sweep"]]) + [""]
    if x.get("speedups"):
        out += table(("impl", "context", "batch", "prefill speedup", "decode speedup", "prefill spread", "decode spread"),
                     [(r.get("impl"), r.get("context"), r.get("batch"), times(r.get("prefill_speedup")), times(r.get("decode_speedup")),
                       spread(r.get("prefill_spread")), spread(r.get("decode_spread"))) for r in x["speedups"]]) + [""]
    if x.get("curve"):
        out += table(("mode", "concurrency", "rate req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms",
                      "TPOT p99 ms", "goodput req/s", "requests"),
                     [(r.get("mode"), r.get("concurrency"), r.get("rate", r.get("rate_rps")), r.get("output_tok_s"),
                       *[(r.get(k) or 0) * 1e3 or None for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s")],
                       r.get("goodput_rps"), r.get("requests")) for r in x["curve"]]) + [""]
    out += batching_blocks(x)
    kv = x.get("kv_cache")
    if isinstance(kv, dict):
        out += [f"KV cache: {num(kv.get('num_blocks'))} blocks of {num(kv.get('block_size'))} tokens, "
                f"{num((kv.get('bytes') or 0) / GB or None)} GB, max concurrency {num(kv.get('max_concurrency'))}", ""]
    ms = x.get("memory_split")
    if isinstance(ms, dict):
        out += ["Memory split: " + ", ".join(f"{k.replace('_bytes', '').replace('_', ' ')} {num((v or 0) / GB)} GB"
                                             for k, v in ms.items() if k.endswith("_bytes")), ""]
    if isinstance(x.get("instrumentation"), dict):
        out += [instrumentation_line(x["instrumentation"]), ""]
    return out


def batching_blocks(x: dict[str, Any]) -> list[str]:
    """continuous-batching's throughput point, capacity and mixed-length rows (docs/batching.md)."""
    out: list[str] = []
    tp = x.get("throughput_point")
    if isinstance(tp, dict):
        rows = [(mode, r.get("requests"), r.get("input_len"), r.get("output_len"), r.get("output_tok_s"),
                 (r.get("ttft_p50_s") or 0) * 1e3 or None, (r.get("tpot_p50_s") or 0) * 1e3 or None, r.get("failed"),
                 "OOM" if r.get("oom") else "")
                for mode in ("continuous", "static") if isinstance(r := tp.get(mode), dict)]
        ref = tp.get("reference_h200_out_tok_s")
        out += [f"Throughput point (all requests at once){f'; H200 reference {num(ref)} output tok/s' if ref else ''}:", ""]
        out += table(("mode", "requests", "in", "out", "out tok/s", "TTFT p50 ms", "TPOT p50 ms", "failed", ""), rows) + [""]
    cap = x.get("capacity")
    if isinstance(cap, list) and cap:
        out += ["Capacity: concurrent sequences of a context that fit:", ""]
        out += table(("engine", "context", "max batch", "OOM at", "peak GB", "how"),
                     [(r.get("engine"), r.get("context"), r.get("max_batch"), r.get("oom_at"),
                       (r.get("peak_bytes") or 0) / GB or None, r.get("method") or r.get("note") or capacity_how(r))
                      for r in cap]) + [""]
    mixed = x.get("mixed")
    if isinstance(mixed, list) and mixed:
        out += ["Mixed lengths (long and short requests together):", ""]
        out += table(("config", "status", "out tok/s", "peak GB", "memory at OOM GB", "padding", "all tokens"),
                     [(r.get("config"), r.get("status"), r.get("output_tok_s"), (r.get("peak_bytes") or 0) / GB or None,
                       (r.get("memory_at_oom_bytes") or 0) / GB or None, pct(r.get("padding_fraction")),
                       r.get("all_tokens_produced")) for r in mixed]) + [""]
    return out


def capacity_how(row: dict[str, Any]) -> str:
    """How a transformers capacity row was found: the sizes probed, and those ruled out."""
    how = f"probed {row['probed']}" if row.get("probed") else ""
    out = row.get("ruled_out")
    if isinstance(out, dict):
        how += f"{'; ' if how else ''}not probed {out.get('batches')}: {out.get('because')}"
    return how


def instrumentation_line(inst: dict[str, Any]) -> str:
    line = f"Per-token clock overhead: {num(inst.get('overhead_pct'))}%"
    lo_hi = inst.get("overhead_pct_range")
    if not lo_hi:  # runs recorded before the interleaved pairs
        return line + " (measured once, generation with vs without the per-token timestamps)"
    line += (f", median of {inst.get('pairs')} interleaved pairs with and without the clock (range {num(lo_hi[0])}% "
             f"to {num(lo_hi[1])}%: the host's noise)")
    if inst.get("clock_call_s") is not None:
        line += (f"; the clock's own work costs {num(inst['clock_call_s'] * 1e6)} µs a token, "
                 f"{pct(inst['clock_call_pct'] / 100)} of a step")
    return line + "."


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


def per_gpu_line(s: StageResult) -> list[str]:
    """The stage's processes' peak on each GPU, where it used more than one (tensor parallelism)."""
    by_dev = per_gpu(s)
    if len(by_dev) < 2:
        return []
    return ["- peak memory per GPU (the stage's processes): " + ", ".join(f"GPU {k} {num(v / GB)} GB" for k, v in sorted(by_dev.items()))]


def stage_notes(s: StageResult) -> list[str]:
    """The stage's notes, then its load's, each once: a stage may repeat at run time what it said at load."""
    return list(dict.fromkeys([*s.notes, *(s.load.notes if s.load else [])]))


def details(run: RunResult) -> list[str]:
    out: list[str] = []
    for s in ok_stages(run):
        impl = (s.load.implementation if s.load else {}) or {}
        out += [f"### {s.name}", "", s.description or "", "",
                "- implementation: " + (", ".join(f"{k} {v}" for k, v in impl.items()) or "-"),
                f"- params: {s.params or '-'}; weights {num((s.load.weights_bytes or 0) / GB or None) if s.load else '-'} GB",
                *([f"- energy: {num(s.energy.get('joules'))} J over {num(s.energy.get('seconds'))} s, "
                   f"{num(s.energy.get('avg_watts'))} W average, "
                   f"{num(ratio(s.energy.get('joules'), s.metrics.output_tokens))} J per output token"] if s.energy else []),
                *per_gpu_line(s),
                *(f"- note: {n}" for n in stage_notes(s)), "", *extra_blocks(s)]
    return out or ["No stage finished."]


DEFINITIONS = """\
- **TTFT** (time to first token) = first token - submit: queueing plus prefill.
- **TPOT** (time per output token) = (E2E - TTFT) / (n - 1) per request, n = output tokens produced; p50/p99 over requests.
- **ITL** (inter-token latency) = every gap between consecutive tokens of a request (TPOT averages them).
- **E2E** = last token - submit, per request.
- **output tok/s** and **QPS**: output tokens (requests) of one repeat divided by that repeat's window, first submit
  to last token; the mean over repeats is shown. Output length is forced, so every stage does the same work.
- **load s**: a fresh process to a ready model (import, weights, quantization, engine start-up, graphs).
- **peak memory**: NVML per-process peak of the stage's whole session when a GPU is visible (vLLM engine processes
  included), else the device peak minus its baseline, else torch's reserved peak, else the host RSS peak (CPU).
- **weights**: the stage's weights at their stored size as load() measured them (quantized sizes for INT8/INT4).
- **energy**: the device's NVML energy counter over the timed run (warm-up excluded), whole device; absent on CPU.
- **speedup**: baseline / stage for latencies, stage / baseline for throughput; "previous" is the previous ok stage.
- **claims**: an "N x" claim holds when this run reaches 80% of N; INT8 memory holds at a weights ratio <= 0.55.
"""


def render_markdown(run: RunResult, charts: dict[str, Path]) -> str:
    def img(name: str, alt: str) -> list[str]:
        return ["", f"![{alt}](charts/{charts[name].name})"] if name in charts else []

    m = run.model
    cl = claims(run)
    body = {
        "Environment and workload": environment(run),
        "Stages": stage_table(run) + img("latency_waterfall", "TPOT per stage") + img("throughput", "output tok/s per stage")
        + img("memory", "memory per stage") + img("distributions", "TTFT and TPOT distributions"),
        "Speedups": speedups(run),
        "Stages that did not run": not_run(run),
        "The story's claims": table(("claim", "target", "this run", "verdict", "how"),
                                    [(c.claim, c.target, c.measured, f"**{c.verdict}**", c.detail) for c in cl]),
        "Conclusions": [f"- {c}" for c in conclusions(run)],
        "Roofline": roofline_section(run) + img("roofline", "roofline"),
        "Stage details": details(run) + img("flash_attention", "FlashAttention speedups")
        + img("batching_curve", "throughput vs load") + img("quality_speed", "quality vs speed"),
        "Metric definitions": DEFINITIONS.splitlines(),
    }
    lines = [f"# llmopt report: {run.run_id}", "",
             f"{m.source if m else '?'} on {run.env.get('gpu') or run.env.get('cpu') or '?'}; "
             f"{len(ok_stages(run))} of {len(run.stages)} stages ok. Generated from run.json by `llmopt report`."]
    scaling = tensor_parallel(run)
    for title in SECTIONS:
        lines += ["", f"## {title}", "", *body[title]]
        if title == "Speedups" and scaling:  # only in runs that measured a stage at two TP sizes
            lines += ["", "## Tensor parallelism", "", *scaling]
    return "\n".join(lines) + "\n"


def write_outputs(run: RunResult, out_dir: Path, formats: Sequence[str] = ("md",)) -> list[Path]:
    """Write each format (md: report.md + charts/, csv: stages.csv, json: report.json)."""
    from llmopt_bench.render import exports

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for fmt in formats:
        if fmt == "md":
            from llmopt_bench.render.charts import write_charts

            charts = {p.stem: p for p in write_charts(run, out_dir / "charts")}
            path = out_dir / "report.md"
            path.write_text(render_markdown(run, charts), encoding="utf-8")
            written += [path, *charts.values()]
        elif fmt == "csv":
            written.append(exports.write_csv(run, out_dir))
        elif fmt == "json":
            written.append(exports.write_json(run, out_dir))
        else:
            raise ValueError(f"unknown report format {fmt!r}")
    return written


def write_report(run: RunResult, out_dir: Path, formats: Sequence[str] = ("md",)) -> Path:
    """Write the report; returns its main file (report.md when md is among the formats)."""
    return write_outputs(run, out_dir, formats)[0]
