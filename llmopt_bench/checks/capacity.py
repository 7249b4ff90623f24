"""`llmopt check capacity`: llmopt's capacity under the SLO on ONE running `vllm serve` (started as
every served configuration is: engines/vllm/served.py), confirmed by vLLM's own client.

On one server (vLLM's default scheduler limits, prefix caching off), with random tokens (450 in /
100 out by default, the output forced):

1. llmopt's serving scenario (scenarios/serving/run.py, the vllm-serve stage's): a closed-loop
   sweep (its concurrency-1 point: llmopt's batch-1 TTFT/TPOT), the ceiling (saturation_requests
   of the workload's requests at once), the capacity search from just under that ceiling down to
   the precision within search_budget_s seconds of load, and the hold at the answer;
2. `vllm bench serve --dataset-name random` at the capacity C and at above x C (where llmopt found
   one), each bench_s
   worth of Poisson arrivals, every request's figures kept and judged by llmopt's own verdict
   (scenarios/peer/judge.py: the SLO, and the steady state: a run whose completions fall behind
   its arrivals misses whatever its latencies): held at C and missed at above x C is the check;
3. `vllm bench serve` at concurrency 1 and all at once, beside llmopt's concurrency-1 point and
   its ceiling point (judged by the same verdict, closed loops: no steady state).

Around every point of either client the server's own clock is read (client/server_clock.py).
Every output lands in `out`: llmopt.json, vllm-*/ (each run's saved JSON, command and log),
summary.json and summary.md, the server's log; each phase is written as soon as it ends. The
budget bounds the whole run; a phase whose estimate does not fit what is left is skipped and said
so. rejudge() judges the vLLM runs saved in `out` again without a server."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from llmopt_bench.checks.progress import Budget, g, ms, portable
from llmopt_bench.core.errors import ExitCode, LlmoptError, UsageError
from llmopt_bench.core.records import StrictModel
from llmopt_bench.core.slo import SLO, default_slo
from llmopt_bench.core.workload import Request, Sampling

VLLMRun = Literal["capacity", "batch1", "inf"]
VLLM_RUNS: tuple[VLLMRun, ...] = ("capacity", "batch1", "inf")  # vLLM's client runs, by kind


class CapacityCheck(StrictModel):
    """What `llmopt check capacity` runs (its options, checked: cli/check.py)."""

    model: str = "synthetic:tiny"
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    max_model_len: int = Field(4096, ge=16)
    enforce_eager: bool = False
    input_len: int = Field(450, ge=1)
    output_len: int = Field(100, ge=2)
    slo: SLO = Field(default_factory=default_slo)
    hold_s: float = Field(60.0, ge=0)
    bench_s: float = Field(60.0, gt=0)
    concurrency: list[int] = Field(default_factory=lambda: [1, 16, 64])
    requests_per_point: int = Field(64, ge=2)
    precision: float = Field(0.05, gt=0, lt=1)
    search_budget_s: float = Field(240.0, gt=0)
    above: float = Field(1.1, gt=1)
    max_point_s: float = Field(60.0, gt=0)
    batch1_prompts: int = Field(64, ge=1)
    saturation_requests: int = Field(256, ge=1)
    vllm_runs: list[VLLMRun] = Field(default_factory=lambda: list(VLLM_RUNS), min_length=1)
    client_cpus: tuple[int, ...] | None = None
    seed: int = 0
    budget_s: float = Field(1500.0, gt=0)
    sampling: Sampling = Field(default_factory=Sampling)
    prompt_format: Literal["text", "tokens"] = "text"
    out: Path
    command: str = "llmopt check capacity"


def random_requests(tok: Any, n: int, input_len: int, seed: int) -> list[Request]:
    """n prompts of input_len random token ids, none of them special (as vLLM's random dataset)."""
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]
    rng = random.Random(seed)
    return [Request(f"r{i:04d}", f"random{i}", tuple(rng.choice(vocab) for _ in range(input_len))) for i in range(n)]


def run_estimate(c: CapacityCheck, label: str) -> float:
    """The seconds one of vLLM's client runs takes, by its label."""
    if label.startswith("at-capacity"):
        return c.bench_s * 1.5 + 30
    if label.startswith("above-capacity"):
        return c.bench_s * 2 + 30
    return c.batch1_prompts * 2.0 + 30 if label == "concurrency-1" else 90.0


def vllm_estimate(c: CapacityCheck) -> float:
    """Seconds vLLM's client runs (vllm_runs) take after llmopt's, at a capacity."""
    return sum(run_estimate(c, label) for kind, label, *_ in vllm_runs(c, 1.0) if kind in c.vllm_runs)


def vllm_runs(c: CapacityCheck, cap: float | None) -> list[tuple[str, str, float | None, int | None, int]]:
    """vLLM's client runs, in order: (kind, label, rate, max concurrency, prompts); those at C and
    above it only where llmopt found a capacity C."""
    at = [] if not cap else [("capacity", f"at-capacity-{cap:.4g}rps", cap, None, math.ceil(cap * c.bench_s)),
                             ("capacity", f"above-capacity-{cap * c.above:.4g}rps", cap * c.above, None,
                              math.ceil(cap * c.above * c.bench_s))]
    return at + [("batch1", "concurrency-1", None, 1, c.batch1_prompts), ("inf", "rate-inf", None, None, c.saturation_requests)]


def run_llmopt(c: CapacityCheck, served: Any, requests: list[Request], budget: Budget, tok: Any) -> dict:
    """llmopt's serving scenario on the server: sweep, ceiling (all at once), search, hold."""
    from llmopt_bench.client.http_load import HTTPLoad
    from llmopt_bench.client.openai_http import Endpoint
    from llmopt_bench.core.contract import StageContext
    from llmopt_bench.load.plans import PlanLoad
    from llmopt_bench.measure.energy import TimedMeter
    from llmopt_bench.scenarios.serving.record import ServingParams
    from llmopt_bench.scenarios.serving.run import ServingRun
    from llmopt_bench.workloads.text import PromptTexts

    sweep_s = 30.0 * len(c.concurrency) + 60  # the sweep and the ceiling point, at most (measured: seconds each on the H200)
    room = budget.left() - vllm_estimate(c) - sweep_s
    search_s = max(30.0, min(c.search_budget_s, room))
    if search_s < c.search_budget_s:
        budget.say(f"the search gets {search_s:.0f} s of load, not {c.search_budget_s:g}: the run's budget keeps "
                   f"{vllm_estimate(c):.0f} s for vLLM's client")
    p = ServingParams(concurrency=c.concurrency, requests_per_point=c.requests_per_point, slo=c.slo, hold_s=c.hold_s,
                      search_precision=c.precision, search_budget_s=search_s, max_point_s=c.max_point_s,
                      ceiling_requests=c.saturation_requests, throughput_point=False, prompt_format=c.prompt_format,
                      **c.sampling.model_dump())
    budget.say(f"llmopt: sweep {c.concurrency}, the ceiling ({c.saturation_requests} at once), the search to {c.precision:.0%} "
               f"within {search_s:.0f} s of load, hold {c.hold_s:g} s")
    ctx = StageContext(run_dir=c.out, stage_dir=c.out, device="cpu", meter=TimedMeter(read_mj=lambda: None),
                       progress=lambda msg, done=None, total=None: budget.say(f"llmopt {msg}") if done is None else None)
    engine = HTTPLoad(Endpoint(served.base_url, served.name, request_timeout_s=600.0, sampling=c.sampling),
                      texts=PromptTexts(tok, c.seed) if c.prompt_format == "text" else None)
    samples, extra, facts = ServingRun(engine, {"url": served.base_url, "command": served.reproduce()}, p,
                                       PlanLoad.of_requests(requests, c.output_len), None, ctx, c.seed).run()
    out = {"params": p.model_dump(mode="json"), "extra": extra.model_dump(mode="json", exclude_none=True),
           "facts": facts.model_dump(mode="json", exclude={"slo_points"})}
    (c.out / "llmopt.json").write_text(json.dumps(out, indent=1))
    return out


def judged(result: dict, c: CapacityCheck, rate: float | None, conc: int | None, warmup_s: float,
           max_failure_rate: float) -> dict:
    """vLLM's client's run judged by llmopt's verdict on a load point (scenarios/peer/judge.py): the
    SLO over every request and, at a rate, the steady state; its p99s as vLLM reports them beside."""
    from llmopt_bench.scenarios.peer.judge import judge_run

    out = {"p99_ttft_ms": result.get("p99_ttft_ms"), "p99_tpot_ms": result.get("p99_tpot_ms"), "completed": result.get("completed"),
           "failed": result.get("failed"), "duration_s": result.get("duration"), "request_rps": result.get("request_throughput")}
    if not result.get("start_times"):
        return {**out, "verdict": "missed", "why": result.get("error") or "no per-request results saved", "judged_by": "-"}
    v, point = judge_run(result, c.slo, max_failure_rate, rate=rate, warmup_s=warmup_s,
                         concurrency=conc if conc is not None else result.get("num_prompts"))
    st = point.steady
    out["llmopt"] = {"p99_ms": {t.target: None if t.value_s is None else round(t.value_s * 1e3, 3) for t in v.targets},
                     "measured": point.sent, "warmup_excluded": point.warmup_excluded, "achieved_rps": point.achieved_rate,
                     "completion_rps": st.completion_rps if st else None, "steady": st.ok if st else None}
    return {**out, "verdict": "held" if v.ok else "missed", "why": v.reason or "",
            "judged_by": "llmopt: SLO and steady state" if rate else "llmopt: SLO"}


def vllm_row(result: dict, c: CapacityCheck, summary: dict, rate: float | None, conc: int | None, n: int) -> dict:
    """What the summary keeps of one vLLM client run: its settings, the verdict, its p50s and the server's clock."""
    return {"rate_rps": rate, "max_concurrency": conc, "num_prompts": n,
            **judged(result, c, rate, conc, summary["warmup_s"], summary["max_failure_rate"]),
            "ttft_p50_ms": result.get("median_ttft_ms"), "tpot_p50_ms": result.get("median_tpot_ms"),
            "output_tok_s": result.get("output_throughput"), "server": clock_summary(result.get("server"))}


def vllm_phases(c: CapacityCheck, served: Any, tokenizer: str, cap: float | None, budget: Budget, summary: dict) -> None:
    """vLLM's client at C and at above x C (where llmopt found a capacity C), at concurrency 1 and
    all at once (those vllm_runs names); each written as it ends."""
    from llmopt_bench.scenarios.peer.bench_serve import BenchServe, random_args

    with BenchServe(c.out / "vllm-bench-serve.log") as bench:
        for kind, label, rate, conc, n in vllm_runs(c, cap):
            if kind not in c.vllm_runs:
                continue
            estimate = run_estimate(c, label)
            if not budget.fits(f"vllm bench serve {label} ({n} prompts)", estimate):
                summary["vllm"][label] = {"skipped": f"budget: needs about {estimate:.0f} s"}
                continue
            args = random_args(served.base_url, served.name, c.input_len, c.output_len, n, tokenizer=tokenizer, rate=rate,
                               concurrency=conc, seed=c.seed, sampling=c.sampling)
            run = bench.run(args, c.out / f"vllm-{label}", timeout_s=3600, metrics_url=served.base_url)
            result = {**(run.result or {"error": run.error}), "server": run.server_clock}
            summary["vllm"][label] = vllm_row(result, c, summary, rate, conc, n)
            budget.say(f"vllm bench serve {label}: {summary['vllm'][label]['verdict']} {summary['vllm'][label]['why']}")
            (c.out / "summary.json").write_text(json.dumps(summary, indent=1))


def rejudge(c: CapacityCheck, given_slo: bool, given_above: bool) -> dict:
    """The vLLM client runs saved in c.out judged again (a check that stopped before its verdicts:
    each run's JSON is on disk as soon as it ends); no server is started. The SLO and `above` are
    the check's own unless given; the server's clock is kept where the summary had it (it is read
    live, not saved)."""
    from llmopt_bench.scenarios.peer.bench_serve import saved_result

    summary = json.loads((c.out / "summary.json").read_text())
    cap = (summary.get("llmopt") or {}).get("capacity_rps")
    if not cap:
        raise UsageError(f"{c.out / 'summary.json'} holds no capacity: vLLM's client never ran there",
                         "run the check again (without --rejudge)")
    was = summary.get("check") or {}
    c = c.model_copy(update={"slo": c.slo if given_slo or "slo" not in was else SLO.model_validate(was["slo"]),
                             "above": c.above if given_above or "above" not in was else was["above"]})
    planned = {label: (rate, conc) for _, label, rate, conc, _ in vllm_runs(c, cap)}
    for run_dir in sorted(d for d in c.out.glob("vllm-*") if d.is_dir()):
        result = saved_result(run_dir)
        if result is None:
            continue
        label = run_dir.name.removeprefix("vllm-")
        if label not in planned:
            raise UsageError(f"{run_dir} is not a run of this check at C = {cap:.4g} req/s (its runs: {', '.join(planned)})",
                             "give the run's own --above")
        rate, conc = planned[label]
        row = vllm_row({**result, "server": None}, c, summary, rate, conc, result.get("num_prompts") or len(result.get("ttfts", [])))
        row["server"] = (summary["vllm"].get(label) or {}).get("server")
        summary["vllm"][label] = row
    summary["check"] = {**was, "slo": str(c.slo), "above": c.above}
    summary["against_vllm"] = against_vllm(cap, summary["vllm"])
    return summary


def clock_summary(clock: dict | None) -> dict | None:
    """What the summary keeps of a point's server clock: each client's TTFT and ITL means beside the server's."""
    if not clock:
        return None
    cl = clock.get("client") or {}
    return {"requests": clock.get("requests"), "ttft_mean_ms": ms((clock.get("ttft") or {}).get("mean_s")),
            "client_ttft_mean_ms": ms(cl.get("ttft_mean_s")), "prefill_mean_ms": ms((clock.get("prefill") or {}).get("mean_s")),
            "itl_mean_ms": ms((clock.get("itl") or {}).get("mean_s")), "client_itl_mean_ms": ms(cl.get("itl_mean_s")),
            "prompt_tokens_per_request": clock["prompt_tokens"] / clock["requests"] if clock.get("prompt_tokens") and
            clock.get("requests") else None, "verdict": clock.get("verdict")}


def llmopt_summary(got: dict) -> dict:
    """What the summary keeps of llmopt's run: the capacity, its precision, its hold, how the
    search got there (the ceiling, the trials, the load spent), which regime, batch 1, saturation."""
    x, f = got["extra"], got["facts"]
    cap = x.get("capacity") or {}
    one: dict = next((r for r in x["curve"] if r["phase"] == "sweep" and r.get("concurrency") == 1), {})
    at_once: dict = next((r for r in x["curve"] if r["phase"] == "ceiling"), {})
    trials = cap.get("trials", [])
    return {"capacity_rps": cap.get("capacity_rps"), "held": cap.get("held"), "hold_s": cap.get("hold_s"),
            "known_within": cap.get("known_within"), "precision": cap.get("precision"), "converged": cap.get("converged"),
            "interval": [cap.get("capacity_rps"), cap.get("upper_rps")], "regime": regime(cap),
            "ceiling_rps": cap.get("ceiling_rps"), "ceiling_how": cap.get("ceiling_how"),
            "saturation_rps": cap.get("saturation_rps"), "search_budget_s": cap.get("budget_s"), "spent_s": cap.get("spent_s"),
            "more_s": cap.get("more_s"), "trials": [[t["kind"], round(t["rate"], 3), t["ok"], t.get("cost_s")] for t in trials],
            "notes": cap.get("notes", []),
            "concurrency_1": {"ttft_p50_ms": ms(one.get("ttft_p50_s")), "tpot_p50_ms": ms(one.get("tpot_p50_s")),
                              "server": clock_summary(one.get("server_clock"))},
            "all_at_once": {"requests": at_once.get("requests"), "output_tok_s": at_once.get("output_tok_s"),
                            "request_rps": at_once.get("qps"), "ttft_p50_ms": ms(at_once.get("ttft_p50_s")),
                            "tpot_p50_ms": ms(at_once.get("tpot_p50_s"))},
            "batch1_ttft_s": f.get("batch1_ttft_s")}


def regime(cap: dict) -> str | None:
    """Whether the SLO bound before saturation: the capacity's upper end is a rate that missed a
    latency target (binds), or the ceiling / a rate the server did not keep up with (does not)."""
    upper = cap.get("upper_rps")
    if cap.get("capacity_rps") is None or upper is None:
        return None
    missed = next((t for t in cap.get("trials", []) if t["rate"] == upper and not t["ok"] and not t.get("invalid")), None)
    reason = ((missed or {}).get("detail") or {}).get("reason") or ""
    if missed is None or reason.startswith("not steady"):
        return "the SLO does not bind before saturation"
    return f"the SLO binds ({reason})"


def against_vllm(cap: float, runs: dict) -> dict | None:
    """C against the highest completion rate vLLM's client measured (above C, or all at once):
    where the SLO does not bind before saturation, C should be at least 0.95 of it."""
    done = {k: r["request_rps"] for k, r in runs.items() if r.get("request_rps") and (k.startswith("above") or k == "rate-inf")}
    if not done:
        return None
    where = max(done, key=lambda k: done[k])
    return {"vllm_completed_rps": done[where], "where": where, "c_over_it": cap / done[where]}


def markdown(c: CapacityCheck, summary: dict) -> str:
    lo, v = summary.get("llmopt") or {}, summary["vllm"]
    held = (f"held {g(lo.get('hold_s'))} s" if lo.get("held") else
            f"not held (its holds of {g(lo.get('hold_s'))} s failed)" if lo.get("held") is False else "not held (no hold)")
    within = (f"known within {lo['known_within']:.1%}" if lo.get("known_within") is not None else "a lower bound only")
    interval = ", ".join(g(x) for x in lo.get("interval") or [])
    probes = [t for t in lo.get("trials") or [] if t[0] == "probe"]
    lines = [f"# Capacity check on one server: `{summary['server']}`", "",
             f"Random tokens, {c.input_len} in / {c.output_len} out (forced), SLO {c.slo}, prefix caching off, "
             f"vLLM's default scheduler limits, max_model_len {c.max_model_len}. Command: `{summary['command']}`.", "",
             f"llmopt: capacity **{g(lo.get('capacity_rps'))} req/s**, {held}, {within} ([{interval}]; "
             f"{g((lo.get('precision') or 0) * 100)}% asked); {lo.get('regime') or '-'}. The search: the ceiling "
             f"{g(lo.get('ceiling_rps'))} req/s ({lo.get('ceiling_how')}), {len(probes)} trial(s) then "
             f"{len(lo.get('trials') or []) - len(probes)} hold(s), {g(lo.get('spent_s'))} s of load of its "
             f"{g(lo.get('search_budget_s'))} s budget; highest completion rate measured {g(lo.get('saturation_rps'))} req/s.",
             "", "| vllm bench serve | rate req/s | prompts | p99 TTFT ms | p99 TPOT ms | completed | req/s | verdict (judged by) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in v.items():
        if "skipped" in r:
            lines.append(f"| {label} | | | | | | | skipped ({r['skipped']}) |")
            continue
        lines.append(f"| {label} | {g(r.get('rate_rps'))} | {r.get('num_prompts')} | {g(r.get('p99_ttft_ms'))} | "
                     f"{g(r.get('p99_tpot_ms'))} | {r.get('completed')} | {g(r.get('request_rps'))} | {r['verdict']} "
                     f"{r.get('why', '')} ({r.get('judged_by', '-')}) |")
    one, inf, vs = v.get("concurrency-1", {}), v.get("rate-inf", {}), summary.get("against_vllm")
    if vs:
        lines += ["", f"C is {vs['c_over_it']:.3f} of the highest completion rate vLLM's client measured "
                      f"({g(vs['vllm_completed_rps'])} req/s, {vs['where']})."]
    c1, v1 = (lo.get("concurrency_1") or {}).get("server") or {}, one.get("server") or {}
    lines += ["", "| beside each other | llmopt | vllm bench serve |", "| --- | --- | --- |",
              f"| TTFT p50 at concurrency 1, ms | {g(lo.get('concurrency_1', {}).get('ttft_p50_ms'))} | {g(one.get('ttft_p50_ms'))} |",
              f"| TPOT p50 at concurrency 1, ms | {g(lo.get('concurrency_1', {}).get('tpot_p50_ms'))} | {g(one.get('tpot_p50_ms'))} |",
              f"| output tok/s, {c.saturation_requests} at once | {g(lo.get('all_at_once', {}).get('output_tok_s'))} | "
              f"{g(inf.get('output_tok_s'))} |",
              f"| completed req/s, {c.saturation_requests} at once | {g(lo.get('all_at_once', {}).get('request_rps'))} | "
              f"{g(inf.get('request_rps'))} |",
              f"| TTFT mean at concurrency 1, ms: client / server's clock | {g(c1.get('client_ttft_mean_ms'))} / "
              f"{g(c1.get('ttft_mean_ms'))} | {g(v1.get('client_ttft_mean_ms'))} / {g(v1.get('ttft_mean_ms'))} |",
              f"| ITL mean at concurrency 1, ms: client / server's clock | {g(c1.get('client_itl_mean_ms'))} / "
              f"{g(c1.get('itl_mean_ms'))} | {g(v1.get('client_itl_mean_ms'))} / {g(v1.get('itl_mean_ms'))} |",
              f"| prompt tokens the server counted per request (asked {c.input_len}) | "
              f"{g(c1.get('prompt_tokens_per_request'))} | {g(v1.get('prompt_tokens_per_request'))} |",
              "", f"Requests: llmopt's prompts as {c.prompt_format}, vLLM's client's as text of its random dataset; both "
                  f"{c.sampling.describe()}."]
    return "\n".join(lines + ["", *[f"- {n}" for n in lo.get("notes", [])]]) + "\n"


def write(c: CapacityCheck, summary: dict) -> None:
    (c.out / "summary.json").write_text(json.dumps(summary, indent=1))
    (c.out / "summary.md").write_text(markdown(c, summary))


def run_check(c: CapacityCheck) -> dict:
    """The check (the module's docstring); its summary, written to c.out as it goes."""
    import os

    from transformers import AutoTokenizer

    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.engines.vllm.params import VLLMEngineParams
    from llmopt_bench.engines.vllm.served import Served, this_device
    from llmopt_bench.scenarios.serving.record import ServingParams

    budget = Budget(c.budget_s)
    model = prepare(parse_model(c.model))
    tok = AutoTokenizer.from_pretrained(model.path)
    requests = random_requests(tok, max(256, c.saturation_requests), c.input_len, c.seed)
    served = Served(model, VLLMEngineParams(dtype=c.dtype, max_model_len=c.max_model_len, enforce_eager=c.enforce_eager), device=this_device(),
                    log_path=c.out / "server.log", name="capacity-check")
    budget.say(f"starting {served.reproduce()}")
    served.start(timeout_s=min(900.0, max(60.0, budget.left())))
    budget.say(f"server ready at {served.base_url}")
    if c.client_cpus:  # after the server started (it keeps its own); both clients (vLLM's processes too) inherit it
        os.sched_setaffinity(0, c.client_cpus)
    summary: dict = {"server": served.reproduce(), "command": c.command, "check": {"slo": str(c.slo), "above": c.above},
                     "llmopt": None, "vllm": {}, "max_failure_rate": ServingParams().max_failure_rate,
                     "warmup_s": ServingParams().warmup_s}
    try:
        summary["llmopt"] = llmopt_summary(run_llmopt(c, served, requests, budget, tok))
        write(c, summary)
        lo = summary["llmopt"]
        budget.say(f"llmopt: capacity {g(lo['capacity_rps'])} req/s, held {lo['held']}, known within {g(lo['known_within'])}")
        vllm_phases(c, served, model.path, lo["capacity_rps"], budget, summary)
        if lo["capacity_rps"]:
            summary["against_vllm"] = against_vllm(lo["capacity_rps"], summary["vllm"])
    finally:
        summary["server_stop"] = served.stop()
        write(c, summary)
        portable(c.out)
    budget.say(f"done: {c.out / 'summary.md'}")
    return summary


def disagreement(summary: dict, out: Path) -> LlmoptError | None:
    """None when vLLM's client held the SLO at C and missed it above C (the check passes); else
    the error the command exits with: 6 (incomplete) when no run at C was made, 5 when vLLM's
    client disagrees with llmopt's capacity."""
    at = next((r for k, r in summary["vllm"].items() if k.startswith("at-capacity")), None)
    above = next((r for k, r in summary["vllm"].items() if k.startswith("above-capacity")), None)
    if not at or "skipped" in at:
        cap = (summary.get("llmopt") or {}).get("capacity_rps")
        why = "llmopt found no capacity under the SLO" if not cap else "the budget left no room for vLLM's client at the capacity"
        return LlmoptError(f"the check is incomplete: {why}", "give it more --budget-s, or less --bench-s and --hold",
                           code=ExitCode.INCOMPLETE)
    if at["verdict"] == "held" and above and above.get("verdict") == "missed":
        return None
    said = f"at C: {at['verdict']} {at.get('why') or ''}".strip()
    said += f"; above C: {above['verdict']} {above.get('why') or ''}".rstrip() if above and "verdict" in above else "; above C: not run"
    return LlmoptError(f"vLLM's client does not confirm llmopt's capacity ({said})", f"see {out / 'summary.md'}",
                       code=ExitCode.REGRESSION)
