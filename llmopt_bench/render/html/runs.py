"""The page of several runs (runs.html): the runs side by side stage by stage, each run against
the baseline (the first given) figure by figure with the change, its interval and the gate's
verdict exactly as `llmopt compare` gives them (analysis/gate/compare.compare_runs, its
defaults, its JSON), and the history: each figure of each stage over the runs given and the
history database's runs of the baseline's device, model and workload."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.analysis.gate.compare import compare_runs, parse_gate, parse_thresholds
from llmopt_bench.core.errors import LlmoptError
from llmopt_bench.core.results import RunResult
from llmopt_bench.render.html.data import stage_figure, whiskers
from llmopt_bench.render.html.page import chart, colour, esc, table, text
from llmopt_bench.render.html.run_page import header
from llmopt_bench.run.history import fingerprint_runs

SIDE_BY_SIDE = (("ttft_p50", "TTFT p50"), ("tpot_p50", "TPOT p50"), ("output_tok_s", "output tok/s"), ("peak_memory", "peak memory"))
HISTORY = SIDE_BY_SIDE + (("e2e_p50", "E2E p50"), ("load_s", "load"))


def labels(runs: list[RunResult], names: list[str] | None = None) -> list[str]:
    """Each run's name on the page: the name given (its directory's), else its id; its place
    first where two runs share one."""
    ids = names or [r.run_id for r in runs]
    return [f"{i + 1}: {rid}" if ids.count(rid) > 1 else rid for i, rid in enumerate(ids)]


def side_by_side(runs: list[RunResult], names: list[str], metric: str, label: str) -> dict | None:
    stages = list(dict.fromkeys(s.name for r in runs for s in r.stages if s.status == "ok" and s.metrics))
    data, rows, unit = [], [], ""
    for i, (run, name) in enumerate(zip(runs, names)):
        figs = [(st, stage_figure(s, metric)) for st in stages if (s := run.stage(st)) and s.status == "ok" and s.metrics]
        figs = [(st, f) for st, f in figs if f.value is not None]
        if not figs:
            continue
        unit = figs[0][1].unit
        data.append({"type": "bar", "name": esc(name), "x": [esc(st) for st, _ in figs], "y": [f.value for _, f in figs],
                     "marker": {"color": colour(i)}, "error_y": whiskers([f for _, f in figs])})
        rows += [[name, st, f.value, f.lo, f.hi, f.repeats] for st, f in figs]
    if not data:
        return None
    return chart(f"side-{metric}", f"{label} per stage, run by run ({unit}; whiskers: the repeats' spread)", data,
                 {"barmode": "group", "yaxis": {"title": {"text": f"{label} ({unit})"}}},
                 ["run", "stage", f"{label} {unit}", "lowest repeat", "highest repeat", "repeats"], rows)


def gate_items(base: RunResult, new: RunResult, base_name: str, new_name: str, db: Path | None) -> tuple[list[dict], dict | None]:
    """The gate's verdicts of one run against the baseline, as `llmopt compare BASE NEW` judges
    them (its default thresholds, gate and seed; the history database's earlier runs for the
    baseline's noise where `db` names one); a pair it refuses says why."""
    try:
        history = fingerprint_runs(db, base, new) if db else []
        cmp = compare_runs(base, new, parse_thresholds(None), gate=parse_gate(None), history=history)
    except LlmoptError as e:
        return [text(f"{new_name} against {base_name}: not compared: {e.message} ({e.fix})")], None
    d = cmp.to_dict()
    rows = [[s["stage"], m["label"], m["unit"], m["baseline"], m["new"], m["change"], m["ci"][0] - 1 if m["ci"] else None,
             m["ci"][1] - 1 if m["ci"] else None, m["verdict"], m["method"]]
            for s in d["stages"] for m in s["metrics"]]
    others = [[s["stage"], s["state"], s["note"] or ""] for s in d["stages"] if s["state"] != "compared"]
    verdict = ("regressed: " + ", ".join(f"{s} {m}" for s, m in cmp.regressions) if cmp.regressions else
               "incomplete: " + "; ".join(cmp.incomplete) if cmp.incomplete else
               "the hosts explain a change: " + ", ".join(f"{s} {m}" for s, m in cmp.host_inconclusive) if cmp.host_inconclusive else
               "inconclusive: " + ", ".join(f"{s} {m}" for s, m in cmp.inconclusive) if cmp.inconclusive and not cmp.pass_inconclusive else
               "no regression")
    items = [text(f"{new_name} against {base_name}: {verdict} (llmopt compare's verdict; {d['history_runs']} earlier runs of "
                  f"the history consulted; interval at {d['confidence']:.0%})"),
             table(["stage", "figure", "unit", "baseline", "new", "change", "interval low", "interval high", "verdict", "method"],
                   rows, f"{new_name} against {base_name}, figure by figure")]
    if others:
        items.append(table(["stage", "state", "note"], others, "Stages not compared"))
    return items, {"baseline": base_name, "new": new_name, "verdict": verdict, "stages": d["stages"]}


def history_runs(runs: list[RunResult], db: Path | None) -> list[RunResult]:
    """The runs given and, with a history database, its runs of the baseline's device, model and
    workload; each once, oldest first."""
    found = list(runs)
    if db is not None:
        newest = max(runs, key=lambda r: r.created_at)
        found += fingerprint_runs(db, runs[0], newest, limit=1000)
    seen: dict[tuple[str, str], RunResult] = {}
    for r in found:
        seen.setdefault((r.run_id, r.created_at), r)
    return sorted(seen.values(), key=lambda r: r.created_at)


def history_chart(runs: list[RunResult], metric: str, label: str) -> dict | None:
    """One line a stage over the runs' times, a colour each; a log axis a click away."""
    stages = list(dict.fromkeys(s.name for r in runs for s in r.stages))
    data, rows, unit = [], [], ""
    for i, st in enumerate(stages):
        pts = [(r, f) for r in runs if (s := r.stage(st)) and s.status == "ok" and s.metrics
               and (f := stage_figure(s, metric)).value is not None]
        if not pts:
            continue
        unit = pts[0][1].unit
        data.append({"type": "scatter", "mode": "lines+markers", "name": esc(st), "x": [r.created_at for r, _ in pts],
                     "y": [f.value for _, f in pts], "text": [esc(r.run_id) for r, _ in pts], "line": {"color": colour(i)},
                     "hovertemplate": esc(st) + ": %{y:.4g} " + unit + " (%{text})<extra></extra>"})
        rows += [[st, r.run_id, r.created_at, f.value] for r, f in pts]
    if not data:
        return None
    scale = [{"type": "buttons", "direction": "right", "x": 0, "y": 1.15, "showactive": True,
              "buttons": [{"label": "linear", "method": "relayout", "args": [{"yaxis.type": "linear"}]},
                          {"label": "log", "method": "relayout", "args": [{"yaxis.type": "log"}]}]}]
    return chart(f"history-{metric}", f"{label} over time, stage by stage ({unit})", data,
                 {"xaxis": {"title": {"text": "run created"}, "type": "date"}, "yaxis": {"title": {"text": f"{label} ({unit})"}, "type": "log"},
                  "updatemenus": scale}, ["stage", "run", "created", f"{label} {unit}"], rows)


def runs_page(runs: list[RunResult], db: Path | None = None, names: list[str] | None = None) -> dict:
    names = labels(runs, names)
    gate: list[dict] = []
    verdicts = []
    for run, name in zip(runs[1:], names[1:]):
        items, verdict = gate_items(runs[0], run, names[0], name, db)
        gate += items
        if verdict:
            verdicts.append(verdict)
    past = history_runs(runs, db)
    sections = [
        {"id": "runs", "title": "The runs", "items": [table(["run", "status", "created", "device", "model", "workload", "command"],
                                                            [[n, *(header(r)[k] for k in ("status", "created_at", "device", "model",
                                                                                          "workload", "command"))]
                                                             for n, r in zip(names, runs)]),
                                                      text(f"Baseline: {names[0]} (the first run given).")]},
        {"id": "side-by-side", "title": "Side by side",
         "items": [c for m, label in SIDE_BY_SIDE if (c := side_by_side(runs, names, m, label))]},
        {"id": "gate", "title": "Against the baseline: the gate's verdicts", "items": gate},
        {"id": "history", "title": f"History: {len(past)} runs",
         "items": [c for m, label in HISTORY if (c := history_chart(past, m, label))]},
    ]
    return {"kind": "runs", "header": {"runs": names, "baseline": names[0]}, "sections": sections, "compare": verdicts}
