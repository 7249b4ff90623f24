"""Every committed run's report.html, and a page of two runs, opened from disk in a real
Chromium with every request but the file itself blocked: none is attempted, the console stays
clean, and the charts hold the numbers run.json holds (the load points and requests read here from
the raw JSON, not through the report's code; each stage's figure is the one every output shows,
analysis/figures.stage_figure, itself recomputed from run.json's samples in tests/unit/test_figures.py).
The two-run page's changes and verdicts are `llmopt compare --format json`'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from testkit import cli_in_process

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted(p.parent for p in (ROOT / "results").rglob("run.json"))
AT_ONCE = 3
PAIR = (ROOT / "results/cpu/host-calibration/run1-quiet", ROOT / "results/cpu/host-calibration/run1-hogs")


def name(run_dir: Path) -> str:
    return str(run_dir.relative_to(ROOT / "results"))


@pytest.fixture(scope="session")
def rendered(tmp_path_factory):
    """Each committed run's report.html, written once by `llmopt report RUN --format html`."""
    out = tmp_path_factory.mktemp("html-reports")
    pages = {}
    for run_dir in COMMITTED:
        dest = out / name(run_dir).replace("/", "__")
        assert cli_in_process(["report", str(run_dir), "--format", "html", "--output", str(dest)]) == 0, run_dir
        pages[run_dir] = dest / "report.html"
    return pages


def close(x: float | None, y: float | None) -> bool:
    return x is not None and y is not None and abs(x - y) <= 1e-9 * max(1.0, abs(x))


def ok_stages(raw: dict) -> list[dict]:
    return [s for s in raw["stages"] if s["status"] == "ok" and s.get("metrics")]


def check_figures(opened, raw: dict, run_dir: Path) -> None:
    """The per-stage charts: one bar an ok stage with the figure, at the figure's value (the
    geometric mean of its repeats' own figures: what the report's table and compare show)."""
    from llmopt_bench.analysis.figures import figure_value
    from llmopt_bench.core.results import load_run

    run = {s.name: s for s in load_run(run_dir).stages}
    for cid in ("figure-ttft_p50", "figure-tpot_p50", "figure-output_tok_s"):
        metric = cid.removeprefix("figure-")
        want = [(s["name"], v) for s in ok_stages(raw) if (v := figure_value(run[s["name"]], metric)) is not None]
        traces = opened.chart(cid)
        if not want:
            assert traces is None, cid
            continue
        assert traces and len(traces[0]["y"]) == len(want), (cid, traces, want)
        assert traces[0]["x"] == [n for n, _ in want]
        assert all(close(y, v) for y, (_, v) in zip(traces[0]["y"], want)), (cid, traces[0]["y"], want)


def check_load_points(opened, raw: dict, lines: list[dict]) -> int:
    """Each load stage's open-loop chart: a point each offered rate, at its TTFT p99; the
    headline point's requests drawn one a marker. Returns the load charts checked."""
    checked = 0
    loaded = [s for s in raw["stages"] if s["status"] == "ok" and ((s.get("extra") or {}).get("curve")
                                                                 or ((s.get("extra") or {}).get("prefix_caching") or {}).get("arms"))]
    for n, s in enumerate(loaded):
        x = s["extra"]
        if x.get("prefix_caching") or "main_point" not in x:
            continue  # the arms' own tags; continuous-batching has no open loop
        rows = sorted((r for r in x["curve"] if r.get("rate_rps") is not None), key=lambda r: r["rate_rps"])
        traces = opened.chart(f"s{n}-open")
        if rows:
            p99 = next(t for t in traces if t["name"] == "TTFT p99")
            assert p99["x"] == [r["rate_rps"] for r in rows]
            assert all(close(y, r["ttft_p99_s"] * 1e3) for y, r in zip(p99["y"], rows))
            checked += 1
        mine = [r for r in lines if r.get("stage") == s["name"] and (r.get("point") or x.get("main_point")) == x.get("main_point")]
        if mine and x.get("main_point"):
            drawn = opened.chart(f"s{n}-req0")
            ttft = next(t for t in drawn if t["name"] == "TTFT ms")
            ok = sorted((r for r in mine if r.get("ok", True)), key=lambda r: r["t_submit"])
            assert len(ttft["y"]) == len(ok)
            assert close(ttft["y"][0], (ok[0]["t_first"] - ok[0]["t_submit"]) * 1e3)
            checked += 1
    return checked


def test_there_are_committed_runs_of_each_kind():
    assert len(COMMITTED) >= 20 and any("h200" in name(d) for d in COMMITTED) and any("cpu" in name(d) for d in COMMITTED)


def test_every_committed_report_opens_offline_with_its_numbers(rendered, open_report):
    load_checked = 0
    todo = list(rendered.items())
    for start in range(0, len(todo), AT_ONCE):  # a few pages draw at once: the browser's processes use every core
        batch = [(run_dir, open_report(path, wait=False)) for run_dir, path in todo[start:start + AT_ONCE]]
        for run_dir, opened in batch:
            load_checked += check_page(run_dir, opened)
    assert load_checked >= 4  # the serving stages of the H200 runs: their curves and their headline requests


def check_page(run_dir: Path, opened) -> int:
    """One report: drawn, offline, quiet, its numbers run.json's; returns the load charts checked."""
    try:
        opened.wait_drawn()
        assert opened.page.evaluate("document.body.dataset.ready") == "1", name(run_dir)
        assert not opened.requested, (name(run_dir), opened.requested)
        assert not opened.errors(), (name(run_dir), opened.errors())
        raw = json.loads((run_dir / "run.json").read_text())
        check_figures(opened, raw, run_dir)
        req = run_dir / "requests.jsonl"
        lines = [json.loads(x) for x in req.read_text().splitlines()] if req.is_file() else []
        checked = check_load_points(opened, raw, lines)
        # every chart has its table of numbers, every section is there
        charts = opened.page.evaluate("document.querySelectorAll('figure.chart').length")
        tables = opened.page.evaluate("document.querySelectorAll('figure.chart .chart-table table').length")
        assert charts == tables > 0, name(run_dir)
        return checked
    finally:
        opened.page.close()


def test_a_table_view_shows_a_charts_numbers(rendered, open_report):
    opened = open_report(rendered[ROOT / "results/h200/20261203-transformers"])
    try:
        fig = opened.page.locator("#fig-figure-tpot_p50")
        table = fig.locator(".chart-table")
        assert table.is_hidden()
        fig.locator("button.toggle").click()
        assert table.is_visible()
        from llmopt_bench.analysis.figures import figure_value
        from llmopt_bench.core.results import load_run

        first = next(s for s in load_run(ROOT / "results/h200/20261203-transformers").stages if s.status == "ok" and s.metrics)
        cells = table.locator("tbody tr").first.locator("td").all_text_contents()
        assert cells[0] == first.name and float(cells[1]) == pytest.approx(figure_value(first, "tpot_p50"), rel=1e-3)
    finally:
        opened.page.close()


def test_two_runs_side_by_side_judged_as_compare_judges_them(tmp_path, open_report, capfd, monkeypatch):
    monkeypatch.setenv("LLMOPT_HISTORY_DB", str(tmp_path / "no-history.sqlite"))  # both: the two runs alone
    base, new = PAIR
    assert cli_in_process(["report", str(base), str(new), "--output", str(tmp_path)]) == 0
    assert capfd.readouterr().out.strip() == str(tmp_path / "runs.html")
    assert cli_in_process(["compare", str(base), str(new), "--format", "json"]) in (0, 5, 6, 8, 9)
    want = json.loads(capfd.readouterr().out)
    opened = open_report(tmp_path / "runs.html")
    try:
        assert opened.page.evaluate("document.body.dataset.ready") == "1"
        assert not opened.requested and not opened.errors(), (opened.requested, opened.errors())
        got = opened.data()["compare"][0]
        assert [s["stage"] for s in got["stages"]] == [s["stage"] for s in want["stages"]]
        assert sum(len(s["metrics"]) for s in want["stages"]) >= 5  # a pair compare judges figure by figure
        for g, w in zip(got["stages"], want["stages"]):
            assert g["state"] == w["state"]
            for gm, wm in zip(g["metrics"], w["metrics"]):
                assert (gm["metric"], gm["verdict"], gm["ci"], gm["change"]) == (wm["metric"], wm["verdict"], wm["ci"], wm["change"])
        # and the page shows them: each compared metric's verdict in the gate's table
        rows = opened.page.locator("#gate table").first.locator("tbody tr")
        verdicts = [rows.nth(i).locator("td").nth(8).text_content() for i in range(rows.count())]
        assert verdicts == [m["verdict"] for s in want["stages"] for m in s["metrics"]]
        assert opened.page.locator("#gate p").first.text_content().startswith("run1-hogs against run1-quiet: the hosts explain a change")
        # side by side: a bar a run a stage
        tpot = opened.chart("side-tpot_p50")
        assert len(tpot) == 2 and all(len(t["y"]) == len(tpot[0]["y"]) for t in tpot)
        assert opened.chart("history-tpot_p50")
    finally:
        opened.page.close()
