"""`llmopt compare BASELINE NEW`: per stage and metric, the change with an interval that carries
run-to-run noise and the smallest change the pair could detect, and both runs' host; exit 5
when a metric regressed beyond its threshold, 6 when the new run is not a complete comparison, 8
when the hosts explain a change (their speed, or the repeats' CPU share, preemptions, steal or
load), 9 when a gated metric's interval reaches across its threshold (docs/regression.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.cli.paths import output_file, write_text
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError

# one vocabulary with `llmopt history show` and the JSON: a change beyond the threshold whose
# interval reaches back inside it is "inconclusive" everywhere
MARK = {"regressed": "**REGRESSED**", "improved": "improved", "unchanged": "unchanged",
        "inconclusive": "**inconclusive**", "inconclusive (host)": "**inconclusive (host)**", "n/a": "-"}


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "ms":
        return f"{value * 1000:.2f} ms"
    if unit == "GB":
        return f"{value / 1e9:.2f} GB"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:.1f} {unit}"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def short_noise(d) -> str:
    """'baseline: 3 repeats; new: 3 repeats' -> '3 repeats / 3 repeats'."""
    return " / ".join(part.split(": ", 1)[-1] for part in d.noise.split("; ")) if d.noise else "-"


def _header(cmp) -> list[str]:
    b, n = cmp.baseline, cmp.new
    level = f"{cmp.confidence * 100:g}%"
    lines = [f"## llmopt compare: {b['run_id']} → {n['run_id']}", "",
             f"- baseline: `{b['run_id']}` ({b['created_at']}, commit {b['commit'] or '?'})",
             f"- new: `{n['run_id']}` ({n['created_at']}, commit {n['commit'] or '?'})",
             (f"- {n['model']} on {n['device']}; ratio new/baseline with a {level} interval "
              "over each run's repeats (the geometric mean of their figures, t on Welch's degrees of freedom); a metric "
              "regresses only when the whole interval lies beyond its threshold, is unchanged only when it lies wholly "
              "within it, and is inconclusive otherwise; *detectable*: the smallest slowdown this pair catches 80% of "
              f"the time; gated (inconclusive fails): {', '.join(cmp.gate) or 'none'}"
              + (f", except the watched {', '.join(cmp.watched)}" if cmp.watched else "")
              + (" (inconclusive passed: --pass-inconclusive)" if cmp.pass_inconclusive else ""))]
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


def settle_text(d) -> str:
    """Why an inconclusive verdict is one, and what would settle it."""
    if not d.judged:
        return "not judged: no run-to-run noise in one repeat a side" if d.ci else "not judged: one value a run, no history"
    if d.settle_repeats is not None:
        return f"~{d.settle_repeats} repeats a side would settle it"
    return "more repeats would not settle it (the change sits at the threshold, or the history's spread exceeds the margin)"


def verdict_cell(s, d) -> str:
    """The verdict, why an inconclusive one is, and what the host did to it."""
    out = MARK.get(d.verdict, d.verdict)
    if d.verdict == "inconclusive":
        out = (out if d.gated else "inconclusive (watched, not gated)") + f": {settle_text(d)}"
    elif d.verdict == "inconclusive (host)" and d.raw_verdict:
        out += f" (raw: {d.raw_verdict})"
    if s.host_bound and s.host and s.host["state"] in ("slower", "faster") and d.normalised_verdict is not None:
        ci = f" [{pct(d.normalised_ci[0] - 1)} … {pct(d.normalised_ci[1] - 1)}]" if d.normalised_ci else ""
        out += f"; {s.host['text'].split(' (')[0]}: {pct(d.normalised_ratio - 1)}{ci} as on the baseline's host"
    return out


HEADERS = ("stage", "metric", "baseline", "new", "change", "interval", "detectable", "noise from (baseline / new)",
           "threshold", "verdict")
DROP_FIRST = (7, 6, 5)  # at a narrow terminal: the noise's source, the detectable change, the interval


def _stage_cells(s) -> list[list[str]]:
    """The table's cells of one stage: a status row, or a row per metric."""
    if s.state != "compared":
        status = {"only in baseline": f"not compared: only in baseline ({s.baseline_status})",
                  "only in new": f"not compared: only in new ({s.new_status})",
                  "not comparable": f"not comparable: {s.note}"}.get(s.state, f"not compared: {s.note or s.state}")
        return [[s.stage, "status", s.baseline_status or "-", s.new_status or "-", "-", "-", "-", "-", "-", status]]
    rows = []
    for d in s.metrics:
        ci = f"{pct(d.ci[0] - 1)} … {pct(d.ci[1] - 1)}" if d.ci else "(single value)"
        mde = "-" if d.mde is None else (f"{pct(-d.mde)}" if d.higher_is_better else pct(d.mde))
        rows.append([s.stage, d.label, fmt_value(d.baseline, d.unit), fmt_value(d.new, d.unit), pct(d.change), ci, mde,
                     short_noise(d), f"{d.threshold * 100:g}%", verdict_cell(s, d)])
    return rows


def _stage_lines(s) -> list[str]:
    return ["| " + " | ".join(cells) + " |" for cells in _stage_cells(s)]


def host_lines(cmp) -> list[str]:
    """Both runs' host-speed index, per stage that recorded it (measure/hostspeed.py)."""
    out = []
    for s in cmp.stages:
        if not s.host:
            continue
        h = s.host
        side = lambda kops, n: "not recorded" if kops is None else f"{kops:.3g} kop/s ({n} repeats)"  # noqa: E731
        bound = f"host-bound: {s.host_bound_why}" if s.host_bound else f"not host-bound: {s.host_bound_why or 'not known'}"
        out.append(f"Host speed of {s.stage} ({bound}): baseline {side(h['baseline_kops'], h['baseline_repeats'])}, "
                   f"new {side(h['new_kops'], h['new_repeats'])}: {h['text']}.")
    return out


def moved_lines(cmp) -> list[str]:
    """Per stage, the repeats set aside and the signals that moved between the runs (analysis/host_signals.py)."""
    out = []
    for s in cmp.stages:
        if s.set_aside:
            sides = "; ".join(f"the {'new run' if side == 'new' else side}'s repeat(s) {', '.join(str(i + 1) for i in idx)}"
                              for side, idx in s.set_aside.items())
            out.append(f"Set aside in {s.stage}: {sides}: the host disturbed them (their CPU share, preemptions or steal "
                       "beyond their run's typical repeat); judged on the others.")
        if s.host_moved:
            out.append(f"Host of {s.stage} moved: " + "; ".join(m["text"] for m in s.host_moved) + ".")
    return out


def headline(cmp) -> str:
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


def _summary(cmp) -> list[str]:
    imps, hosts = cmp.improvements, cmp.host_inconclusive
    lines = [headline(cmp)]
    if hosts:
        lines.append(f"**Inconclusive (host)**: {', '.join(f'{s} {m}' for s, m in hosts)}: the hosts explain the change.")
    lines += moved_lines(cmp) + host_lines(cmp)
    for stage, sides in cmp.conditions.items():  # was one run's machine busier? (docs/regression.md)
        lines.append(f"Repeat conditions of {stage}: baseline {sides['baseline'] or 'not recorded'}; "
                     f"new {sides['new'] or 'not recorded'}.")
    if cmp.incomplete:
        lines.append("**Incomplete comparison**: " + "; ".join(cmp.incomplete) + ".")
    for stage, text in cmp.accepted_drift.items():
        lines.append(f"Not compared, accepted by --drift: {stage} {text}.")
    if imps:
        lines.append(f"Improved: {', '.join(f'{s} {m}' for s, m in imps)}.")
    return lines


def to_markdown(cmp) -> str:
    level = f"{cmp.confidence * 100:g}%"
    head = [h if h != "interval" else f"{level} interval" for h in HEADERS]
    lines = _header(cmp) + ["", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for s in cmp.stages:
        lines += _stage_lines(s)
    return "\n".join(lines + [""] + _summary(cmp)) + "\n"


def plain(line: str) -> str:
    """A markdown line as a terminal shows it: no heading marks, bold or code ticks."""
    return re.sub(r"^#+ ", "", line).replace("**", "").replace("`", "")


def print_terminal(cmp, after: list[str] | None = None) -> None:
    """The comparison at the terminal's width ($COLUMNS): sentences wrapped between words, the
    table's cells too, its least needed columns left out (and named) where even that does not fit."""
    from llmopt_bench.cli.terminal import echo, print_table, width

    cols = width()
    echo([plain(line) for line in _header(cmp)], cols)
    rows = [cells for s in cmp.stages for cells in _stage_cells(s)]
    head = [h if h != "interval" else f"{cmp.confidence * 100:g}% interval" for h in HEADERS]
    print_table(head, [[plain(c) for c in r] for r in rows], columns=cols, drop=DROP_FIRST,
                dropped_note="--format md or json has every column")
    echo([plain(line) for line in _summary(cmp) + (after or [])], cols)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def same_file(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def promote_fix(baseline: Path, new: Path, cmp) -> str:
    """Copy the new run into the baseline FILE the user named; a baseline that is a run
    directory is another run's record, never overwritten: suggest a baselines/ file instead.
    Never a copy of a file onto itself: a new run that already is that file is said to be."""
    src = new / "run.json" if new.is_dir() else new
    if not baseline.is_dir():
        if same_file(src, baseline):
            return f"the new run is the baseline file itself ({baseline}): nothing to promote"
        return f"if the change is intended, make the new run the baseline: cp {src} {baseline}"
    name = f"{slug(cmp.new['device'] or 'device')}-{slug(cmp.new['model'] or 'model')}.json"
    dst = Path("results") / "baselines" / name
    if same_file(src, dst):
        return (f"if the change is intended, the new run is already a baseline file ({dst}): compare against it from now on "
                f"(the baseline {baseline} is a run's own record: leave it)")
    return (f"if the change is intended, keep the new run as a baseline file (the baseline {baseline} is a run's own "
            f"record: leave it): mkdir -p {dst.parent} && cp {src} {dst}, then compare against {dst}")


def tune_lines(baseline: Path, new: Path) -> list[str]:
    """Both runs' held capacities where both are llmopt tune runs (tune.json beside run.json):
    the defaults with the defaults, the winner with the winner, each with its settings."""
    from llmopt_bench.tune.record import TUNE_JSON, TuneRecord
    from llmopt_bench.tune.report import capacity_text, interval

    def read(path: Path):
        f = (path if path.is_dir() else path.parent) / TUNE_JSON
        try:
            return TuneRecord.model_validate_json(f.read_text()) if f.is_file() else None
        except (OSError, ValueError):
            return None
    runs = read(baseline), read(new)
    if None in runs:
        return []
    lines = ["", "llmopt tune's held capacities (baseline -> new; docs/tune.md):"]
    for role in ("defaults", "winner"):
        a, b = (r.trial(getattr(r, role)) for r in runs)  # type: ignore[union-attr]
        side = lambda t: "-" if t is None else f"{capacity_text(t.held_rung or t.last, ' req/s')} {interval(t.held_rung or t.last)} ({t.label})"  # noqa: E731
        lines.append(f"- {role}: {side(a)} -> {side(b)}")
    return lines


def known_stages(*runs) -> set[str]:
    """The names --allow-missing may take: the runs' stages and every registered one."""
    from llmopt_bench.run.registry import stage_names

    return {s.name for r in runs for s in r.stages} | set(stage_names())


@app.command("compare")
def compare_cmd(
    baseline: Path = typer.Argument(..., help="Baseline run directory or run.json (e.g. results/baselines/<gpu>-<model>.json)."),
    new: Path = typer.Argument(..., help="New run directory or run.json."),
    max_regression: Optional[List[str]] = typer.Option(None, "--max-regression", help="Allowed change in the bad direction: 5% for every metric, or per metric: tpot=3%, ttft=10%, tok_s=5%, load=30%, memory=2% (repeat or comma-separate). Default: 5%, load 20%."),
    allow_missing: Optional[List[str]] = typer.Option(None, "--allow-missing", help="Stages (comma-separated) that may be missing, skipped, failed or not comparable (other params) in the new run; 'run': accept a run that did not complete; 'all': both, for every stage."),
    fmt: str = typer.Option("table", "--format", help="table (the terminal's width), md (a markdown table, what --output writes unless json) or json."),
    force: bool = typer.Option(False, "--force", help="Compare even when device, model, workload or schema differ."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Also write the comparison to FILE: markdown, or JSON with --format json."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help="History whose earlier runs of the same device, model and workload give the baseline's noise. [default: $LLMOPT_HISTORY_DB, else history.sqlite in $LLMOPT_CACHE or ~/.cache/llmopt; none there: the two runs alone]"),
    no_history: bool = typer.Option(False, "--no-history", help="Judge from the two runs alone, even where the history knows earlier runs."),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence level of the interval."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap."),
    drift: Optional[Path] = typer.Option(None, "--drift", help="A baselines' drift file (results/baselines/drift.toml): the params it declares for this baseline's stages are accepted as no gap (those stages are not compared); any other difference still exits 6."),
    gate: Optional[List[str]] = typer.Option(None, "--gate", help="Metrics whose inconclusive verdict fails the comparison (exit 9), comma-separated or repeated: tpot, e2e, tok_s, memory (the default), ttft, load, or all. The others are watched: their regression still exits 5."),
    watch: Optional[List[str]] = typer.Option(None, "--watch", help="Stages or STAGE:METRIC pairs (comma-separated or repeated) whose gated metrics are only watched: judged and reported, a regression still exits 5, an inconclusive verdict does not fail (e.g. flash-attn:tpot, a sweep whose eager decode its own 3 repeats cannot settle)."),
    pass_inconclusive: bool = typer.Option(False, "--pass-inconclusive", help="Let a gated metric whose interval reaches across its threshold pass (exit 0), as the gate did before: a comparison then passes without the evidence that nothing changed."),
    host_rule: str = typer.Option("attribute", "--host-rule", help="How a host-bound stage's verdict weighs the host-speed index: attribute (the raw verdict; a change the hosts' speed explains, or hides, is inconclusive (host)) or normalise (judged as if on the baseline's host). docs/regression.md"),
) -> None:
    """Compare two runs; exit 5 when a metric regressed beyond its threshold, 6 when the new run is
    not a complete comparison (a stage missing, not ok or run with other params, the run
    unfinished), 8 when the hosts explain a change (their speed, or the repeats' CPU share,
    preemptions, steal or load moved), 9 when a gated metric is inconclusive (its interval reaches
    across the threshold), 0 when every gated metric is settled and none regressed."""
    import json

    from llmopt_bench.analysis.baseline_drift import declared_for, load_drift
    from llmopt_bench.analysis.compare import (
        compare_runs,
        parse_allowed,
        parse_gate,
        parse_thresholds,
        parse_watch,
    )
    from llmopt_bench.analysis.completeness import check_allowed
    from llmopt_bench.core.results import load_run
    from llmopt_bench.run.history import default_db, fingerprint_runs

    if fmt not in ("table", "md", "json"):
        raise UsageError(f"--format {fmt!r}: unknown", "use table, md or json")
    if output is not None:
        output_file(output, "--output", "compare.md")  # a bad path fails before the bootstrap
    thresholds, gated = parse_thresholds(max_regression), parse_gate(gate)
    base_run, new_run = load_run(baseline), load_run(new)
    allowed = parse_allowed(allow_missing)
    check_allowed(allowed, known_stages(base_run, new_run))
    declared = declared_for(load_drift(drift), baseline) if drift is not None else {}
    history = [] if no_history else fingerprint_runs(db or default_db(), base_run, new_run)
    cmp = compare_runs(base_run, new_run, thresholds, force=force, resamples=resamples, confidence=confidence,
                       seed=seed, history=history, allowed=allowed, host_rule=host_rule, gate=gated,
                       pass_inconclusive=pass_inconclusive, drift=declared, watch=parse_watch(watch))
    tune = tune_lines(baseline, new)  # two llmopt tune runs: their held capacities beside each other
    text = json.dumps(cmp.to_dict(), indent=1) + "\n" if fmt == "json" else to_markdown(cmp) + "\n".join(tune)
    if fmt == "table":
        print_terminal(cmp, tune)
    else:
        typer.echo(text, nl=False)
    if output is not None:
        write_text(output, text, "--output", "compare.md")
    exit_status(cmp, baseline, new)


def exit_status(cmp, baseline: Path, new: Path) -> None:
    """One exit path, the strongest finding first: a regression (5), an incomplete comparison
    (6), a change the hosts explain (8), a gated metric left unsettled (9)."""
    from llmopt_bench.analysis.completeness import gap_fix

    if cmp.regressions:
        what = ", ".join(f"{s} {m}" for s, m in cmp.regressions)
        raise LlmoptError(f"{len(cmp.regressions)} regression(s): {what}", promote_fix(baseline, new, cmp),
                          code=ExitCode.REGRESSION)
    if cmp.incomplete:
        raise LlmoptError(f"incomplete comparison: {'; '.join(cmp.incomplete)}",
                          gap_fix(cmp.gaps, str(new.parent if new.is_file() else new)), code=ExitCode.INCOMPLETE)
    if cmp.host_inconclusive:
        what = ", ".join(f"{s} {m}" for s, m in cmp.host_inconclusive)
        signals = sorted({m["label"] for s in cmp.stages for m in s.host_moved})
        why = f"the repeats' {', '.join(signals)} moved" if signals else "the hosts' speed explains it"
        raise LlmoptError(f"inconclusive (host): {what}: {why} (under the table)",
                          "compare runs made on the same host, or on a quiet one (docs/regression.md, 'The host')",
                          code=ExitCode.HOST_INCONCLUSIVE)
    if cmp.inconclusive and not cmp.pass_inconclusive:
        raise LlmoptError(f"inconclusive: {inconclusive_text(cmp)}", inconclusive_fix(cmp), code=ExitCode.INCONCLUSIVE)


def inconclusive_text(cmp) -> str:
    """'hf-fp16 tpot_p50 (interval -31% ... +62% across the 5% threshold; ~24 repeats a side would settle it)'."""
    parts = []
    for s in cmp.stages:
        for d in s.metrics:
            if d.verdict == "inconclusive" and d.gated:
                ci = f"interval {pct(d.ci[0] - 1)} … {pct(d.ci[1] - 1)} across the {d.threshold * 100:g}% threshold; " if d.ci else ""
                parts.append(f"{s.stage} {d.metric} ({ci}{settle_text(d)})")
    return "; ".join(parts)


def inconclusive_fix(cmp) -> str:
    """More repeats where they would settle it (the stopping rule), else the gate's other levers."""
    needed = [d.settle_repeats for s in cmp.stages for d in s.metrics
              if d.verdict == "inconclusive" and d.gated and d.settle_repeats is not None]
    more = (f"measure again with enough repeats to settle it (llmopt bench --max-repeats {max(needed)}: the stopping "
            "rule stops each stage as soon as it is settled), on both sides if the baseline's own spread is the wider; "
            if needed else "")
    return (f"{more}keep a history of earlier runs (llmopt history add), or gate this metric with a wider threshold "
            "(--max-regression METRIC=PCT) or leave it watched (--gate); --pass-inconclusive passes it as before")
