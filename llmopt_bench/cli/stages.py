"""`llmopt stages`: every registered stage and whether it can run here (never imports torch)."""

from __future__ import annotations

import json

import typer

from llmopt_bench.cli.app import app


@app.command("stages")
def stages_cmd(as_json: bool = typer.Option(False, "--json", help="Print the list as JSON.")) -> None:
    """List every stage, whether it can run on this machine, and why not."""
    from llmopt_bench.run.registry import stage_names, stage_or_why

    rows = []
    for name in stage_names():
        cls, why = stage_or_why(name)
        rows.append({"name": name, "description": cls.description if cls else "", "available": why is None,
                     "reason": why[0] if why else None, "fix": why[1] if why else None,
                     "params": list(cls.Params.model_fields) if cls else []})
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    print_rows(rows)


def print_rows(rows: list[dict]) -> None:
    """The stages at the terminal's width: a table of what each is or why it cannot run, then
    each fix once, under the stages it fixes (a fix is a command: printed whole, not in a cell)."""
    from llmopt_bench.render.terminal import echo, print_table

    print_table(("stage", "here", "what it measures, or why it cannot run here"),
                [(r["name"], "yes" if r["available"] else "no", r["description"] if r["available"] else r["reason"])
                 for r in rows], title="llmopt stages",
                style_of=lambda i, text: {"yes": "green", "no": "red"}.get(text, "") if i == 1 else "")
    fixes: dict[str, list[str]] = {}
    for r in rows:
        if not r["available"]:
            fixes.setdefault(r["fix"], []).append(r["name"])
    lines = []
    for fix, names in fixes.items():
        lines += ["", f"{', '.join(names)}:", f"  fix: {fix}"]
    echo(lines)
