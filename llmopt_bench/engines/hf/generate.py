"""transformers: load a checkpoint, and generate with a timestamp for every token.

Per-token times come from a streamer: generate() hands it each step's tokens after copying
them to the host, which waits for the step's kernels, so each timestamp is a synced clock."""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypedDict

from llmopt_bench.analysis.overhead import OverheadEstimate
from llmopt_bench.core.freeform import Json, Kwargs
from llmopt_bench.core.records import LoadInfo, RequestSample
from llmopt_bench.core.workload import Request
from llmopt_bench.measure.timing import make_sync, now

if TYPE_CHECKING:  # the type only: vLLM's parts import this module (engines/vllm/params.py)
    from llmopt_bench.engines.vllm.kv import KVCacheRecord


def best_cpu_dtype() -> str:
    """bfloat16 where the CPU has native bf16 (AVX512-BF16 / AMX), else float32."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return "float32"
    return "bfloat16" if (" avx512_bf16" in flags or " amx_bf16" in flags) else "float32"


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "float16" if device == "cuda" else best_cpu_dtype()


class TokenClock:
    """A generate() streamer that records when each step's tokens reached the host."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:  # the first put is the prompt itself
            self._prompt_seen = True
            return
        self.times.append(now())

    def end(self) -> None:
        pass


def load_model(path: str, device: str, dtype: str, attn_implementation: str | None = None,
               quantization_config: Any = None) -> tuple[Any, Any, LoadInfo]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sync = make_sync(device)
    t0 = now()
    tok = AutoTokenizer.from_pretrained(path)
    kwargs: Kwargs = {"dtype": getattr(torch, dtype)}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if quantization_config is not None:
        kwargs.update(quantization_config=quantization_config, device_map=device if device == "cuda" else "cpu")
    else:
        kwargs["device_map"] = device
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    model.eval()
    sync()
    t1 = now()
    # Output length is forced: nothing stops generation but max_new_tokens.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    tok.padding_side = "left"
    info = LoadInfo(
        phases_s={"tokenizer_and_weights_s": round(t1 - t0, 4)},
        implementation={"engine": "transformers", "dtype": dtype, "device": device,
                        "attn_implementation": getattr(model.config, "_attn_implementation", attn_implementation)},
        versions={"transformers": transformers.__version__, "torch": torch.__version__},
        weights_bytes=int(model.get_memory_footprint()),
    )
    return model, tok, info


def generate_batch(model: Any, pad_id: int, requests: Sequence[Request], max_new_tokens: int, device: str,
                   repeat: int = 0, batch: int = 0, streamer: bool = True,
                   tokens_out: dict[str, list[int]] | None = None) -> list[RequestSample]:
    """Generate for requests together (left-padded); every request shares the step times.
    A request's output length is its own (Request.output_len, a generated plan's) or
    max_new_tokens; a batch runs to its longest, and each request's sample and ids end at its
    own length (its last token is when a streaming client would have it; the batch's later
    steps are its neighbours'). tokens_out, when given, receives each request's generated ids."""
    import torch

    sync = make_sync(device)
    width = max(len(r.token_ids) for r in requests)
    ids = torch.full((len(requests), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(requests), width), dtype=torch.long)
    for i, r in enumerate(requests):
        ids[i, width - len(r.token_ids):] = torch.tensor(r.token_ids)
        mask[i, width - len(r.token_ids):] = 1
    ids, mask = ids.to(model.device), mask.to(model.device)
    clock = TokenClock() if streamer else None
    sync()
    t_submit = now()
    wants = [r.output_len or max_new_tokens for r in requests]
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(wants),
                             min_new_tokens=None, do_sample=False, streamer=clock, use_cache=True)
    sync()
    t_done = now()
    produced = int(out.shape[1] - width)
    times = clock.times if clock else []
    if clock and len(times) != produced:
        raise RuntimeError(f"streamer saw {len(times)} steps but generate produced {produced} tokens")
    first = times[0] if times else t_done
    if tokens_out is not None:
        for i, r in enumerate(requests):
            tokens_out[r.id] = out[i, width:width + min(wants[i], produced)].tolist()
    return [RequestSample(request_id=r.id, prompt_id=r.prompt_id, repeat=repeat, batch=batch,
                          prompt_tokens=len(r.token_ids), output_tokens=min(n, produced), t_submit=t_submit, t_first=first,
                          t_done=times[min(n, produced) - 1] if times else t_done, token_times=times[:n])
            for r, n in zip(requests, wants)]


OVERHEAD_MIN_PAIRS, OVERHEAD_MAX_PAIRS = 10, 40  # 10 pairs: the median's interval drops the extreme pair each side
OVERHEAD_BUDGET_S = 5.0  # seconds the pairs may take in all, once the minimum of pairs is met
OVERHEAD_TOKENS = 16  # each generation's length: the clock's cost is per decode step, 16 of them show it


def streamer_step_costs(device: str, batch: int = 1, calls: int = 2000, rounds: int = 7,
                        round_s: float = 0.05) -> list[float]:
    """What the per-token clock adds to one decode step, timed apart from any generation: what
    generate() does only for a streamer (copy the step's tokens to the host) and TokenClock.put.
    One figure per round (up to `calls` steps or round_s seconds), so the bound comes with its spread."""
    import time

    import torch

    tokens = torch.zeros(batch, dtype=torch.long, device=device)
    clock = TokenClock()
    clock.put(tokens.cpu())  # the prompt
    out = []
    for _ in range(rounds):
        clock.times.clear()
        done, t0 = 0, time.perf_counter()
        while done < calls and (done == 0 or time.perf_counter() - t0 < round_s):
            clock.put(tokens.cpu())
            done += 1
        out.append((time.perf_counter() - t0) / done)
    return out


def decode_per_token(wholes: list[float], firsts: list[float], tokens: int) -> list[float]:
    """Each generation's time per decode step: less the median one-token generation's time (the
    prefill and the first token, the same clock setting: a median, as one prefill's noise must not
    land on a pair), over the steps after the first; the whole time per token below 2 tokens."""
    if tokens < 2 or not firsts:
        return [w / max(1, tokens) for w in wholes]
    first = statistics.median(firsts)
    return [max(w - first, 1e-9) / (tokens - 1) for w in wholes]


class OverheadRecord(OverheadEstimate):
    """instrumentation_overhead's record: the estimate and how its per-token times were taken."""

    tokens: int  # the generations' length
    per_token: str


class EngineRecords(TypedDict, total=False):
    """What an engine of the fixed workload says of itself after the repeats, untimed
    (scenarios/fixed.FixedEngine.records): the parts FixedExtra names, and those that join the
    stage's extra beside them as they are."""

    instrumentation: OverheadRecord  # the per-token clock's own cost (transformers engines, when asked)
    kv_cache: KVCacheRecord  # vLLM engines: the preallocated KV cache
    compile: Json  # the compiled engine's CompileRecord, dumped (engines/hf/compiled.py)


def instrumentation_overhead(model: Any, pad_id: int, request: Request, max_new_tokens: int, device: str,
                             pairs: int | None = None, budget_s: float = OVERHEAD_BUDGET_S) -> OverheadRecord:
    """Decode time per token with and without the per-token clock, in interleaved pairs
    (alternating which goes first) so that drift on a noisy host hits both alike, plus the
    clock's own work timed apart; analysis/overhead.py turns them into an interval and a verdict.
    pairs=None: as many pairs as budget_s allows after the first, between 10 and 40.

    Per token means per decode step: each side of a pair also times a one-token generation (the
    prefill and the first token, with the same clock setting), and decode_per_token takes it out,
    so the prefill's share does not grow as the generations get shorter."""
    from llmopt_bench.analysis import overhead

    times: dict[bool, list[float]] = {False: [], True: []}  # a whole generation's time, by clock setting
    firsts: dict[bool, list[float]] = {False: [], True: []}  # a one-token generation's

    def timed(streamer: bool, tokens: int) -> float:
        s = generate_batch(model, pad_id, [request], tokens, device, streamer=streamer)[0]
        return s.t_done - s.t_submit

    def pair(i: int) -> None:
        for streamer in ((False, True) if i % 2 == 0 else (True, False)):
            firsts[streamer].append(timed(streamer, 1))
            times[streamer].append(timed(streamer, max_new_tokens))

    t0 = now()
    pair(0)
    if pairs is None:  # sized by the first pair's time, never by its outcome
        pairs = min(OVERHEAD_MAX_PAIRS, max(OVERHEAD_MIN_PAIRS, int(budget_s / max(now() - t0, 1e-9))))
    for i in range(1, pairs):
        pair(i)
    without, with_clock = (decode_per_token(times[c], firsts[c], max_new_tokens) for c in (False, True))
    return {**overhead.overhead_estimate(without, with_clock, streamer_step_costs(device, batch=1)), "tokens": max_new_tokens,
            "per_token": "decode steps: (a generation - the median one-token generation) / (tokens - 1)"}


def run_sequential(gen: Callable[[Sequence[Request], int, int], list[RequestSample]], requests: Sequence[Request],
                   batch_size: int, repeats: int, progress: Callable[..., None]) -> list[RequestSample]:
    """The fixed workload: every repeat walks the requests in batches of batch_size."""
    samples: list[RequestSample] = []
    batches = [requests[i:i + batch_size] for i in range(0, len(requests), batch_size)]
    total = repeats * len(batches)
    for rep in range(repeats):
        for b, chunk in enumerate(batches):
            samples.extend(gen(chunk, rep, b))
            progress(f"repeat {rep + 1}/{repeats}", rep * len(batches) + b + 1, total)
    return samples
