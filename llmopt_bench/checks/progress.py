"""A check's wall-time budget and its progress lines (render/progress.py's reporter, as bench's:
plain timed lines on stderr without a TTY or in CI), and the outputs made committable."""

from __future__ import annotations

import time
from pathlib import Path


class Budget:
    """Wall time since the check began, what is left of `seconds`, and a line for each step."""

    def __init__(self, seconds: float):
        from llmopt_bench.render.progress import make_reporter

        self.t0, self.seconds = time.monotonic(), seconds
        self.reporter = make_reporter()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def say(self, msg: str) -> None:
        self.reporter.phase(msg)

    def fits(self, what: str, estimate_s: float) -> bool:
        """Whether a step of about estimate_s seconds fits what is left; said either way."""
        if estimate_s <= self.left():
            self.say(f"{what} (about {estimate_s:.0f} s; {self.left():.0f} s of budget left)")
            return True
        self.say(f"SKIPPED {what}: it needs about {estimate_s:.0f} s, {self.left():.0f} s of budget left")
        return False


def portable(out: Path) -> None:
    """Every text output with the cache's and the home's paths in portable form (committable)."""
    from llmopt_bench.core.models import portable_text

    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".txt", ".md", ".json"):
            path.write_text(portable_text(path.read_text(errors="replace")))


def ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def g(v: object) -> str:
    """A figure in a summary's table: 4 significant digits, '-' for none."""
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
