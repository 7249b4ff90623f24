"""Text a run recorded is data, never markup: a run whose prompt file, command, model, stage
name, failure reason and served request error hold `<script>` and `</script><img onerror=...>`
renders each as the text it is and executes nothing, in the browser and in the file."""

from __future__ import annotations

import json
from pathlib import Path

from testkit import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "results/h200-20261204/run"  # a full journey with two serving stages
HOSTILE = "<script>window.__xss = 1</script></script><img src=x onerror=\"window.__xss = 2\">&amp;\u2028"


def hostile_run(tmp: Path) -> Path:
    raw = json.loads((SOURCE / "run.json").read_text())
    raw["command"] = f"llmopt bench --prompts '{HOSTILE}'"
    raw["workload"]["prompts"] = HOSTILE
    raw["model"]["source"] = "synthetic:" + HOSTILE
    raw["stages"][0]["name"] = "hf-fp16" + HOSTILE  # a journey label as a tampered run.json could hold it
    serve = next(s for s in raw["stages"] if s["name"] == "vllm-serve")
    serve["extra"]["error_examples"] = [HOSTILE]
    failed = next(s for s in raw["stages"] if s["name"] == "vllm")
    failed.update(status="error", reason=HOSTILE, fix=HOSTILE)
    out = tmp / "run"
    out.mkdir()
    (out / "run.json").write_text(json.dumps(raw))
    lines = [json.loads(x) for x in (SOURCE / "requests.jsonl").read_text().splitlines()]
    for r in lines:
        r["prompt_id"] = HOSTILE
    (out / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return out


def test_a_hostile_run_renders_as_text_and_runs_nothing(tmp_path, open_report):
    run = hostile_run(tmp_path)
    assert cli_in_process(["report", str(run), "--format", "html"]) == 0
    html = (run / "report.html").read_text()
    data_block = html.split('id="llmopt-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in data_block and ">" not in data_block and "\u2028" not in data_block  # nothing in it can end it
    assert "<img" not in html.split("<script>", 1)[0]  # nor does the run's text reach the markup around it
    opened = open_report(run / "report.html")
    try:
        page = opened.page
        assert page.evaluate("document.body.dataset.ready") == "1"
        assert page.evaluate("window.__xss") is None, "a script from the run's text ran"
        assert page.evaluate("document.querySelectorAll('#app img, #app script').length") == 0
        shown = page.evaluate("document.getElementById('app').textContent")
        assert HOSTILE.replace("\u2028", "") in shown.replace("\u2028", "")  # shown as itself, command, prompts and reason
        assert not opened.requested, opened.requested  # an injected <img src=x> would have asked for x
        assert not [e for e in opened.errors() if "Content Security Policy" not in e], opened.errors()
    finally:
        opened.page.close()
