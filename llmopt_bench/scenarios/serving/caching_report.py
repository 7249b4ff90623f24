"""How the prefix-caching stage presents its two arms: the same load points with vLLM's prefix
cache off and on, side by side (TTFT, E2E, throughput, the cache's hit rate), the capacities
under the SLO, and the claim "prefix caching cuts TTFT p50 by Nx" judged on the lightest point
both arms measured (the fewest requests in flight: where TTFT is the prompt's prefill, not queueing)."""

from __future__ import annotations

from typing import Any

from llmopt_bench.analysis.narrative.claims import claim_verdict
from llmopt_bench.core.fmt import ms, num, pct, times
from llmopt_bench.core.records import Block, Claim
from llmopt_bench.scenarios.serving.record import CachingArm, LoadRow, PrefixCachingRecord, ServingExtra
from llmopt_bench.scenarios.workload_report import plan_sentence


def _key(row: LoadRow) -> tuple[str, float | None]:
    """What makes two rows the same load point in both arms: phase and concurrency or rate
    (the search's trials differ between arms: left out)."""
    return row.phase, float(row.concurrency) if row.mode == "closed" and row.concurrency is not None else row.rate_rps


def paired(rec: PrefixCachingRecord) -> list[tuple[LoadRow, LoadRow]]:
    """(off, on) rows of the points both arms measured, in the off arm's order."""
    off, on = _arm(rec, False), _arm(rec, True)
    if off is None or on is None:
        return []
    found = {_key(r): r for r in on.curve if r.phase in ("sweep", "point", "replay") and not r.error}
    return [(r, found[_key(r)]) for r in off.curve if r.phase in ("sweep", "point", "replay") and not r.error and _key(r) in found]


def _arm(rec: PrefixCachingRecord, on: bool) -> CachingArm | None:
    return next((a for a in rec.arms if a.enable_prefix_caching is on), None)


def _hit(row: LoadRow) -> Any:
    c = row.cache
    if c is not None and c.hits == 0 and not c.queries:
        return "0 hits"  # prefix caching off: vLLM looks nothing up
    return pct(c.hit_rate) if c is not None and c.hit_rate is not None else "-"


def _ratio(off: float | None, on: float | None) -> str:
    return times(off / on) if off and on else "-"


def comparison_blocks(result: Any) -> list[Block]:
    rec = result.extra_as(ServingExtra).prefix_caching
    if rec is None:
        return []
    pairs = paired(rec)
    rows = [[f"{off.phase} {'c=' + str(off.concurrency) if off.mode == 'closed' else num(off.rate_rps) + ' req/s'}",
             ms(off.ttft_p50_s), ms(on.ttft_p50_s), _ratio(off.ttft_p50_s, on.ttft_p50_s), ms(off.ttft_p99_s), ms(on.ttft_p99_s),
             ms(off.e2e_p50_s), ms(on.e2e_p50_s), off.output_tok_s, on.output_tok_s, _hit(off), _hit(on)] for off, on in pairs]
    out = [Block(text=f"Prefix caching off, then on: the same server config and the same requests (workload `{rec.workload}`, "
                      "the cache emptied before each point of the 'on' arm, so a point's hits are its own). 'off / on' is how "
                      "many times lower TTFT p50 is with the cache; hit rate: prompt tokens served from the cache over those "
                      "looked up (vLLM's counters).",
                 headers=["point", "TTFT p50 ms off", "on", "off / on", "TTFT p99 ms off", "on", "E2E p50 ms off", "on",
                          "out tok/s off", "on", "hit rate off", "on"], rows=rows)]
    caps = [(a, a.capacity_rps) for a in rec.arms if a.capacity_rps is not None]
    if caps:
        out.append(Block(text="Capacity under the SLO: " + "; ".join(
            f"prefix caching {'on' if a.enable_prefix_caching else 'off'} {num(c)} req/s{'' if a.capacity_held else ' (not held)'}"
            for a, c in caps) + "."))
    return out


def caching_claim(result: Any) -> Claim:
    """Prefix caching's TTFT factor at the lightest point both arms measured."""
    rec = result.extra_as(ServingExtra).prefix_caching
    pairs = sorted(paired(rec), key=lambda p: (p[0].mode != "closed", p[0].concurrency or 0, p[0].rate_rps or 0.0)) if rec else []
    off, on = pairs[0] if pairs else (None, None)
    value = off.ttft_p50_s / on.ttft_p50_s if off and on and off.ttft_p50_s and on.ttft_p50_s else None
    where = (f"{off.phase} {'concurrency ' + str(off.concurrency) if off.mode == 'closed' else num(off.rate_rps) + ' req/s'}"
             if off else "")
    hit = f", hit rate {_hit(on)}" if on and on.cache else ""
    return Claim(key="prefix-caching-ttft", claim="Prefix caching cuts TTFT on prompts that share a prefix",
                 target="TTFT p50 lower with prefix caching on (> 1x), same server and requests",
                 measured=f"{num(ms(off.ttft_p50_s))} -> {num(ms(on.ttft_p50_s))} ms ({times(value)}) at {where}{hit}" if value and off and on
                 else "-", value=value, verdict=claim_verdict(None if value is None else value > 1.0),
                 detail=f"workload {rec.workload}" if rec else "needs both arms of the prefix-caching stage")


def _point(r: LoadRow) -> str:
    return f"{r.phase} {'c=' + str(r.concurrency) if r.mode == 'closed' else num(r.rate_rps) + ' req/s'}"


def workload_blocks(result: Any, rows: list[LoadRow]) -> list[Block]:
    """What a serving stage's generated workload was, its prefix cache over each point, and a
    multi-turn point's TTFT by turn (docs/workloads.md)."""
    out = []
    plan = result.facts.workload if result.facts else None
    if plan is not None:
        out.append(Block(text=plan_sentence(plan)))
    cached = [r for r in rows if r.cache is not None]
    if cached:
        out.append(Block(text="Prefix cache and KV cache over each point (the engine's counters, the requests' own cached tokens, "
                              "the KV-cache gauge sampled during the point):",
                         headers=["point", "looked up", "hits", "hit rate", "requests' cached tokens", "KV use peak", "KV use mean",
                                  "preemptions", "emptied before"],
                         rows=[[_point(r), r.cache.queries, r.cache.hits, _hit(r), r.cache.cached_tokens, pct(r.cache.kv_usage_peak),
                                pct(r.cache.kv_usage_mean), r.cache.preemptions, num(r.cache.reset)] for r in cached if r.cache]))
    for r in rows:
        if r.turns:
            out.append(Block(text=f"{_point(r)}, by turn (a later turn's prompt carries the conversation so far):",
                             headers=["turn", "requests", "prompt tokens p50", "cached tokens p50", "TTFT p50 ms", "TTFT p99 ms"],
                             rows=[[t.turn, t.n, t.prompt_tokens_p50, t.cached_tokens_p50, ms(t.ttft_p50_s), ms(t.ttft_p99_s)]
                                   for t in r.turns]))
    return out
