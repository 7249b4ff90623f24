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
    name = f"{slug(cmp.new.device or 'device')}-{slug(cmp.new.model or 'model')}.json"
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
    gate_file: Optional[Path] = typer.Option(None, "--gate-file", help="The baseline's gate file: per stage, the figures gated at the threshold their measured noise supports and those only watched, with the arithmetic (scripts/gate/gate-file.py makes it). [default: BASELINE's own X.gate.toml beside X.json, where there is one]"),
    no_gate_file: bool = typer.Option(False, "--no-gate-file", help="Judge every stage at the default thresholds, even where the baseline has a gate file."),
    host_rule: str = typer.Option("attribute", "--host-rule", help="How a host-bound stage's verdict weighs the host-speed index: attribute (the raw verdict; a change the hosts' speed explains, or hides, is inconclusive (host)) or normalise (judged as if on the baseline's host). docs/regression.md"),
) -> None:
    """Compare two runs; exit 5 when a metric regressed beyond its threshold, 6 when the new run is
    not a complete comparison (a stage missing, not ok or run with other params, the run
    unfinished), 8 when the hosts explain a change (their speed, or the repeats' CPU share,
    preemptions, steal or load moved), 9 when a gated metric is inconclusive (its interval reaches
    across the threshold), 0 when every gated metric is settled and none regressed."""
    import json

    from llmopt_bench.analysis.gate import gate_file as gates
    from llmopt_bench.analysis.gate.baseline_drift import declared_for, load_drift
    from llmopt_bench.analysis.gate.compare import compare_runs, parse_allowed, parse_gate, parse_thresholds, parse_watch
    from llmopt_bench.analysis.gate.completeness import check_allowed
    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.compare_text import comparison_json, print_terminal, to_markdown
    from llmopt_bench.run.history import default_db, fingerprint_runs

    if fmt not in ("table", "md", "json"):
        raise UsageError(f"--format {fmt!r}: unknown", "use table, md or json")
    if output is not None:
        output_file(output, "--output", "compare.md")  # a bad path fails before the bootstrap
    thresholds, gated = parse_thresholds(max_regression), parse_gate(gate)
    if gate_file is not None and no_gate_file:
        raise UsageError("--gate-file and --no-gate-file together", "pass one of them")
    base_run, new_run = load_run(baseline), load_run(new)
    allowed, stages = parse_allowed(allow_missing), known_stages(base_run, new_run)
    check_allowed(allowed, stages)
    watched = parse_watch(watch, stages)
    declared = declared_for(load_drift(drift), baseline) if drift is not None else {}
    found = None if no_gate_file else gate_file or gates.beside(baseline)
    plan = gates.load(found, baseline) if found is not None else None
    if plan is not None:  # the user's own --max-regression wins, the file's watched figures join --watch
        thresholds, watched = plan.merged(thresholds), watched | plan.watched()
    history = [] if no_history else fingerprint_runs(db or default_db(), base_run, new_run)
    cmp = compare_runs(base_run, new_run, thresholds, force=force, resamples=resamples, confidence=confidence,
                       seed=seed, history=history, allowed=allowed, host_rule=host_rule, gate=gated,
                       pass_inconclusive=pass_inconclusive, drift=declared, watch=watched)
    cmp.gate_file = str(found) if found is not None else None
    tune = tune_lines(baseline, new)  # two llmopt tune runs: their held capacities beside each other
    text = json.dumps(comparison_json(cmp), indent=1) + "\n" if fmt == "json" else to_markdown(cmp) + "\n".join(tune)
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
    from llmopt_bench.analysis.gate.completeness import gap_fix
    from llmopt_bench.render.compare_text import inconclusive_fix, inconclusive_text

    if cmp.regressions:
        what = ", ".join(f"{s} {m}" for s, m in cmp.regressions)
        raise LlmoptError(f"{len(cmp.regressions)} regression(s): {what}", promote_fix(baseline, new, cmp),
                          code=ExitCode.REGRESSION)
    if cmp.incomplete:
        raise LlmoptError(f"incomplete comparison: {'; '.join(cmp.incomplete)}",
                          gap_fix(cmp.gaps, str(new.parent if new.is_file() else new)), code=ExitCode.INCOMPLETE)
    if cmp.host_inconclusive:
        what = ", ".join(f"{s} {m}" for s, m in cmp.host_inconclusive)
        signals = sorted({m.label for s in cmp.stages for m in s.host_moved})
        why = f"the repeats' {', '.join(signals)} moved" if signals else "the hosts' speed explains it"
        raise LlmoptError(f"inconclusive (host): {what}: {why} (under the table)",
                          "compare runs made on the same host, or on a quiet one (docs/regression.md, 'The host')",
                          code=ExitCode.HOST_INCONCLUSIVE)
    if cmp.inconclusive and not cmp.pass_inconclusive:
        raise LlmoptError(f"inconclusive: {inconclusive_text(cmp)}", inconclusive_fix(cmp), code=ExitCode.INCONCLUSIVE)


