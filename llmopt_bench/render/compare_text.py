"""compare's text: the comparison as markdown (`--format md`, `--output`), at the terminal's
width (`--format table`), and the sentences of its exit error; the shared figure formatting that
`llmopt history` prints too. Reads analysis/gate/compare.Comparison; writes nothing."""

from __future__ import annotations

import re

from llmopt_bench.analysis.gate.compare import Comparison, MetricDelta, StageDelta
from llmopt_bench.analysis.metric_registry import REGISTRY
from llmopt_bench.core.fmt import change, quantity

# one vocabulary with `llmopt history show` and the JSON: a change beyond the threshold whose
# interval reaches back inside it is "inconclusive" everywhere
MARK = {"regressed": "**REGRESSED**", "improved": "improved", "unchanged": "unchanged",
        "inconclusive": "**inconclusive**", "inconclusive (host)": "**inconclusive (host)**", "n/a": "-"}


def figure_text(key: str, recorded: float | None) -> str:
    """A registered metric's recorded value in its shown unit: "12.34 ms", "1.23 GB"; a name the
    registry does not know (an older history's) as a plain number."""
    m = REGISTRY.get(key)
    if m is None:
        return "-" if recorded is None else f"{recorded:.4g}"
    return quantity(m.shown(recorded), m.unit)


# compare's JSON: what its numbers without a unit in their key or beside them measure
JSON_UNITS = {
    "stages.metrics.baseline": "the metric's `unit` beside it", "stages.metrics.new": "the metric's `unit` beside it",
    "stages.metrics.ratio": "new / baseline", "stages.metrics.ci": "new / baseline, 95% (or --confidence) interval",
    "stages.metrics.change": "fraction: ratio - 1", "stages.metrics.threshold": "fraction (0.05 = 5%)",
    "stages.metrics.mde": "fraction: the smallest change caught 80% of the time",
    "stages.metrics.settle_repeats": "count of repeats a side",
    "stages.metrics.normalised_ratio": "new / baseline, as on the baseline's host",
    "stages.metrics.normalised_ci": "new / baseline, as on the baseline's host",
    "stages.host.ratio": "new / baseline host-speed index", "stages.host.ci": "new / baseline host-speed index",
    "stages.host.baseline_repeats": "count", "stages.host.new_repeats": "count",
    "stages.host_moved.baseline": "the signal's `unit` beside it", "stages.host_moved.new": "the signal's `unit` beside it",
    "stages.set_aside": "0-based repeat indices", "thresholds": "fraction (0.05 = 5%)", "confidence": "fraction",
    "resamples": "count", "seed": "count", "history_runs": "count",
}


def comparison_json(cmp: Comparison) -> dict:
    """compare's JSON (`--format json`): Comparison.to_dict with each metric's baseline and new
    in the unit beside them (the registry's: ms, s, tok/s, GB; the figures of analysis/figures.py),
    and `units`: what every number without a unit in its key or beside it measures."""
    d = cmp.to_dict()
    for sd in d["stages"]:
        for md in sd["metrics"]:
            m = REGISTRY[md["metric"]]
            md["baseline"], md["new"] = m.shown(md["baseline"]), m.shown(md["new"])
    d["units"] = JSON_UNITS
    return d


def short_noise(d: MetricDelta) -> str:
    """'baseline: 3 repeats; new: 3 repeats' -> '3 repeats / 3 repeats'."""
    return " / ".join(part.split(": ", 1)[-1] for part in d.noise.split("; ")) if d.noise else "-"


def _header(cmp: Comparison) -> list[str]:
    b, n = cmp.baseline, cmp.new
    level = f"{cmp.confidence * 100:g}%"
    lines = [f"## llmopt compare: {b.name} → {n.name}", "",
             f"- baseline: `{b.name}` ({b.created_at}, commit {b.commit or '?'})",
             f"- new: `{n.name}` ({n.created_at}, commit {n.commit or '?'})",
             (f"- {n.model} on {n.device}; ratio new/baseline with a {level} interval "
              "over each run's repeats (the geometric mean of their figures, t on Welch's degrees of freedom); a metric "
              "regresses only when the whole interval lies beyond its threshold, is unchanged only when it lies wholly "
              "within it, and is inconclusive otherwise; *detectable*: the smallest slowdown this pair catches 80% of "
              f"the time; gated (inconclusive fails): {', '.join(cmp.gate) or 'none'}"
              + (f", except the watched {', '.join(cmp.watched)}" if cmp.watched else "")
              + (" (inconclusive passed: --pass-inconclusive)" if cmp.pass_inconclusive else ""))]
    if cmp.gate_file:
        lines.append(f"- thresholds and watched figures per stage from the baseline's gate file `{cmp.gate_file}` "
                     "(each at what its measured noise supports: docs/regression.md)")
    if cmp.history_runs:
        lines.append(f"- baseline noise from the history: {cmp.history_runs} earlier run(s) of this device, model and workload")
    if cmp.mismatches:
        lines.append(f"- **forced** despite: {'; '.join(cmp.mismatches)}")
    if cmp.allowed:
        lines.append(f"- allowed to be missing: {', '.join(cmp.allowed)}")
    if any(s.host for s in cmp.stages):
        lines.append(f"- host-bound stages weigh the host-speed index (rule `{cmp.host_rule}`): "
                     f"{'the verdict is the raw one' if cmp.host_rule == 'attribute' else 'the verdict is judged as if on the baseline host'}; "
                     "a change the hosts' speed explains is *inconclusive (host)* (exit 8)")
    if any(s.host_moved or s.set_aside for s in cmp.stages):
        lines.append("- the repeats' recorded CPU share, preemptions and steal are weighed: a repeat the host disturbed is set "
                     "aside, a change a moved host explains is *inconclusive (host)* (exit 8); see under the table")
    return lines


def settle_text(d: MetricDelta) -> str:
    """Why an inconclusive verdict is one, and what would settle it."""
    if not d.judged:
        return "not judged: no run-to-run noise in one repeat a side" if d.ci else "not judged: one value a run, no history"
    if d.settle_repeats is not None:
        return f"~{d.settle_repeats} repeats a side would settle it"
    return "more repeats would not settle it (the change sits at the threshold, or the history's spread exceeds the margin)"


def verdict_cell(s: StageDelta, d: MetricDelta) -> str:
    """The verdict, why an inconclusive one is, and what the host did to it."""
    out = MARK.get(d.verdict, d.verdict)
    if d.verdict == "inconclusive":
        out = (out if d.gated else "inconclusive (watched, not gated)") + f": {settle_text(d)}"
    elif d.verdict == "inconclusive (host)" and d.raw_verdict:
        out += f" (raw: {d.raw_verdict})"
    if s.host_bound and s.host and s.host.differs and d.normalised_verdict is not None:
        ci = f" [{change(d.normalised_ci[0] - 1)} … {change(d.normalised_ci[1] - 1)}]" if d.normalised_ci else ""
        moved = change(None if d.normalised_ratio is None else d.normalised_ratio - 1)
        out += f"; {s.host.text().split(' (')[0]}: {moved}{ci} as on the baseline's host"
    return out


HEADERS = ("stage", "metric", "baseline", "new", "change", "interval", "detectable", "noise from (baseline / new)",
           "threshold", "verdict")
DROP_FIRST = (7, 6, 5)  # at a narrow terminal: the noise's source, the detectable change, the interval


def _stage_cells(s: StageDelta) -> list[list[str]]:
    """The table's cells of one stage: a status row, or a row per metric."""
    if s.state != "compared":
        status = {"only in baseline": f"not compared: only in baseline ({s.baseline_status})",
                  "only in new": f"not compared: only in new ({s.new_status})",
                  "not comparable": f"not comparable: {s.note}"}.get(s.state, f"not compared: {s.note or s.state}")
        return [[s.stage, "status", s.baseline_status or "-", s.new_status or "-", "-", "-", "-", "-", "-", status]]
    rows = []
    for d in s.metrics:
        ci = f"{change(d.ci[0] - 1)} … {change(d.ci[1] - 1)}" if d.ci else "(single value)"
        mde = "-" if d.mde is None else (f"{change(-d.mde)}" if d.higher_is_better else change(d.mde))
        rows.append([s.stage, d.label, figure_text(d.metric, d.baseline), figure_text(d.metric, d.new), change(d.change), ci, mde,
                     short_noise(d), f"{d.threshold * 100:g}%", verdict_cell(s, d)])
    return rows


def _stage_lines(s: StageDelta) -> list[str]:
    return ["| " + " | ".join(cells) + " |" for cells in _stage_cells(s)]


def host_lines(cmp: Comparison) -> list[str]:
    """Both runs' host-speed index, per stage that recorded it (measure/hostspeed.py)."""
    out = []
    for s in cmp.stages:
        if not s.host:
            continue
        h = s.host
        side = lambda kops, n: "not recorded" if kops is None else f"{kops:.3g} kop/s ({n} repeats)"  # noqa: E731
        bound = f"host-bound: {s.host_bound_why}" if s.host_bound else f"not host-bound: {s.host_bound_why or 'not known'}"
        out.append(f"Host speed of {s.stage} ({bound}): baseline {side(h.baseline_kops, h.baseline_repeats)}, "
                   f"new {side(h.new_kops, h.new_repeats)}: {h.text()}.")
    return out


def moved_lines(cmp: Comparison) -> list[str]:
    """Per stage, the repeats set aside and the signals that moved between the runs (analysis/gate/host_signals.py)."""
    out = []
    for s in cmp.stages:
        if s.set_aside:
            sides = "; ".join(f"the {'new run' if side == 'new' else side}'s repeat(s) {', '.join(str(i + 1) for i in idx)}"
                              for side, idx in s.set_aside.items())
            out.append(f"Set aside in {s.stage}: {sides}: the host disturbed them (their CPU share, preemptions or steal "
                       "beyond their run's typical repeat); judged on the others.")
        if s.host_moved:
            out.append(f"Host of {s.stage} moved: " + "; ".join(m.text() for m in s.host_moved) + ".")
    return out


def headline(cmp: Comparison) -> str:
    """The summary's first line: "No regression." only when nothing gated is left unsettled."""
    regs, unsettled, hosts = cmp.regressions, cmp.inconclusive, cmp.host_inconclusive
    if regs:
        return f"**{len(regs)} regression(s)**: " + ", ".join(f"{s} {m}" for s, m in regs)
    if unsettled and not cmp.pass_inconclusive:
        return (f"**Inconclusive**: {len(unsettled)} gated metric(s) not settled, neither a pass nor a regression: "
                + ", ".join(f"{s} {m}" for s, m in unsettled))
    if hosts:
        return "**No regression of the build shown**: the hosts moved (below)."
    if unsettled:
        return (f"**No regression beyond the noise**; {len(unsettled)} gated metric(s) inconclusive, passed by "
                "--pass-inconclusive: " + ", ".join(f"{s} {m}" for s, m in unsettled))
    return "**No regression.**"


def _summary(cmp: Comparison) -> list[str]:
    imps, hosts = cmp.improvements, cmp.host_inconclusive
    lines = [headline(cmp)]
    if hosts:
        lines.append(f"**Inconclusive (host)**: {', '.join(f'{s} {m}' for s, m in hosts)}: the hosts explain the change.")
    lines += moved_lines(cmp) + host_lines(cmp)
    for stage, sides in cmp.conditions.items():  # was one run's machine busier? (docs/regression.md)
        lines.append(f"Repeat conditions of {stage}: baseline {sides.baseline or 'not recorded'}; "
                     f"new {sides.new or 'not recorded'}.")
    if cmp.incomplete:
        lines.append("**Incomplete comparison**: " + "; ".join(cmp.incomplete) + ".")
    for stage, text in cmp.accepted_drift.items():
        lines.append(f"Not compared, accepted by --drift: {stage} {text}.")
    if imps:
        lines.append(f"Improved: {', '.join(f'{s} {m}' for s, m in imps)}.")
    if watched := cmp.watched_unsettled:
        lines.append(f"Watched, not settled (their noise is wider than a pair can gate; a regression of theirs still fails): "
                     f"{', '.join(f'{s} {m}' for s, m in watched)}.")
    return lines


def to_markdown(cmp: Comparison) -> str:
    level = f"{cmp.confidence * 100:g}%"
    head = [h if h != "interval" else f"{level} interval" for h in HEADERS]
    lines = _header(cmp) + ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in cmp.stages:
        lines += _stage_lines(s)
    return "\n".join(lines + [""] + _summary(cmp)) + "\n"


def plain(line: str) -> str:
    """A markdown line as a terminal shows it: no heading marks, bold or code ticks."""
    return re.sub(r"^#+ ", "", line).replace("**", "").replace("`", "")


def print_terminal(cmp: Comparison, after: list[str] | None = None) -> None:
    """The comparison at the terminal's width ($COLUMNS): sentences wrapped between words, the
    table's cells too, its least needed columns left out (and named) where even that does not fit."""
    from llmopt_bench.render.terminal import echo, print_table, width

    cols = width()
    echo([plain(line) for line in _header(cmp)], cols)
    rows = [cells for s in cmp.stages for cells in _stage_cells(s)]
    head = [h if h != "interval" else f"{cmp.confidence * 100:g}% interval" for h in HEADERS]
    print_table(head, [[plain(c) for c in r] for r in rows], columns=cols, drop=DROP_FIRST,
                dropped_note="--format md or json has every column")
    echo([plain(line) for line in _summary(cmp) + (after or [])], cols)


def inconclusive_text(cmp: Comparison) -> str:
    """'hf-fp16 tpot_p50 (interval -31% ... +62% across the 5% threshold; ~24 repeats a side would settle it)'."""
    parts = []
    for s in cmp.stages:
        for d in s.metrics:
            if d.verdict == "inconclusive" and d.gated:
                ci = f"interval {change(d.ci[0] - 1)} … {change(d.ci[1] - 1)} across the {d.threshold * 100:g}% threshold; " if d.ci else ""
                parts.append(f"{s.stage} {d.metric} ({ci}{settle_text(d)})")
    return "; ".join(parts)


def inconclusive_fix(cmp: Comparison) -> str:
    """More repeats where they would settle it (the stopping rule), else the gate's other levers."""
    needed = [d.settle_repeats for s in cmp.stages for d in s.metrics
              if d.verdict == "inconclusive" and d.gated and d.settle_repeats is not None]
    more = (f"measure again with enough repeats to settle it (llmopt bench --max-repeats {max(needed)}: the stopping "
            "rule stops each stage as soon as it is settled), on both sides if the baseline's own spread is the wider; "
            if needed else "")
    return (f"{more}keep a history of earlier runs (llmopt history add), or gate this metric with a wider threshold "
            "(--max-regression METRIC=PCT) or leave it watched (--gate); --pass-inconclusive passes it as before")
