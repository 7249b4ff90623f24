"""`llmopt history check --since NAME` names one run: a run's name is its directory's unless
`bench --name` gave one, so two runs of the history can share one (two machines'
results/runs/<timestamp>, two `run` directories); then the name alone is refused with the runs it
could mean, and NAME@CREATED_AT picks one. The history shows each run by its name (issue 46)."""

from __future__ import annotations

import json
from pathlib import Path

from testkit import cli_in_process as main

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "cpu" / "gate-calibration" / "run01"


def test_a_shared_run_id_is_refused_and_id_at_created_picks_one(tmp_path, capfd):
    db = str(tmp_path / "h.sqlite")
    raw = json.loads((RUN / "run.json").read_text())
    for i, created in enumerate(("2026-12-01T10:00:00+00:00", "2026-12-02T10:00:00+00:00")):
        d = tmp_path / f"m{i}" / "run"  # two directories named "run"
        d.mkdir(parents=True)
        (d / "run.json").write_text(json.dumps({**raw, "run_id": "run", "created_at": created}))
        assert main(["history", "add", str(d), "--db", db]) == 0
    capfd.readouterr()
    assert main(["history", "check", "--db", db, "--since", "run"]) == 2
    err = capfd.readouterr().err.splitlines()
    assert err[0] == ("error: --since 'run': 2 runs in the history have this name (created 2026-12-01T10:00:00+00:00, "
                      "2026-12-02T10:00:00+00:00)")
    assert err[1] == "  fix: name one by its name and created time, like --since run@2026-12-02T10:00:00+00:00"
    assert main(["history", "check", "--db", db, "--since", "run@2026-12-02T10:00:00+00:00", "--json"]) == 0
    series = json.loads(capfd.readouterr().out)["series"]
    assert series and all(s["runs"] == 1 for s in series)  # from the second run on: one run in each series
    assert main(["history", "check", "--db", db, "--since", "run@2026-12-03T00:00:00+00:00"]) == 2
    assert "no such run" in capfd.readouterr().err


def test_the_history_calls_each_run_by_its_name(tmp_path, capfd):
    """Runs written in directories of one name ("llmopt-run" on a device) and copied under
    names of their own: the history shows those names, not one run_id repeated, and --since
    takes them; a run.json's own name (bench --name) wins over its directory's."""
    db = str(tmp_path / "h.sqlite")
    raw = json.loads((RUN / "run.json").read_text())
    for i, (folder, own) in enumerate((("monday", None), ("tuesday", None), ("copied-as", "wednesday"))):
        d = tmp_path / folder
        d.mkdir()
        named = {"name": own} if own else {}
        (d / "run.json").write_text(json.dumps({**raw, "run_id": "llmopt-run", **named,
                                                "created_at": f"2026-12-0{i + 1}T10:00:00+00:00"}))
        assert main(["history", "add", str(d), "--db", db]) == 0
    assert "added: monday (" in capfd.readouterr().err
    assert main(["history", "show", "--db", db, "--stage", "hf-fp16", "--json"]) == 0
    points = json.loads(capfd.readouterr().out)
    assert [p["run_name"] for p in points] == ["monday", "tuesday", "wednesday"]
    assert main(["history", "show", "--db", db, "--stage", "hf-fp16"]) == 0
    shown = capfd.readouterr().out
    assert all(name in shown for name in ("monday", "tuesday", "wednesday")) and "llmopt-run" not in shown
    assert main(["history", "check", "--db", db, "--since", "tuesday", "--json"]) == 0
    series = json.loads(capfd.readouterr().out)["series"]
    assert series and all(s["runs"] == 2 for s in series)  # tuesday and wednesday


def test_did_you_mean_a_stage_by_its_spelling(capfd, tmp_path):
    assert main(["bench", "--stages", "hf_fp16,vllm", "-o", str(tmp_path / "r")]) == 2
    assert "fix: did you mean hf-fp16? known stages:" in capfd.readouterr().err
    assert main(["bench", "--stages", "zzz", "-o", str(tmp_path / "r")]) == 2
    assert "did you mean" not in capfd.readouterr().err  # nothing close: no guess
