"""Size and drawing time of report.html, and the screenshots docs/report.md shows.

    python scripts/maintainers/report-html-bench.py [RUN_DIR] [--loads 5] [--screenshots docs/report-html]

Writes RUN_DIR's report.html (default: results/h200-20261204/run, a full journey) into a
temporary directory, opens it --loads times in headless Chromium (Debian's, through Playwright)
with every request but the file blocked, and prints the file's size and each load's time from
navigation to the viewer's "drawn" mark (performance.now() when every chart is drawn). With
--screenshots, also a page of two runs, and a PNG of each page kind's top and of a load stage."""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-quic"]
PAIR = ("results/cpu/host-calibration/run1-quiet", "results/cpu/host-calibration/run1-hogs")


def drawn(page, url: str) -> float:
    page.route("**/*", lambda r: r.continue_() if r.request.url == url else r.abort())
    page.goto(url)
    while page.evaluate("document.body.dataset.ready || null") is None:
        page.wait_for_timeout(20)
    assert page.evaluate("document.body.dataset.ready") == "1"
    return float(page.evaluate("document.body.dataset.drawnMs")) / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir", nargs="?", default="results/h200-20261204/run")
    ap.add_argument("--loads", type=int, default=5)
    ap.add_argument("--screenshots", type=Path)
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    from llmopt_bench.core.results import load_run
    from llmopt_bench.render.html.write import write_run_html, write_runs_html

    tmp = Path(tempfile.mkdtemp())
    run_dir = ROOT / a.run_dir
    path = write_run_html(load_run(run_dir), tmp, run_dir)
    print(f"{path.name} of {a.run_dir}: {path.stat().st_size / 1e6:.2f} MB")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        times = []
        for _ in range(a.loads):
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            times.append(drawn(page, path.resolve().as_uri()))
            page.close()
        print(f"drawn in {statistics.median(times):.2f} s median over {len(times)} loads "
              f"({', '.join(f'{t:.2f}' for t in times)} s), Chromium {browser.version}")
        if a.screenshots:
            a.screenshots.mkdir(parents=True, exist_ok=True)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            drawn(page, path.resolve().as_uri())
            page.screenshot(path=str(a.screenshots / "run-top.png"))
            page.locator("#load-1").scroll_into_view_if_needed()
            page.evaluate("document.getElementById('load-1').scrollIntoView()")
            page.screenshot(path=str(a.screenshots / "run-serving.png"))
            runs = write_runs_html([load_run(ROOT / d) for d in PAIR], tmp / "runs", tmp / "no-history.sqlite", [Path(d).name for d in PAIR])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            drawn(page, runs.resolve().as_uri())
            page.evaluate("document.getElementById('gate').scrollIntoView()")
            page.screenshot(path=str(a.screenshots / "runs-gate.png"))
            page.evaluate("document.getElementById('side-by-side').scrollIntoView()")
            page.screenshot(path=str(a.screenshots / "runs-side-by-side.png"))
            print(f"screenshots in {a.screenshots}")
        browser.close()


if __name__ == "__main__":
    main()
