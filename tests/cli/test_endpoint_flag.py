"""`llmopt bench --endpoint URL --model NAME`: the openai-endpoint stage on a server the user
runs, from one flag. A real closed port (nothing listens on it) is refused cleanly: the stage is
skipped with the reason and the fix, the command exits 3 as for any stage named on the command
line, and no traceback; missing --model is a usage error."""

from __future__ import annotations

import socket

from testkit import read_run, run_cli


def closed_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_endpoint_that_refuses_connections_is_skipped_with_the_fix(tmp_path, tiny_model):
    url = f"http://127.0.0.1:{closed_port()}"
    res = run_cli("bench", "--endpoint", url, "--model", "served-name", "--api-key-env", "MY_KEY", "--slo", "ttft_p90=1s,e2e_p99=3s",
                  "--hold", "600", "--no-report", "--output", str(tmp_path / "run"), env={"MY_KEY": "sk-secret-123"})
    assert res.returncode == 3, res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "connection refused" in res.stderr and "fix:" in res.stderr
    run = read_run(tmp_path / "run")
    (stage,) = run["stages"]
    assert stage["name"] == "openai-endpoint" and stage["status"] == "skipped"
    assert stage["params"]["endpoint"] == url and stage["params"]["model"] == "served-name"
    assert stage["params"]["slo"] == "ttft_p90=1s,e2e_p99=3s"  # --slo reached the serving stage
    assert stage["params"]["hold_s"] == 600  # and --hold
    assert run["model"]["source"] == "endpoint:served-name"
    assert "sk-secret-123" not in (tmp_path / "run" / "run.json").read_text()
    # the server's model is not prepared here, and the server gets the workload defaults, not this CPU's lighter ones
    assert "endpoint:served-name: the server's model, nothing of it prepared here" in res.stderr
    assert "first use writes its checkpoint" not in res.stderr
    assert run["workload"]["max_new_tokens"] == 100 and run["workload"]["num_prompts"] == 8 and not run["workload"]["notes"]


def test_endpoint_without_a_model_name_is_a_usage_error(tmp_path):
    res = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--output", str(tmp_path / "run"))
    assert res.returncode == 2 and "--model" in res.stderr and "Traceback" not in res.stderr


def refused(res) -> str:
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert lines[-2].startswith("error: ") and lines[-1].startswith("  fix: "), res.stderr
    return lines[-2]


def test_endpoint_that_is_not_a_url_is_a_usage_error(tmp_path):
    error = refused(run_cli("bench", "--endpoint", "localhost-8000", "--model", "m", "--output", str(tmp_path / "run")))
    assert "not an http(s) URL" in error and not (tmp_path / "run").exists()


def test_a_bad_slo_is_refused_before_anything_starts(tmp_path):
    error = refused(run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--slo", "ttft_p99=fast",
                            "--output", str(tmp_path / "run")))
    assert "ttft_p99" in error and not (tmp_path / "run").exists()


def test_slo_without_a_serving_stage_is_refused(tmp_path):
    error = refused(run_cli("bench", "--stages", "hf-fp16", "--slo", "ttft_p99=2s", "--output", str(tmp_path / "run")))
    assert "no serving stage" in error and not (tmp_path / "run").exists()


def test_a_negative_hold_or_a_hold_without_a_serving_stage_is_refused(tmp_path):
    error = refused(run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--hold", "-5",
                            "--output", str(tmp_path / "run")))
    assert "--hold -5" in error and not (tmp_path / "run").exists()
    error = refused(run_cli("bench", "--stages", "hf-fp16", "--hold", "60", "--output", str(tmp_path / "run")))
    assert "no serving stage" in error and not (tmp_path / "run").exists()
