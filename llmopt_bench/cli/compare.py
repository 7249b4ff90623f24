"""`llmopt compare BASELINE NEW`: per stage and metric, the change with its bootstrap interval;
exit 5 when a metric regressed beyond its threshold (docs/regression.md)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.errors import ExitCode, LlmoptError, UsageError

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


def to_markdown(cmp) -> str:
    b, n = cmp.baseline, cmp.new
    level = f"{cmp.confidence * 100:g}%"
    lines = [f"## llmopt compare: {b['run_id']} → {n['run_id']}", "",
             f"- baseline: `{b['run_id']}` ({b['created_at']}, commit {b['commit'] or '?'})",
             f"- new: `{n['run_id']}` ({n['created_at']}, commit {n['commit'] or '?'})",
             f"- {n['model']} on {n['device']}; ratio new/baseline with a {level} bootstrap interval "
             f"({cmp.resamples} resamples, seed {cmp.seed}); a metric regresses only when the whole interval "
             "lies beyond its threshold"]
    if cmp.mismatches:
        lines.append(f"- **forced** despite: {'; '.join(cmp.mismatches)}")
    lines += ["", f"| stage | metric | baseline | new | change | {level} interval | threshold | verdict |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for s in cmp.stages:
        if s.state != "compared":
            status = {"only in baseline": f"only in baseline ({s.baseline_status})",
                      "only in new": f"only in new ({s.new_status})"}.get(s.state, s.note or s.state)
            verdict = "**REGRESSED** (failed)" if s.state == "failed in new" else "not compared"
            lines.append(f"| {s.stage} | status | {s.baseline_status or '-'} | {s.new_status or '-'} | - | - | - | {verdict}: {status} |")
            continue
        for d in s.metrics:
            ci = f"{pct(d.ci[0] - 1)} … {pct(d.ci[1] - 1)}" if d.ci else "(single value)"
            lines.append(f"| {s.stage} | {d.label} | {fmt_value(d.baseline, d.unit)} | {fmt_value(d.new, d.unit)} | "
                         f"{pct(d.change)} | {ci} | {d.threshold * 100:g}% | {MARK[d.verdict]} |")
    regs, imps = cmp.regressions, cmp.improvements
    lines += ["", f"**{len(regs)} regression(s)**: " + ", ".join(f"{s} {m}" for s, m in regs) if regs else "**No regression.**"]
    if imps:
        lines.append(f"Improved: {', '.join(f'{s} {m}' for s, m in imps)}.")
    return "\n".join(lines) + "\n"


@app.command("compare")
def compare_cmd(
    baseline: Path = typer.Argument(..., help="Baseline run directory or run.json (e.g. results/baselines/<gpu>-<model>.json)."),
    new: Path = typer.Argument(..., help="New run directory or run.json."),
    max_regression: Optional[List[str]] = typer.Option(None, "--max-regression", help="Allowed change in the bad direction: 5% for every metric, or per metric: tpot=3%, ttft=10%, tok_s=5%, load=30%, memory=2% (repeat or comma-separate). Default: 5%, load 20%."),
    fmt: str = typer.Option("md", "--format", help="md (a markdown table) or json."),
    force: bool = typer.Option(False, "--force", help="Compare even when device, model, workload or schema differ."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Also write the table (or JSON) to FILE."),
    resamples: int = typer.Option(2000, "--resamples", help="Bootstrap resamples."),
    confidence: float = typer.Option(0.95, "--confidence", help="Confidence level of the interval."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap."),
) -> None:
    """Compare two runs; exit 5 when a metric regressed beyond its threshold, 0 otherwise."""
    import json

    from llmopt_bench.analysis.compare import compare_runs, parse_thresholds
    from llmopt_bench.results import load_run

    if fmt not in ("md", "json"):
        raise UsageError(f"--format {fmt!r}: unknown", "use md or json")
    thresholds = parse_thresholds(max_regression)
    cmp = compare_runs(load_run(baseline), load_run(new), thresholds, force=force, resamples=resamples,
                       confidence=confidence, seed=seed)
    text = to_markdown(cmp) if fmt == "md" else json.dumps(cmp.to_dict(), indent=1) + "\n"
    typer.echo(text, nl=False)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    if cmp.regressions:
        what = ", ".join(f"{s} {m}" for s, m in cmp.regressions)
        src = new / "run.json" if new.is_dir() else new
        dst = baseline / "run.json" if baseline.is_dir() else baseline
        raise LlmoptError(f"{len(cmp.regressions)} regression(s): {what}",
                          f"if the change is intended, make the new run the baseline: cp {src} {dst}",
                          code=ExitCode.REGRESSION)
