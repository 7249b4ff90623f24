"""The typer application every command module registers on, and how its help reads.

Help is click's plain layout (rich_markup_mode=None): rich's markup reads any [word] in a help
string as a style and drops it (`pip install 'llmopt-bench[charts]'` lost its `[charts]`,
"[default: every stage]" vanished). The help formatter wraps at the terminal's width between
words only: a hyphenated name or command (`hf-fp16`, `llmopt-bench[charts]`) is never split."""

from __future__ import annotations

from typing import Any

import typer

from llmopt_bench import __version__

NB_HYPHEN = "\u2011"  # a hyphen textwrap does not break at; put back before the help is shown


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"llmopt {__version__}")
        raise typer.Exit()


app = typer.Typer(
    name="llmopt",
    help="Replay the LLM inference optimization journey on your own GPU and model, with faithful metrics.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print llmopt's version and exit.")) -> None:
    """Replay the LLM inference optimization journey on your own GPU and model, with faithful metrics."""


# `llmopt -h`'s command list: one line each (click cuts a docstring's first sentence with "..."),
# by the command's path under llmopt (`history check` and `check` are two commands)
SUMMARIES = {"bench": "Run the journey's stages on one model and workload.",
             "compare": "Compare two runs, stage by stage, with noise-aware intervals.",
             "doctor": "What this machine offers llmopt, and the fix for each gap.",
             "recommend": "What to deploy: the best result for a priority and an SLO.",
             "report": "Write report.md, charts, CSV or JSON from a run's run.json.",
             "stages": "Every stage, and why one cannot run here.",
             "tune": "The vLLM serving configuration that holds the most load under the SLO.",
             "history": "A history of runs: add them, show a trend, find shifts.",
             "history add": "Append runs to the history.",
             "history show": "A metric per stage across the history's runs.",
             "history check": "Sustained shifts in each stage's series; exit 5 on a regression.",
             "check": "llmopt's measurement checked: beside vllm bench serve, and the client's own ceiling.",
             "check peer": "The same load from llmopt and vllm bench serve: do their figures agree?",
             "check capacity": "llmopt's capacity under the SLO, confirmed by vllm bench serve.",
             "check client": "The load client's own ceiling: requests a second before it, not the server, sets the latency."}


def slo_option(help: str) -> Any:
    """--slo, declared once for every command that takes one: parsed here, once (core/slo.parse_slo:
    a bad target is its one-line error with the fix, exit 2), so a command gets the SLO as a type."""
    def parse(text: str) -> Any:
        from llmopt_bench.core.slo import SLO, parse_slo

        return text if isinstance(text, SLO) else parse_slo(text)
    return typer.Option(None, "--slo", parser=parse, metavar="TARGETS", help=help)


def help_formatter() -> type:
    """click's HelpFormatter, with hyphens kept from being line-break points."""
    from typer._click.formatting import HelpFormatter

    class Formatter(HelpFormatter):
        def write_usage(self, prog: str, args: str = "", prefix: str | None = None) -> None:
            super().write_usage(prog, args.replace("-", NB_HYPHEN), prefix)

        def write_text(self, text: str) -> None:
            super().write_text(text.replace("-", NB_HYPHEN))

        def write_dl(self, rows: Any, col_max: int = 30, col_spacing: int = 2) -> None:
            super().write_dl([(a, b.replace("-", NB_HYPHEN)) for a, b in rows], col_max, col_spacing)

        def getvalue(self) -> str:
            return super().getvalue().replace(NB_HYPHEN, "-")

    return Formatter


def command():
    """The click command of the application, every (sub)command's help through help_formatter."""
    from typer.main import get_command

    class HelpContext(typer.Context):
        formatter_class = help_formatter()

    root = get_command(app)
    todo = [(root, "")]
    while todo:
        cmd, path = todo.pop()
        cmd.context_class = HelpContext
        cmd.short_help = SUMMARIES.get(path, cmd.short_help)
        todo += [(sub, f"{path} {name}".strip()) for name, sub in getattr(cmd, "commands", {}).items()]
    return root
