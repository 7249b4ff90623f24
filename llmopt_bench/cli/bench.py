"""`llmopt bench`: run stages on one model and workload, each in its own process.

Every option is checked before anything starts (no probe, no directory written): a bad value
is one line naming the option, the value and what is allowed, exit 2."""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from llmopt_bench.cli.app import app, slo_option
from llmopt_bench.cli.workload_options import given_workload, with_workload_options
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.slo import SLO
from llmopt_bench.measure.pinning import ENV as PIN_ENV

if TYPE_CHECKING:
    from llmopt_bench.core.workload import WorkloadConfig, WorkloadOptions


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


def pin_stages(value: bool) -> bool:
    """--pin-cpu: the stage processes read LLMOPT_PIN_CPU (measure/pinning.py); set before any starts."""
    if value:
        os.environ[PIN_ENV] = "1"
    return value


def check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:  # `not >` also refuses nan
        raise UsageError(f"--timeout {timeout:g}: out of range, allowed more than 0 seconds",
                         "pass --timeout with a number of seconds above 0, like --timeout 1800")
    return timeout


def check_name(name: str | None) -> str | None:
    """--name: one line of at most 80 printable characters, without '@' (history's --since reads
    NAME@CREATED_AT) and not blank."""
    if name is None:
        return None
    if not name.strip() or len(name) > 80 or not name.isprintable() or "@" in name:
        raise UsageError(f"--name {name!r}: not a run name (1 to 80 printable characters, no '@', not blank)",
                         "pass a short label, like --name nightly-2026-12-07 or --name 'vllm 0.33 bump'")
    return name.strip()


def run_directory(output: Path | None, resume: Path | None) -> Path:
    """The run directory, made and proven writable; never another run's, unless resumed."""
    if resume is not None:
        if output is not None and output != resume:
            raise UsageError("--resume DIR and --output differ", "--resume DIR writes into DIR; drop --output")
        output = resume
    elif output is not None and (output / "run.json").is_file():
        raise UsageError(f"--output {output}: already holds a run (run.json)",
                         f"continue it with --resume {output}, or pass another --output")
    out = output or Path("results") / "runs" / datetime.now().strftime("%Y%m%d-%H%M%S")
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {out}: a file, not a directory", "pass a directory path (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise UsageError(f"--output {out}: cannot write there ({e.strerror or e})",
                         "pass a directory you can write to, like --output results/runs/mine") from None
    return out


def write_outputs(run, out: Path, report: bool, as_json: bool) -> None:
    if report:
        try:
            from llmopt_bench.render.report import DEFAULT_FORMATS, write_report

            write_report(run, out, DEFAULT_FORMATS)  # report.md and report.html
        except ImportError as e:  # said, not swallowed: the run is measured, its report can follow
            print(f"warning: report not written ({e}); install what it needs, then run `llmopt report {out}`", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - a report failure must not lose the measured run
            print(f"warning: report not written ({type(e).__name__}: {e}); run `llmopt report {out}`", file=sys.stderr)
    if as_json:
        typer.echo(run.model_dump_json(indent=1))
    else:
        from llmopt_bench.render.table import print_summary

        print_summary(run)
    print(f"results: {out / 'run.json'}", file=sys.stderr)


def exit_status(run, out: Path, named: bool) -> None:
    from llmopt_bench.core.results import FAILED

    failed = [s.name for s in run.stages if s.status in FAILED]
    if failed:
        raise LlmoptError(f"stage(s) failed: {', '.join(failed)}", f"see the logs in {out / 'logs'}", code=ExitCode.STAGE_FAILED)
    skipped = [s for s in run.stages if s.status == "skipped"]
    if named and skipped:
        raise LlmoptError(f"stage(s) could not run here: {', '.join(s.name + ' (' + (s.reason or '') + ')' for s in skipped)}",
                          skipped[0].fix, code=ExitCode.STAGE_UNAVAILABLE)


def presets_epilog() -> str:
    """The presets, one line each, under the options of `llmopt bench --help`."""
    from llmopt_bench.run.registry import PRESETS
    from llmopt_bench.workloads.spec import kinds_help

    lines = [f"--preset {name}: {p.description}" for name, p in PRESETS.items()]
    kinds = [f"--workload {line}" for line in kinds_help().split("; ")]
    return ("Presets (their times: README.md, Presets):\n\n" + "\n\n".join(lines) +
            "\n\nWorkloads (--workload KIND:key=value,...; or a journey file's workload table; docs/workloads.md):\n\n" + "\n\n".join(kinds))


@app.command("bench", epilog=presets_epilog())
@with_workload_options(after="model")
def bench_cmd(
    stages: str | None = typer.Option(None, "--stages", "-s", help="all (journeys/journey.toml), a comma list (hf-fp16,vllm), or a journey .toml file (default: all). With --resume: stages added to the run's journey."),
    preset: str | None = typer.Option(None, "--preset", help="quick, standard or full: a journey at one of three sizes with its workload defaults (listed below; a workload option given wins). Not with --stages, --endpoint or --resume.", show_default=False),
    model: str | None = typer.Option(None, "--model", "-m", help="synthetic:tiny | synthetic:llama2-7b | bundled:smollm2-135m | a local checkpoint dir | a hub id. Default: synthetic:llama2-7b on CUDA, synthetic:tiny on CPU."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Run directory, created if missing; never another run's (use --resume). (default: results/runs/<timestamp>)"),
    name: str | None = typer.Option(None, "--name", help="What compare and history call this run, kept in run.json (default: the run directory's name). With --resume: renames the run.", show_default=False),
    resume: Path | None = typer.Option(None, "--resume", help="Continue the run in DIR: the journey it was started with, only the stages missing from its run.json or interrupted there."),
    rerun: str | None = typer.Option(None, "--rerun", help="With --resume: also measure these stages again (comma-separated names, or 'failed': every stage that ended in error, oom or timeout), keeping every other stage as measured.", show_default=False),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Stop at the first stage that fails (error, oom, timeout)."),
    share_engines: bool = typer.Option(True, "--share-engines/--no-share-engines", help="Run stages that start the same engine configuration (vllm and continuous-batching's vLLM side) one after the other on one engine, in one process."),
    prefetch: bool | None = typer.Option(None, "--prefetch/--no-prefetch", help="Start the next stage's process while the current one loads, so its imports are done by its turn; it waits, stopped, while the current stage measures, and its imports are reported apart (timing.prefetched_s), never in load_s. Default: on with 8 or more cores.", show_default=False),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds per stage (more than 0), overriding the journey's timeout_s (default: 1800)."),
    as_json: bool = typer.Option(False, "--json", help="Print run.json to stdout instead of the table."),
    report: bool = typer.Option(True, "--report/--no-report", help="Write report.md, charts/ and report.html into the run directory."),
    endpoint: str | None = typer.Option(None, "--endpoint", help="Put the serving load on a server you run (any OpenAI-compatible URL); --model then names the model it serves. Runs the openai-endpoint stage."),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="With --endpoint: the NAME of the environment variable that holds the API key (the key is never written anywhere)."),
    tokenizer: str | None = typer.Option(None, "--tokenizer", help="With --endpoint: the served model's tokenizer (a directory or hub id) to build and count prompts."),
    slo: SLO | None = slo_option(help="The serving stages' latency targets, like ttft_p99=2s,tpot_p99=100ms (default: MLPerf's Server limits for Llama-3.1-8B): the capacity is the highest request rate that meets them. Sets the slo of every serving stage in the journey."),
    hold: float | None = typer.Option(None, "--hold", help="Seconds the serving stages hold the capacity they found, judged again (default: each stage's hold_s, 60 s; 600 for an MLPerf-like check; 0: no hold, the capacity is reported as not held). Sets the hold_s of every serving stage in the journey."),
    min_quality: str | None = typer.Option(None, "--min-quality", help="Quality gate: a stage whose perplexity exceeds FP16's by more than 1 - Q is flagged as a quality regression (0.99 or 99%: within 1%; default: 0.99)."),
    pin_cpu: bool = typer.Option(False, "--pin-cpu", callback=pin_stages, help="Pin each fixed-workload stage's main thread to one core during its repeats, that core kept busy 0.2 s before each (sets LLMOPT_PIN_CPU=1; recorded in each repeat's conditions; docs/regression.md)."),
    **workload,
) -> None:
    """Run the journey's stages and write run.json, requests.jsonl and logs into the run directory."""
    from llmopt_bench.core.models import default_model, parse_model
    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.progress import make_reporter
    from llmopt_bench.run.registry import cuda_devices
    from llmopt_bench.run.runner import RunOptions, run_journey

    # the workload options (cli/workload_options.py: one per WorkloadConfig field), in range before anything else is looked at
    given = given_workload(workload)
    gate, timeout, name = parse_min_quality(min_quality), check_timeout(timeout), check_name(name)
    check_preset_use(preset, stages=stages, endpoint=endpoint, resume=resume)
    previous, cuda = (load_run(resume) if resume is not None else None), bool(cuda_devices())
    plans, named, model, cfg = plans_and_workload(preset, given, previous, cuda, stages, model, endpoint, api_key_env, tokenizer, slo, hold)
    again = rerun_names(rerun, previous, plans)
    spec = parse_model(model or (previous.model.source if previous and previous.model else default_model(cuda)))
    out = run_directory(output, resume)
    opts = RunOptions(out_dir=out, model=spec, workload=cfg, plans=plans, fail_fast=fail_fast, timeout_s=timeout,
                      resume=previous is not None, command=shlex.join(["llmopt", *sys.argv[1:]]), min_quality=gate,
                      share_engines=share_engines, preset=preset, prefetch=prefetch_on(prefetch), rerun=again, name=name)
    reporter = make_reporter()
    say_workload(cfg, reporter, out)
    try:
        run = run_journey(opts, reporter)
    except KeyboardInterrupt:  # typer would turn it into an exit code that main() never sees
        raise LlmoptError(f"interrupted: {out / 'run.json'} holds what finished",
                          f"continue with llmopt bench --resume {out}", code=ExitCode.INTERRUPTED) from None
    write_outputs(run, out, report, as_json)
    exit_status(run, out, named)


def rerun_names(rerun: str | None, previous, plans: list) -> frozenset[str]:
    """--rerun NAME,...|failed -> the names the runner measures again; refused without --resume, and
    for a name that is no stage of the run (a typo would rerun nothing, silently)."""
    from llmopt_bench.run.registry import did_you_mean
    from llmopt_bench.run.runner import RERUN_FAILED

    if rerun is None:
        return frozenset()
    if previous is None:
        raise UsageError("--rerun measures stages of an existing run again, and there is none without --resume",
                         "add --resume DIR, or drop --rerun")
    names = [n.strip() for n in rerun.split(",") if n.strip()]
    if not names:
        raise UsageError(f"--rerun {rerun!r}: empty", "name stages of the run (comma-separated), or 'failed'")
    known = [p.name for p in plans]  # the journey the resumed run finishes
    for name in names:
        if name != RERUN_FAILED and name not in known:
            raise UsageError(f"--rerun {name!r}: no such stage in the run's journey",
                             f"{did_you_mean(name, known)}name its stages ({', '.join(known)}) or 'failed'")
    return frozenset(names)


def prefetch_on(asked: bool | None) -> bool:
    """--prefetch/--no-prefetch, else on where the host has cores to spare (run/prefetch.py)."""
    from llmopt_bench.run.prefetch import spare_cores

    return spare_cores() if asked is None else asked


def check_preset_use(preset: str | None, *, stages: str | None, endpoint: str | None, resume: Path | None) -> None:
    """--preset names the journey and its workload: with another way of naming them, one must go."""
    from llmopt_bench.run.registry import check_preset

    if preset is None:
        return
    check_preset(preset)
    for option, value, fix in (("--stages", stages, f"drop --stages to run the {preset} preset, or drop --preset to run --stages {stages}"),
                               ("--endpoint", endpoint, "drop --preset: --endpoint runs the openai-endpoint stage alone"),
                               ("--resume", resume, f"drop --preset: --resume {resume} finishes the journey that run was started with")):
        if value is not None:
            raise UsageError(f"--preset {preset} and {option} both choose the stages to run", fix)


def plans_and_workload(preset: str | None, given: WorkloadOptions, previous, cuda: bool, stages: str | None,
                       model: str | None, endpoint: str | None, api_key_env: str | None, tokenizer: str | None,
                       slo: SLO | None, hold: float | None = None) -> tuple[list, bool, str | None, WorkloadConfig]:
    """The stages to run, whether the user named them, the run's model and its workload: the
    preset's, or those of --stages (or --endpoint) at the default workload; --slo and --hold set."""
    from llmopt_bench.core.workload import resolve_workload

    if preset is not None:
        plans, cfg = preset_run(preset, given)
        if slo is not None:
            with_slo(plans, slo)
        named = False
    else:
        plans, named, model = journey_plans(stages, previous, model, endpoint, api_key_env, tokenizer, slo)
        given = {**journey_workload(stages), **given}  # --workload wins over the journey's [workload] table
        # the lighter CPU defaults are for work this machine does; an endpoint's server does it elsewhere
        device = "cuda" if cuda or endpoint is not None else "cpu"
        cfg = resolve_workload(given, previous.workload if previous else None, device)
    if hold is not None:
        with_hold(plans, hold)
    return plans, named, model, cfg


def journey_workload(stages: str | None) -> WorkloadOptions:
    """A journey file's [workload] table, as the --workload it stands for (none: {})."""
    from llmopt_bench.cli.workload_options import checked_spec
    from llmopt_bench.run.registry import journey_table
    from llmopt_bench.workloads.spec import spec_of_table

    if not stages or not stages.endswith(".toml"):
        return {}
    table = journey_table(stages, "workload")
    return {"spec": checked_spec(spec_of_table(table, stages))} if table else {}


def preset_run(name: str, given: WorkloadOptions) -> tuple[list, WorkloadConfig]:
    """--preset NAME -> its journey's plans on this machine (with CUDA or without) and the run's
    workload: the preset's defaults for the device, under the workload options given."""
    from llmopt_bench.core.workload import resolve_workload
    from llmopt_bench.run.registry import cuda_devices, resolve_preset

    cuda = bool(cuda_devices())
    plans, defaults = resolve_preset(name, cuda)
    return plans, resolve_workload(given, None, "cuda" if cuda else "cpu", defaults)


def journey_plans(stages: str | None, previous, model: str | None, endpoint: str | None, api_key_env: str | None,
                  tokenizer: str | None, slo: SLO | None) -> tuple[list, bool, str | None]:
    """The stages to run, whether the user named them, and the run's model (an endpoint's own)."""
    if endpoint is not None:
        journey, model = endpoint_stage(endpoint, model, api_key_env, tokenizer, stages)
        plans, named = choose_plans(journey, previous)[0], True  # named: an endpoint it cannot use exits 3
        Path(journey).unlink()
    else:
        plans, named = choose_plans(stages, previous)
    if slo is not None:
        with_slo(plans, slo)
    return plans, named, model


def endpoint_stage(url: str, model: str | None, key_env: str | None, tokenizer: str | None,
                   stages: str | None) -> tuple[str, str]:
    """--endpoint: a one-stage journey file for openai-endpoint, and the run's model (the server's)."""
    import json
    import tempfile
    from urllib.parse import urlsplit

    if stages is not None:
        raise UsageError("--endpoint runs the openai-endpoint stage alone: --stages is not for it",
                         "drop --stages, or name openai-endpoint in a journey file with its params")
    if not model:
        raise UsageError("--endpoint needs --model: the model name the server answers to", "pass --model NAME (its /v1/models lists them)")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--endpoint {url}: not an http(s) URL", "pass the server's base URL, like http://localhost:8000 (or .../v1)")
    params = {"endpoint": url, "model": model, **({"api_key_env": key_env} if key_env else {}),
              **({"tokenizer": tokenizer} if tokenizer else {})}
    inline = ", ".join(f"{k} = {json.dumps(v)}" for k, v in params.items())
    path = Path(tempfile.mkdtemp(prefix="llmopt-endpoint-")) / "endpoint.toml"
    path.write_text(f'[[stage]]\nname = "openai-endpoint"\nparams = {{ {inline} }}\n')
    return str(path), f"endpoint:{model}"


def with_slo(plans: list, slo: SLO) -> None:
    """--slo (parsed once, by the option): the slo param of every serving stage of the journey, set
    through the stage's own Params (its typed field; the job file carries it as that type writes it)."""
    from llmopt_bench.run.registry import load_stage, validate_params

    serving = [p for p in plans if "slo" in load_stage(p.stage).Params.model_fields]
    if not serving:
        raise UsageError("--slo sets the serving stages' targets, and this journey has no serving stage",
                         "add one (--stages vllm-serve, or --endpoint URL --model NAME), or drop --slo")
    for plan in serving:
        plan.params = validate_params(load_stage(plan.stage), {**plan.params, "slo": slo})


def with_hold(plans: list, seconds: float) -> None:
    """--hold: the hold_s param of every serving stage of the journey, checked before anything starts."""
    from llmopt_bench.run.registry import load_stage

    if not seconds >= 0:
        raise UsageError(f"--hold {seconds:g}: the hold is a number of seconds, 0 or more", "pass --hold 60 (or 0 for no hold)")
    serving = [p for p in plans if "hold_s" in load_stage(p.stage).Params.model_fields]
    if not serving:
        raise UsageError("--hold sets how long the serving stages hold their capacity, and this journey has no serving stage",
                         "add one (--stages vllm-serve, or --endpoint URL --model NAME), or drop --hold")
    for plan in serving:
        plan.params = {**plan.params, "hold_s": seconds}


def choose_plans(stages: str | None, previous) -> tuple[list, bool]:
    """The stages to run, and whether the user named them one by one. --resume finishes the
    journey the run was started with (a schema-1 run did not record it: then --stages, default
    all, as before); --stages given with --resume adds stages to it."""
    from llmopt_bench.run.registry import resolve_stages
    from llmopt_bench.run.runner import resume_plans

    if previous is not None and previous.journey:
        added, named = resolve_stages(stages) if stages is not None else ([], False)
        return resume_plans(previous, added), named
    return resolve_stages("all" if stages is None else stages)  # '' (an unset shell variable) is refused, not "all"


def say_workload(cfg, reporter, out: Path) -> None:
    reporter.phase(f"run directory {out}")
    for note in cfg.notes:
        reporter.phase(note)
    if cfg.prompt_key != "text":
        reporter.phase(f"prompts read from {cfg.prompts} as " + ("plain text, one prompt a line" if cfg.prompt_key == "line"
                                                                  else f'JSONL, key "{cfg.prompt_key}"'))

