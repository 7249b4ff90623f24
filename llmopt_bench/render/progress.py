"""Progress on stderr: rich on a terminal, plain throttled lines without a TTY or in CI."""

from __future__ import annotations

import os
import sys
import time

from llmopt_bench.core.results import StageResult


def _fmt(result: StageResult) -> str:
    if result.status == "ok" and result.metrics and result.metrics.tpot_s:
        m = result.metrics
        return f"ok: TPOT p50 {m.tpot_s.p50 * 1000:.2f} ms, {m.output_tok_s or 0:.1f} tok/s"
    return f"{result.status}: {result.reason or ''}" + (f" (fix: {result.fix})" if result.fix else "")


class PlainReporter:
    def __init__(self, every_s: float = 5.0):
        self.every_s = every_s
        self._last = 0.0

    def _say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

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
        self._status = None

    def _say(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

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
        self.console.print(f"  [bold]{result.name}[/]: [{color}]{_fmt(result)}[/]", highlight=False)


def make_reporter():
    if sys.stderr.isatty() and not os.environ.get("CI"):
        return RichReporter()
    return PlainReporter()
