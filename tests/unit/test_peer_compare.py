"""The peer check's comparison (scenarios/peer.py): vLLM's saved figures read by their names,
llmopt's side by side, the 5% verdict; and both ways of starting `vllm bench serve`."""

from __future__ import annotations

import pytest

from llmopt_bench.scenarios import peer

VLLM_RESULT = {"median_ttft_ms": 20.0, "median_tpot_ms": 4.0, "output_throughput": 1000.0, "median_itl_ms": 3.9,
               "median_e2el_ms": 500.0, "completed": 100, "failed": 0, "duration": 12.5}


def test_vllm_s_figures_are_read_by_name():
    got = peer.vllm_figures(VLLM_RESULT)
    assert (got["ttft_p50_ms"], got["tpot_p50_ms"], got["output_tok_s"], got["completed"]) == (20.0, 4.0, 1000.0, 100)


@pytest.mark.parametrize("ours,within", [({"ttft_p50_ms": 20.9, "tpot_p50_ms": 3.81, "output_tok_s": 1049.0}, [True, True, True]),
                                         ({"ttft_p50_ms": 21.2, "tpot_p50_ms": 4.0, "output_tok_s": 940.0}, [False, True, False]),
                                         ({"ttft_p50_ms": None, "tpot_p50_ms": 4.0, "output_tok_s": 1000.0}, [False, True, True])])
def test_each_figure_is_judged_against_the_tolerance(ours, within):
    rows = peer.compare(ours, peer.vllm_figures(VLLM_RESULT), 0.05)
    assert [r["figure"] for r in rows] == list(peer.FIGURES) and [r["within"] for r in rows] == within
    if ours["ttft_p50_ms"] is not None:
        assert rows[0]["difference"] == pytest.approx(ours["ttft_p50_ms"] / 20.0 - 1)


def test_both_entry_points_of_vllm_bench_serve():
    args = peer.bench_serve_command("http://h:1", "m", "d.jsonl", 10, 8, rate=2.0, concurrency=4)
    assert peer.bench_serve_argv("py", args, True)[:5] == ["py", "-m", "vllm.entrypoints.cli.main", "bench", "serve"]
    direct = peer.bench_serve_argv("py", args, False)
    assert direct[:2] == ["py", "-c"] and direct[3:] == args[2:]
    compile(direct[2], "bench_serve_main", "exec")  # the fallback program is valid Python
    assert args[args.index("--request-rate") + 1] == "2" and args[args.index("--max-concurrency") + 1] == "4"


def test_vllm_s_client_gets_llmopt_s_extra_fields():
    import json

    args = peer.bench_serve_command("http://h:1", "m", "d.jsonl", 10, 8, extra_body={"return_token_ids": True, "min_tokens": 8})
    assert json.loads(args[args.index("--extra-body") + 1]) == {"min_tokens": 8, "return_token_ids": True}
    assert "--extra-body" not in peer.bench_serve_command("http://h:1", "m", "d.jsonl", 10, 8)


def test_vllm_s_random_dataset_as_a_user_runs_it():
    args = peer.bench_serve_random_command("http://h:1", "m", 450, 100, 3000, tokenizer="/t", rate=49.5, seed=3,
                                           result_dir="out")
    at = {k: args[args.index(k) + 1] for k in ("--dataset-name", "--random-input-len", "--random-output-len", "--num-prompts",
                                               "--request-rate", "--tokenizer", "--seed", "--result-dir")}
    assert at == {"--dataset-name": "random", "--random-input-len": "450", "--random-output-len": "100", "--num-prompts": "3000",
                  "--request-rate": "49.5", "--tokenizer": "/t", "--seed": "3", "--result-dir": "out"}
    assert "--ignore-eos" in args and "--save-result" in args and "--max-concurrency" not in args
    assert "--dataset-path" not in args and "--custom-output-len" not in args
    inf = peer.bench_serve_random_command("http://h:1", "m", 450, 100, 64, concurrency=1)
    assert inf[inf.index("--request-rate") + 1] == "inf" and inf[inf.index("--max-concurrency") + 1] == "1"
