"""`llmopt compare BASELINE NEW`: per stage and metric, the change with an interval that carries
run-to-run noise and the smallest change the pair could detect; exit 5 when a metric regressed
beyond its threshold, 6 when the new run is not a complete comparison (docs/regression.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError

MARK = {"regressed": "**REGRESSED**", "improved": "improved", "unchanged": "unchanged",
        "inconclusive": "within noise", "n/a": "-"}


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
             (f"- {n['model']} on {n['device']}; ratio new/baseline with a {level} interval from a cluster bootstrap "
              f"over repeats ({cmp.resamples} resamples, seed {cmp.seed}); a metric regresses only when the whole "
              "interval lies beyond its threshold; *detectable*: the smallest slowdown this pair catches 80% of the time")]
    if cmp.history_runs:
        lines.append(f"- baseline noise from the history: {cmp.history_runs} earlier run(s) of this device, model and workload")
    if cmp.mismatches:
        lines.append(f"- **forced** despite: {'; '.join(cmp.mismatches)}")
    if cmp.allowed:
        lines.append(f"- allowed to be missing: {', '.join(cmp.allowed)}")
    return lines


def _stage_rows(s) -> list[str]:
    if s.state != "compared":
        status = {"only in baseline": f"only in baseline ({s.baseline_status})",
                  "only in new": f"only in new ({s.new_status})"}.get(s.state, s.note or s.state)
        return [(f"| {s.stage} | status | {s.baseline_status or '-'} | {s.new_status or '-'} | - | - | - | - | - | "
                 f"not compared: {status} |")]
    rows = []
    for d in s.metrics:
        ci = f"{pct(d.ci[0] - 1)} … {pct(d.ci[1] - 1)}" if d.ci else "(single value)"
        mde = "-" if d.mde is None else (f"{pct(-d.mde)}" if d.higher_is_better else pct(d.mde))
        rows.append(f"| {s.stage} | {d.label} | {fmt_value(d.baseline, d.unit)} | {fmt_value(d.new, d.unit)} | "
                    f"{pct(d.change)} | {ci} | {mde} | {short_noise(d)} | {d.threshold * 100:g}% | {MARK[d.verdict]} |")
    return rows


def to_markdown(cmp) -> str:
    level = f"{cmp.confidence * 100:g}%"
    lines = _header(cmp) + ["", (f"| stage | metric | baseline | new | change | {level} interval | detectable | "
                                 "noise from (baseline / new) | threshold | verdict |"),
                            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in cmp.stages:
        lines += _stage_rows(s)
    regs, imps = cmp.regressions, cmp.improvements
    lines += ["", f"**{len(regs)} regression(s)**: " + ", ".join(f"{s} {m}" for s, m in regs) if regs else "**No regression.**"]
    for stage, sides in cmp.conditions.items():  # was one run's machine busier? (docs/regression.md)
        lines.append(f"Repeat conditions of {stage}: baseline {sides['baseline'] or 'not recorded'}; "
                     f"new {sides['new'] or 'not recorded'}.")
    if cmp.incomplete:
        lines.append("**Incomplete comparison**: " + "; ".join(cmp.incomplete) + ".")
    if imps:
        lines.append(f"Improved: {', '.join(f'{s} {m}' for s, m in imps)}.")
    return "\n".join(lines) + "\n"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def promote_fix(baseline: Path, new: Path, cmp) -> str:
    """Copy the new run into the baseline FILE the user named; a baseline that is a run
    directory is another run's record, never overwritten: suggest a baselines/ file instead."""
    src = new / "run.json" if new.is_dir() else new
    if not baseline.is_dir():
        return f"if the change is intended, make the new run the baseline: cp {src} {baseline}"
    name = f"{slug(cmp.new['device'] or 'device')}-{slug(cmp.new['model'] or 'model')}.json"
    dst = Path("results") / "baselines" / name
    return (f"if the change is intended, keep the new run as a baseline file (the baseline {baseline} is a run's own "
            f"record: leave it): mkdir -p {dst.parent} && cp {src} {dst}, then compare against {dst}")


@app.command("compare")
def compare_cmd(
    baseline: Path = typer.Argument(..., help="Baseline run directory or run.json (e.g. results/baselines/<gpu>-<model>.json)."),
    new: Path = typer.Argument(..., help="New run directory or run.json."),
    max_regression: Optional[List[str]] = typer.Option(None, "--max-regression", help="Allowed change in the bad direction: 5% for every metric, or per metric: tpot=3%, ttft=10%, tok_s=5%, load=30%, memory=2% (repeat or comma-separate). Default: 5%, load 20%."),
    allow_missing: Optional[List[str]] = typer.Option(None, "--allow-missing", help="Stages (comma-separated) that may be missing, skipped or failed in the new run; 'run': accept a run that did not complete; 'all': both, for every stage."),
    fmt: str = typer.Option("md", "--format", help="md (a markdown table) or json."),
    force: bool = typer.Option(False, "--force", help="Compare even when device, model, workload or schema differ."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Also write the table (or JSON) to FILE."),
    db: Optional[Path] = typer.Option(None, "--db", envvar="LLMOPT_HISTORY_DB", help="History whose earlier runs of the same device, model and workload give the baseline's noise. [default: $LLMOPT_HISTORY_DB, else history.sqlite in $LLMOPT_CACHE or ~/.cache/llmopt; none there: the two runs alone]"),
    no_history: bool = typer.Option(False, "--no-history", help="Judge from the two runs alone, even where the history knows earlier runs."),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence level of the interval."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap."),
) -> None:
    """Compare two runs; exit 5 when a metric regressed beyond its threshold, 6 when the new run is
    not a complete comparison (a stage missing or not ok, the run unfinished), 0 otherwise."""
    import json

    from llmopt_bench.analysis.compare import (
        compare_runs,
        parse_allowed,
        parse_thresholds,
    )
    from llmopt_bench.core.results import load_run
    from llmopt_bench.run.history import default_db, fingerprint_runs

    if fmt not in ("md", "json"):
        raise UsageError(f"--format {fmt!r}: unknown", "use md or json")
    thresholds = parse_thresholds(max_regression)
    base_run, new_run = load_run(baseline), load_run(new)
    history = [] if no_history else fingerprint_runs(db or default_db(), base_run, new_run)
    cmp = compare_runs(base_run, new_run, thresholds, force=force, resamples=resamples, confidence=confidence,
                       seed=seed, history=history, allowed=parse_allowed(allow_missing))
    text = to_markdown(cmp) if fmt == "md" else json.dumps(cmp.to_dict(), indent=1) + "\n"
    typer.echo(text, nl=False)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    if cmp.regressions:
        what = ", ".join(f"{s} {m}" for s, m in cmp.regressions)
        raise LlmoptError(f"{len(cmp.regressions)} regression(s): {what}", promote_fix(baseline, new, cmp),
                          code=ExitCode.REGRESSION)
    if cmp.incomplete:
        raise LlmoptError(f"incomplete comparison: {'; '.join(cmp.incomplete)}",
                          f"finish an interrupted run with llmopt bench --resume {new.parent if new.is_file() else new} (a failed "
                          "stage needs a new run), or accept the gaps by name: --allow-missing STAGE[,STAGE] ('run' for an "
                          "unfinished run, 'all' for everything)",
                          code=ExitCode.INCOMPLETE)
