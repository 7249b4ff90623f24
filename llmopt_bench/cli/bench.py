"""`llmopt bench`: run stages on one model and workload, each in its own process."""

from __future__ import annotations

import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from llmopt_bench.cli.app import app
from llmopt_bench.errors import ExitCode, LlmoptError, UsageError


def _workload(resume_from, **opts):
    from llmopt_bench.workload import WorkloadConfig, load_prompts

    base = resume_from.workload.model_dump() if resume_from else {}
    given = {k: v for k, v in opts.items() if v is not None}
    cfg = WorkloadConfig(**{**base, **given})
    load_prompts(cfg.prompts)  # a bad prompt file fails here, before any stage starts
    return cfg


def parse_min_quality(text: str | None) -> float | None:
    """"0.99" or "99%" -> 0.99; None stays None (the resumed run's gate, else the default)."""
    if text is None:
        return None
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise UsageError(f"--min-quality {text!r}: not a fraction in (0, 1] or a percentage",
                         "use for example --min-quality 0.99 or --min-quality 99%")
    return value


@app.command("bench")
def bench_cmd(
    stages: Optional[str] = typer.Option(None, "--stages", "-s", help="all (stages/journey.toml), a comma list (hf-fp16,vllm), or a journey .toml file. With --resume: stages to add to the run's journey. [default: all]"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="synthetic:tiny | synthetic:llama2-7b | bundled:smollm2-135m | a local checkpoint dir | a hub id. Default: synthetic:llama2-7b on CUDA, synthetic:tiny on CPU."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="JSONL prompt file, one {\"id\", \"text\"} per line. Default: the shipped set."),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", help="Output length, forced (EOS ignored) so every stage does the same work. [default: 100]"),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help="Requests per repeat, chosen from the prompt set with --seed. [default: 8]"),
    input_len: Optional[int] = typer.Option(None, "--input-len", help="Force every prompt to exactly N tokens (truncate or repeat)."),
    max_prompt_len: Optional[int] = typer.Option(None, "--max-prompt-len", help="Longer prompts keep their last N tokens. [default: 2048]"),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Untimed requests before measuring. [default: 2]"),
    repeats: Optional[int] = typer.Option(None, "--repeats", help="Times the workload is measured; the spread is reported. [default: 3]"),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed for prompt choice and arrivals. [default: 0]"),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", help="Requests generated together by one-shot stages. [default: 1]"),
    workload_kind: Optional[str] = typer.Option(None, "--workload", help="fixed, or mixed (a quarter long documents, the rest short questions)."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Run directory. [default: results/runs/<timestamp>]"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="Continue the run in DIR: the journey it was started with, only the stages missing from its run.json or interrupted there; --stages adds stages to it."),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Stop at the first stage that fails (error, oom, timeout)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds per stage, overriding the journey's timeout_s. [default: 1800]"),
    as_json: bool = typer.Option(False, "--json", help="Print run.json to stdout instead of the table."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write report.md and charts/ into the run directory."),
    min_quality: Optional[str] = typer.Option(None, "--min-quality", help="Quality gate: a stage whose perplexity exceeds FP16's by more than 1 - Q is flagged as a quality regression (0.99 or 99%: within 1%). [default: 0.99]"),
) -> None:
    """Run the journey's stages and write run.json, requests.jsonl and logs into the run directory."""
    from llmopt_bench.models import default_model, parse_model
    from llmopt_bench.registry import cuda_devices, resolve_stages
    from llmopt_bench.render.progress import make_reporter
    from llmopt_bench.results import FAILED, load_run
    from llmopt_bench.runner import RunOptions, run_journey

    previous = None
    if resume is not None:
        if output is not None and output != resume:
            raise UsageError("--resume DIR and --output differ", "--resume DIR writes into DIR; drop --output")
        previous = load_run(resume)
        output = resume
    # --resume finishes the journey the run was started with (a schema-1 run did not record
    # it: then --stages, default all, as before); --stages with --resume adds stages to it
    plans, named = resolve_stages(stages or "all") if stages is not None or not (previous and previous.journey) else ([], False)
    if previous is not None and previous.journey:
        from llmopt_bench.runner import resume_plans

        plans = resume_plans(previous, plans)
    source = model or (previous.model.source if previous and previous.model else default_model(bool(cuda_devices())))
    spec = parse_model(source)
    if workload_kind not in (None, "fixed", "mixed"):
        raise UsageError(f"--workload {workload_kind!r}: unknown", "use fixed or mixed")
    cfg = _workload(previous, prompts=prompts, max_new_tokens=max_new_tokens, num_prompts=num_prompts,
                    input_len=input_len, max_prompt_len=max_prompt_len, warmup=warmup, repeats=repeats, seed=seed, batch_size=batch_size,
                    kind=workload_kind)
    out = output or Path("results") / "runs" / datetime.now().strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    opts = RunOptions(out_dir=out, model=spec, workload=cfg, plans=plans, fail_fast=fail_fast, timeout_s=timeout,
                      resume=previous is not None, command=shlex.join(["llmopt", *sys.argv[1:]]),
                      min_quality=parse_min_quality(min_quality))
    reporter = make_reporter()
    reporter.phase(f"run directory {out}")
    try:
        run = run_journey(opts, reporter)
    except KeyboardInterrupt:  # typer would turn it into an exit code that main() never sees
        raise LlmoptError(f"interrupted: {out / 'run.json'} holds what finished",
                          f"continue with llmopt bench --resume {out}", code=ExitCode.INTERRUPTED) from None
    if report:
        try:
            from llmopt_bench.render.report import write_report

            write_report(run, out)
        except ImportError:
            pass
        except Exception as e:  # noqa: BLE001 - a report failure must not lose the measured run
            print(f"warning: report not written ({type(e).__name__}: {e}); run `llmopt report {out}`", file=sys.stderr)
    if as_json:
        typer.echo(run.model_dump_json(indent=1))
    else:
        from llmopt_bench.render.table import print_summary

        print_summary(run)
    print(f"results: {out / 'run.json'}", file=sys.stderr)
    failed = [s.name for s in run.stages if s.status in FAILED]
    if failed:
        raise LlmoptError(f"stage(s) failed: {', '.join(failed)}", f"see the logs in {out / 'logs'}", code=ExitCode.STAGE_FAILED)
    skipped = [s for s in run.stages if s.status == "skipped"]
    if named and skipped:
        raise LlmoptError(f"stage(s) could not run here: {', '.join(s.name + ' (' + (s.reason or '') + ')' for s in skipped)}",
                          skipped[0].fix, code=ExitCode.STAGE_UNAVAILABLE)
