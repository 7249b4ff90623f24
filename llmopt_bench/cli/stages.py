"""`llmopt stages`: every registered stage and whether it can run here (never imports torch)."""

from __future__ import annotations

import json

import typer

from llmopt_bench.cli.app import app


@app.command("stages")
def stages_cmd(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List every stage, whether it can run on this machine, and why not."""
    from llmopt_bench.run.registry import load_stage, stage_names, unavailable

    rows = []
    for name in stage_names():
        cls = load_stage(name)
        why = unavailable(cls)
        rows.append({"name": name, "description": cls.description, "available": why is None,
                     "reason": why[0] if why else None, "fix": why[1] if why else None,
                     "params": list(cls.Params.model_fields)})
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title="llmopt stages")
    for col in ("stage", "can run here", "description / why not"):
        table.add_column(col)
    for r in rows:
        status = "[green]yes[/]" if r["available"] else "[red]no[/]"
        detail = r["description"] if r["available"] else f"{r['reason']}: {r['fix']}"
        table.add_row(r["name"], status, escape(detail))
    Console().print(table)
