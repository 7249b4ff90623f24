"""transformers compiled: the same model and generate() as the eager engine, with a static KV cache
and torch.compile of the decode step (transformers' own automatic compilation in generate: a
CompileConfig on the generation config; CUDA graphs on a GPU with mode "reduce-overhead"). It is
the cheap fix a transformers user tries before changing engines, and beside the eager baseline
it shows how much of a token was Python and launches, not GPU work (issue 25: 6.8 ms a token on
an H200 where eager generate took 21-43 ms).

Prefill stays eager (transformers compiles only the decode step). torch.compile specialises on
shapes, so before timing, the engine generates once for every batch of the timed requests
(`compile_for`, untimed, its wall time recorded): the static cache is sized once for the longest
prompt plus the output (generation_config.max_cache_len, where this transformers has it), so
every decode step has one shape. On a CPU, inductor compiles C++ with the system compiler (gcc)
in mode "default" (CUDA graphs need a GPU). If generate did not compile (a model or cache
transformers will not compile), the stage is skipped rather than timed as eager under this name.

Quality: the teacher-forced agreement of the eager engine measures the weights, the same here;
what compiling can change is the decode path, so the engine also runs the reference's prompts
through the compiled generate, teacher-forced (each step is fed the reference's token, so one
flip does not derail the rest), and compares each step's argmax with the reference's token. A
differing token that the reference itself rates within TIE_NATS of its own choice is a near
tie that rounding alone can flip (random weights are full of them): it is counted apart, and
only a flip against a clear reference choice is a disagreement."""

from __future__ import annotations

from typing import Any, Literal, Sequence, cast

from pydantic import Field

from llmopt_bench.analysis import quality
from llmopt_bench.core.contract import StageContext, StageSkipped
from llmopt_bench.core.errors import describe
from llmopt_bench.core.records import LoadInfo, StrictModel
from llmopt_bench.core.workload import Request, WorkloadConfig
from llmopt_bench.engines.hf.engine import HFEngineParams, TransformersEngine
from llmopt_bench.engines.hf.generate import EngineRecords
from llmopt_bench.measure.timing import now


class CompiledEngineParams(HFEngineParams):
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune"] = "auto"  # auto: reduce-overhead on CUDA, default on CPU
    measure_overhead: bool = False  # the per-token clock's cost is measured once, in the eager baseline


# a flip between two tokens whose reference log-probs are this close is rounding's to make: above
# the reference file's own fp16 rounding (~0.008 nats at log-probs of -8 to -16) with room for
# eager and compiled kernels summing in another order; on CPU the two differ by ~0.001 nats
TIE_NATS = 0.05
TEACHER_FORCED = ("the compiled generate on the reference's prompts, teacher-forced: each step's argmax against the "
                  "reference's token")


class DecodeAgreement(StrictModel):
    match_rate: float | None = Field(None, description="argmax equal to the reference continuation, position by position")
    first_divergence_mean: float | None = None
    tokens: int = 0
    method: str = "the compiled generate's greedy tokens on the reference's prompts, free-running, against its continuation"
    note: str | None = None
    # teacher-forced runs only (older runs compared free-running tokens and have none of these)
    near_ties: int | None = Field(None, description="differing tokens the reference rates within tie_nats of its own")
    disagreements: int | None = Field(None, description="differing tokens where the reference's choice was clear")
    tie_nats: float | None = None
    logprob_delta_max: float | None = Field(None, description="largest |log-prob of the reference's token|, compiled "
                                                              "against the reference's, in nats")


class CompileRecord(StrictModel):
    mode: str
    cache_implementation: str = "static"
    max_cache_len: int | None = None  # None: this transformers sizes the cache per call
    compile_s: float | None = None  # the untimed pass that compiled every shape of the timed requests
    decode_agreement: DecodeAgreement | None = None


def resolve_mode(mode: str, device: str) -> str:
    if mode != "auto":
        return mode
    return "reduce-overhead" if device.startswith("cuda") else "default"


def compile_generation(model: Any, mode: str, device: str) -> None:
    """Ask generate() for a static cache and a compiled decode step."""
    from transformers import CompileConfig

    config = CompileConfig(mode=mode)
    if not device.startswith("cuda"):
        # transformers compiles on CUDA-like devices only unless told
        config._compile_all_devices = True  # type: ignore[assignment]  # a bool flag, declared `= None` in transformers
    model.generation_config.cache_implementation = "static"
    model.generation_config.compile_config = config


class CompiledTransformersEngine(TransformersEngine):
    mode: str  # torch.compile's, resolved for the device
    record: CompileRecord

    @classmethod
    def start(cls, model_info: Any, params: HFEngineParams, ctx: StageContext,
              quantization_config: Any = None) -> tuple["CompiledTransformersEngine", LoadInfo]:
        engine, info = super().start(model_info, params, ctx, quantization_config)
        assert isinstance(engine, cls), "TransformersEngine.start builds an instance of cls"
        # the base's signature takes any HFEngineParams: those without compile_mode get "auto"
        engine.mode = resolve_mode(params.compile_mode if isinstance(params, CompiledEngineParams) else "auto", ctx.device)
        compile_generation(engine.model, engine.mode, ctx.device)
        info.implementation.update(cache_implementation="static", compile=f"torch.compile (inductor, mode {engine.mode}) "
                                   "of the decode step, by generate()")
        engine.record = CompileRecord(mode=engine.mode)
        return engine, info

    def compile_for(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> None:
        """One untimed pass over the timed requests, batch by batch: every shape compiled before timing."""
        longest = max(len(r.token_ids) for r in requests) + workload.max_new_tokens
        if hasattr(self.model.generation_config, "max_cache_len"):
            self.model.generation_config.max_cache_len = longest
            self.record.max_cache_len = longest
        ctx.progress(f"compiling the decode step (torch.compile, mode {self.mode}): one untimed pass", None, None)
        t0 = now()
        self.serve(requests, workload.max_new_tokens, batch_size=workload.batch_size, repeat=0, tokens_out=None,
                   progress=lambda n: None)
        self.record.compile_s = round(now() - t0, 3)
        if not hasattr(self.model, "_compiled_call"):
            raise StageSkipped("transformers did not compile generate() for this model (its cache or quantization is "
                               "not compileable here): a run would be the eager baseline again",
                               "use hf-fp16 for this model")

    def forced_logits(self, prompt: list[int], continuation: list[int]) -> Any:
        """The compiled generate's logits at each step, fed the continuation's tokens: one row a
        step (the first from the eager prefill, the others from the compiled decode step)."""
        import torch
        from transformers import LogitsProcessorList

        out = self.model.generate(input_ids=torch.tensor([prompt], device=self.model.device),
                                  attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=self.model.device),
                                  max_new_tokens=len(continuation), min_new_tokens=None, do_sample=False, use_cache=True,
                                  logits_processor=LogitsProcessorList([forcing(continuation)]), output_logits=True, return_dict_in_generate=True)
        return torch.cat(out.logits)

    def decode_agreement(self, ctx: StageContext) -> DecodeAgreement:
        if ctx.reference_file is None or not ctx.reference_file.is_file():
            return DecodeAgreement(note=quality.NO_REFERENCE)
        import torch

        items = quality.load_reference(ctx.reference_file)["items"]
        with torch.inference_mode():
            runs = [(item["logprobs"], list(item["continuation"]),
                     self.forced_logits(list(item["prompt"]), list(item["continuation"]))) for item in items]
        return compare_decode(runs)

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> EngineRecords:
        out = super().records(requests, workload, ctx)
        ctx.progress("quality of the compiled decode: teacher-forced against the reference", None, None)
        try:
            self.record.decode_agreement = self.decode_agreement(ctx)
        except Exception as e:  # noqa: BLE001 - the timed samples are worth keeping whatever broke here
            self.record.decode_agreement = DecodeAgreement(note=f"not measured: {describe(e, 200)}")
        out["compile"] = self.record.model_dump(mode="json")
        return out


def forcing(tokens: Sequence[int]) -> Any:
    """A logits processor that makes generate() emit `tokens`, one a step, whatever its logits
    (output_logits keeps the raw ones): teacher forcing through generate's own decode loop."""
    import torch
    from transformers import LogitsProcessor

    class Force(LogitsProcessor):
        step = 0

        def __call__(self, input_ids: Any, scores: Any) -> Any:
            forced = torch.full_like(scores, -float("inf"))
            forced[:, tokens[self.step]] = 0
            self.step += 1
            return forced
    return Force()


def compare_decode(runs: Sequence[tuple[Any, Sequence[int], Any]], tie_nats: float = TIE_NATS) -> DecodeAgreement:
    """Agreement of teacher-forced decode logits with the reference: runs holds, per prompt, the
    reference's log-probs (one row per continuation token), its continuation, and the decode's
    logits at the same steps."""
    import torch

    matches = positions = ties = 0
    firsts: list[int] = []
    delta = 0.0
    for ref_logprobs, continuation, logits in runs:
        ref = torch.log_softmax(ref_logprobs.float(), dim=-1)  # stored in fp16: renormalised
        got = torch.log_softmax(logits.float().to(ref.device), dim=-1)
        targets = torch.tensor(list(continuation), device=ref.device)[:, None]
        chosen = got.argmax(dim=-1, keepdim=True)
        same = cast(list[bool], (chosen == targets)[:, 0].tolist())
        # a near tie: the reference rates the decode's choice within tie_nats of its own
        tied = cast(list[bool], ((ref.gather(1, targets) - ref.gather(1, chosen)) <= tie_nats)[:, 0].tolist())
        matches, positions = matches + sum(same), positions + len(same)
        ties += sum(1 for s, t in zip(same, tied) if not s and t)
        firsts.append(same.index(False) if False in same else len(same))
        delta = max(delta, float((got.gather(1, targets) - ref.gather(1, targets)).abs().max()))
    return DecodeAgreement(match_rate=matches / positions if positions else None,
                           first_divergence_mean=sum(firsts) / len(firsts) if firsts else None, tokens=positions,
                           method=TEACHER_FORCED, near_ties=ties, disagreements=positions - matches - ties, tie_nats=tie_nats,
                           logprob_delta_max=round(delta, 6) if positions else None)
