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
