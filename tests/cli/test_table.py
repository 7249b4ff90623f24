"""The end-of-run table reads at 80 columns and wide: headers whole with their units, nothing
cut with an ellipsis, no line longer than the terminal; at 80 the columns that do not fit are
left out and named; very narrow terminals get one block per stage."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from llmopt_bench.core.results import load_run
from llmopt_bench.render.table import COLUMNS, print_summary

ROOT = Path(__file__).resolve().parents[2]
RUNS = [ROOT / "results" / "h200", ROOT / "results" / "cpu" / "20261203-smollm2-quantization"]
HEADERS = [" ".join(c.header).strip() for c in COLUMNS]


def printed(run_dir: Path, width: int) -> list[str]:
    buf = io.StringIO()
    print_summary(load_run(run_dir), Console(file=buf, width=width, color_system=None, legacy_windows=False))
    return buf.getvalue().splitlines()


def header_rows(lines: list[str]) -> tuple[str, str]:
    top = next(i for i, line in enumerate(lines) if line.lstrip().startswith("stage "))
    return lines[top], lines[top + 1]


def shown_columns(lines: list[str]) -> list[str]:
    """The headers whose two lines stand one above the other in the printed header."""
    top, unit = header_rows(lines)
    out = []
    for c in COLUMNS:
        name, stat = c.header
        at = top.find(name)
        if at >= 0 and (not stat or stat in unit):
            out.append(" ".join(c.header).strip())
    return out


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
@pytest.mark.parametrize("width", [80, 60, 44])
def test_fits_the_width_and_cuts_nothing(run_dir, width):
    lines = printed(run_dir, width)
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert not any("…" in line for line in lines), lines
    run = load_run(run_dir)
    body = "\n".join(lines)
    for s in run.stages:
        assert s.name in body  # every stage's whole name
    shown = shown_columns(lines)
    assert shown[:2] == ["stage", "status"] and "TPOT p50 ms" in shown
    left_out = [h for h in HEADERS if h not in shown]
    if left_out:  # named, with where to find them
        joined = " ".join(line.strip() for line in lines)
        assert "left out at this width: " + ", ".join(left_out) in joined, joined
        assert "run.json" in joined and "--json" in joined


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: p.name)
def test_wide_shows_every_column_with_units(run_dir):
    lines = printed(run_dir, 200)
    assert shown_columns(lines) == HEADERS
    _, unit = header_rows(lines)
    for u in ("s", "p50 ms", "p50 s", "tok/s", "GB"):
        assert u in unit.split("  ") or f" {u}" in unit, (u, unit)
    assert not any("left out" in line for line in lines)


def test_at_80_the_h200_journey_keeps_every_column():
    """The reference journey's numbers fit 80 columns whole: nothing needs leaving out."""
    assert shown_columns(printed(RUNS[0], 80)) == HEADERS


def test_very_narrow_stacks_one_block_per_stage():
    lines = printed(RUNS[0], 30)
    run = load_run(RUNS[0])
    assert not any("…" in line for line in lines)
    for s in run.stages:
        assert f"{s.name}: {s.status}" in lines
    tpot = next(i for i, line in enumerate(lines) if line == "hf-fp16: ok")
    assert "  TPOT p50 ms: 25.59" in lines[tpot:tpot + 8]  # the figure compare shows too (analysis/figures.py)


def test_notes_and_fixes_under_the_table():
    lines = printed(RUNS[0], 80)
    assert "flash-attn: own workload (sweep): see the report" in lines
