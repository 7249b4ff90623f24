"""The transformers capacity search (scenarios/batching/kv_capacity.hf_capacity) against a card whose
memory holds a fixed number of batch x context tokens: the probe here stands in for the
process that would load the model, so the search itself is what is tested."""

from __future__ import annotations

from pathlib import Path

from llmopt_bench.scenarios.batching.kv_capacity import hf_capacity

GB = 1024**3


def card(budget_tokens: int, calls: list[tuple[int, int]], fail_at: int | None = None):
    def probe(kind, job, timeout_s, workdir):
        b, c = job["batch"], job["context"]
        calls.append((b, c))
        if b == fail_at:
            return {"status": "error", "reason": "probe crashed"}
        if b * c > budget_tokens:
            return {"status": "oom", "memory_at_oom_bytes": b * GB}
        return {"status": "ok", "peak_bytes": b * c}
    return probe


def search(budget: int, contexts, max_batch=64, device="cuda", fail_at=None):
    calls: list[tuple[int, int]] = []
    rows, probes = hf_capacity("m", device, "float16", "eager", contexts, max_batch, 4, 60.0, Path("."),
                               probe=card(budget, calls, fail_at))
    return rows, probes, calls


def test_cuda_search_goes_top_down_and_finds_the_largest_power_of_two_that_fits():
    rows, probes, calls = search(16 * 4096, [4096, 2048])
    at2k, at4k = rows  # shortest context first
    assert (at2k["max_batch"], at2k["oom_at"], at2k["probed"]) == (32, 64, [64, 32])
    assert (at4k["max_batch"], at4k["oom_at"], at4k["probed"]) == (16, 32, [32, 16])
    # the memory reported is the OOM probe's, not the last (successful) one's
    assert at4k["memory_at_oom_bytes"] == 32 * GB and at4k["peak_bytes"] == 16 * 4096
    # batch 64 ran out at 2048 tokens: at 4096 it is not probed again (a model load saved)
    assert at4k["ruled_out"] == {"batches": [64], "because": "batch 64 ran out of memory at 2048 tokens"}
    assert calls == [(64, 2048), (32, 2048), (32, 4096), (16, 4096)]
    assert len(probes) == 4
    from llmopt_bench.scenarios.batching.record import CapacityRow
    from llmopt_bench.scenarios.batching.report import capacity_how

    assert capacity_how(CapacityRow(**at4k)) == "probed [32, 16]; not probed [64]: batch 64 ran out of memory at 2048 tokens"


def test_cuda_search_agrees_with_counting_up_from_one():
    for budget in (1000, 5000, 40_000, 300_000):
        rows, _, _ = search(budget, [1024])
        fits = [b for b in (1, 2, 4, 8, 16, 32, 64) if b * 1024 <= budget]
        want = max(fits) if fits else None
        assert rows[0]["max_batch"] == want
        assert rows[0]["oom_at"] == (None if want == 64 else (want * 2 if want else 1))


def test_ruling_out_gives_what_probing_every_size_gives():
    """For any card and set of contexts, the answers are those of a search that probes every
    context from max_batch down: the largest power of two that fits and the next one up."""
    for budget in (500, 3000, 100_000, 150_000, 10**6):
        for contexts in ([1024, 2048, 4096], [2048, 3072], [512, 8192]):
            rows, _, calls = search(budget, contexts)
            for row in rows:
                c = row["context"]
                fits = [b for b in (1, 2, 4, 8, 16, 32, 64) if b * c <= budget]
                want = max(fits) if fits else None
                assert (row["max_batch"], row["oom_at"]) == (want, None if want == 64 else (want * 2 if want else 1)), (budget, row)
            # and never probes a batch at least as large as one that ran out at a shorter context
            for i, (b, c) in enumerate(calls):
                assert not any(b2 <= b and c2 < c and b2 * c2 > budget for b2, c2 in calls[:i]), (budget, contexts, calls)


def test_no_oom_up_to_max_batch_is_said():
    rows, _, calls = search(10**9, [2048], max_batch=8)
    assert rows[0]["max_batch"] == 8 and rows[0]["oom_at"] is None and calls == [(8, 2048)]
    assert "no OOM up to max_batch=8" in rows[0]["note"]


def test_a_crashed_probe_stops_the_search_and_is_reported():
    rows, _, calls = search(16 * 2048, [2048], fail_at=32)
    assert rows[0]["max_batch"] is None and rows[0]["error"] == "probe crashed"
    assert calls == [(64, 2048), (32, 2048)]


def test_cpu_runs_both_small_sizes():
    rows, _, calls = search(10**9, [512], device="cpu")
    assert rows[0]["probed"] == [1, 2] and rows[0]["max_batch"] == 2 and calls == [(1, 512), (2, 512)]
