"""What the report, its charts and the docs say against what the run holds (issue 28): the run's
end-to-end time never below its own stages', where each stage's time went, when each stage
started, the reference's own agreement where it is plotted, "no divergence" where nothing
diverged, each box's sample size, a roofline title inside its figure, and docs that name the
charts a run writes and the dtype a CPU run used."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from testkit import committed_files, committed_runs

from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.records import QualityRecord
from llmopt_bench.core.results import RunResult, Samples, StageMetrics, StageResult, load_run
from llmopt_bench.core.workload import WorkloadConfig

ROOT = Path(__file__).resolve().parents[2]
H200_RESUMED = ROOT / "results" / "h200-20261204" / "run"  # call 1 killed with the machine, then --resume


def test_the_end_to_end_time_is_never_below_the_stages_own():
    from llmopt_bench.render.report import time_section

    run = load_run(H200_RESUMED)
    stages_s = sum(s.duration_s for s in run.stages)
    assert run.wall_s < stages_s  # what made the report say "425 s" beside 892 s of stages
    said = time_section(run)[0]
    assert said.startswith(f"The run took at least {stages_s:.0f} s") and "425 s llmopt counted" in said
    assert "38.5 min passed from its creation to its end" in said


@pytest.mark.parametrize("path", committed_runs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_stage_started_before_it_ended(path):
    """started_at is when the stage's process was spawned: it and its duration lie within the
    run (runs made between c2a3759 and this fix recorded the end there; their files are fixed)."""
    raw = json.loads(path.read_text())
    created = datetime.fromisoformat(raw["created_at"])
    finished = datetime.fromisoformat(raw["finished_at"]) if raw.get("finished_at") else None
    for s in raw["stages"]:
        if not (s.get("started_at") and s.get("duration_s")):
            continue
        start = datetime.fromisoformat(s["started_at"])
        if finished is not None:  # 2 s: both are rounded to the second, and the end is written after the stage
            assert start + timedelta(seconds=s["duration_s"]) <= finished + timedelta(seconds=2), s["name"]
        # a resumed run keeps its created_at: a stage starts after it (the probe runs first, a few seconds)
        assert start >= created - timedelta(seconds=2), s["name"]


def test_the_timeline_sums_each_phase_from_one_message_to_the_next(monkeypatch):
    from llmopt_bench.run import durations

    t = durations.Timeline(started=8.0)
    clock = iter([10.0, 12.0, 12.5, 20.0, 21.0, 30.0])  # read once per change of phase
    monkeypatch.setattr(t, "_clock", lambda: next(clock))
    for msg in ("loading m (bfloat16, eager)", "repeat 1/2", "repeat 1/2", "quality: agreement", "repeat 2/2", "teardown"):
        t.mark(durations.phase_label(msg))
    assert t.close() == {"start-up (process, imports)": 2.0, "loading m": 2.0, "repeat": 1.5, "quality: agreement": 7.5,
                         "teardown": 9.0}
    assert durations.top_phases(t.close(), 22.0, 2) == "teardown 9 s (41%), quality: agreement 7.5 s (34%)"


def test_progress_lines_carry_the_time_since_the_run_began(capsys, monkeypatch):
    from llmopt_bench.render import progress

    now = iter([100.0, 107.4, 3725.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(now))
    r = progress.PlainReporter()
    r.phase("probing")
    r.stage_start("hf-fp16", 1, 1)
    assert capsys.readouterr().err.splitlines() == ["[0:07] llmopt: probing", "[1:00:25] [1/1] hf-fp16: starting"]


def test_the_eta_under_a_minute_and_a_half_is_said_in_seconds():
    from llmopt_bench.run import runner

    said = []
    reporter = type("R", (), {"phase": lambda self, m: said.append(m)})()
    run = RunResult(run_id="t", created_at="now", command="x", workload=WorkloadConfig())
    plans = [runner.StagePlan("hf-fp16")]
    from unittest import mock

    with mock.patch("llmopt_bench.run.durations.eta", return_value=(23.0, 1)):
        runner.say_eta(run, plans, reporter)
    assert said == ["ETA ~23 s for 1 stage(s), from their last run here"]


def test_the_endpoint_run_takes_the_workload_defaults_not_this_cpu_s():
    from llmopt_bench.cli.bench import plans_and_workload

    given: dict = {}  # no workload option given
    _, _, model, cfg = plans_and_workload(None, given, None, False, None, "m", "http://127.0.0.1:9", None, None, None)
    assert model == "endpoint:m" and cfg.max_new_tokens == WorkloadConfig().max_new_tokens and not cfg.notes
    _, _, _, local = plans_and_workload(None, given, None, False, "hf-fp16", None, None, None, None, None)
    assert local.max_new_tokens < WorkloadConfig().max_new_tokens and local.notes  # the CPU's lighter defaults, said


# --- charts --------------------------------------------------------------------------------------

def _stage(name: str, tpot: float, match: float | None, reference: bool = False, n: int = 8) -> StageResult:
    d = Distribution.of([tpot] * 3)
    return StageResult(name=name, status="ok", quality_reference=reference,
                       quality=QualityRecord(token_match_rate=match, first_divergence_mean=20.0),
                       metrics=StageMetrics(requests=n, output_tokens=8 * n, prompt_tokens=8 * n, repeats=1, tpot_s=d, ttft_s=d),
                       samples=Samples(ttft_s=[0.1] * n, tpot_s=[tpot] * n, e2e_s=[1.0] * n, output_tokens=[8] * n,
                                       repeat=[0] * n))


def drawn(monkeypatch, chart, run):
    """The figure a chart function draws, caught before it is saved."""
    from llmopt_bench.render import charts

    figs = []
    monkeypatch.setattr(charts, "_save", lambda fig, path: figs.append(fig) or path)
    assert chart(run, Path("/nonexistent/x.png")) is not None
    return figs[0]


def run_of(*stages: StageResult) -> RunResult:
    return RunResult(run_id="t", created_at="now", command="x", workload=WorkloadConfig(), stages=list(stages))


def test_quality_speed_plots_the_reference_at_its_own_measured_match(monkeypatch):
    from llmopt_bench.render import charts

    fig = drawn(monkeypatch, charts.quality_speed, run_of(_stage("hf-fp16", 0.02, 0.977, reference=True),
                                                         _stage("bnb-int8", 0.04, 0.57)))
    ys = sorted(float(p.get_offsets()[0][1]) for p in fig.axes[0].collections)
    assert ys == pytest.approx([57.0, 97.7])  # not 100: the reference against its own re-run


def test_distributions_name_each_box_s_sample_size(monkeypatch):
    from llmopt_bench.render import charts

    fig = drawn(monkeypatch, charts.distributions, run_of(_stage("hf-fp16", 0.02, 1.0, n=8), _stage("vllm", 0.01, 1.0, n=24)))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["hf-fp16\nn=8", "vllm\nn=24"]


def test_the_roofline_titles_stay_inside_the_figure(monkeypatch):
    from llmopt_bench.render import charts

    fig = drawn(monkeypatch, charts.roofline_chart, load_run(ROOT / "results" / "cpu" / "gate-calibration" / "run01"))
    fig.tight_layout()  # as plotting.save does before it writes the file
    fig.canvas.draw()
    for ax in fig.axes:
        box = ax.title.get_window_extent()
        assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (ax.get_title(), box.x0, box.x1, fig.bbox.width)


# --- the report's words ----------------------------------------------------------------------------

def test_a_reference_that_never_diverged_says_so():
    from llmopt_bench.render.details import quality_line

    same = QualityRecord(reference="hf-fp16", token_match_rate=1.0, first_divergence_mean=32.0, agreement_positions=128)
    line = quality_line(same, is_reference=True)[0]
    assert "no divergence (every one of the 128 tokens matched)" in line and "token 32" not in line
    assert "itself, re-run" in line
    parted = QualityRecord(reference="hf-fp16", token_match_rate=0.9, first_divergence_mean=11.5)
    assert "first divergence at token 11.5 on average" in quality_line(parted)[0]


# --- the docs against the runs ----------------------------------------------------------------------

def test_the_docs_name_every_chart_a_run_writes_and_no_other():
    from llmopt_bench.render.charts import CHARTS

    doc = (ROOT / "docs" / "report.md").read_text()
    listed = set(re.findall(r"^\| `([^`]+\.png)` \|", doc, re.M))
    assert {f"{name}.png" for name in CHARTS} <= listed
    patterns = [re.compile("^" + re.escape(n).replace(re.escape("<stage>"), r"[\w.-]+") + "$") for n in listed]
    written = {p.name for p in committed_files() if p.suffix == ".png" and p.parent.name == "charts"}
    assert written and all(any(p.match(name) for p in patterns) for name in written), written
    cross = {n for n in listed if "<stage>" not in n}
    assert cross == {f"{name}.png" for name in CHARTS}  # no chart listed that nothing draws


def test_the_docs_say_the_dtype_cpu_runs_use():
    """Each committed CPU run's transformers baseline ran in the dtype docs/report.md gives."""
    doc = " ".join((ROOT / "docs" / "report.md").read_text().split())
    dtypes = set()
    for path in (p for p in committed_runs() if p.name == "run.json" and p.is_relative_to(ROOT / "results" / "cpu")):
        run = load_run(path)
        for s in run.stages:
            if s.name == "hf-fp16" and s.load:
                dtypes.add(s.load.implementation.get("dtype"))
    assert dtypes == {"bfloat16"}
    assert "On CPU the baseline runs in bfloat16 where the CPU computes it natively" in doc
