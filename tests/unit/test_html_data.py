"""What report.html embeds, as data (not pixels): a snapshot of each page kind's sections and
every chart's table of numbers, for a committed full journey and a two-run page; and the JSON
block that no run's text can end. Regenerate a snapshot after an intended change with
LLMOPT_UPDATE_SNAPSHOTS=1 and commit the diff with the change."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmopt_bench.core.results import load_run
from llmopt_bench.render.html.page import clean, script_json
from llmopt_bench.render.html.run_page import run_page
from llmopt_bench.render.html.runs import runs_page

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOTS = ROOT / "tests" / "data" / "html"


def rounded(v):
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, list):
        return [rounded(x) for x in v]
    return v


def digest(page: dict) -> dict:
    """The page's sections, and each item's kind with, for a chart, its traces' sizes and its numbers."""
    def item(it: dict) -> dict:
        if it["kind"] == "chart":
            return {"chart": it["id"], "title": it["title"], "traces": [len(t.get("y") or t.get("x") or []) for t in it["figure"]["data"]],
                    "headers": it["table"]["headers"], "rows": rounded(it["table"]["rows"])}
        if it["kind"] == "picker":
            return {"picker": it["id"], "options": [{"name": o["name"], "items": [item(x) for x in o["items"]]} for o in it["options"]]}
        if it["kind"] == "table":
            return {"table": it["title"], "headers": it["headers"], "rows": len(it["rows"])}
        return {it["kind"]: len(it.get("items") or []) if it["kind"] == "list" else 1}
    return {"kind": page["kind"], "sections": [{"id": s["id"], "items": [item(i) for i in s["items"]]} for s in page["sections"]]}


def check(name: str, page: dict) -> None:
    got = clean(digest(page))
    path = SNAPSHOTS / f"{name}.json"
    if os.environ.get("LLMOPT_UPDATE_SNAPSHOTS"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(path.read_text())
    assert got == want, f"{name}: the embedded data changed; if intended: LLMOPT_UPDATE_SNAPSHOTS=1 pytest {__file__}"


def test_a_full_journeys_page_embeds_what_it_did():
    run_dir = ROOT / "results/h200-20261204/run"
    check("h200-journey", run_page(load_run(run_dir), run_dir))


def test_a_two_run_page_embeds_what_it_did(monkeypatch, tmp_path):
    runs = [load_run(ROOT / "results/cpu/host-calibration/run1-quiet"), load_run(ROOT / "results/cpu/host-calibration/run1-hogs")]
    check("two-runs", runs_page(runs, tmp_path / "no-history.sqlite", ["run1-quiet", "run1-hogs"]))


@pytest.mark.parametrize("text", ["</script><script>alert(1)</script>", "<!--", "a\u2028b\u2029c", "&lt;", "]]>"])
def test_no_text_can_end_the_data_block_and_each_reads_back_as_itself(text):
    body = script_json({"prompt": text, "nan": float("nan")})
    assert not set("<>&\u2028\u2029") & set(body)
    assert json.loads(body) == {"prompt": text, "nan": None}


def test_tunes_trials_by_knob_with_the_winner_and_the_defaults(tmp_path):
    from llmopt_bench.render.html.data import tune_record
    from llmopt_bench.render.html.tune import tune_items

    rung = lambda cap, held=None: {"name": "held" if held is not None else "short", "capacity_rps": cap, "held": held, "precision": 0.1}  # noqa: E731
    record = {"space": {"knobs": {"max_num_seqs": [None, 64, 256], "block_size": [None, 32]}}, "defaults": 0, "winner": 2,
              "trials": [{"number": 0, "config": {}, "label": "defaults", "outcome": "held", "rungs": [rung(8.0), rung(7.5, True)]},
                         {"number": 1, "config": {"max_num_seqs": 64}, "label": "max_num_seqs=64", "outcome": "pruned", "rungs": [rung(5.0)]},
                         {"number": 2, "config": {"max_num_seqs": 256, "block_size": 32}, "label": "<b>win</b>", "outcome": "held",
                          "rungs": [rung(12.0), rung(11.0, True)]}]}
    (tmp_path / "tune.json").write_text(json.dumps(record))
    items = tune_items(tune_record(tmp_path))
    seqs = next(i for i in items if i.get("id") == "tune-max_num_seqs")
    by_role = {t["name"]: t for t in seqs["figure"]["data"]}
    assert by_role["winner"]["x"] == ["256"] and by_role["winner"]["y"] == [11.0]  # the held rung's capacity
    assert by_role["defaults"]["y"] == [7.5] and by_role["trial"]["y"] == [5.0]  # else the last rung's
    assert by_role["winner"]["text"] == ["&lt;b&gt;win&lt;/b&gt;"]  # a label is text to plotly too
    assert [r[-1] for r in seqs["table"]["rows"]] == ["defaults", "trial", "winner"]
    assert tune_record(tmp_path / "nowhere") is None
