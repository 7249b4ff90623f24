"""`llmopt compare` and `llmopt history` as a user runs them, on the committed runs and runs built
from their real repeats (tests/gatekit.py): the H200 baseline against itself and its own
repeats, incomplete runs (exit 6), a whole-run slowdown (exit 5) and the fix it suggests, the
history's place and the noise it gives, and `history check` over a nightly series."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
from gatekit import (
    BASELINE,
    CPU_RUNS,
    H200,
    H200_BATCHING,
    load,
    only_stages,
    repeats_run,
    write,
)
from testkit import run_cli


@pytest.fixture
def env(tmp_path) -> dict:
    """No history unless a test adds one (compare reads the default one when it exists)."""
    return {"LLMOPT_HISTORY_DB": str(tmp_path / "no-history.sqlite")}


def compare(*args: str, env: dict) -> tuple[int, str, str]:
    r = run_cli("compare", "--format", "md", *map(str, args), env=env)  # the markdown table: what the asserts read
    return r.returncode, r.stdout, r.stderr


def test_the_baseline_against_itself_passes_by_its_gate_file_and_is_unsettled_without_it(tmp_path, env):
    """No change at all: with the baseline's gate file beside it (issue 46) the figures its noise
    can gate are settled and host-bound hf-fp16's (TPOT 21.3 / 32.7 / 24.0 ms) are watched, said
    as such: exit 0. At the default thresholds those three repeats cannot show it: exit 9, never
    "No regression."; --pass-inconclusive asks for the old pass by name."""
    rc, out, err = compare(BASELINE, BASELINE, env=env)
    assert rc == 0, err
    assert "**No regression.**" in out and "gate file `" in out
    assert "Watched, not settled" in out and "hf-fp16 tpot_p50" in out.split("Watched, not settled", 1)[1]
    rc, out, err = compare(BASELINE, BASELINE, "--no-gate-file", env=env)
    assert rc == 9, err
    assert "**Inconclusive**: " in out and "No regression" not in out and "Incomplete" not in out
    assert "inconclusive: hf-fp16 tpot_p50 (interval " in err and "repeats a side would settle it" in err
    assert "--pass-inconclusive" in err.split("fix: ", 1)[1]
    rc, out, err = compare(BASELINE, BASELINE, "--no-gate-file", "--pass-inconclusive", env=env)
    assert rc == 0 and "**No regression beyond the noise**" in out and "passed by --pass-inconclusive" in out
    for k in range(3):
        one = write(tmp_path / f"repeat{k}", repeats_run(load(BASELINE), [k]))
        rc, out, err = compare(BASELINE, one, "--no-gate-file", env=env)
        assert rc == 9, (k, out, err)
        assert "1 repeat, with the spread of the other run's 3 repeats" in out


@pytest.mark.parametrize("edit, said", [
    (lambda r: r["stages"].pop(4), "vllm: missing from the new run (ok in the baseline)"),
    (lambda r: r["stages"][4].update(status="error", reason="EngineDeadError", metrics=None, samples=None),
     "vllm: error in the new run (EngineDeadError) (ok in the baseline)"),
])
def test_a_stage_removed_or_failed_exits_6_unless_allowed(tmp_path, env, edit, said):
    new = copy.deepcopy(load(BASELINE))
    edit(new)
    path = write(tmp_path / "new", new)
    rc, out, err = compare(BASELINE, path, env=env)
    assert rc == 6, (out, err)
    assert f"**Incomplete comparison**: {said}." in out
    assert f"incomplete comparison: {said}" in err and "--allow-missing" in err and "Traceback" not in err
    rc, out, err = compare(BASELINE, path, "--allow-missing", "vllm-fp8,vllm", "--pass-inconclusive", env=env)
    assert rc == 0, err
    assert "allowed to be missing: vllm, vllm-fp8" in out


def test_a_run_with_no_stages_or_unfinished_exits_6(tmp_path, env):
    empty = load(BASELINE)
    empty.update(stages=[], status="running")
    rc, out, err = compare(BASELINE, write(tmp_path / "empty", empty), env=env)
    assert rc == 6 and "No regression" in out and "the new run is running, not complete" in err
    assert all(f"{s['name']}: missing from the new run" in err for s in load(BASELINE)["stages"])
    cut = load(BASELINE)
    cut["status"] = "interrupted"
    path = write(tmp_path / "cut", cut)
    assert compare(BASELINE, path, env=env)[0] == 6
    assert compare(BASELINE, path, "--allow-missing", "run", "--pass-inconclusive", env=env)[0] == 0


def same_params(raw: dict, like: dict) -> dict:
    """The second H200 session ran continuous-batching without the phases after its load sweep
    (capacity, static replay, mixed): as recorded, not comparable (test_compare.py); aligned here
    to judge its sweep."""
    out = copy.deepcopy(raw)
    out["stages"][0]["params"] = like["stages"][0]["params"]
    return out


def test_a_whole_run_slowdown_exits_5_and_the_fix_never_overwrites_a_run(tmp_path, env):
    """Two H200 sessions of continuous-batching, the second slowed by 20% as a whole."""
    first = only_stages(load(H200), ["continuous-batching"])
    base = write(tmp_path / "base-run", first)
    slow = write(tmp_path / "slow", same_params(repeats_run(load(H200_BATCHING), [0, 1, 2], factor=1.2), first))
    rc, out, err = compare(base, slow, env=env)
    assert rc == 5, (out, err)
    row = next(line for line in out.splitlines() if "| TPOT p50 |" in line)
    assert "**REGRESSED**" in row and "3 repeats / 3 repeats" in row
    assert "regression(s): " in err and "continuous-batching tpot_p50" in err
    assert "Repeat conditions of continuous-batching: baseline not recorded; new not recorded." in out
    fix = err.split("fix: ", 1)[1]
    assert f"{base}/run.json" not in fix and "results/baselines/nvidia-h200-synthetic-llama2-7b.json" in fix
    baseline_file = tmp_path / "baselines" / "h200.json"
    baseline_file.parent.mkdir()
    baseline_file.write_text((base / "run.json").read_text())
    rc, out, err = compare(baseline_file, slow, env=env)
    assert rc == 5 and f"cp {slow}/run.json {baseline_file}" in err
    same = write(tmp_path / "same", same_params(load(H200_BATCHING), first))
    assert compare(base, same, env=env)[0] == 0  # the other session, not slowed


def test_the_table_says_what_each_metric_could_detect(env):
    rc, out, _ = compare(BASELINE, BASELINE, "--format", "json", "--no-gate-file", env=env)
    assert rc == 9
    data = json.loads(out)
    assert ["hf-fp16", "tpot_p50"] in data["inconclusive"] and ["vllm", "tpot_p50"] not in data["inconclusive"]
    mde = {(s["stage"], m["metric"]): m["mde"] for s in data["stages"] for m in s["metrics"]}
    assert mde[("vllm", "tpot_p50")] < 0.1 and mde[("hf-fp16", "tpot_p50")] > 0.5
    assert data["incomplete"] == [] and data["history_runs"] == 0
    _, md, _ = compare(BASELINE, BASELINE, env=env)
    assert "| detectable |" in md and "smallest slowdown this pair catches 80% of the time" in md


@pytest.mark.parametrize("edit, what", [
    (lambda r: r["env"].update(gpu="NVIDIA A100"), "device"),
    (lambda r: r["workload"].update(num_prompts=3), "workload"),
])
def test_mismatched_runs_are_refused_then_forced(tmp_path, env, edit, what):
    other = load(BASELINE)
    edit(other)
    path = write(tmp_path / "other", other)
    rc, out, err = compare(BASELINE, path, env=env)
    assert rc == 2 and "not comparable" in err and what in err and "--force" in err
    rc, out, err = compare(BASELINE, path, "--force", "--pass-inconclusive", env=env)
    assert rc == 0 and "**forced** despite" in out


def test_usage_errors_exit_2(tmp_path, env):
    assert compare(BASELINE, tmp_path / "nothing", env=env)[0] == 2
    rc, _, err = compare(BASELINE, BASELINE, "--max-regression", "fast", env=env)
    assert rc == 2 and "not a percentage" in err
    assert compare(BASELINE, BASELINE, "--format", "xml", env=env)[0] == 2


def test_the_history_lives_in_the_cache_whatever_the_directory(tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    clean = {"LLMOPT_HISTORY_DB": "", "LLMOPT_CACHE": str(tmp_path / "cache")}
    r = run_cli("history", "add", str(CPU_RUNS[0].parent), env=clean, cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cache" / "history.sqlite").is_file() and list(cwd.iterdir()) == []
    shown = run_cli("history", "show", "--json", env=clean, cwd=tmp_path)
    assert shown.returncode == 0 and json.loads(shown.stdout)[0]["run_id"] == load(CPU_RUNS[0])["run_id"]
    own = tmp_path / "own.sqlite"
    assert run_cli("history", "add", str(CPU_RUNS[1]), env={**clean, "LLMOPT_HISTORY_DB": str(own)}, cwd=cwd).returncode == 0
    assert own.is_file()


def test_compare_takes_the_baseline_noise_from_the_history(tmp_path):
    """run05 -> run11 of the 12 CPU runs: the host's load rose in between (TPOT p50 108 -> 474
    ms). Alone, the two runs' repeats cannot tell that from a regression; the ten runs before
    run11 in the history show how far whole runs move on this host."""
    db = tmp_path / "history.sqlite"
    r = run_cli("history", "add", *(str(p.parent) for p in CPU_RUNS), "--db", str(db))
    assert r.returncode == 0 and r.stderr.count("added:") == 12, r.stderr
    a, b = CPU_RUNS[4].parent, CPU_RUNS[10].parent
    rc, out, err = compare(a, b, "--db", db, "--no-history", env={})
    assert rc == 5 and "hf-fp16 tpot_p50" in err and "baseline noise from the history" not in out
    rc, out, err = compare(a, b, "--db", db, env={})
    assert rc == 9 and "REGRESSED" not in out, (out, err)  # the spread of whole runs: neither a pass nor a regression
    assert "baseline noise from the history: 10 earlier run(s)" in out  # run01..run10: none after run11, not run11
    assert "| hf-fp16 | TPOT p50 |" in out and "10 runs in the history" in out


def nightly_series(tmp_path: Path, factor_of, nights: int = 20) -> Path:
    """A history of `nights` runs of the H200 bnb-nf4 and vllm stages: each night three repeats
    drawn from the journey's own, slowed as a whole by factor_of(night)."""
    raw, rng, db = only_stages(load(H200), ["bnb-nf4", "vllm"]), np.random.default_rng(1), tmp_path / "nightly.sqlite"
    dirs = []
    for night in range(nights):
        picks = [int(k) for k in rng.integers(0, 3, size=3)]
        run = repeats_run(raw, picks, factor_of(night), run_id=f"night-{night:02d}",
                          created_at=f"2027-01-{night + 1:02d}T03:00:00+00:00")
        run["workload"]["repeats"] = 3
        dirs.append(str(write(tmp_path / f"night-{night:02d}", run)))
    assert run_cli("history", "add", *dirs, "--db", str(db)).returncode == 0
    return db


def test_history_check_names_the_first_run_of_a_sustained_shift(tmp_path):
    db = nightly_series(tmp_path, lambda night: 1.2 if night >= 13 else 1.0)
    r = run_cli("history", "check", "--db", str(db))
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "vllm tpot_p50: 20 runs, 1 change point(s)" in r.stdout
    assert "from run night-13" in r.stdout and "REGRESSION, still in effect" in r.stdout
    assert "sustained regression(s)" in r.stderr and "--since night-13" in r.stderr
    data = json.loads(run_cli("history", "check", "--db", str(db), "--json").stdout)
    firsts = {(s["stage"], s["metric"]): s["run_id"] for s in data["shifts"] if s["fails"]}
    assert firsts[("vllm", "tpot_p50")] == firsts[("bnb-nf4", "tpot_p50")] == "night-13"
    assert firsts[("vllm", "output_tok_s")] == "night-13"
    accepted = run_cli("history", "check", "--db", str(db), "--since", "night-13")
    assert accepted.returncode == 0, accepted.stdout


def test_history_check_passes_one_noisy_night(tmp_path):
    db = nightly_series(tmp_path, lambda night: 1.5 if night == 11 else 1.0)
    r = run_cli("history", "check", "--db", str(db))
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert "vllm tpot_p50: 20 runs, no change point(s)" in r.stdout
    shown = run_cli("history", "show", "--stage", "vllm", "--db", str(db), "--json")
    points = json.loads(shown.stdout)
    assert [p["run_id"] for p in points][:2] == ["night-00", "night-01"] and points[0]["verdict"] == "first"
    assert points[11]["verdict"] == "regressed" and points[5]["method"] == "history"
    chart = tmp_path / "charts" / "tpot.png"
    drawn = run_cli("history", "show", "--metric", "tpot", "--chart", str(chart), "--db", str(db), env={"COLUMNS": "200"})
    assert drawn.returncode == 0 and "night-11" in drawn.stdout and "regressed" in drawn.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000
    assert run_cli("history", "show", "--metric", "nosuch", "--db", str(db)).returncode == 2
    assert run_cli("history", "check", "--db", str(tmp_path / "none.sqlite")).returncode == 2
