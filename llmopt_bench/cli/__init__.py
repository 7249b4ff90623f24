"""Command-line entry: one module per command; one exit path with documented codes.

Every command module is imported for `llmopt --help`, so a command imports the machinery it
drives (run/, render/, analysis/, engines/) inside its function: `llmopt --help` and a bad
option's error stay instant (~0.3 s) whatever the command needs. That is the one reason for the
function-level imports under cli/; elsewhere they are for torch, vllm, transformers, matplotlib,
or an import cycle named beside them."""

from __future__ import annotations

import os
import select
import signal
import sys
import traceback
from typing import TYPE_CHECKING, cast

from llmopt_bench.core.errors import ExitCode, LlmoptError

if TYPE_CHECKING:
    from typer._click.exceptions import ClickException  # the class found below, in the typer this was written for


# what a shell reports for a command whose reader stopped reading (`llmopt recommend RUN | head`):
# killed by SIGPIPE, 128 + 13. llmopt keeps SIGPIPE ignored (as Python sets it, so that a server
# closing a socket is an error to handle, not a death) and ends this way on its own, quietly.
BROKEN_PIPE = 128 + signal.SIGPIPE


def _pipe_error(e: BaseException) -> BrokenPipeError | None:
    """The BrokenPipeError behind `e`: itself, or the one click was handling when it raised
    SystemExit(1) (it catches EPIPE around every command, and exits without a word)."""
    if isinstance(e, BrokenPipeError):
        return e
    return e.__context__ if isinstance(e, SystemExit) and isinstance(e.__context__, BrokenPipeError) else None


def _readers_gone() -> list[int]:
    """stdout and stderr, those of them that are pipes whose reader has closed its end: poll says
    POLLERR there. A BrokenPipeError with both streams still read is a socket's, a bug to report."""
    poll = select.poll()
    for fd in (1, 2):
        poll.register(fd, select.POLLOUT)
    return [fd for fd, events in poll.poll(0) if events & select.POLLERR]


def _silence(fds: list[int]) -> None:
    """Point those streams at /dev/null, so that what is still buffered for the closed pipe is
    dropped at exit instead of failing again ("Exception ignored ... BrokenPipeError", exit 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in fds:
        os.dup2(devnull, fd)
    os.close(devnull)


def _on_sigterm(signum, frame):  # a kill ends the run like Ctrl-C: run.json keeps what finished
    raise KeyboardInterrupt


def register_commands() -> None:
    """Every command on the app: each module registers its own on import. Here, not at the top:
    the commands import llmopt_bench.cli.app, which runs this package's __init__ first (a cycle),
    and `import llmopt_bench.cli.X` alone would load every command."""
    from llmopt_bench.cli import bench, check, check_client, compare, doctor, history, recommend, report, stages, tune  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    import typer

    register_commands()
    from llmopt_bench.cli.app import command

    signal.signal(signal.SIGTERM, _on_sigterm)
    # A shell without job control starts background commands with SIGINT ignored, and Python
    # then keeps it ignored: `kill -INT` must still stop a run and keep what finished.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 <pid>: where is it stuck?
    # typer 0.29 vendors click (typer._click): its usage errors are not click's own classes, so
    # take the base of whichever click this typer raises, or a bad option becomes a traceback
    click_error = cast("type[ClickException]", next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"))
    try:
        command().main(args=argv, prog_name="llmopt", standalone_mode=False)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the interpreter's exit
        code: int = ExitCode.OK
    except LlmoptError as e:
        print(f"error: {e.message}", file=sys.stderr)
        if e.fix:
            print(f"  fix: {e.fix}", file=sys.stderr)
        code = e.code
    except typer.Exit as e:
        code = e.exit_code
    except click_error as e:  # an unknown option or command, a value of the wrong type
        ctx = getattr(e, "ctx", None)
        print(f"error: {e.format_message()}", file=sys.stderr)
        print(f"  fix: see `{ctx.command_path if ctx else 'llmopt'} --help` for what it takes", file=sys.stderr)
        code = ExitCode.USAGE
    except (BrokenPipeError, SystemExit) as e:
        pipe_error = _pipe_error(e)
        if pipe_error is None:  # a SystemExit of its own
            raise
        if gone := _readers_gone():  # the reader closed the pipe: end quietly, as `cat` would
            _silence(gone)
            code = BROKEN_PIPE
        else:
            traceback.print_exception(pipe_error)
            print("internal error: please report it with the traceback above", file=sys.stderr)
            code = ExitCode.INTERNAL
    except typer.Abort:
        print("interrupted", file=sys.stderr)
        code = ExitCode.INTERRUPTED
    except KeyboardInterrupt:
        print("interrupted: run.json holds what finished; continue with --resume DIR", file=sys.stderr)
        code = ExitCode.INTERRUPTED
    except Exception:  # noqa: BLE001 - a bug in llmopt, not the user's fault
        traceback.print_exc()
        print("internal error: please report it with the traceback above", file=sys.stderr)
        code = ExitCode.INTERNAL
    if argv is None:
        sys.exit(int(code))
    return int(code)
