"""Stage metrics from raw request samples. The definitions, once:

TTFT = first token - submit; E2E = last token - submit; TPOT = (E2E - TTFT) / (n - 1);
ITL = every gap between consecutive tokens; output tok/s and QPS over each repeat's window
(first submit to last token), each repeat's kept. run.json keeps these statistics of the pooled
requests; the figure every output shows, one statistic over the repeats, is analysis/figures.py's."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from llmopt_bench.core.distribution import Distribution
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.results import Samples, StageMetrics


def ttft(s: RequestSample) -> float:
    return s.t_first - s.t_submit


def e2e(s: RequestSample) -> float:
    return s.t_done - s.t_submit


def tpot(s: RequestSample) -> float | None:
    return (e2e(s) - ttft(s)) / (s.output_tokens - 1) if s.output_tokens > 1 else None


def itls(s: RequestSample) -> list[float]:
    return [b - a for a, b in zip(s.token_times, s.token_times[1:])]


def compute(samples: Iterable[RequestSample]) -> StageMetrics | None:
    all_samples = list(samples)
    ok = [s for s in all_samples if s.ok]
    if not ok:
        return None
    by_repeat: dict[int, list[RequestSample]] = defaultdict(list)
    for s in ok:
        by_repeat[s.repeat].append(s)
    tok_s, qps, tpot_p50 = [], [], []
    for group in by_repeat.values():
        window = max(s.t_done for s in group) - min(s.t_submit for s in group)
        if window > 0:
            tok_s.append(sum(s.output_tokens for s in group) / window)
            qps.append(len(group) / window)
        d = Distribution.of([t for s in group if (t := tpot(s)) is not None])
        if d:
            tpot_p50.append(d.p50)
    return StageMetrics(
        requests=len(ok), failed_requests=len(all_samples) - len(ok),
        output_tokens=sum(s.output_tokens for s in ok), prompt_tokens=sum(s.prompt_tokens for s in ok),
        repeats=len(by_repeat),
        ttft_s=Distribution.of([ttft(s) for s in ok]),
        tpot_s=Distribution.of([t for s in ok if (t := tpot(s)) is not None]),
        itl_s=Distribution.of([g for s in ok for g in itls(s)]),
        e2e_s=Distribution.of([e2e(s) for s in ok]),
        output_tok_s=sum(tok_s) / len(tok_s) if tok_s else None, output_tok_s_repeats=tok_s,
        qps=sum(qps) / len(qps) if qps else None, qps_repeats=qps, tpot_p50_repeats_s=tpot_p50,
    )


def compact(samples: Iterable[RequestSample]) -> Samples:
    """The ok requests' scalars, column-wise, as run.json keeps them."""
    ok = [s for s in samples if s.ok]
    return Samples(ttft_s=[ttft(s) for s in ok], tpot_s=[tpot(s) for s in ok], e2e_s=[e2e(s) for s in ok],
                   output_tokens=[s.output_tokens for s in ok], repeat=[s.repeat for s in ok])
