"""`llmopt recommend RUN_DIR [--slo ...] [--priority ...] [--json]`: what to deploy, from a run's
run.json alone (analysis/recommend/choose.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from llmopt_bench.cli.app import app, slo_option
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.slo import SLO


@app.command("recommend")
def recommend_cmd(
    run_dir: Path = typer.Argument(..., help="A run directory written by `llmopt bench` (or its run.json)."),
    slo: Optional[SLO] = slo_option(help="Judge the measured load points under this SLO instead of the run's, "
                                    "e.g. ttft_p99=2s,tpot_p99=100ms."),
    priority: str = typer.Option("throughput", "--priority", help="throughput (the held capacity under the SLO; without one, the "
                                 "saturated, else the fixed-workload, output tok/s), latency (TPOT at one request in flight), memory "
                                 "(weights), cost (GPU-seconds per request at the held capacity: GPUs / capacity; no held capacity, no "
                                 "cost). The candidates and their quality verdicts are the same under every priority."),
    as_json: bool = typer.Option(False, "--json", help="Print the recommendation as JSON."),
) -> None:
    """Which configuration to deploy: among the run's deployable configurations (vLLM served, or vLLM's engine),
    the best for the priority that passes the quality gate and meets the SLO, what it carries and costs, the
    runner-up and why it lost, what is missing, and the `vllm serve` line."""
    from llmopt_bench.analysis.recommend.choose import recommend
    from llmopt_bench.analysis.recommend.text import lines
    from llmopt_bench.core.results import load_run

    if not run_dir.exists():
        raise UsageError(f"no run directory at {run_dir}", "pass a directory written by `llmopt bench` (results/runs/<timestamp>)")
    rec = recommend(load_run(run_dir), priority=priority, slo=slo)
    if as_json:
        typer.echo(json.dumps(rec.as_dict(), indent=1))
    else:
        print_lines(lines(rec, markdown=False), rec.command)


def local_command(command: str) -> str:
    """The `vllm serve` line for this shell: $LLMOPT_CACHE (how a run writes the cache's path)
    where the variable is unset here becomes the cache llmopt uses here (~/.cache/llmopt)."""
    import os

    from llmopt_bench.core.models import cache_dir

    if "$LLMOPT_CACHE" not in command or os.environ.get("LLMOPT_CACHE"):
        return command
    home, cache = str(Path.home()), str(cache_dir())
    return command.replace("$LLMOPT_CACHE", "~" + cache[len(home):] if cache.startswith(home + "/") else cache)


def print_lines(text: list[str], command: str | None) -> None:
    """The recommendation at the terminal's width: prose wrapped between words, the command
    continued with backslashes (one command when copied)."""
    from llmopt_bench.render.terminal import echo, shell_lines, width

    cols = width()
    for line in text:
        if command and line == f"    {command}":
            echo(shell_lines(local_command(command), cols), cols)
        else:
            echo([line], cols)
