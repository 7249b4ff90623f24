"""`llmopt compare` and `llmopt history` as a user runs them, on a real CPU run and modified
copies of its run.json (the helpers in tests/unit/test_compare.py, repeated here so that each
file runs alone)."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import pytest

from testkit import run_cli
from llmopt_bench.distribution import Distribution

BENCH = ("--stages", "hf-fp16", "--model", "synthetic:tiny", "--num-prompts", "16", "--max-new-tokens", "16",
         "--repeats", "2", "--warmup", "1", "--no-report")


def real_run(tmp_path_factory) -> Path:
    """One real run per session, shared with tests/unit/test_compare.py (same fixed path)."""
    out = tmp_path_factory.getbasetemp() / "compare-real-run"
    if not (out / "run.json").is_file():
        prompts = tmp_path_factory.getbasetemp() / "compare-prompts.jsonl"
        prompts.write_text("".join(json.dumps({"id": f"p{i}", "text": f"Question {i}: where is parcel {i}? " * (1 + i % 3)}) + "\n"
                                   for i in range(16)))
        r = run_cli("bench", *BENCH, "--prompts", str(prompts), "--output", str(out))
        assert r.returncode == 0, r.stderr
    return out


def mutate_samples(raw: dict, fn) -> dict:
    """fn(samples) -> {column: values} on each ok stage, metrics made to agree (see the unit test)."""
    raw = copy.deepcopy(raw)
    for s in raw["stages"]:
        if s["status"] != "ok":
            continue
        sm, m = s["samples"], s["metrics"]
        old_e2e = list(sm["e2e_s"])
        sm.update(fn(sm))
        for col in ("ttft_s", "tpot_s", "e2e_s"):
            m[col] = Distribution.of([v for v in sm[col] if v is not None]).model_dump()
        for i, rep in enumerate(sorted(set(sm["repeat"]))):
            idx = [j for j, r in enumerate(sm["repeat"]) if r == rep]
            m["output_tok_s_repeats"][i] /= sum(sm["e2e_s"][j] for j in idx) / sum(old_e2e[j] for j in idx)
        m["output_tok_s"] = sum(m["output_tok_s_repeats"]) / len(m["output_tok_s_repeats"])
    return raw


def scale_tpot(raw: dict, factor: float) -> dict:
    return mutate_samples(raw, lambda sm: {
        "tpot_s": [t * factor if t is not None else None for t in sm["tpot_s"]],
        "e2e_s": [a + (e - a) * factor for a, e in zip(sm["ttft_s"], sm["e2e_s"])]})


def add_noise(raw: dict, pct: float, seed: int, shift: float = 0.0) -> dict:
    rng = random.Random(seed)
    return mutate_samples(raw, lambda sm: {
        col: [x * (1 + shift + rng.uniform(-pct, pct)) if x is not None else None for x in sm[col]]
        for col in ("ttft_s", "tpot_s", "e2e_s")})


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return real_run(tmp_path_factory)


@pytest.fixture(scope="module")
def raw(base) -> dict:
    return json.loads((base / "run.json").read_text())


def write(tmp_path: Path, name: str, raw: dict, as_dir: bool = False) -> Path:
    if as_dir:
        (tmp_path / name).mkdir()
        path = tmp_path / name / "run.json"
    else:
        path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(raw))
    return path.parent if as_dir else path


def test_same_run_exits_0_with_no_regression(base):
    r = run_cli("compare", str(base), str(base / "run.json"))
    assert r.returncode == 0, r.stderr
    assert "No regression" in r.stdout and "REGRESSED" not in r.stdout
    assert "| hf-fp16 | TPOT p50 |" in r.stdout


def test_tpot_20_percent_slower_exits_5(base, raw, tmp_path):
    slow = write(tmp_path, "slow", scale_tpot(raw, 1.2), as_dir=True)
    r = run_cli("compare", str(base), str(slow))
    assert r.returncode == 5, (r.stdout, r.stderr)
    tpot = next(line for line in r.stdout.splitlines() if "| TPOT p50 |" in line)
    assert "REGRESSED" in tpot and "+20.0%" in tpot
    assert "regression(s): hf-fp16 tpot_p50" in r.stderr and "fix: " in r.stderr
    allowed = run_cli("compare", str(base), str(slow), "--max-regression", "tpot=60%", "--max-regression", "e2e=60%,tok_s=60%")
    assert allowed.returncode == 0, allowed.stdout


def test_json_output_to_a_file(base, raw, tmp_path):
    slow = write(tmp_path, "slow", scale_tpot(raw, 1.2))
    out = tmp_path / "cmp" / "compare.json"
    r = run_cli("compare", str(base), str(slow), "--format", "json", "--output", str(out))
    assert r.returncode == 5
    data = json.loads(out.read_text())
    assert json.loads(r.stdout) == data
    assert ["hf-fp16", "tpot_p50"] in data["regressions"]
    tpot = next(m for m in data["stages"][0]["metrics"] if m["metric"] == "tpot_p50")
    assert tpot["verdict"] == "regressed" and tpot["ci"][0] > 1.05 and tpot["change"] == pytest.approx(0.2)


def test_two_percent_noise_exits_0(base, raw, tmp_path):
    noisy = write(tmp_path, "noisy", add_noise(raw, 0.02, seed=11))
    r = run_cli("compare", str(base), str(noisy))
    assert r.returncode == 0, r.stdout
    assert "No regression" in r.stdout
    drift = write(tmp_path, "drift", add_noise(raw, 0.02, seed=12, shift=0.03))  # clear, but below 5%
    r = run_cli("compare", str(base), str(drift))
    assert r.returncode == 0, r.stdout
    assert "REGRESSED" not in r.stdout and "| TPOT p50 |" in r.stdout
    strict = run_cli("compare", str(base), str(drift), "--max-regression", "1%")
    assert strict.returncode == 5, strict.stdout


@pytest.mark.parametrize("edit, what", [
    (lambda r: r["env"].update(gpu="NVIDIA H200"), "device"),
    (lambda r: r["model"].update(source="synthetic:llama2-7b"), "model"),
    (lambda r: r["workload"].update(num_prompts=3), "workload"),
])
def test_mismatched_environment_is_refused_then_forced(base, raw, tmp_path, edit, what):
    other = copy.deepcopy(raw)
    edit(other)
    path = write(tmp_path, "other", other)
    r = run_cli("compare", str(base), str(path))
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "not comparable" in r.stderr and what in r.stderr and "--force" in r.stderr
    forced = run_cli("compare", str(base), str(path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "**forced** despite" in forced.stdout and what in forced.stdout


def test_stage_missing_on_one_side_is_reported(base, raw, tmp_path):
    other = copy.deepcopy(raw)
    other["stages"][0]["name"] = "hf-renamed"
    r = run_cli("compare", str(base), str(write(tmp_path, "renamed", other)))
    assert r.returncode == 0, r.stderr
    assert "only in baseline (ok)" in r.stdout and "only in new (ok)" in r.stdout


def test_stage_that_fails_in_new_exits_5(base, raw, tmp_path):
    other = copy.deepcopy(raw)
    other["stages"][0].update(status="oom", reason="CUDA out of memory", metrics=None, samples=None)
    r = run_cli("compare", str(base), str(write(tmp_path, "oom", other)))
    assert r.returncode == 5
    assert "oom" in r.stdout and "REGRESSED" in r.stdout


def test_usage_errors_exit_2(base, tmp_path):
    assert run_cli("compare", str(base), str(tmp_path / "nothing")).returncode == 2
    bad = run_cli("compare", str(base), str(base), "--max-regression", "fast")
    assert bad.returncode == 2 and "not a percentage" in bad.stderr
    assert run_cli("compare", str(base), str(base), "--format", "xml").returncode == 2


def test_history_add_show_and_chart(base, raw, tmp_path):
    db = tmp_path / "h" / "history.sqlite"
    later = scale_tpot(raw, 1.2)
    later.update(run_id="later-run", created_at="2099-01-01T00:00:00+00:00")
    second = write(tmp_path, "later", later, as_dir=True)
    r = run_cli("history", "add", str(base), str(second), "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("added:") == 2
    again = run_cli("history", "add", str(base), "--db", str(db))
    assert again.returncode == 0 and "already in history" in again.stderr

    shown = run_cli("history", "show", "--stage", "hf-fp16", "--metric", "tpot_p50", "--db", str(db), "--json")
    assert shown.returncode == 0, shown.stderr
    points = json.loads(shown.stdout)
    assert [p["run_id"] for p in points] == ["compare-real-run", "later-run"]
    assert points[0]["verdict"] == "first"
    assert points[1]["verdict"] == "regressed" and points[1]["method"].startswith("bootstrap")
    assert points[1]["change"] == pytest.approx(0.2)

    chart = tmp_path / "charts" / "tpot.png"
    table = run_cli("history", "show", "--metric", "tpot", "--chart", str(chart), "--db", str(db),
                    env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    assert "compare-real-run" in table.stdout and "later-run" in table.stdout and "regressed" in table.stdout
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 5000

    qps = run_cli("history", "show", "--metric", "qps", "--db", str(db), "--json")
    assert qps.returncode == 0 and json.loads(qps.stdout)[1]["method"] == "relative change"
    assert run_cli("history", "show", "--metric", "nosuch", "--db", str(db)).returncode == 2
    assert run_cli("history", "show", "--db", str(tmp_path / "none.sqlite")).returncode == 2
