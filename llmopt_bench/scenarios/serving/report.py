"""How a serving stage presents itself (vllm-serve's and openai-endpoint's hooks): the server
and the load as run (the prompts as sent and the sampling), the load curve, the capacity search,
what the client saw, the prompts as the server counted them, the server's own clock beside the
client's, HTTP's own cost beside the offline engine at the same config, the story's QPS claim,
and the chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from llmopt_bench.analysis.figures import figure_value
from llmopt_bench.analysis.narrative.claims import claim_verdict, holds
from llmopt_bench.analysis.selectors import reference
from llmopt_bench.client.server_clock import HistogramSummary, ServerClock
from llmopt_bench.client.workers import ONE_PROCESS
from llmopt_bench.core.fmt import ms, num, pct, times
from llmopt_bench.core.records import Block, Claim
from llmopt_bench.core.workload import Sampling
from llmopt_bench.load.capacity.search import Capacity
from llmopt_bench.scenarios.serving.caching_report import workload_blocks
from llmopt_bench.scenarios.serving.record import LoadRow, ServingExtra

STORY_QPS = (0.03, 0.2)  # the story's customer-service bot: QPS before and after its optimizations
NOT_OWNED = ("This server was not started by llmopt: no GPU memory, energy or engine figures are measured or "
             "claimed for it; its latencies and throughput are what the client saw over HTTP.")
PROMPTS = {"text": "text, each of its asked length as the server's tokenizer counts it (workloads/text.py)",
           "tokens": "token ids, NOT what users send: the server skips its tokenization (~3.5 ms of TTFT at 450 tokens on "
                     "an H100), so TTFT and every TTFT target read below what a client sending text sees"}
PROMPT_WARN = 0.01  # a point whose prompts the server counted more than 1% off the asked length is said so


def _jt(row: LoadRow) -> Any:
    return (row.energy or {}).get("joules_per_output_token")


def _backlog(row: LoadRow) -> Any:
    """Requests queued on the client or in flight when an open loop's window closed."""
    return None if row.mode == "closed" else (row.queued_at_end or 0) + (row.in_flight_at_end or 0)


def _slo_cell(r: LoadRow) -> str:
    return r.error or (f"not judged: {r.client_untimed}" if r.client_untimed else
                       "met" if r.slo_ok else f"missed: {r.slo_reason}" if r.slo_ok is False else "-")


def curve_block(rows: list[LoadRow]) -> Block:
    return Block(
        text="Load points (closed loop: a concurrency, its rate the completions a second; open loop: an arrival rate, "
             "its backlog what was queued or in flight when its window closed, steady whether the server kept up; "
             "warm-up left out):",
        headers=["phase", "concurrency", "rate req/s", "achieved req/s", "completed req/s", "out tok/s", "TTFT p50 ms",
                 "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "goodput req/s", "steady", "SLO", "failed", "backlog at end",
                 "J/token"],
        rows=[[r.phase, r.concurrency, r.rate_rps, r.achieved_rate if r.mode == "open" else r.qps,
               r.completion_rps if r.mode == "open" else r.qps, r.output_tok_s, ms(r.ttft_p50_s), ms(r.ttft_p99_s),
               ms(r.tpot_p50_s), ms(r.tpot_p99_s), r.goodput_rps, steady_cell(r), _slo_cell(r),
               f"{r.failed}/{r.requests}", _backlog(r), _jt(r)] for r in rows])


def steady_cell(r: Any) -> str:
    """A row's steady state in a word: yes, no, or - (a closed loop, not judged)."""
    return "-" if r.steady is None else "yes" if r.steady else "no"


def capacity_line(c: Capacity, slo: str) -> str:
    """The capacity with its hold, the precision it is known to, how the search got there, and
    the saturation check, as the report states it."""
    if c.capacity_rps is None:
        return f"Capacity under the SLO {slo}: none; {'; '.join(n.rstrip('.') for n in c.notes)}."
    judged = any(t.detail.get("steady") is not None for t in c.trials)  # runs from before the steady-state rules: none
    cap = num(c.capacity_rps)
    held = (f"**{cap} req/s**, held {c.hold_s:g} s" if c.held and c.hold_s else
            f"**~{cap} req/s, not held**" + (f" (holds of {c.hold_s:g} s)" if c.hold_s else
                                             " (no hold)" if judged else " (a run from before holds)"))
    sat = (f" Saturation check: the highest completion rate measured is {num(c.saturation_rps)} req/s ({c.saturation_how})."
           if c.saturation_rps else "")
    probes = [t for t in c.trials if t.kind == "probe"]
    how = "each judged in steady state" if judged else "judged by the SLO alone, before the steady-state rules"
    knee = f" Knee of the latency curve: {num(c.knee_rps) + ' req/s' if c.knee_rps else 'none found'}."
    notes = "".join(f" {n.rstrip('.')}." for n in c.notes)
    if c.spent_s is None:  # a run from before the search from the ceiling down (issue 34)
        hi = f"{num(c.failing_rps)} req/s" if c.failing_rps else "not found (it held at every rate tried)"
        return (f"Capacity under the SLO {slo}: {held}; the search's answer is known within [{num(c.passing_rps)}, {hi}] "
                f"({'converged to' if c.converged else 'not converged to'} {pct(c.precision)}; {len(probes)} trials, "
                f"bracket then bisect, {how}; {len(c.holds)} holds).{sat}{knee}{notes}")
    start = (f"from just under the ceiling, {num(c.ceiling_rps)} req/s ({c.ceiling_how or 'the highest completion rate measured'})"
             if c.ceiling_rps and c.trials and c.trials[0].rate < c.ceiling_rps else
             f"from {num(c.trials[0].rate)} req/s" if c.trials else "")
    spent = (f": {c.spent_s:.0f} s of load" + (f" of its {c.budget_s:g} s budget" if c.budget_s else "")
             if c.spent_s is not None else "")
    return (f"Capacity under the SLO {slo}: {held}, {precision_words(c)}. The search: {plural(len(probes), 'trial')} {start}, {how}, "
            f"then {plural(len(c.holds), 'hold')}{spent}.{sat}{knee}{notes}")


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def precision_words(c: Capacity) -> str:
    """"known within 4.1% ([38.0, 39.6] req/s; 5% asked)", or why there is no upper bound."""
    asked = f"{c.precision * 100:g}% asked"
    if c.known_within is None:
        why = ("it met the SLO at every rate tried" if c.failing_rps is None else
               "the rates above it measured the client, not the server")
        return f"known only as a lower bound ({why}; {asked})"
    ceiling = c.failing_rps is None or (c.upper_rps is not None and c.upper_rps < c.failing_rps)
    upper = f"{num(c.upper_rps)}: the ceiling" if ceiling else num(c.upper_rps)
    return f"known within {pct(c.known_within)} ([{num(c.capacity_rps)}, {upper}] req/s; {asked})"


def capacity_blocks(x: ServingExtra) -> list[Block]:
    c = x.capacity
    if c is None:
        return [Block(text="Capacity search: not run (capacity_search = false).")]
    costed = any(t.cost_s is not None for t in c.trials)  # runs from before issue 34 kept no trial's cost
    rows = [[i + 1, t.kind, t.rate, num(t.duration_s), *([num(t.cost_s)] if costed else []),
             "not judged" if t.invalid else "met" if t.ok else "missed",
             t.invalid or t.detail.get("reason") or "-", t.detail.get("goodput_rps"), t.detail.get("achieved_rate"),
             t.detail.get("completion_rps"), ms(t.detail.get("send_delay_p99_s")), t.detail.get("backlog_at_end")]
            for i, t in enumerate(c.trials)]
    return [Block(text=capacity_line(c, x.settings.get("slo", "?")),
                  headers=["trial", "kind", "rate req/s", "window s", *(["load s"] if costed else []), "SLO", "why", "goodput req/s",
                           "achieved req/s", "completed req/s", "send delay p99 ms", "backlog at end"], rows=rows)]


def client_block(x: ServingExtra) -> Block:
    t = x.tally
    counted = ", ".join(f"{k} {v}" for k, v in sorted(t.counted_by.items())) or "-"
    usage = (f"the server's usage agreed on {t.usage_agreed}, disagreed on {t.usage_mismatch_count}"
             + (f" (e.g. {t.usage_mismatch[:3]})" if t.usage_mismatch else "") + f", was missing on {t.usage_missing}")
    short = f"; {t.short_count} answers came back shorter than asked" if t.short_count else ""
    errors = ", ".join(f"{k} {v}" for k, v in sorted(x.errors.items()))
    processes = x.settings.get("client")  # runs from before it was recorded: not said
    if processes == ONE_PROCESS:
        processes += " (client_workers 1; its punctuality below says whether that kept up)"
    text = (f"Client: {processes + '; ' if processes else ''}tokens counted from {counted}; {usage}{short}. "
            + (f"Failed requests by kind: {errors} (e.g. {x.error_examples[0]})." if errors else "No request failed.")
            + _punctuality(x.curve))
    return Block(text=text)


def _punctuality(rows: list[LoadRow]) -> str:
    """The client's own clock over the points (client/health.py), and the points it could not time."""
    seen = [r.client for r in rows if r.client and r.client.chunks]
    if not seen:
        return ""
    kernel = min(c.kernel_timed_share or 0 for c in seen)
    late = max((c.read_delay_p99_s or 0 for c in seen), default=0)
    untimed = [f"{r.phase} at " + (f"concurrency {r.concurrency}" if r.mode == "closed" else f"{num(r.rate_rps)} req/s")
               for r in rows if r.client_untimed]
    return (f" Tokens timed by the kernel's receive clock: {pct(kernel)} at the worst point; the client read them at worst "
            f"{num(ms(late))} ms late (p99 of a point)." + (f" Points it could not time (not the server's latency, not "
                                                        f"judged): {', '.join(untimed)}." if untimed else ""))


def _sampling(s: dict[str, float | int | None] | None) -> str:
    """The requests' sampling as stated (runs from before it was recorded: greedy, temperature 0, as sent then)."""
    if not s:
        return "greedy (temperature 0; the run predates the sampling record)"
    return Sampling.model_validate(s).describe()


def _point(r: LoadRow) -> str:
    return f"{r.phase} " + (f"c={r.concurrency}" if r.mode == "closed" else f"{num(r.rate_rps)} req/s")


def prompt_count_blocks(rows: list[LoadRow]) -> list[Block]:
    """The prompts' lengths as the server counted them (its usage field) beside the asked ones;
    a point more than 1% off is a warning."""
    counted = [r for r in rows if r.prompt_count]
    if not counted:
        return []
    off = [r for r in counted if r.prompt_count and max(abs(r.prompt_count.difference), r.prompt_count.worst) > PROMPT_WARN]
    exact = sum(r.prompt_count.checked - r.prompt_count.off for r in counted if r.prompt_count)
    total = sum(r.prompt_count.checked for r in counted if r.prompt_count)
    made = sum(r.prompt_count.made_sending for r in counted if r.prompt_count)
    text = (f"Prompt lengths as the server counted them (usage.prompt_tokens): {exact} of {total} requests at the asked length."
            + (f" {made} text prompts were made while their point ran (not before it)." if made else ""))
    if not off:
        return [Block(text=text)]
    return [Block(text=text + f" **Warning:** at {len(off)} point(s) the server counted the prompts more than "
                              f"{pct(PROMPT_WARN)} off the asked length: their latencies are for other lengths than stated "
                              "(a tokenizer other than the server's? pass the server's as `tokenizer`).",
                  headers=["point", "requests", "asked mean", "counted mean", "difference", "requests off", "worst request"],
                  rows=[[_point(r), r.prompt_count.checked, r.prompt_count.asked_mean, r.prompt_count.counted_mean,
                         pct(r.prompt_count.difference), r.prompt_count.off, pct(r.prompt_count.worst)]
                        for r in off if r.prompt_count])]


def _fig(summary: HistogramSummary | None, stat: Literal["mean_s", "p50_s", "p99_s"] = "mean_s") -> Any:
    return ms(summary.get(stat) if summary else None)


def bucket_cell(summary: HistogramSummary | None, q: Literal["p50", "p99"]) -> str:
    """A server quantile as its histogram knows it: the bounds of the bucket that holds it, in ms
    ("≤ 300", "250-500", "> 10000"), never a figure interpolated inside it (8 TTFTs near 320 ms in
    vLLM's (250, 500] bucket interpolate to a "p50" of 375); "-" for a record from before the
    bounds were kept, whose interpolated figure alone could read 150 ms for a 17 us wait."""
    if not summary:
        return "-"
    bounds = summary.get("p50_bucket_s") if q == "p50" else summary.get("p99_bucket_s")
    if not bounds:
        return "-"
    lower, upper = bounds
    return f"> {num(ms(lower))}" if upper is None else f"≤ {num(ms(upper))}" if not lower else f"{num(ms(lower))}-{num(ms(upper))}"


def server_clock_blocks(rows: list[LoadRow], watched: bool | None) -> list[Block]:
    """The server's own clock (its /metrics histograms, read around each point) beside the
    client's over the same requests; the points whose two clocks disagree beyond their bounds.
    watched: whether the client read the server's metrics (None: a run from before it did)."""
    clocked = [r for r in rows if r.server_clock]
    if not clocked:
        return [Block(text="Server clock: the server exposes no Prometheus metrics (/metrics): only the client's clock "
                           "is read.")] if rows and watched else []
    source = clocked[0].server_clock.get("source") if clocked[0].server_clock else "?"
    table = []
    for r in clocked:
        c: ServerClock = r.server_clock or {}
        mine, diff = c.get("client"), c.get("client_minus_server")
        running, waiting, kv = c.get("running"), c.get("waiting"), c.get("kv_usage")
        table.append([_point(r), f"{c.get('requests')}/{mine.get('requests') if mine else None}",
                      ms(mine.get("ttft_mean_s") if mine else None), _fig(c.get("ttft")), ms(diff.get("ttft_s") if diff else None),
                      bucket_cell(c.get("ttft"), "p50"), bucket_cell(c.get("ttft"), "p99"), ms(mine.get("itl_mean_s") if mine else None),
                      _fig(c.get("itl")), ms(diff.get("e2e_s") if diff else None), _fig(c.get("queue")), _fig(c.get("prefill")),
                      running.get("mean") if running else None, waiting.get("max") if waiting else None,
                      pct(kv.get("max") if kv else None), c.get("preemptions"), c.get("verdict") or "agree"])
    flagged = [f"{_point(r)}: {(r.server_clock or {}).get('verdict')}" for r in clocked
               if (r.server_clock or {}).get("verdict") and not str((r.server_clock or {}).get("verdict")).startswith("not compared")]
    text = (f"Server clock ({source}, read before and after each point; gauges sampled during it) beside the client's, over "
            "the same requests (warm-up included, as the server counts them). Means are exact (sum / count); the server's "
            "p50 and p99 are known only to the bucket of its histogram that holds them: their cells give that bucket's "
            "bounds (≤ 300: somewhere up to 300 ms). The client reads a little above the server (its HTTP "
            "and SSE path); below it, its clock is wrong; far above it, the client host or the server's HTTP front end is "
            "the bottleneck (docs/serving.md, \"One TTFT clock\").")
    if flagged:
        text += " **Warning:** " + "; ".join(flagged) + "."
    return [Block(text=text, headers=["point", "requests server/client", "TTFT mean ms client", "server", "client - server",
                                      "server TTFT p50 ms (bucket)", "server TTFT p99 ms (bucket)", "ITL mean ms client", "server",
                                      "E2E client - server ms", "queue mean ms", "prefill mean ms", "running mean",
                                      "waiting max", "KV use max", "preemptions", "clocks"], rows=table)]


def serving_blocks(result: Any) -> list[Block]:
    x = result.extra_as(ServingExtra)
    t, s = x.target, x.settings
    out = [Block(text=f"Server: {t.get('kind', '?')} at {t.get('url', '?')}, model {t.get('model', '?')}"
                      + (f"; reproduce it with `{t['command']}`" if t.get("command") else "") + ".")]
    if not x.owns_device:
        out.append(Block(text=NOT_OWNED))
    out.append(Block(text=f"Load: {s.get('arrival', '?')} arrivals (burstiness {s.get('burstiness', 1)}), seed {s.get('seed')}, "
                          f"{s.get('requests_per_point')} measured requests a point, {s.get('output_len')} output tokens forced, "
                          f"{_sampling(s.get('sampling'))}, prompts as {PROMPTS.get(s.get('prompt_format'), s.get('prompt_format'))}, "
                          f"{s.get('input_tokens')} tokens; warm-up: closed loop "
                          f"{s.get('closed_loop_warmup')}, open loop {s.get('open_loop_warmup')}. Headline (the stage's "
                          f"row in the table): {x.main_point or 'none'}"
                          + (" (the client could not time it, nor any other point: its latencies are the client's, not the "
                             "server's)" if x.main_untimed else "") + "."))
    if x.curve:
        out.append(curve_block(x.curve))
    out += workload_blocks(result, x.curve)
    out += capacity_blocks(x)
    out.append(client_block(x))
    out += prompt_count_blocks(x.curve) + server_clock_blocks(x.curve, s.get("server_metrics"))
    if x.server:
        sv = x.server
        out.append(Block(text=f"Server stopped in {num(sv.get('stop_s'))} s (exit {sv.get('exit_code')}, "
                              f"{'killed after the grace period, ' if sv.get('killed') else ''}{sv.get('processes_left', 0)} "
                              f"processes left, device memory freed: {num(sv.get('memory_freed'))})."
                              + (f" Its processes' host memory peaked at {num(sv['host_peak_rss_bytes'] / 1e9)} GB (the sum of "
                                 "each one's own peak; where no GPU is sampled, the table's peak memory is the client's "
                                 "process, not the server's)." if sv.get("host_peak_rss_bytes") else "")))
    return out


# --- HTTP's own cost: beside the offline engine at the same config --------------------------

def engine_signature(s: Any, keys: tuple[str, ...]) -> tuple:
    """What makes two vLLM results the same engine: their params on `keys`, the quantization
    the engine really ran (vllm-fp8 sets its own), and whether the weights were AWQ."""
    impl = (s.load.implementation if s.load else {}) or {}
    return (tuple((s.params or {}).get(k) for k in keys), impl.get("quantization") or (s.params or {}).get("quantization"),
            bool(impl.get("awq")))


def offline_twin(result: Any, run: Any, keys: tuple[str, ...], want: str) -> Any:
    """The first ok result in the run (labelled twins count) that is not a served one, runs the
    same engine on `keys`, and has `want` ("fixed": the fixed workload; "saturated": a saturated figure)."""
    mine = engine_signature(result, keys)
    for s in run.stages:
        if s is result or s.status != "ok":
            continue
        impl = (s.load.implementation if s.load else {}) or {}
        if impl.get("engine") != "vllm" or engine_signature(s, keys) != mine:
            continue
        if (want == "fixed" and not s.own_workload and s.metrics) or (want == "saturated" and s.facts.saturated_tok_s):
            return s
    return None


def http_cost_blocks(result: Any, run: Any, engine_keys: tuple[str, ...], scheduler_keys: tuple[str, ...]) -> list[Block]:
    f = result.facts
    fixed = offline_twin(result, run, engine_keys, "fixed")
    sat = offline_twin(result, run, engine_keys + scheduler_keys, "saturated")
    rows = []
    if fixed is not None and run.workload.batch_size == 1:
        m = fixed.metrics
        for label, off, srv in (("TTFT p50 at concurrency 1, ms", m.ttft_s.p50 if m.ttft_s else None, f.batch1_ttft_s),
                                ("TPOT p50 at concurrency 1, ms", m.tpot_s.p50 if m.tpot_s else None, f.batch1_tpot_s)):
            rows.append([label, fixed.name, ms(off), ms(srv), ms(srv - off) if off and srv else None, times(srv / off) if off and srv else "-"])
    if sat is not None:
        same = sat.facts.saturated_how == f.saturated_how
        rows.append([f"output tok/s at saturation ({f.saturated_how} vs {sat.facts.saturated_how})", sat.name,
                     sat.facts.saturated_tok_s, f.saturated_tok_s,
                     (f.saturated_tok_s - sat.facts.saturated_tok_s) if same and f.saturated_tok_s else None,
                     times(f.saturated_tok_s / sat.facts.saturated_tok_s) if same and f.saturated_tok_s else "measured differently"])
    if not rows:
        return [Block(text="HTTP's own cost: no offline vLLM result at this engine config in the run (run `vllm` with the same "
                           "engine params, or continuous-batching with the same scheduler limits, in the same run).")]
    missing = "" if sat is not None else (" No offline result at the same scheduler limits (max_num_seqs, "
                                          "max_num_batched_tokens, gpu_memory_utilization) measured a saturated throughput: "
                                          "run continuous-batching with them in the same run for that row.")
    text_sent = (result.extra or {}).get("settings", {}).get("prompt_format") == "text"
    return [Block(text="HTTP's own cost: this server beside the offline vLLM engine at the same engine config (same weights, "
                       "dtype, quantization and kernels; for saturation the same scheduler limits too). 'HTTP adds' is served "
                       "minus offline; the ratio is served / offline."
                       + (" The served requests are text: their TTFT holds the server's tokenization, which the offline "
                          "engine, given token ids, skips." if text_sent else "") + missing,
                  headers=["figure", "offline result", "offline", "served", "HTTP adds", "served / offline"], rows=rows)]


# --- the story's claim and the chart -------------------------------------------------------

def qps_claim(result: Any, run: Any) -> Claim:
    """The story's "QPS 0.03 -> 0.2": its bot served 6.7x the requests a second after the journey.
    Ours: the capacity under the SLO against the quality reference's one-at-a-time QPS."""
    before, after = STORY_QPS
    story = after / before
    ref = reference(run)
    base = figure_value(ref, "qps") if ref and ref.metrics else None  # the figure the stage table shows
    cap = result.facts.slo_capacity_rps
    value = cap / base if cap and base else None
    held = "" if result.facts.slo_capacity_held else ", not held"
    detail = (f"{ref.name} one request at a time: {num(base)} req/s; {result.name}: {num(cap)} req/s under {result.facts.slo}"
              if value and ref else f"needs the quality reference (transformers FP16) and a capacity under the SLO; "
                                    f"{result.name}'s capacity: {num(cap)} req/s")
    return Claim(key="serving-qps", claim=f"Serving: QPS {before} -> {after} ({story:.1f}x)",
                 target=f">= {story:.1f}x the FP16 baseline's QPS, as capacity under the SLO",
                 measured=f"{num(base)} -> {num(cap)} req/s ({times(value)}{held})" if value else "-", value=value,
                 verdict=claim_verdict(holds(value, story)), detail=detail)


def curve_chart(result: Any, path: Path) -> Path | None:
    from llmopt_bench.core.plotting import legend, plt, save

    x = result.extra_as(ServingExtra)
    sweep = sorted((r for r in x.curve if r.phase == "sweep" and r.completed), key=lambda r: r.concurrency or 0)
    rated = sorted((r for r in x.curve if r.phase in ("point", "search", "hold") and r.completed), key=lambda r: r.rate_rps or 0)
    if not sweep and not rated:
        return None
    fig, axes = plt().subplots(1, 2, figsize=(11, 4.5))
    if sweep:
        axes[0].plot([r.concurrency for r in sweep], [r.output_tok_s or float("nan") for r in sweep], "-o")
        axes[0].set_xscale("log", base=2)
    axes[0].set(xlabel="concurrency (closed loop)", ylabel="output tokens / s", title=f"{result.name}: throughput vs concurrency")
    for attr, label in (("ttft_p99_s", "TTFT p99"), ("tpot_p99_s", "TPOT p99")):
        axes[1].plot([r.rate_rps for r in rated], [(getattr(r, attr) or float("nan")) * 1e3 for r in rated], "-o", label=label)
    unsteady = [r for r in rated if r.steady is False]
    if unsteady:  # a point whose server fell behind: a miss whatever its latencies
        axes[1].plot([r.rate_rps for r in unsteady], [(r.ttft_p99_s or float("nan")) * 1e3 for r in unsteady], "x",
                     color="red", markersize=10, label="not steady")
    cap, held = result.facts.slo_capacity_rps, result.facts.slo_capacity_held
    if cap:
        axes[1].axvline(cap, linestyle="--", color="gray", label=f"capacity {num(cap)} req/s" + ("" if held else ", not held"))
    axes[1].set(xlabel="arrival rate (requests / s, open loop)", ylabel="ms", title=f"{result.name}: latency vs rate")
    axes[1].set_yscale("log")
    legend(axes[1], fontsize=8)
    return save(fig, path)
