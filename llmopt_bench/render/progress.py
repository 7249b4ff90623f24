"""Progress on stderr: rich on a terminal, plain throttled lines without a TTY or in CI."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

from llmopt_bench.core.results import StageResult

if TYPE_CHECKING:
    from rich.status import Status


def _took(result: StageResult) -> str:
    """", 84 s (load 4.2 s; most in repeat 52 s)": the stage's wall time and where most of it went."""
    if not result.duration_s:
        return ""
    parts = [f"load {result.load_s:.1f} s"] if result.load_s else []
    if result.phases:
        label, seconds = max(result.phases.items(), key=lambda kv: kv[1])
        parts.append(f"most in {label} {seconds:.0f} s")
    return f", {result.duration_s:.0f} s" + (f" ({'; '.join(parts)})" if parts else "")


def _fmt(result: StageResult) -> str:
    from llmopt_bench.analysis.figures import stage_figure

    m = result.metrics if result.status == "ok" else None
    if m and m.tpot_s:  # the figures the end-of-run table and the report show (analysis/figures.py)
        tpot, tok_s = stage_figure(result, "tpot_p50").value, stage_figure(result, "output_tok_s").value
        return f"ok: TPOT p50 {tpot or 0:.2f} ms, {tok_s or 0:.1f} tok/s{_took(result)}"
    return f"{result.status}: {result.reason or ''}" + (f" (fix: {result.fix})" if result.fix else "")


def clock(seconds: float) -> str:
    """Elapsed time as the progress lines' prefix: 0:07, 12:34, 1:02:03."""
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


class PlainReporter:
    """Lines on stderr, each with the time since the run began ([m:ss]): a log says when each
    phase came, and a slow one shows as a gap."""

    def __init__(self, every_s: float = 5.0):
        self.every_s = every_s
        self._last = 0.0
        self._began = time.monotonic()

    def _say(self, text: str) -> None:
        print(f"[{clock(time.monotonic() - self._began)}] {text}", file=sys.stderr, flush=True)

    def phase(self, msg: str) -> None:
        self._say(f"llmopt: {msg}")

    def stage_start(self, name: str, index: int, total: int) -> None:
        self._say(f"[{index}/{total}] {name}: starting")
        self._last = 0.0

    def progress(self, name: str, msg: str, done: int | None, total: int | None) -> None:
        t = time.monotonic()
        final = done is not None and done == total
        if t - self._last < self.every_s and done is not None and not final:
            return
        self._last = t
        self._say(f"  {name}: {msg}" + (f" ({done}/{total})" if done is not None else ""))

    def stage_end(self, result: StageResult) -> None:
        self._say(f"  {result.name}: {_fmt(result)}")


class RichReporter(PlainReporter):
    def __init__(self) -> None:
        from rich.console import Console

        super().__init__(every_s=0.0)
        self.console = Console(stderr=True)
        self._status: Status | None = None

    def _say(self, text: str) -> None:
        self.console.print(f"[{clock(time.monotonic() - self._began)}] {text}", highlight=False, markup=False)

    def progress(self, name: str, msg: str, done: int | None, total: int | None) -> None:
        text = f"{name}: {msg}" + (f" ({done}/{total})" if done is not None else "")
        if self._status is None:
            self._status = self.console.status(text)
            self._status.start()
        else:
            self._status.update(text)

    def stage_end(self, result: StageResult) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
        color = "green" if result.status == "ok" else ("yellow" if result.status == "skipped" else "red")
        from rich.markup import escape

        self.console.print(escape(f"[{clock(time.monotonic() - self._began)}]") + f"   [bold]{escape(result.name)}[/]: "
                           f"[{color}]{escape(_fmt(result))}[/]", highlight=False)


def make_reporter():
    if sys.stderr.isatty() and not os.environ.get("CI"):
        return RichReporter()
    return PlainReporter()
