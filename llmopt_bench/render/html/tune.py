"""tune's section of a run's page, from tune.json as `llmopt tune` wrote it: each trial's capacity
against each knob's value (one chart a knob), the winner and the defaults marked, and every
trial in a table. Read as data (data.tune_record): the report sits below tune's own code."""

from __future__ import annotations

from typing import Any

from llmopt_bench.core.freeform import Json
from llmopt_bench.render.html.data import number
from llmopt_bench.render.html.page import chart, colour, esc, table


def trial_capacity(t: Json) -> float | None:
    """A trial's capacity: its held rung's, else its last rung's lower bound."""
    rungs = [r for r in t.get("rungs") or [] if isinstance(r, dict)]
    held = next((r for r in rungs if r.get("name") == "held" and r.get("held")), None)
    last = held or (rungs[-1] if rungs else None)
    return number(last.get("capacity_rps")) if last else None


def role(t: Json, record: Json) -> str:
    return "winner" if t.get("number") == record.get("winner") else "defaults" if t.get("number") == record.get("defaults") else "trial"


def knob_chart(knob: str, trials: list[Json], record: Json) -> dict:
    marker = {"winner": ("star", 16, "#2e7d32"), "defaults": ("diamond", 13, "#000"), "trial": ("circle", 9, colour(0))}
    data = []
    for r in ("trial", "defaults", "winner"):
        kept = [t for t in trials if role(t, record) == r]
        if not kept:
            continue
        sym, size, c = marker[r]
        data.append({"type": "scatter", "mode": "markers", "name": r, "x": [esc(_value(t, knob)) for t in kept],
                     "y": [trial_capacity(t) for t in kept], "text": [esc(t.get("label", "")) for t in kept],
                     "marker": {"symbol": sym, "size": size, "color": c},
                     "hovertemplate": "%{text}: %{y:.4g} req/s<extra></extra>"})
    return chart(f"tune-{knob}", f"Capacity under the SLO against {knob}", data,
                 {"xaxis": {"title": {"text": esc(knob)}, "type": "category"}, "yaxis": {"title": {"text": "capacity (req/s)"}}},
                 ["trial", knob, "capacity req/s", "outcome", "role"],
                 [[t.get("number"), _value(t, knob), trial_capacity(t), t.get("outcome"), role(t, record)] for t in trials])


def _value(t: Json, knob: str) -> Any:
    v = (t.get("config") or {}).get(knob, "default")
    return "default" if v is None else str(v)


def tune_items(record: Json) -> list[dict]:
    trials = [t for t in record.get("trials") or [] if isinstance(t, dict)]
    if not trials:
        return []
    knobs = list(((record.get("space") or {}).get("knobs") or {}).keys())
    items: list[dict] = [knob_chart(k, trials, record) for k in knobs]
    items.append(table(["trial", "configuration", "outcome", "capacity req/s", "reason", "vllm serve"],
                       [[t.get("number"), t.get("label"), t.get("outcome"), trial_capacity(t), t.get("reason") or "",
                         t.get("command") or ""] for t in trials], "Every trial"))
    return items
