"""The typer application every command module registers on."""

import typer

app = typer.Typer(
    name="llmopt",
    help="Replay the LLM inference optimization journey on your own GPU and model, with faithful metrics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
