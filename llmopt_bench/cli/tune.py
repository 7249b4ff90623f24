"""`llmopt tune`: the vLLM serving configuration that holds the most load under the SLO, with its
quality kept, found within a budget (llmopt_bench/tune/, docs/tune.md).

Every option is checked before anything starts: a bad value is one line and exit 2."""

from __future__ import annotations

import re
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from llmopt_bench.cli.app import app, slo_option
from llmopt_bench.cli.workload_options import given_workload, with_workload_options
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.slo import SLO

# the run's workload defaults under the options given: the FP16 reference's own timing is a by-product here
TUNE_WORKLOAD: dict[str, object] = {"repeats": 1}
# the workload options tune has no use for, so neither its --help nor its command line offers them: a
# trial measures served load points (the load's own rules: docs/tune.md), never the fixed workload's
# repeats and their stopping rule, nor a one-shot batch; the reference is measured once, for its quality
NOT_FOR_TUNE = ("repeats", "max_repeats", "stop_within", "repeat_budget_s", "batch_size")
BUDGET_MIN_S, BUDGET_MAX_S = 60.0, 48 * 3600.0
_BUDGET = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?$")


def parse_budget(text: str) -> float:
    """"30m", "1h30m", "1.5h", "90s" -> seconds, within [1 min, 48 h]."""
    m = _BUDGET.match(text.strip().lower())
    if not text.strip() or not m or not any(m.groupdict().values()):
        raise UsageError(f"--budget {text!r}: not a duration", "write it with units, like --budget 30m, 1h30m or 90s")
    seconds = float(m["h"] or 0) * 3600 + float(m["m"] or 0) * 60 + float(m["s"] or 0)
    if not BUDGET_MIN_S <= seconds <= BUDGET_MAX_S:
        raise UsageError(f"--budget {text}: out of range, allowed 1m to 48h",
                         "each trial is a server start and its load points: give at least a few minutes, like --budget 30m")
    return seconds


def check_hold(hold: float) -> float:
    if not 0 < hold <= 3600:
        raise UsageError(f"--hold {hold:g}: out of range, allowed more than 0 and at most 3600 seconds",
                         "the winner and the defaults are each held this long: 60 (the default) on a GPU, less on a CPU, like --hold 10")
    return hold


def check_max_trials(n: int | None) -> int | None:
    if n is not None and n < 1:
        raise UsageError(f"--max-trials {n}: out of range, allowed 1 or more", "drop it to let the budget decide, or pass --max-trials 8")
    return n


def out_dir(output: Path | None) -> Path:
    """A new tune run's directory: made, writable, and no run's already."""
    from llmopt_bench.cli.paths import output_dir

    out = output or Path("results") / "tune" / datetime.now().strftime("%Y%m%d-%H%M%S")
    for name in ("tune.json", "run.json"):
        if (out / name).is_file():
            raise UsageError(f"--output {out}: already holds a run ({name})",
                             f"continue it with llmopt tune --resume {out}, or pass another --output")
    return output_dir(out, "--output", "results/tune/mine")


def resume_conflicts(given: dict[str, object]) -> None:
    """--resume goes on with the interrupted run's own settings: only the budget and the trials may change."""
    named = [k for k, v in given.items() if v not in (None, False)]
    if named:
        raise UsageError(f"--resume continues that run with its own settings: {', '.join(named)} cannot change them",
                         "drop them (--budget and --max-trials may be given), or start a new run with --output")


@app.command("tune")
@with_workload_options(after="model", leave_out=NOT_FOR_TUNE)
def tune_cmd(
    space: Optional[Path] = typer.Option(None, "--space", help="The search space, a TOML file (docs/tune.md). Default: journeys/tune.toml with CUDA, journeys/tune-cpu.toml without."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="synthetic:tiny | synthetic:llama2-7b | bundled:smollm2-135m | a local checkpoint dir | a hub id. Default: synthetic:llama2-7b on CUDA, synthetic:tiny on CPU."),
    budget: Optional[str] = typer.Option(None, "--budget", help="Wall time for the whole search, the FP16 reference included: 30m, 1h30m, 90s (1m to 48h; default: 30m; with --resume: the run's own, the time it spent counted). A trial starts only while the time left holds a server start and its first rung."),
    slo: Optional[SLO] = slo_option(help="The latency targets every capacity is judged under, like ttft_p99=2s,tpot_p99=100ms (default: MLPerf's Server limits for Llama-3.1-8B)."),
    hold: Optional[float] = typer.Option(None, "--hold", help="Seconds each configuration that climbs every rung (the defaults, the winner) is held at its capacity, and vLLM's client runs there (default: 60; less on a CPU)."),
    max_trials: Optional[int] = typer.Option(None, "--max-trials", help="Server starts of the search at most, the winner's confirmation beyond them (default: as many as the budget allows)."),
    min_quality: Optional[str] = typer.Option(None, "--min-quality", help="Quality gate: a configuration whose perplexity exceeds FP16's by more than 1 - Q is no answer, whatever its speed (0.99 or 99%: within 1%; default: 0.99)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Run directory, created if missing; never another run's (use --resume). (default: results/tune/<timestamp>)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Go on with the interrupted tune run in DIR: its finished trials kept, its settings, the time it spent counted in the budget."),
    **workload,
) -> None:
    """Find the vLLM serving configuration with the highest capacity held under the SLO whose outputs pass the
    quality gate: vLLM's defaults first, every one-knob change screened on its ceiling, the promising searched
    under the SLO and held, the knobs that helped combined; the winner confirmed by vllm bench serve (its time
    kept back from the start), its `vllm serve` line."""
    from llmopt_bench.cli.bench import parse_min_quality

    given = given_workload(workload)
    budget_s = parse_budget(budget) if budget is not None else None
    hold_s, limit = check_hold(hold) if hold is not None else None, check_max_trials(max_trials)
    gate = parse_min_quality(min_quality)
    if resume is not None:
        resume_conflicts({"--space": space, "--model": model, "--slo": slo, "--hold": hold, "--min-quality": min_quality,
                          "--output": output if output != resume else None, **{f"workload {k}": v for k, v in given.items()}})
        return finish(go_on(resume, budget_s, limit), resume)
    opts = new_options(space, model, budget_s or parse_budget("30m"), slo, hold_s, limit, gate, output, given)
    from llmopt_bench.tune.command import tune

    finish(interrupted_said(lambda: tune(opts), opts.out_dir), opts.out_dir)


def new_options(space: Path | None, model: str | None, budget_s: float, slo: SLO | None, hold_s: float | None,
                max_trials: int | None, gate: float | None, output: Path | None, given: dict[str, object]):
    """Everything a new tune run needs, checked: the space (for this device), the model, the workload, the SLO."""
    from llmopt_bench.analysis.quality_gate import DEFAULT_MIN_QUALITY
    from llmopt_bench.core.models import default_model, parse_model
    from llmopt_bench.core.slo import default_slo
    from llmopt_bench.core.workload import resolve_workload
    from llmopt_bench.run.registry import JOURNEY_DIR, cuda_devices
    from llmopt_bench.tune.command import TuneOptions
    from llmopt_bench.tune.space import read_space

    cuda = bool(cuda_devices())
    device = "cuda" if cuda else "cpu"
    parsed = read_space(space or JOURNEY_DIR / ("tune.toml" if cuda else "tune-cpu.toml"))
    parsed_slo = slo or default_slo()
    source = model or default_model(cuda)
    parse_model(source)
    cfg = resolve_workload(given, None, device, TUNE_WORKLOAD)
    out = out_dir(output)
    return TuneOptions(out_dir=out, space=parsed, model=source, workload=cfg, slo=parsed_slo,
                       hold_s=hold_s if hold_s is not None else (60.0 if cuda else 10.0), budget_s=budget_s, seed=cfg.seed,
                       min_quality=gate if gate is not None else DEFAULT_MIN_QUALITY, command=shlex.join(["llmopt", *sys.argv[1:]]),
                       max_trials=max_trials, device=device)


def go_on(directory: Path, budget_s: float | None, max_trials: int | None):
    """--resume DIR: the interrupted run's record and options, the budget and trial limit updated if given."""
    from llmopt_bench.tune.command import TuneOptions, load_record, tune

    record = load_record(directory)
    s = record.settings
    if budget_s is not None:
        s.budget_s = budget_s
    if max_trials is not None:
        s.max_trials = max_trials
    opts = TuneOptions(out_dir=directory, space=record.space, model=record.model, workload=s.workload, slo=s.slo,
                       hold_s=s.hold_s, budget_s=s.budget_s, seed=s.seed, min_quality=s.min_quality,
                       command=record.command, max_trials=s.max_trials, device=record.device)
    return interrupted_said(lambda: tune(opts, record), directory)


def interrupted_said(work, out: Path):
    try:
        return work()
    except KeyboardInterrupt:
        raise LlmoptError(f"interrupted: {out / 'tune.json'} holds every finished trial",
                          f"continue with llmopt tune --resume {out}", code=ExitCode.INTERRUPTED) from None


def finish(record, out: Path) -> None:
    """The answer on stdout, where the files are on stderr; exit 4 when nothing held."""
    w = record.trial(record.winner)
    print(f"results: {out / 'tune.md'}, {out / 'tune.json'}, {out / 'run.json'}", file=sys.stderr)
    if w is None or w.held_rung is None:
        raise LlmoptError("no configuration held a capacity under the SLO with its quality kept",
                          f"see {out / 'tune.md'}: each trial's outcome and reason", code=ExitCode.STAGE_FAILED)
    ref = record.space.reference_name()
    ratio = f" ({record.ratio.value:.2f}x {ref})" if record.ratio and not w.defaults else f" ({ref})" if w.defaults else ""
    typer.echo(f"winner: trial {w.number}, {w.label}: {w.held_rung.capacity_rps:.4g} req/s held{ratio}")
    from llmopt_bench.core.models import cache_dir

    typer.echo((w.command or "").replace("$LLMOPT_CACHE", str(cache_dir())))  # tune.json keeps it portable; this shell's path
