"""tune.md and charts/tune_trials.png, from tune.json alone: the winner against the defaults
(held capacities, each known within [capacity, upper end), the ratio with its interval, the
confirmation by vLLM's client, the `vllm serve` line), where the budget went (by phase), every
trial in a table (why it was started, what came of it, its ceiling, the rung it reached, its
capacity with the interval and precision it is known to, p99 TTFT and TPOT there, memory,
quality, whether it is on the Pareto front), and a chart of capacity against p99 TTFT and TPOT.

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
    """[passing, upper end) and the precision reached: what a capacity is known within (the upper
    end: the lowest rate that failed, or the highest completion rate measured where lower)."""
    if r is None or r.capacity_rps is None:
        return "-"
    hi = num(r.top) if r.top else "not bounded"
    reached = f", {r.reached:.0%}" if r.reached is not None else ""
    return f"[{num(r.capacity_rps)}, {hi}){reached}"


def capacity_text(r: Rung | None, unit: str = "") -> str:
    """A rung's capacity as the report says it: held, or "~N" (short trials only, or a failed hold)."""
    if r is not None and r.name == "ceiling" and r.ceiling_rps is not None:
        return f"ceiling {num(r.ceiling_rps)}{unit}"
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
    hold, ref = rec.settings.hold_s, rec.space.reference_name()
    Ref = "T" + ref[1:] if ref.startswith("the ") else ref  # noqa: N806 - at a sentence's start
    if w is None:
        return ["**No configuration held a capacity under the SLO with its quality kept**: see the trials below."]
    wr = w.held_rung
    assert wr is not None
    lines = []
    if d is not None and w.number == d.number:
        lines.append(f"**{Ref} held the most**: {num(wr.capacity_rps)} req/s, held {hold:g} s, known within "
                     f"{interval(wr)}; no configuration tried beat them.")
    else:
        lines.append(f"**Deploy trial {w.number}** ({w.label}): **{num(wr.capacity_rps)} req/s held {hold:g} s**, known within "
                     f"{interval(wr)}.")
        if d is not None and d.last is not None:
            lines.append(f"{Ref} (trial {d.number}): {capacity_text(d.held_rung or d.last, ' req/s')}, known "
                         f"within {interval(d.held_rung or d.last)}.")
        if rec.ratio:
            lo = f"{rec.ratio.lo:.2f}" if rec.ratio.lo is not None else "not bounded"
            hi = f"{rec.ratio.hi:.2f}" if rec.ratio.hi is not None else "not bounded"
            lines.append(f"Held capacity, the winner's over the defaults': **{rec.ratio.value:.2f}x** (interval {lo} to {hi}x: the "
                         "winner's capacity over the defaults' upper end, and the winner's upper end over the defaults' "
                         "capacity).")
        elif d is not None:
            lines.append(f"No ratio to the defaults: their trial ended {d.outcome}" + (f" ({d.reason})" if d.reason else "") + ".")
    if w.paired:
        lines.append("It runs with " + "; ".join(f"{k} {v}" for k, v in w.paired.items()) + ".")
    lines.append(f"Quality: {quality_text(w)}.")
    c = w.confirmation
    if c is not None:
        figs = ", ".join(f"{k} {v:.4g}" for k, v in c.figures.items() if isinstance(v, (int, float)))
        where = f"trial {c.on_trial}, a start of the same configuration" if c.on_trial else "same server"
        lines.append(f"Confirmed by vLLM's client (`vllm bench serve`, {c.num_prompts} Poisson arrivals at {num(c.rate_rps)} req/s, "
                     f"{where}): **{c.verdict}**{' (' + c.why + ')' if c.why else ''}; {figs}.")
    else:
        why = next((n for n in rec.notes if "not confirmed" in n or n.startswith("the winner's confirmation")), None)
        lines.append("**Not confirmed by vLLM's client**" + (f": {why}" if why else " ([search] confirm = false)") + ".")
    return [" ".join(lines), "", "The `vllm serve` line that deploys it:", "", f"    {w.command}"]



def spent(rec: TuneRecord) -> list[str]:
    """Where the budget went: each phase's starts and seconds."""
    rows = ["| phase | what it does | server starts | not started | seconds |", "| --- | --- | --- | --- | --- |"]
    what = {"defaults": "every rung of the reference: ceiling, short, precise, held",
            "screen": "one knob from the base, its ceiling alone (rung 0)",
            "combine": "the knobs that each helped, together: their ceiling",
            "narrow": "the promising screened, started again: capacity under the SLO, held where it can win",
            "confirm": "the winner's confirmation by vLLM's client on a start of its own"}
    for phase, text in what.items():
        ts = [t for t in rec.trials if t.phase == phase]
        if ts:
            started = [t for t in ts if t.outcome != "not started"]
            rows.append(f"| {phase} | {text} | {len(started)} | {len(ts) - len(started)} | "
                        f"{sum(t.seconds or 0 for t in started):.0f} |")
    return rows


def trial_rows(rec: TuneRecord) -> list[str]:
    front = pareto(rec.trials)
    head = ["trial", "phase", "configuration", "why started", "outcome", "then", "ceiling req/s", "rung", "capacity req/s",
            "known within (precision)", "p99 TTFT ms", "p99 TPOT ms", "memory", "KV tokens", "quality", "Pareto", "s"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for t in rec.trials:
        r = t.held_rung or t.last
        name = f"{t.number}" + (" (defaults)" if t.defaults else "") + (" **winner**" if t.number == rec.winner else "")
        outcome = t.outcome + (f": {t.reason}" if t.reason and t.outcome != "held" else "")
        config = t.label + "".join(f" (with {k} {v.split(':')[0]})" for k, v in t.paired.items())
        rows.append("| " + " | ".join(x.replace("|", "/") for x in [
            name, t.phase or "-", config, t.why or "-", outcome, t.decision or "", num(t.ceiling_rps) if t.ceiling_rps else "-",
            r.name if r else "-", capacity_text(r) if r and r.name != "ceiling" else "-", interval(r),
            num(ms(r.ttft_p99_s if r else None)), num(ms(r.tpot_p99_s if r else None)), gb_text(t.memory.bytes),
            num(t.memory.kv_cache_tokens) if t.memory.kv_cache_tokens else "-", quality_text(t),
            "yes" if t.number in front else "", f"{t.seconds:.0f}" if t.seconds else "-"]) + " |")
    return rows


def markdown(rec: TuneRecord, chart: Path | None) -> str:
    s = rec.settings
    starts = sum(1 for t in rec.trials if t.outcome != "not started")
    lines = [f"# llmopt tune: {rec.model} on {rec.device}", "",
             f"{starts} server starts in {rec.wall_s / 60:.1f} min of a {s.budget_s / 60:.0f}-min budget; SLO {s.slo}; "
             f"workload {s.workload.spec}; each capacity the highest Poisson arrival rate whose points met the SLO in steady "
             f"state, the winner and the defaults held {s.hold_s:g} s. Status: {rec.status}.", "", "## The answer", "",
             *headline(rec), "", "## Where the budget went", "",
             "The defaults climb every rung; every configuration one knob away is screened on its ceiling alone (what its "
             "server completes a second, all at once: an upper bound of its capacity); only the screened whose ceiling "
             "leaves room above the best held capacity are started again for their capacity under the SLO (the best 1/eta "
             "of a phase at most), and held where they can win; the knobs that each raised the ceiling are combined and "
             "screened the same way; time for the winner's confirmation by vLLM's client is kept back from the start.", "",
             *spent(rec), "", "## Every trial", "",
             "Each trial is one server start: its quality against the FP16 reference, then its rungs (ceiling: one "
             "all-at-once point; short: short points, coarse; precise: narrowed; held: run again for the hold), going on "
             "only while it can beat the best held. A capacity reads with the interval it is known within: [highest rate "
             "that met the SLO, upper end: the lowest that missed, or the ceiling where lower), and that interval's width "
             "(the precision reached). \"then\": what the search made of a screened configuration, and why.", "",
             *trial_rows(rec), ""]
    if chart is not None:
        lines += [f"![capacity against p99 TTFT and TPOT, every trial]({chart.as_posix()})", ""]
    lines += ["## The space", ""] + [f"- `{k}`: {', '.join(map(str, v))} ({KNOBS[k]})" for k, v in rec.space.knobs.items()]
    lines += [f"- not tried here: `{k}`: {why}" for k, why in rec.space.removed.items()]
    lines += [f"- every trial: {', '.join(f'{k} = {v}' for k, v in rec.space.fixed.items()) or 'the vllm-serve stage defaults'}",
              f"- measured against: {rec.space.reference_name()}", "", *[f"- {n}" for n in rec.notes]]
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
