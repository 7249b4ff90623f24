"""`llmopt bench`'s workload options, built from the fields that declare them: each field of
core/workload.WorkloadConfig marked option() becomes one `--option` (its name, help, default
and CPU default from the field), and its value is checked against the field's own bounds
(core/workload.check_option). Nothing about a workload option is written here a second time.

    @app.command("bench")
    @with_workload_options(after="model")
    def bench_cmd(ctx, stages, model, ..., **workload): ...

`workload` then holds every option's value (None: not given); a command that has no use for some
of them leaves them out (`llmopt tune`: no repeats, no stopping rule, no batch), so its --help lists
only what it reads and a left-out option is refused as unknown. given_workload() keeps the given
ones, the --workload spec made canonical (workloads/spec.py) and, for a trace, its file read."""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Collection
from typing import Any, Optional, Union, get_args, get_origin

import typer

from llmopt_bench.core.workload import WorkloadConfig, WorkloadOptions, option_fields, option_help, option_name

KINDS_HELP_TAIL = " The kinds and their keys: below, and docs/workloads.md."


def _option_type(field: str) -> Any:
    """The option's type: the field's, optional (None: not given)."""
    annotation = WorkloadConfig.model_fields[field].annotation
    if get_origin(annotation) in (Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
    return Optional[annotation]  # noqa: UP045 - typer reads typing.Optional


def _parameter(field: str) -> inspect.Parameter:
    help_text = option_help(field) + (KINDS_HELP_TAIL if field == "spec" else "")
    return inspect.Parameter(field, inspect.Parameter.KEYWORD_ONLY, annotation=_option_type(field),
                             default=typer.Option(None, option_name(field), help=help_text, show_default=False))


def with_workload_options(after: str, leave_out: Collection[str] = ()) -> Callable[[Callable], Callable]:
    """Adds one keyword parameter per workload option to the command's signature (typer reads
    the signature), after the parameter named `after`; the command takes them as **workload.
    leave_out: fields whose options the command does not read (it gets no such key)."""
    unknown = set(leave_out) - set(option_fields())
    assert not unknown, f"not workload options: {sorted(unknown)}"

    def add(command: Callable) -> Callable:
        sig = inspect.signature(command)
        own = [p for p in sig.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
        at = next(i for i, p in enumerate(own) if p.name == after) + 1
        added = [_parameter(f) for f in option_fields() if f not in leave_out]
        # keyword-only parameters after the command's own: typer only reads names and defaults
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[:at]] + added + \
                 [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own[at:]]
        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]  # typer reads it; functions have no declared slot
        return command
    return add


def given_workload(values: WorkloadOptions) -> WorkloadOptions:
    """The workload options given on the command line, each checked: field -> value; the spec
    canonical, its files (a trace, a histogram) read, so a bad one fails before anything starts.
    values: the command's, one per option (None: not given)."""
    given = {f: values[f] for f in option_fields() if values.get(f) is not None}
    if "spec" in given:  # --workload: a str, as typer parsed it
        given["spec"] = checked_spec(str(given["spec"]))
    return given


def checked_spec(text: str) -> str:
    """A --workload spec (or a journey's [workload] table made one) as canonical text, its trace read."""
    from llmopt_bench.core.errors import UsageError
    from llmopt_bench.workloads.spec import TraceKind, parse_spec

    params = parse_spec(text)
    if isinstance(params, TraceKind):
        from llmopt_bench.workloads.traces import read_trace

        try:
            read_trace(params)
        except UsageError as e:  # the file's own error, named as the option that gave it
            raise UsageError(f"--workload {text.strip()}: {e.message}", e.fix) from None
    return params.canonical()
