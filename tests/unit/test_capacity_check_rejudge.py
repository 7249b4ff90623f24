"""scripts/capacity-check.py --rejudge: the vLLM client runs a check saved before it stopped
(each run's JSON is written as soon as it ends) judged again without a server, by the same
rules as a finished check: held at C, missed above C, exit 0."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from simserver import vllm_client_run

ROOT = Path(__file__).resolve().parents[2]


def script():
    spec = importlib.util.spec_from_file_location("capacity_check", ROOT / "scripts" / "capacity-check.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_check_stopped_before_its_verdicts_is_judged_from_what_it_saved(tmp_path):
    cc = script()
    (tmp_path / "summary.json").write_text(json.dumps({"server": "vllm serve m", "command": "python scripts/capacity-check.py",
                                                       "llmopt": {"capacity_rps": 20.0}, "vllm": {},
                                                       "max_failure_rate": 0.01, "warmup_s": 2.0}))
    runs = {"at-capacity-20rps": vllm_client_run(20.0, 30.0, 25.0, latencies=False),
            "above-capacity-22rps": vllm_client_run(22.0, 30.0, 20.5, latencies=False)}
    for label, run in runs.items():
        (tmp_path / f"vllm-{label}").mkdir()
        (tmp_path / f"vllm-{label}" / "openai-x.json").write_text(json.dumps(run))
    code = cc.main(["--rejudge", "--slo", "ttft_p99=60s,tpot_p99=1s", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    at, above = summary["vllm"]["at-capacity-20rps"], summary["vllm"]["above-capacity-22rps"]
    assert (at["verdict"], at["rate_rps"], at["judged_by"]) == ("held", 20.0, "llmopt: SLO and steady state")
    assert above["verdict"] == "missed" and above["rate_rps"] == 22.0 and above["why"].startswith("not steady")
    assert code == 0 and "| at-capacity-20rps | 20 | 600 |" in (tmp_path / "summary.md").read_text()
    assert summary["against_vllm"]["where"] == "above-capacity-22rps"


def test_rejudge_without_a_saved_check_is_a_usage_error(tmp_path, capsys):
    cc = script()
    with pytest.raises(SystemExit) as stop:
        cc.main(["--rejudge", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "summary.json is missing (give that run's --out)" in capsys.readouterr().err


def test_a_saved_run_the_check_would_not_have_made_names_the_option_to_give(tmp_path, capsys):
    cc = script()
    (tmp_path / "summary.json").write_text(json.dumps({"llmopt": {"capacity_rps": 20.0}, "vllm": {},
                                                       "max_failure_rate": 0.01, "warmup_s": 2.0}))
    (tmp_path / "vllm-above-capacity-22rps").mkdir()
    (tmp_path / "vllm-above-capacity-22rps" / "openai-x.json").write_text(json.dumps(vllm_client_run(22.0, 5.0, 20.5, latencies=False)))
    with pytest.raises(SystemExit) as stop:
        cc.main(["--rejudge", "--above", "1.2", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "is not a run of this check at C = 20 req/s" in err and "give the run's own --above" in err
