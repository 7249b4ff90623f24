#!/usr/bin/env python3
"""The peer check: llmopt's load point and vLLM's own client (`vllm bench serve`) on ONE running
`vllm serve`, at the same request rate and concurrency, with the same prompts (exported as
vllm bench serve's custom dataset) and the same forced output length; both outputs and a
comparison of TTFT p50, TPOT p50 and output throughput (target: within 5%).

    python scripts/peer-serve.py --model synthetic:llama2-7b --rate 8 --concurrency 32 \\
        --num-prompts 400 --input-len 128 --output-len 128 --out results/h200-serving/peer

Starts the server itself (vLLM's interpreter: LLMOPT_VLLM_PYTHON, else this one) unless --url
points at one already running (--served-name then names its model, --tokenizer its tokenizer).
The two clients run one after the other, --rounds times, alternating which goes first; the
comparison takes each figure's median over the rounds. Arrivals are Poisson at --rate with at
most --concurrency in flight (vllm bench serve's --request-rate and --max-concurrency); the two
clients draw their own arrival times (same rate and distribution, not the same instants).
At a finite rate the output throughput follows the arrival schedule as much as the server (a
few hundred requests narrow that); --rate inf compares the server's throughput itself. Both
clients send the same request body (llmopt's token ids and min_tokens go to vLLM's client as
--extra-body): vLLM's server holds back chunks whose text is empty unless token ids are asked for.
Exit 0 when every figure is within --tolerance, 1 when one is not, 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llmopt_bench.checkpoints.prepare import prepare
from llmopt_bench.core.models import parse_model
from llmopt_bench.core.workload import WorkloadConfig, build_requests
from llmopt_bench.engines import vllm as V
from llmopt_bench.engines.http_load import HTTPLoad
from llmopt_bench.engines.openai_http import Endpoint
from llmopt_bench.engines.vllm_server import VLLMServer, vllm_cli_works, vllm_python
from llmopt_bench.load.dispatchers import cycled
from llmopt_bench.load.engine import run_point
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.scenarios import peer


def parse_args(argv: list[str]) -> argparse.Namespace:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--model", default="synthetic:tiny", help="llmopt model source (prepared once into the cache)")
    a.add_argument("--url", help="a running server's base URL; default: start one")
    a.add_argument("--served-name", help="the model name the running server answers to (with --url)")
    a.add_argument("--tokenizer", help="its tokenizer directory (with --url; default: the model's)")
    a.add_argument("--api-key-env", help="the variable that holds the server's key (never the key itself)")
    a.add_argument("--dtype", default="auto")
    a.add_argument("--max-model-len", type=int, default=4096)
    a.add_argument("--max-num-seqs", type=int)
    a.add_argument("--max-num-batched-tokens", type=int)
    a.add_argument("--quantization")
    a.add_argument("--rate", type=float, required=True, help="Poisson arrivals, requests/s; inf: all at once, --concurrency "
                   "at a time (a closed loop: throughput then measures the server, not the arrival schedule)")
    a.add_argument("--concurrency", type=int, required=True, help="at most this many requests in flight")
    a.add_argument("--num-prompts", type=int, default=200)
    a.add_argument("--input-len", type=int, default=128)
    a.add_argument("--output-len", type=int, default=128)
    a.add_argument("--warmups", type=int, default=8, help="requests each client sends before measuring")
    a.add_argument("--rounds", type=int, default=1)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--tolerance", type=float, default=0.05)
    a.add_argument("--out", type=Path, default=Path("results") / "peer" / time.strftime("%Y%m%d-%H%M%S"))
    return a.parse_args(argv)


def run_llmopt(endpoint: Endpoint, texts: list[str], requests: list, args: argparse.Namespace, out: Path, seed: int) -> dict:
    """llmopt's client: warm-up requests one at a time, then one open-loop point over the same
    prompt texts, on the load machine's HTTP engine."""
    by_id = {r.id: t for r, t in zip(requests, texts)}
    engine = HTTPLoad(endpoint, prompt_of=lambda s: by_id[s.id.split(".")[0]])
    source = cycled(requests)
    if args.warmups:
        run_point(engine, LoadPoint(concurrency=1, num_requests=args.warmups), source, args.output_len)
    point = (LoadPoint(concurrency=args.concurrency, num_requests=args.num_prompts) if math.isinf(args.rate) else
             LoadPoint(rate=args.rate, max_concurrency=args.concurrency, num_requests=args.num_prompts, seed=seed))
    res = run_point(engine, point, source, args.output_len)
    out.mkdir(parents=True, exist_ok=True)  # llmopt's own output: the point without per-token times
    (out / "point.json").write_text(res.model_copy(update={"samples": [s.model_copy(update={"token_times": []})
                                                                       for s in res.samples]}).model_dump_json(indent=1))
    return {**peer.llmopt_figures(res), "errors": res.errors, "tally": engine.tally.as_dict(),
            "send_delay_p99_ms": res.send_delay_s.p99 * 1e3 if res.send_delay_s else None}


def run_vllm_bench(base_url: str, name: str, dataset: Path, tokenizer: str, args: argparse.Namespace, out: Path,
                   seed: int) -> dict:
    """vLLM's own client on the same server and prompts; its saved JSON."""
    python = vllm_python()
    # the body llmopt's client sends beyond vLLM's own (engines/openai_http.py payload): the same request from both
    same = {"return_token_ids": True, "min_tokens": args.output_len}
    cmd = peer.bench_serve_command(base_url, name, dataset, args.num_prompts, args.output_len, tokenizer=tokenizer,
                                   rate=None if math.isinf(args.rate) else args.rate, concurrency=args.concurrency, seed=seed,
                                   result_dir=out, warmups=args.warmups,
                                   extra_body=same)
    argv = peer.bench_serve_argv(python, cmd, vllm_cli_works(python))
    env = dict(os.environ)
    if args.api_key_env:
        env["OPENAI_API_KEY"] = os.environ[args.api_key_env]
    out.mkdir(parents=True, exist_ok=True)
    (out / "command.txt").write_text(shlex.join(argv) + "\n")
    with open(out / "stdout.log", "w") as log:
        proc = subprocess.run(argv, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=3600, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed (exit {proc.returncode}); see {out / 'stdout.log'}")
    result = json.loads(max(out.glob("*.json"), key=lambda p: p.stat().st_mtime).read_text())
    return peer.vllm_figures(result)


def server_for(args: argparse.Namespace, model_path: str) -> VLLMServer | None:
    if args.url:
        return None
    cfg = V.EngineConfig(dtype=args.dtype if args.dtype != "auto" else ("float16" if _cuda() else "bfloat16"),
                         quantization=args.quantization, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens, extra={"enable_prefix_caching": False})
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return VLLMServer(model_path, cfg, log_path=args.out / "server.log", served_model_name="peer",
                      api_key_env=args.api_key_env)


def _cuda() -> bool:
    from llmopt_bench.measure import nvml

    return bool(nvml.device_indices())


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _median(values) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def report(args: argparse.Namespace, rounds: list[dict], server: str) -> tuple[str, bool]:
    ours = {k: _median(r["llmopt"].get(k) for r in rounds) for k in peer.FIGURES}
    theirs = {k: _median(r["vllm"].get(k) for r in rounds) for k in peer.FIGURES}
    rows = peer.compare(ours, theirs, args.tolerance)
    ok = all(r["within"] for r in rows)
    lines = [f"# Peer check: llmopt vs vllm bench serve on one server ({server})", "",
             f"{args.num_prompts} prompts of {args.input_len} tokens, {args.output_len} output tokens forced, Poisson at "
             f"{args.rate:g} req/s, at most {args.concurrency} in flight, {args.warmups} warm-up requests each, "
             f"{len(rounds)} round(s) (medians).", "",
             "| figure | llmopt | vllm bench serve | llmopt / vLLM - 1 | within |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['figure']} | {_g(r['llmopt'])} | {_g(r['vllm_bench_serve'])} | "
              f"{'-' if r['difference'] is None else format(r['difference'] * 100, '+.1f') + '%'} | "
              f"{'yes' if r['within'] else 'NO'} |" for r in rows]
    info = {k: (_median(r["llmopt"].get(k) for r in rounds), _median(r["vllm"].get(k) for r in rounds))
            for k in ("itl_p50_ms", "e2e_p50_ms", "request_rps")}
    lines += [f"| {k} (not judged) | {a:.4g} | {b:.4g} | | |" for k, (a, b) in info.items() if a is not None and b is not None]
    lines += ["", f"Target: every figure within {args.tolerance:.0%}: {'met' if ok else 'NOT met'}."]
    return "\n".join(lines) + "\n", ok


def scrub(out: Path) -> None:
    """Every text output with the cache's and the home's paths in portable form (committable)."""
    from llmopt_bench.core.models import portable_text

    for path in out.rglob("*"):
        if path.is_file() and path.suffix in (".log", ".txt", ".md", ".json"):
            path.write_text(portable_text(path.read_text(errors="replace")))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = prepare(parse_model(args.model))
    from transformers import AutoTokenizer

    tok_path = args.tokenizer or model.path
    tok = AutoTokenizer.from_pretrained(tok_path)
    requests = build_requests(WorkloadConfig(num_prompts=args.num_prompts, input_len=args.input_len, seed=args.seed),
                              lambda text: tok(text, add_special_tokens=False)["input_ids"])
    dataset = args.out / "prompts.jsonl"
    texts = peer.export_custom_dataset(requests, tok.decode, dataset, args.output_len)
    server = server_for(args, model.path)
    if server is not None:
        server.start()
    base_url = args.url or server.base_url
    name = args.served_name or (server.served_model_name if server else args.model)
    try:
        endpoint = Endpoint(base_url, name, api_key_env=args.api_key_env)
        rounds = []
        for i in range(args.rounds):
            seed = args.seed + i
            order = ("llmopt", "vllm") if i % 2 == 0 else ("vllm", "llmopt")
            got = {}
            for who in order:
                got[who] = (run_llmopt(endpoint, texts, requests, args, args.out / f"llmopt-round{i + 1}", seed) if who == "llmopt" else
                            run_vllm_bench(base_url, name, dataset, tok_path, args, args.out / f"vllm-bench-round{i + 1}", seed))
            rounds.append({**got, "order": list(order)})
            (args.out / "rounds.json").write_text(json.dumps(rounds, indent=1))
    finally:
        if server is not None:
            server.stop()
    text, ok = report(args, rounds, server.reproduce() if server else base_url)
    (args.out / "comparison.md").write_text(text)
    scrub(args.out)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
