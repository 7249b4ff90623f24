"""`llmopt compare` as a newcomer meets it (issue 28): stages measured with other params are not
compared and say so as `history show` does; exit 6's fix says what to do with each gap and never
`--resume` on a run it would not change, and `--resume --rerun` for a stage that failed; the promote command never copies a file onto itself; an
unknown --allow-missing name is refused with a did-you-mean; one vocabulary ("inconclusive");
exactly one regression still exits 5. On the committed H200 runs and runs built from their real
repeats (tests/gatekit.py)."""

from __future__ import annotations

import copy
import shutil

import pytest
from gatekit import BASELINE, H200, H200_BATCHING, load, only_stages, repeats_run, write
from testkit import run_cli

from llmopt_bench.core.results import load_run
from llmopt_bench.run.history import add_run, trend


@pytest.fixture
def env(tmp_path) -> dict:
    return {"LLMOPT_HISTORY_DB": str(tmp_path / "no-history.sqlite")}


def compare(*args, env: dict, cwd=None) -> tuple[int, str, str]:
    r = run_cli("compare", "--format", "md", *map(str, args), env=env, cwd=cwd)  # the markdown table
    return r.returncode, r.stdout, r.stderr


def test_stages_with_other_params_are_not_comparable_in_compare_as_in_history(tmp_path, env):
    """The committed H200 journey's continuous-batching against a session that ran it without
    its capacity, static-replay and mixed phases: compare paired them (and, reversed, exited 5
    on its peak memory); now neither direction compares them."""
    a = write(tmp_path / "a", only_stages(load(H200), ["continuous-batching"]))
    b = write(tmp_path / "b", load(H200_BATCHING))
    for base, new in ((a, b), (b, a)):
        rc, out, err = compare(base, new, env=env)
        assert rc == 6, (out, err)
        row = next(line for line in out.splitlines() if line.startswith("| continuous-batching |"))
        assert "not comparable: params differ (capacity " in row and "REGRESSED" not in out
        assert "ran with other params: compare against a baseline made with the same params" in err
        assert "--allow-missing continuous-batching" in err
    assert compare(a, b, "--allow-missing", "continuous-batching", env=env)[0] == 0
    db = tmp_path / "h.sqlite"
    for path in (a, b):
        add_run(db, load_run(path))
    assert [p.verdict for p in trend(db, "tpot_p50", "continuous-batching")] == ["first", "not comparable"]


def test_exit_6_on_a_complete_run_says_how_to_add_the_stage_not_to_resume_it(tmp_path, env):
    new = copy.deepcopy(load(BASELINE))
    new["stages"] = [s for s in new["stages"] if s["name"] != "vllm"]
    path = write(tmp_path / "new", new)
    rc, _, err = compare(BASELINE, path, env=env)
    assert rc == 6
    fix = err.split("fix: ", 1)[1]
    assert f"measure the missing stages into it: llmopt bench --resume {path} --stages vllm" in fix
    assert "finish the run" not in fix and "--allow-missing vllm" in fix
    new["status"] = "interrupted"
    rc, _, err = compare(BASELINE, write(tmp_path / "cut", new), env=env)
    assert rc == 6 and f"finish the run: llmopt bench --resume {tmp_path / 'cut'}" in err


def test_exit_6_on_a_failed_stage_says_how_to_measure_it_again_in_place(tmp_path, env):
    """Issue 33: a flaky stage used to cost a new run (--resume kept it); --rerun measures it again."""
    new = copy.deepcopy(load(BASELINE))
    next(s for s in new["stages"] if s["name"] == "vllm").update(status="error", reason="EngineDeadError", metrics=None,
                                                                  samples=None)
    path = write(tmp_path / "new", new)
    rc, _, err = compare(BASELINE, path, env=env)
    assert rc == 6 and f"then measure it again in place: llmopt bench --resume {path} --rerun vllm" in err


def test_the_promote_command_never_copies_a_file_onto_itself(tmp_path, env):
    """Reversed: a run directory as the baseline and the committed baseline file, slower, as the
    new run; the file a baseline directory would be promoted to is that very file."""
    (tmp_path / "results" / "baselines").mkdir(parents=True)
    shutil.copy(BASELINE, tmp_path / "results" / "baselines" / BASELINE.name)
    faster = write(tmp_path / "faster-run", repeats_run(load(BASELINE), [0, 1, 2], factor=0.5))
    rc, _, err = compare(faster, f"results/baselines/{BASELINE.name}", env=env, cwd=tmp_path)
    assert rc == 5, err
    fix = err.split("fix: ", 1)[1]
    assert "cp " not in fix and f"the new run is already a baseline file (results/baselines/{BASELINE.name})" in fix
    rc, _, err = compare(BASELINE, BASELINE, "--max-regression", "0%", env=env)
    assert "cp " not in err  # never `cp X X`, whatever the verdict


def test_an_unknown_allow_missing_name_is_refused_with_a_did_you_mean(env):
    rc, out, err = compare(BASELINE, BASELINE, "--allow-missing", "vllm,vlm", env=env)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert "error: --allow-missing 'vlm': no such stage in either run" in err and "did you mean vllm?" in err
    assert compare(BASELINE, BASELINE, "--allow-missing", "run,all,vllm-fp8,hf-compiled", "--pass-inconclusive", env=env)[0] == 0


def test_one_vocabulary_with_history_show(tmp_path, env):
    """A change beyond the threshold whose interval reaches back: "inconclusive", as history show
    says, with the repeats a side that would settle it (hf-fp16's: its repeats spread by 53%; gated,
    as it is at the default thresholds, not watched as the baseline's gate file has it)."""
    slow = write(tmp_path / "slow", repeats_run(load(BASELINE), [0, 1, 2], factor=1.15))
    rc, out, _ = compare(BASELINE, slow, "--no-gate-file", env=env)
    hf = next(line for line in out.splitlines() if line.startswith("| hf-fp16 | TPOT p50 |"))
    assert hf.endswith("| **inconclusive**: ~191 repeats a side would settle it |") and "within noise" not in out
    assert rc == 5  # vllm's 15% slowdown, its repeats within 0.2%, is a regression


def test_exactly_one_regression_exits_5(tmp_path, env):
    """One stage slowed 1.2x, every metric allowed 900% but TPOT 5%: one regression, exit 5."""
    raw = load(BASELINE)
    slow = repeats_run(raw, [0, 1, 2], factor=1.2)
    slow["stages"] = [s if s["name"] == "vllm" else b for s, b in zip(slow["stages"], copy.deepcopy(raw["stages"]))]
    rc, out, err = compare(BASELINE, write(tmp_path / "slow", slow), "--max-regression", "900%,tpot=5%", env=env)
    assert rc == 5, (out, err)
    assert "**1 regression(s)**: vllm tpot_p50" in out and "error: 1 regression(s): vllm tpot_p50" in err
