"""One figure of one run is one number in every output (issue 46): every committed run is rendered
by every output that shows a stage's figures (the terminal table, report.md's tables, claims and
conclusions, stages.csv, report.json, compare's markdown and JSON, the history, recommend's JSON),
each output's numbers are read back per (stage, figure), and two readings of one figure must be two
roundings of one number: |a - b| within half a unit of each one's last shown digit. On the code
before analysis/figures.py, results/h200 read hf-fp16's TPOT p50 as 24.8 ms in the report and
25.59 ms in compare, vllm's speedup as 5.51x in the Speedups table and 5.68x in the Conclusions.

And a history's change is the change between the two values its rows show."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections import defaultdict
from pathlib import Path

import pytest

from llmopt_bench.analysis.gate.compare import compare_runs
from llmopt_bench.analysis.metric_registry import REGISTRY
from llmopt_bench.analysis.selectors import baseline, reference
from llmopt_bench.core.results import RunResult, load_run
from llmopt_bench.render.compare_text import comparison_json, to_markdown
from llmopt_bench.render.exports import report_data, write_csv
from llmopt_bench.render.report import render_markdown
from llmopt_bench.render.table import print_summary
from llmopt_bench.run.history import add_run, trend

ROOT = Path(__file__).resolve().parents[2]
RUNS = sorted(p.parent for p in (ROOT / "results").rglob("run.json"))
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")
HISTORY_METRICS = ("tpot_p50", "ttft_p50", "e2e_p50", "output_tok_s", "tpot_p99", "peak_memory")

Reading = tuple[str, float, float]  # (the output, the value read, half a unit of its last shown digit)


def shown(text: str) -> tuple[float, float] | None:
    """A number as an output printed it ("25.59 ms", "110 (~max)", "5.68x", "1.2e-05"): its value
    and half a unit of its last digit; None for "-" and words."""
    m = NUMBER.search(text.replace(",", ""))
    if m is None:
        return None
    mantissa, _, exp = m.group(0).lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return float(m.group(0)), 0.5 * 10 ** (int(exp or 0) - decimals)


def exact(value: float) -> tuple[float, float]:
    """A number an output keeps whole (CSV, JSON): only float noise around it."""
    return value, abs(value) * 1e-9


class Readings:
    def __init__(self) -> None:
        self.by_figure: dict[tuple[str, str], list[Reading]] = defaultdict(list)

    def text(self, output: str, stage: str, key: str, text: str) -> None:
        if (v := shown(text)) is not None:
            self.by_figure[(stage, key)].append((output, *v))

    def value(self, output: str, stage: str, key: str, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self.by_figure[(stage, key)].append((output, *exact(value)))

    def disagreements(self) -> list[str]:
        out = []
        for (stage, key), readings in self.by_figure.items():
            for i, (out_a, a, ha) in enumerate(readings):
                for out_b, b, hb in readings[i + 1:]:
                    if abs(a - b) > ha + hb + 1e-12 * max(abs(a), abs(b)):
                        out.append(f"{stage} {key}: {out_a} {a:g} vs {out_b} {b:g}")
        return out


def markdown_table(lines: list[str], first_header: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of the markdown table whose header row starts with `first_header`."""
    start = next((i for i, line in enumerate(lines) if line.startswith(f"| {first_header} ")), None)
    if start is None:
        return [], []
    cells = lambda line: [c.strip() for c in line.strip().strip("|").split("|")]  # noqa: E731
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(cells(line))
    return cells(lines[start]), rows


def read_report(run: RunResult, r: Readings) -> None:
    """report.md: the stage table, the Speedups table, the two claims that quote figures, the conclusions."""
    lines = render_markdown(run, charts={}).splitlines()
    by_header = {m.header: k for k, m in REGISTRY.items()}
    head, rows = markdown_table(lines, "stage | status")
    for row in rows:
        for h, cell in zip(head, row):
            if h in by_header and not (h == "n"):
                r.text("report.md stages", row[0], by_header[h], cell)
    speedup_keys = {"TPOT vs baseline": "tpot_x_baseline", "E2E vs baseline": "e2e_x_baseline",
                    "tok/s vs baseline": "output_tok_s_x_baseline", "TPOT vs previous": "tpot_x_previous",
                    "tok/s vs previous": "output_tok_s_x_previous"}
    head, rows = markdown_table(lines, "stage | TPOT vs baseline")
    for row in rows:
        for h, cell in zip(head, row):
            if h in speedup_keys:
                r.text("report.md speedups", row[0], speedup_keys[h], cell)
    base, ref = baseline(run), reference(run)
    for line in lines:
        if base is not None and (m := re.match(r"\| 30 s to 2 s a request \| [^|]+ \| ([^ |]+)[^|]* \| [^|]+ \| "
                                               r"(\S+) E2E p50 (\S+) s -> (\S+) (\S+) s", line)):
            r.text("claim overall", m.group(4), "e2e_x_baseline", m.group(1))
            r.text("claim overall", m.group(2), "e2e_p50", m.group(3))
            r.text("claim overall", m.group(4), "e2e_p50", m.group(5))
        if m := re.match(r"\| vLLM cuts per-token latency \| [^|]+ \| ([^ |]+)[^|]* \| [^|]+ \| TPOT p50 (\S+) ms \((\S+)\) "
                         r"vs (\S+) ms \((\S+)\)", line):
            if base is not None and ref is not None and ref.name == base.name:  # a ratio to the baseline
                r.text("claim vllm-latency", m.group(5), "tpot_x_baseline", m.group(1))
            r.text("claim vllm-latency", m.group(3), "tpot_p50", m.group(2))
            r.text("claim vllm-latency", m.group(5), "tpot_p50", m.group(4))
        if m := re.match(r"- (?:The fastest decode is|.*the fastest other is) (\S+) at (\S+) ms/token, (\S+) the baseline", line):
            r.text("conclusion fastest decode", m.group(1), "tpot_p50", m.group(2))
            r.text("conclusion fastest decode", m.group(1), "tpot_x_baseline", m.group(3))
        if m := re.match(r"- (?:The highest output throughput is|.*the best other is) (\S+) at (\S+) tok/s, (\S+) the baseline", line):
            r.text("conclusion throughput", m.group(1), "output_tok_s", m.group(2))
            r.text("conclusion throughput", m.group(1), "output_tok_s_x_baseline", m.group(3))
        if line.startswith("- TPOT speedups against ") and ": " in line:
            for name, x in re.findall(r"(\S+) (\d+\.\d+)x \[", line.split(": ", 1)[1]):
                r.text("conclusion speedups", name, "tpot_x_baseline", x)


def read_exports(run: RunResult, r: Readings, tmp: Path) -> None:
    """stages.csv and report.json: the stage rows, the figures, the speedups, the roofline's timings."""
    by_csv = {m.csv: k for k, m in REGISTRY.items() if m.csv}
    with open(write_csv(run, tmp), newline="") as f:
        for row in csv.DictReader(f):
            for col, key in by_csv.items():
                if row.get(col) and key != "requests":
                    r.value("stages.csv", row["stage"], key, float(row[col]))
    data = report_data(run)
    for row in data["stages"]:
        for col, key in by_csv.items():
            if key != "requests":
                r.value("report.json stages", row["stage"], key, row[col])
    for stage, figures in data["figures"].items():
        for key, f in figures.items():
            r.value("report.json figures", stage, key, f["value"])
    for row in data["speedups"]:
        for key in ("tpot_x_baseline", "e2e_x_baseline", "output_tok_s_x_baseline", "tpot_x_previous", "output_tok_s_x_previous"):
            r.value("report.json speedups", row["stage"], key, row[key])
    for row in data["roofline"]:
        s = run.stage(row["stage"])
        if s is not None and not (s.facts.decode_batch is None and s.facts.batch1_tpot_s):  # timed by the stage's figures
            r.value("report.json roofline", row["stage"], "tpot_p50" if row["phase"] == "decode" else "ttft_p50",
                    row["measured_s"] * 1e3)


def read_terminal(run: RunResult, r: Readings) -> None:
    """The end-of-run table at a width that holds every column, and stacked one stage a block
    at a narrow one ("  TPOT p50 ms: 25.59")."""
    from rich.console import Console

    keys = ("load_s", "ttft_p50", "tpot_p50", "e2e_p50", "output_tok_s", "peak_memory")  # its columns after stage, status
    names = {s.name for s in run.stages}
    out = io.StringIO()
    print_summary(run, Console(file=out, width=250, color_system=None))
    for line in out.getvalue().splitlines():
        cells = line.split()
        if len(cells) == 2 + len(keys) and cells[0] in names:
            for key, cell in zip(keys, cells[2:]):
                r.text("terminal table", cells[0], key, cell)
    labels = {"load s": "load_s", "TTFT p50 ms": "ttft_p50", "TPOT p50 ms": "tpot_p50", "E2E p50 s": "e2e_p50",
              "output tok/s": "output_tok_s", "peak mem GB": "peak_memory"}
    out = io.StringIO()
    print_summary(run, Console(file=out, width=20, color_system=None, soft_wrap=True))  # lines unwrapped
    stage = None
    for line in out.getvalue().splitlines():
        if (m := re.match(r"^(\S+): \S+$", line)) and m.group(1) in names:
            stage = m.group(1)
        elif stage and (m := re.match(r"^  (.+): (.+)$", line)) and m.group(1) in labels:
            r.text("terminal stacked", stage, labels[m.group(1)], m.group(2))


def read_compare(run: RunResult, r: Readings) -> None:
    """compare's markdown and JSON of the run against itself (baseline and new are its figures)."""
    cmp = compare_runs(run, run, resamples=100, force=True)
    by_label = {m.label: k for k, m in REGISTRY.items()}
    head, rows = markdown_table(to_markdown(cmp).splitlines(), "stage | metric")
    for row in rows:
        if row[1] in by_label:
            r.text("compare md", row[0], by_label[row[1]], row[2])
    for sd in comparison_json(cmp)["stages"]:
        for md in sd["metrics"]:
            r.value("compare json", sd["stage"], md["metric"], md["baseline"])


def read_recommend(run: RunResult, r: Readings) -> None:
    """recommend's JSON: the figures it quotes of the fixed workload's stages (batch-1 TPOT where
    the stage measured none apart, the not-saturated tok/s, the energy per token)."""
    from llmopt_bench.analysis.recommend.choose import recommend
    from llmopt_bench.analysis.scaling import NOT_SATURATED

    try:
        data = recommend(run).as_dict()
    except Exception:  # noqa: BLE001 - a run recommend cannot answer quotes no figure
        return
    for c in data.get("candidates") or []:
        s = run.stage(c.get("name") or "")
        if s is None:
            continue
        if c.get("batch1_tpot_s") and not s.facts.batch1_tpot_s:
            r.value("recommend json", c["name"], "tpot_p50", c["batch1_tpot_s"] * 1e3)
        if c.get("saturated_tok_s") and c.get("saturated_how") == NOT_SATURATED:
            r.value("recommend json", c["name"], "output_tok_s", c["saturated_tok_s"])
        r.value("recommend json", c["name"], "j_per_token", c.get("j_per_token"))


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict[tuple[str, str, str, str], float]:
    """Every committed run in one history; each figure's value as `history show --json` gives it,
    by (run_id, created_at, stage, metric)."""
    from llmopt_bench.run.history import dump

    db = tmp_path_factory.mktemp("history") / "h.sqlite"
    for d in RUNS:
        add_run(db, load_run(d))
    out = {}
    for metric in HISTORY_METRICS:
        for p in json.loads(dump(trend(db, metric, resamples=100), metric)):
            if p["value"] is not None:
                out[(p["run_id"], p["created_at"], p["stage"], metric)] = p["value"]
    return out


def test_every_committed_run_is_read():
    assert len(RUNS) >= 50 and ROOT / "results" / "h200" in RUNS


@pytest.mark.parametrize("run_dir", RUNS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_one_figure_of_one_run_is_one_number_in_every_output(run_dir, history, tmp_path):
    run = load_run(run_dir)
    r = Readings()
    read_report(run, r)
    read_exports(run, r, tmp_path)
    read_terminal(run, r)
    read_compare(run, r)
    read_recommend(run, r)
    for (run_id, created, stage, metric), value in history.items():
        if (run_id, created) == (run.run_id, run.created_at) and run.stage(stage) is not None:
            r.value("history json", stage, metric, value)
    compared = [k for k, v in r.by_figure.items() if len({out for out, *_ in v}) >= 3]
    if any(s.status == "ok" and s.metrics for s in run.stages):
        assert compared, "no figure was read from three outputs: the readers no longer find them"
    assert not r.disagreements(), "\n".join(r.disagreements()[:20])


def test_the_reader_catches_two_numbers_for_one_figure():
    """The check itself: 24.8 (one decimal) and 25.59 are not two roundings of one number, 25.6 and 25.59 are."""
    r = Readings()
    r.text("a", "hf-fp16", "tpot_p50", "24.8")
    r.text("b", "hf-fp16", "tpot_p50", "25.59 ms")
    assert r.disagreements() == ["hf-fp16 tpot_p50: a 24.8 vs b 25.59"]
    r = Readings()
    r.text("a", "hf-fp16", "tpot_p50", "25.6")
    r.text("b", "hf-fp16", "tpot_p50", "25.59 ms")
    r.text("c", "hf-fp16", "tpot_p50", "110 (~max)")  # a p99's caveat does not change its number
    r.by_figure[("hf-fp16", "tpot_p50")].pop()
    assert r.disagreements() == []


def test_a_history_change_is_the_change_between_the_values_it_shows(tmp_path, capsys, monkeypatch):
    """`history show`: each row's change is its value over the previous row's, less 1, for the
    judged figures (compare's method) as for the others (a relative change); on the CPU gate pairs,
    where the host disturbed some repeats (set aside by compare) and the repeats spread."""
    from llmopt_bench.render.history_text import print_trend

    db = tmp_path / "h.sqlite"
    pairs = sorted((ROOT / "results" / "cpu" / "gate-pairs").glob("hf-fp16-round[0-2]-a[12]"))
    assert len(pairs) == 6
    for d in pairs:
        add_run(db, load_run(d))
    checked = 0
    for metric in ("tpot_p50", "output_tok_s", "tpot_p99"):
        points = trend(db, metric, "hf-fp16", resamples=100)
        for prev, p in zip(points, points[1:]):
            if p.change is not None:
                assert p.change == pytest.approx(p.value / prev.value - 1, rel=1e-9, abs=1e-12), (metric, p)
                checked += 1
        monkeypatch.setenv("COLUMNS", "250")
        print_trend(points, metric)
        rows = [line for line in capsys.readouterr().out.splitlines() if line.lstrip().startswith("hf-fp16")]
        shown_values = [shown(re.split(r"\s{2,}", line.strip())[5]) for line in rows]
        changes = [re.split(r"\s{2,}", line.strip())[6] for line in rows]
        for (a, ha), (b, hb), text in zip(shown_values, shown_values[1:], changes[1:]):
            if text != "-":  # the printed change agrees with the printed values, to their digits
                lo, hi = (b - hb) / (a + ha) - 1, (b + hb) / (a - ha) - 1
                assert lo - 0.0005 <= float(text.rstrip("%")) / 100 <= hi + 0.0005, (metric, a, b, text)
    assert checked >= 10
