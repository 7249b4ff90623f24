"""A serving row's typed parts (scenarios/serving/record.py) are written exactly as they were
built: the client's health, the server's clock and the settings keep every key, their order and
their None values through the dump the stages write (exclude_none), and read back the same."""

from __future__ import annotations

from llmopt_bench.client import server_clock as M
from llmopt_bench.client.health import ClientHealth
from llmopt_bench.core.records import RequestSample
from llmopt_bench.scenarios.serving.record import LoadRow, ServingExtra


def histogram(name: str, le_counts: list[tuple[str, int]], total: float) -> str:
    lines = [f"# TYPE {name} histogram"] + [f'{name}_bucket{{le="{le}"}} {n}' for le, n in le_counts]
    return "\n".join(lines + [f"{name}_count {le_counts[-1][1]}", f"{name}_sum {total}"]) + "\n"


PAGE = (histogram("vllm:time_to_first_token_seconds", [("0.01", 1), ("0.1", 3), ("+Inf", 3)], 0.05)
        + histogram("vllm:e2e_request_latency_seconds", [("0.1", 0), ("1.0", 3), ("+Inf", 3)], 0.55)
        + "# TYPE vllm:num_preemptions counter\nvllm:num_preemptions_total 0.0\n")


def clock() -> M.ServerClock:
    """A point's server clock: three requests on the server's page after it, nothing before, no waiting gauge sampled."""
    samples = [RequestSample(request_id=f"r{i}", prompt_id="p", prompt_tokens=4, output_tokens=5, t_submit=0.0,
                             t_first=0.01 * (i + 1), t_done=0.2, ok=True) for i in range(3)]
    return M.server_clock("vllm /metrics", M.Snapshot(), M.parse(PAGE), {"running": [1.0, 2.0], "waiting": [], "kv_usage": [0.1]}, samples)


def test_the_server_clock_is_written_in_its_declared_order():
    c = clock()
    assert list(c) == [k for k in M.ServerClock.__annotations__ if k in c]
    assert "waiting" not in c and c["verdict"] is None and c["client_minus_server"]["itl_s"] is None  # Nones that say something


def test_row_and_extra_parts_keep_their_keys_order_and_nones_through_the_stages_dump():
    health = ClientHealth(requests=3, chunks=7, kernel_clock_share=None, kernel_timed_share=0.5, read_delay_p50_s=None,
                          read_delay_p99_s=0.001, read_delay_max_s=None, send_p50_s=0.002, send_p99_s=None,
                          loop_lag_p50_s=0.0, loop_lag_p99_s=None, loop_lag_max_s=0.01, loop_lag_samples=4,
                          burst_share_read=None, burst_share=1.0, edge_lost_share=None)
    row = LoadRow(phase="search", mode="open", requests=3, completed=3, server_clock=clock())
    row.client = health
    settings = {"slo": "ttft p99 <= 1 s", "burstiness": 1.0, "hold_s": None, "prompts": None, "input_tokens": [4, 4]}
    extra = ServingExtra(target={"kind": "endpoint", "url": "u", "api_key_env": None}, settings=settings, curve=[row])
    written = extra.model_dump(mode="json", exclude_none=True)
    kept = written["curve"][0]
    assert list(kept["client"].items()) == list(vars(health).items())  # every figure, None ones too, in field order
    assert list(kept["server_clock"].items()) == list(clock().items())
    assert list(written["settings"].items()) == list(settings.items())
    assert written["target"] == {"kind": "endpoint", "url": "u", "api_key_env": None}
    back = ServingExtra.model_validate(written)  # read back (run.json -> extra_as)
    assert back.curve[0].client == health and back.curve[0].server_clock == kept["server_clock"]
    assert back.model_dump(mode="json", exclude_none=True) == written
