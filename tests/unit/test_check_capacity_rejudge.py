"""`llmopt check capacity --rejudge`: the vLLM client runs a check saved before it stopped (each
run's JSON is written as soon as it ends) judged again without a server, by the same rules as a
finished check: held at C, missed above C, exit 0; the check's own SLO and --above unless given."""

from __future__ import annotations

import json

from simserver import vllm_client_run
from testkit import cli_in_process as main


def saved_check(tmp_path, runs: dict, check: dict | None = None) -> None:
    (tmp_path / "summary.json").write_text(json.dumps({"server": "vllm serve m", "command": "llmopt check capacity",
                                                       "llmopt": {"capacity_rps": 20.0}, "vllm": {},
                                                       "max_failure_rate": 0.01, "warmup_s": 2.0,
                                                       **({"check": check} if check else {})}))
    for label, run in runs.items():
        (tmp_path / f"vllm-{label}").mkdir()
        (tmp_path / f"vllm-{label}" / "openai-x.json").write_text(json.dumps(run))


def test_a_check_stopped_before_its_verdicts_is_judged_from_what_it_saved(tmp_path, capfd):
    saved_check(tmp_path, {"at-capacity-20rps": vllm_client_run(20.0, 30.0, 25.0, latencies=False),
                           "above-capacity-22rps": vllm_client_run(22.0, 30.0, 20.5, latencies=False)})
    code = main(["check", "capacity", "--rejudge", "--slo", "ttft_p99=60s,tpot_p99=1s", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    at, above = summary["vllm"]["at-capacity-20rps"], summary["vllm"]["above-capacity-22rps"]
    assert (at["verdict"], at["rate_rps"], at["judged_by"]) == ("held", 20.0, "llmopt: SLO and steady state")
    assert above["verdict"] == "missed" and above["rate_rps"] == 22.0 and above["why"].startswith("not steady")
    assert code == 0 and "| at-capacity-20rps | 20 | 600 |" in (tmp_path / "summary.md").read_text()
    assert summary["against_vllm"]["where"] == "above-capacity-22rps"
    assert summary["check"] == {"slo": "ttft_p99=60s,tpot_p99=1s", "above": 1.1}
    assert "# Capacity check on one server" in capfd.readouterr().out


def test_rejudge_reads_the_check_s_own_slo_and_above_unless_given(tmp_path, capfd):
    # the check ran under a TTFT limit this run's p99 (about 0.5 s) misses: without --slo, it is judged so again
    saved_check(tmp_path, {"at-capacity-20rps": vllm_client_run(20.0, 30.0, 25.0, latencies=False),
                           "above-capacity-24rps": vllm_client_run(24.0, 30.0, 20.5, latencies=False)},
                check={"slo": "ttft_p99=100ms", "above": 1.2})
    code = main(["check", "capacity", "--rejudge", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    at = summary["vllm"]["at-capacity-20rps"]
    assert at["verdict"] == "missed" and at["why"].startswith("ttft_p99") and code == 5
    assert "error: vLLM's client does not confirm llmopt's capacity (at C: missed ttft_p99" in capfd.readouterr().err


def test_rejudge_without_a_saved_check_is_a_usage_error(tmp_path, capfd):
    assert main(["check", "capacity", "--rejudge", "--out", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert "summary.json is missing" in err and "give that check's --out" in err and len(err.strip().splitlines()) == 2


def test_a_saved_run_the_check_would_not_have_made_names_the_option_to_give(tmp_path, capfd):
    saved_check(tmp_path, {"above-capacity-22rps": vllm_client_run(22.0, 5.0, 20.5, latencies=False)})
    assert main(["check", "capacity", "--rejudge", "--above", "1.2", "--out", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert "is not a run of this check at C = 20 req/s" in err and "give the run's own --above" in err
