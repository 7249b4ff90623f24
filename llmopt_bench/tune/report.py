"""tune.md and charts/tune_trials.png, from tune.json alone: the winner against vLLM's defaults
(held capacities, the ratio with its interval, the confirmation by vLLM's client, the `vllm serve`
line), every trial in a table (its outcome, the rung it reached, its capacity with the interval
and precision it is known to, p99 TTFT and TPOT there, memory, quality, whether it is on the
Pareto front), and a chart of capacity against p99 TTFT and TPOT.

The Pareto front: the trials that pass the quality gate and that no other such trial beats on
every one of capacity (higher), p99 TTFT, p99 TPOT and memory (lower) at once; each trial at its
last rung (a held capacity where it was held). Memory counts in steps of 5% (MEMORY_STEP): two
servers' peaks a few megabytes apart are the same memory, not a trade-off."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.core.fmt import gb_text, ms, num
from llmopt_bench.tune.record import Rung, TrialRecord, TuneRecord
from llmopt_bench.tune.space import KNOBS

CHART = "charts/tune_trials.png"
MEMORY_STEP = 1.05


def interval(r: Rung | None) -> str:
    """[passing, first failing) and the precision reached: what a capacity is known within."""
    if r is None or r.capacity_rps is None:
        return "-"
    hi = num(r.failing_rps) if r.failing_rps else "not found"
    reached = f", {r.reached:.0%}" if r.reached is not None else ""
    return f"[{num(r.capacity_rps)}, {hi}){reached}"


def capacity_text(r: Rung | None, unit: str = "") -> str:
    """A rung's capacity as the report says it: held, or "~N" (short trials only, or a failed hold)."""
    if r is None or r.capacity_rps is None:
        return "-"
    if r.name == "held":
        return f"{num(r.capacity_rps)}{unit} held" if r.held else f"~{num(r.capacity_rps)}{unit} (hold failed)"
    return f"~{num(r.capacity_rps)}{unit}"


def quality_text(t: TrialRecord) -> str:
    q = t.quality
    if q is None:
        return "-"
    if q.error:
        return f"not measured ({q.error[:60]})"
    if q.quality_regression:
        return f"**fails** (perplexity {q.quality_ratio:.3f}x the reference's)" if q.quality_ratio else "**fails**"
    match = f"token match {q.token_match_rate:.0%}" if q.token_match_rate is not None else ""
    if q.quality_regression is False:
        return f"passes (perplexity {q.quality_ratio:.3f}x{', ' + match if match else ''})"
    return "not judged (random weights)" + (f"; {match}" if match else "")


def pareto(trials: list[TrialRecord]) -> set[int]:
    """Trial numbers on the Pareto front (see the module doc)."""
    import math

    pts = {}
    for t in trials:
        r = t.last
        if r is None or r.capacity_rps is None or not t.quality_ok:
            continue
        memory = round(math.log(t.memory.bytes) / math.log(MEMORY_STEP)) if t.memory.bytes else 0
        pts[t.number] = (-r.capacity_rps, r.ttft_p99_s if r.ttft_p99_s is not None else math.inf,
                         r.tpot_p99_s if r.tpot_p99_s is not None else math.inf, memory)

    def dominated(a: tuple, b: tuple) -> bool:  # b dominates a
        return all(y <= x for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b))
    return {n for n, a in pts.items() if not any(dominated(a, b) for m, b in pts.items() if m != n)}


def headline(rec: TuneRecord) -> list[str]:
    w, d = rec.trial(rec.winner), rec.trial(rec.defaults)
    hold = rec.settings.hold_s
    if w is None:
        return ["**No configuration held a capacity under the SLO with its quality kept**: see the trials below."]
    wr = w.held_rung
    assert wr is not None
    lines = []
    if d is not None and w.number == d.number:
        lines.append(f"**vLLM's defaults held the most**: {num(wr.capacity_rps)} req/s, held {hold:g} s, known within "
                     f"{interval(wr)}; no configuration tried beat them.")
    else:
        lines.append(f"**Deploy trial {w.number}** ({w.label}): **{num(wr.capacity_rps)} req/s held {hold:g} s**, known within "
                     f"{interval(wr)}.")
        if d is not None and d.last is not None:
            lines.append(f"vLLM's defaults (trial {d.number}): {capacity_text(d.held_rung or d.last, ' req/s')}, known within "
                         f"{interval(d.held_rung or d.last)}.")
        if rec.ratio:
            lo = f"{rec.ratio.lo:.2f}" if rec.ratio.lo is not None else "?"
            hi = f"{rec.ratio.hi:.2f}" if rec.ratio.hi is not None else "not bounded"
            lines.append(f"Held capacity against the defaults': **{rec.ratio.value:.2f}x** (interval {lo} to {hi}x: the "
                         "winner's capacity over the defaults' first failing rate, and the winner's first failing rate over "
                         "the defaults' capacity).")
        elif d is not None:
            lines.append(f"No ratio to the defaults: their trial ended {d.outcome}" + (f" ({d.reason})" if d.reason else "") + ".")
    lines.append(f"Quality: {quality_text(w)}.")
    c = w.confirmation
    if c is not None:
        figs = ", ".join(f"{k} {v:.4g}" for k, v in c.figures.items() if isinstance(v, (int, float)))
        lines.append(f"Confirmed by vLLM's client (`vllm bench serve`, {c.num_prompts} Poisson arrivals at {num(c.rate_rps)} req/s, "
                     f"same server): **{c.verdict}**{' (' + c.why + ')' if c.why else ''}; {figs}.")
    else:
        lines.append("Not confirmed by vLLM's client (the budget, or [search] confirm = false).")
    return [" ".join(lines), "", "The `vllm serve` line that deploys it:", "", f"    {w.command}"]


def trial_rows(rec: TuneRecord) -> list[str]:
    front = pareto(rec.trials)
    head = ["trial", "configuration", "outcome", "rung", "capacity req/s", "known within (precision)", "p99 TTFT ms",
            "p99 TPOT ms", "memory", "KV tokens", "quality", "Pareto", "s"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for t in rec.trials:
        r = t.held_rung or t.last
        name = f"{t.number}" + (" (defaults)" if t.defaults else "") + (" **winner**" if t.number == rec.winner else "")
        outcome = t.outcome + (f": {t.reason}" if t.reason and t.outcome != "held" else "")
        rows.append("| " + " | ".join([
            name, t.label, outcome.replace("|", "/"), r.name if r else "-", capacity_text(r), interval(r),
            num(ms(r.ttft_p99_s if r else None)), num(ms(r.tpot_p99_s if r else None)), gb_text(t.memory.bytes),
            num(t.memory.kv_cache_tokens) if t.memory.kv_cache_tokens else "-", quality_text(t),
            "yes" if t.number in front else "", f"{t.seconds:.0f}" if t.seconds else "-"]) + " |")
    return rows


def markdown(rec: TuneRecord, chart: Path | None) -> str:
    s = rec.settings
    lines = [f"# llmopt tune: {rec.model} on {rec.device}", "",
             f"{len(rec.trials)} trials in {rec.wall_s / 60:.1f} min of a {s.budget_s / 60:.0f}-min budget; SLO {s.slo}; "
             f"workload {s.workload.spec}; each capacity the highest Poisson arrival rate whose points met the SLO in steady "
             f"state, the winner and the defaults held {s.hold_s:g} s. Status: {rec.status}.", "", "## The answer", "",
             *headline(rec), "", "## Every trial", "",
             "Each trial is one server start: its quality against the FP16 reference, then its capacity rung by rung "
             "(short: short points, coarse; precise: narrowed; held: run again for the hold), going on only while successive "
             "halving keeps it. A capacity reads with the interval it is known within: [highest rate that met the SLO, "
             "lowest that missed), and that interval's width (the precision reached).", "", *trial_rows(rec), ""]
    if chart is not None:
        lines += [f"![capacity against p99 TTFT and TPOT, every trial]({chart.as_posix()})", ""]
    lines += ["## The space", ""] + [f"- `{k}`: {', '.join(map(str, v))} ({KNOBS[k]})" for k, v in rec.space.knobs.items()]
    lines += [f"- not tried here: `{k}`: {why}" for k, why in rec.space.removed.items()]
    lines += [f"- every trial: {', '.join(f'{k} = {v}' for k, v in rec.space.fixed.items()) or 'the vllm-serve stage defaults'}",
              "", *[f"- {n}" for n in rec.notes]]
    return "\n".join(lines) + "\n"


def chart(rec: TuneRecord, path: Path) -> Path | None:
    """Capacity against p99 TTFT and p99 TPOT, every trial with a capacity; the Pareto front
    ringed, the defaults a square, the winner a star, the SLO's limits dashed."""
    from llmopt_bench.core.plotting import ALT, BASE, BEST, legend, plt, save

    pts: list[tuple[TrialRecord, Rung, float]] = []
    for t in rec.trials:
        r = t.held_rung or t.last
        if r is not None and r.capacity_rps is not None:
            pts.append((t, r, r.capacity_rps))
    if not pts:
        return None
    front = pareto(rec.trials)
    limits = {t.metric: t.limit_s * 1e3 for t in rec.settings.slo.targets if t.percentile == 99}
    fig, axes = plt().subplots(1, 2, figsize=(11, 4.2))
    for ax, metric in zip(axes, ("ttft", "tpot")):
        for t, r, x in pts:
            y = getattr(r, f"{metric}_p99_s")
            if y is None:
                continue
            marker = "*" if t.number == rec.winner else "s" if t.defaults else "o"
            color = BEST if t.number == rec.winner else BASE if t.quality_ok else ALT
            ax.scatter(x, y * 1e3, marker=marker, s=140 if marker == "*" else 45, color=color, zorder=3)
            if t.number in front:
                ax.scatter(x, y * 1e3, s=260, facecolors="none", edgecolors=BEST, zorder=2)
            ax.annotate(str(t.number), (x, y * 1e3), textcoords="offset points", xytext=(5, 4), fontsize=8)
        if metric in limits:
            ax.axhline(limits[metric], linestyle="--", color=BASE, linewidth=1, label=f"SLO {metric} p99")
        ax.set_xlabel("capacity under the SLO (req/s)")
        ax.set_ylabel(f"p99 {metric.upper()} at that rate (ms)")
        legend(ax, fontsize=8)
    axes[0].set_title("square: vLLM defaults; star: winner; ringed: Pareto front; orange: fails the quality gate", fontsize=9)
    return save(fig, path)


def write_report(out: Path, rec: TuneRecord) -> Path:
    path = None
    try:
        path = chart(rec, out / CHART)
    except ImportError:  # matplotlib is optional (the charts extra): the table says everything
        path = None
    from llmopt_bench.core.models import portable_text
    from llmopt_bench.run.rundir import atomic_write

    atomic_write(out / "tune.md", portable_text(markdown(rec, Path(CHART) if path else None)))
    return out / "tune.md"
