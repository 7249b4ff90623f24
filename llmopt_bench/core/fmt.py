"""How numbers read in tables and sentences: one place for every renderer and every stage's
report hook (a low module: it imports nothing of llmopt)."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

GB = 1e9


def num(v: Any) -> str:
    """A number with the digits that matter: 1234 -> "1234", 12.34 -> "12.3", 0.01234 -> "0.0123"."""
    if v is None or isinstance(v, str):
        return v or "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    if a == 0:
        return "0"
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}" if a >= 1 else f"{v:.3g}"


def times(v: float | None) -> str:
    return f"{v:.2f}x" if v else "-"


def spread(lo_hi: Sequence[float | None] | None) -> str:
    """A speedup's range over the repeats, [low, high] -> "1.70-1.77x"."""
    if not lo_hi or None in lo_hi:
        return "-"
    return f"{lo_hi[0]:.2f}-{lo_hi[1]:.2f}x"


def pct(v: float | None) -> str:
    """A share as a percentage: 0.1234 -> "12.3%"; small ones keep two significant digits."""
    if v is None:
        return "-"
    return f"{v * 100:.1f}%" if abs(v) >= 0.01 or v == 0 else f"{v * 100:.2g}%"


def change(v: float | None) -> str:
    """A relative change, always signed: 0.034 -> "+3.4%", a ratio's 0.9 - 1 -> "-10.0%"."""
    return "-" if v is None else f"{v * 100:+.1f}%"


def quantity(v: float | None, unit: str) -> str:
    """A figure already in its shown unit, with the unit (analysis/metric_registry.Metric.shown):
    ms, GB and req/s to two decimals, s to three, tok/s to one, a count or ratio to four digits."""
    if v is None:
        return "-"
    if not unit:
        return f"{v:.4g}"  # a count or a ratio: its significant digits
    digits = {"ms": 2, "GB": 2, "s": 3, "req/s": 2}.get(unit, 1)
    return f"{v:.{digits}f} {unit}".rstrip()


def gb(v: float | None) -> float | None:
    """Bytes to GB for a table cell; None (and 0) stay empty."""
    return v / GB if v else None


def ms(v: float | None) -> float | None:
    """Seconds to milliseconds, a number for a table cell (num formats it)."""
    return v * 1e3 if v is not None else None


def ms_text(seconds: float | None) -> str:
    """Seconds as milliseconds in a sentence: 0.01234 -> "12.3 ms"."""
    return "-" if seconds is None else f"{num(seconds * 1e3)} ms"


def gb_text(size: float | None) -> str:
    """Bytes as GB in a sentence: 13_476_831_744 -> "13.5 GB"; none recorded (or 0) -> "-"."""
    return f"{num(size / GB)} GB" if size else "-"


def tail(value: float | None, n: int | None, q: float) -> Any:
    """A high percentile of n samples; marked "(~max)" when fewer than one sample lies beyond it
    (p99 of 24 requests is the largest one or two values, not a tail)."""
    if value is None or not n or n * (1 - q) >= 1:
        return value
    return f"{num(value)} (~max)"


def cell(v: Any) -> str:
    return num(v).replace("|", "\\|").replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A markdown table, one line per row."""
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join("---" for _ in headers) + " |"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out
