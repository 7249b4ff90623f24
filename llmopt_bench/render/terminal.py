"""What the commands print to a terminal, at its width ($COLUMNS, else the terminal's, else 80):
prose wrapped between words (never inside one, never at a hyphen: a command or a path stays
whole, on a line of its own when longer than the width), tables that fit or, when even their
longest words do not, one block per row. Errors are not wrapped: they stay one line each.

    width()                                the columns to print in
    wrap(line, width)                      one line -> lines, its indent kept, a bullet's text hung
    echo(lines, width=None, err=False)     wrapped lines to stdout (or stderr)
    print_table(headers, rows, title=..., style_of=..., drop=...)   a table at the width: the droppable
                                           columns left out (and named) first, else one block per row"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from typing import Any, Callable, Iterable, Sequence

DEFAULT_WIDTH = 80
KEEP_WHOLE = ("fix: ",)


def width() -> int:
    """$COLUMNS when set (what a user or a test asks for), else the terminal's, else 80."""
    try:
        cols = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        cols = 0
    return cols if cols > 0 else shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns


def wrap(line: str, columns: int) -> list[str]:
    """One line at `columns`: broken between words only; the indent kept, and a bullet's ("- ",
    "* ") or an indented label's ("  note: ") text hung under its first word. A fix line stays
    whole, as errors do: it holds a command to copy, which a terminal's own soft wrap keeps one
    line when copied, and a hard break would not."""
    if len(line) <= columns or line.lstrip().startswith(KEEP_WHOLE):
        return [line]
    indent = line[: len(line) - len(line.lstrip())]
    head = re.match(r"\s*[-*] |\s+[\w][\w -]{0,20}: ", line)
    hang = " " * (len(head.group(0)) if head else len(indent))
    return textwrap.wrap(line, columns, initial_indent="", subsequent_indent=hang, break_long_words=False,
                         break_on_hyphens=False, drop_whitespace=True) or [line]


def shell_lines(command: str, columns: int, indent: str = "    ") -> list[str]:
    """A shell command at `columns`, continued with backslashes between its arguments (an option
    kept with its value): still one command when copied."""
    import shlex

    args = shlex.split(command)
    words: list[str] = []
    for a in args:
        head = re.match(r"~/|\$\w+/", a)  # ~/... and $LLMOPT_CACHE/...: left for the shell to expand
        quoted = head.group(0) + shlex.quote(a[head.end():]) if head else shlex.quote(a)
        if words and words[-1].startswith("-") and not a.startswith("-") and " " not in words[-1]:
            words[-1] += " " + quoted
        else:
            words.append(quoted)
    lines, cur = [], indent
    for w in words:
        if cur.strip() and len(cur) + 1 + len(w) + 2 > columns:
            lines.append(cur + " \\")
            cur = indent + "  " + w
        else:
            cur = cur + (" " if cur.strip() else "") + w
    return lines + [cur]


def echo(lines: Iterable[str], columns: int | None = None, err: bool = False) -> None:
    cols = columns or width()
    out = sys.stderr if err else sys.stdout
    for line in lines:
        for part in (wrap(line, cols) if line else [""]):
            print(part, file=out)


def _blocks(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None, columns: int) -> list[str]:
    """A table too wide even for its longest words: each row as "header: value" lines."""
    out = [title, ""] if title else []
    for row in rows:
        out.append(f"{headers[0]} {row[0]}")
        for h, v in zip(headers[1:], row[1:]):
            out += wrap(f"  {h}: {v}", columns)
        out.append("")
    return out


def min_width(rows: Sequence[Sequence[Any]]) -> int:
    """The narrowest a table of these rows prints without cutting a word: each column as wide as
    its longest word, three spaces between columns (print_table's layout)."""
    longest = [max((len(w) for cell in col for w in str(cell).split()), default=0) for col in zip(*rows)]
    return sum(longest) + 3 * (len(longest) - 1)


def widths(rows: Sequence[Sequence[Any]], columns: int) -> list[int]:
    """Each column's width so that the table fits `columns` (when it can): the widest columns
    narrowed first, none below its longest word (rich's own layout cuts words to fit)."""
    cells = [[str(c) for c in col] for col in zip(*rows)]
    low = [max((len(w) for c in col for w in c.split()), default=1) for col in cells]
    out = [max((len(c) for c in col), default=1) for col in cells]
    room = columns - 3 * (len(out) - 1)
    while sum(out) > room:
        slack = [w - m for w, m in zip(out, low)]
        if max(slack) <= 0:
            break
        i = max(range(len(out)), key=lambda k: (slack[k] > 0, out[k]))
        out[i] -= 1
    return out


def fitting(headers: Sequence[str], rows: Sequence[Sequence[Any]], columns: int, drop: Sequence[int]) -> list[int]:
    """The column indices to print: all, less the droppable ones (in `drop`'s order) that must go
    for the longest words of the rest to fit side by side."""
    keep = list(range(len(headers)))
    for i in [*drop, None]:
        if min_width([[r[k] for k in keep] for r in [headers, *rows]]) <= columns or i is None:
            return keep
        keep.remove(i)
    return keep


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None,
                style_of: Callable[[int, str], str] | None = None, columns: int | None = None, console: Any = None,
                drop: Sequence[int] = (), dropped_note: str = "") -> None:
    """A table at the terminal's width: cells wrap between words. Where the longest words of its
    columns do not fit side by side, the `drop` columns go first (in that order; a line names
    them, with `dropped_note` saying where they are), then, if still too wide, one block per row
    (nothing cut, nothing folded). style_of(column index, text): a cell's rich style (colour on a
    terminal, nothing in a file or a pipe)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    cols = columns or width()
    console = console or Console(width=cols, highlight=False)
    keep = fitting(headers, rows, cols, drop)
    left_out = [h for k, h in enumerate(headers) if k not in keep]
    headers, rows = [headers[k] for k in keep], [[r[k] for k in keep] for r in rows]
    if min_width([headers, *rows]) > cols:
        for line in _blocks(headers, [[str(v) for v in r] for r in rows], title, cols):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    else:
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, title_justify="left")
        for h, w in zip(headers, widths([headers, *rows], cols)):
            table.add_column(h, width=w, overflow="fold")
        for row in rows:
            table.add_row(*(Text(str(v), style=style_of(keep[i], str(v)) if style_of else "") for i, v in enumerate(row)))
        console.print(table)
    if left_out:
        for line in wrap(f"left out at this width: {', '.join(left_out)}" + (f" ({dropped_note})" if dropped_note else ""), cols):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
