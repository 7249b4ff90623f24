"""The paths a command writes to, checked before any work and written with one-line errors.

Every command that takes an output path (report's --output, compare's --output, history's --db
and --chart) goes through here, so that an unwritable, odd or wrong-kind path is a usage error
(exit 2) naming the option, the path and why, with a fix, never a traceback:

    output_dir(path, option, example)     a directory to write into: made if missing, proven writable
    output_file(path, option, example)    a file to write: not a directory, its directory made, writable
    write_text(path, text, option, example)   write a checked file; a failure is the same one-line error
    writing(path, option, example)        around other writes into a checked path (charts, a database)

`example` is a path that would work, shown in the fix ("pass a file you can write to, like
--output compare.md")."""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from llmopt_bench.core.errors import UsageError


def _cannot(path: Path, option: str, why: str, example: str, kind: str) -> UsageError:
    return UsageError(f"{option} {path}: {why}", f"pass a {kind} you can write to, like {option} {example}")


def _why(e: OSError) -> str:
    return f"cannot write there ({e.strerror or e})"


def output_dir(path: Path, option: str = "--output", example: str = "results/reports/mine") -> Path:
    """A directory to write into, created if missing and proven writable (a temporary file made
    and removed in it); a file, a device or an unwritable place is refused."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise _cannot(path, option, "not a directory (a file or a device is there)", example, "directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise _cannot(path, option, _why(e), example, "directory") from None
    return path


def output_file(path: Path, option: str = "--output", example: str = "out.md") -> Path:
    """A file to write, checked before the work that fills it: not a directory, its directory
    created, and writable there (an existing file: open for writing; else a temporary file made
    and removed beside it). A device such as /dev/null is accepted: writing there is asked for."""
    path = Path(path)
    if path.is_dir():
        raise _cannot(path, option, "a directory, not a file", f"{path / Path(example).name}", "file path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            if not os.access(path, os.W_OK):
                raise PermissionError(13, "Permission denied")
        else:
            with tempfile.TemporaryFile(dir=path.parent):
                pass
    except OSError as e:
        raise _cannot(path, option, _why(e), example, "file path") from None
    return path


@contextmanager
def writing(path: Path, option: str = "--output", example: str = "out.md", kind: str = "file path") -> Iterator[None]:
    """Writes into a checked path: an OSError (a full disk, a path that went away) becomes the
    option's one-line error."""
    try:
        yield
    except IsADirectoryError:
        raise _cannot(Path(path), option, "a directory, not a file", example, kind) from None
    except OSError as e:
        raise _cannot(Path(path), option, _why(e), example, kind) from None


def write_text(path: Path, text: str, option: str = "--output", example: str = "out.md") -> Path:
    """A checked file written whole (output_file first, then the text)."""
    path = output_file(path, option, example)
    with writing(path, option, example):
        path.write_text(text, encoding="utf-8")
    return path
