"""A run has a name: `bench --name`, else its directory's, kept in run.json; a run.json from
before names gets the name of the directory it is read from. compare calls the runs by those
names (issue 46: every run was `llmopt-run` or `run`, so compare said "run -> run")."""

from __future__ import annotations

import json
import shutil

from testkit import ROOT
from testkit import cli_in_process as main

from llmopt_bench.core.results import load_run

PAIRS = ROOT / "results" / "cpu" / "gate-pairs"


def test_a_run_from_before_names_is_named_after_its_directory_or_file():
    assert json.loads((ROOT / "results" / "h200" / "run.json").read_text())["run_id"] == "llmopt-run"
    assert load_run(ROOT / "results" / "h200").name == "h200"
    assert load_run(ROOT / "results" / "h200" / "run.json").name == "h200"
    assert load_run(ROOT / "results" / "baselines" / "nvidia-h200-synthetic-llama2-7b.json").name == "nvidia-h200-synthetic-llama2-7b"


def test_a_recorded_name_wins_over_the_directory(tmp_path):
    raw = json.loads((PAIRS / "hf-fp16-round0-a1" / "run.json").read_text())
    (tmp_path / "run.json").write_text(json.dumps({**raw, "name": "before the bump"}))
    run = load_run(tmp_path)
    assert run.name == run.label == "before the bump" and run.run_id == "run"


def test_compare_calls_the_runs_by_their_names(tmp_path, capfd):
    base, new = PAIRS / "hf-fp16-round0-a1", tmp_path / "tonight"
    shutil.copytree(PAIRS / "hf-fp16-round0-a2", new)  # run_id "run" on both sides
    out = tmp_path / "cmp.md"
    main(["compare", str(base), str(new), "--format", "md", "--output", str(out)])
    capfd.readouterr()
    head = out.read_text().splitlines()
    assert head[0] == "## llmopt compare: hf-fp16-round0-a1 → tonight"
    assert head[2].startswith("- baseline: `hf-fp16-round0-a1` (") and head[3].startswith("- new: `tonight` (")
    main(["compare", str(base), str(new), "--format", "json"])
    said = json.loads(capfd.readouterr().out)
    assert (said["baseline"]["name"], said["new"]["name"]) == ("hf-fp16-round0-a1", "tonight")
