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
through the compiled generate and compares its greedy tokens with the reference continuation."""

from __future__ import annotations

from typing import Any, Literal, Sequence

from pydantic import Field

from llmopt_bench.analysis import quality
from llmopt_bench.core.contract import StageContext, StageSkipped
from llmopt_bench.core.errors import describe
from llmopt_bench.core.records import LoadInfo, StrictModel
from llmopt_bench.core.workload import Request, WorkloadConfig
from llmopt_bench.engines.transformers import HFEngineParams, TransformersEngine
from llmopt_bench.measure.timing import now


class CompiledEngineParams(HFEngineParams):
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune"] = "auto"  # auto: reduce-overhead on CUDA, default on CPU
    measure_overhead: bool = False  # the per-token clock's cost is measured once, in the eager baseline


class DecodeAgreement(StrictModel):
    match_rate: float | None = Field(None, description="greedy tokens equal to the reference continuation, position by position")
    first_divergence_mean: float | None = None
    tokens: int = 0
    method: str = "the compiled generate's greedy tokens on the reference's prompts, free-running, against its continuation"
    note: str | None = None


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

    def decode_agreement(self, ctx: StageContext) -> DecodeAgreement:
        if ctx.reference_file is None or not ctx.reference_file.is_file():
            return DecodeAgreement(note=quality.NO_REFERENCE)
        items = quality.load_reference(ctx.reference_file)["items"]
        matches = positions = 0
        firsts = []
        for item in items:
            ref = list(item["continuation"])
            got = self.greedy(list(item["prompt"]), len(ref))
            same = [a == b for a, b in zip(got, ref)]
            matches, positions = matches + sum(same), positions + len(ref)
            firsts.append(same.index(False) if False in same else len(ref))
        return DecodeAgreement(match_rate=matches / positions if positions else None,
                               first_divergence_mean=sum(firsts) / len(firsts) if firsts else None, tokens=positions)

    def records(self, requests: Sequence[Request], workload: WorkloadConfig, ctx: StageContext) -> dict[str, Any]:
        out = super().records(requests, workload, ctx)
        ctx.progress("quality of the compiled decode: greedy tokens against the reference", None, None)
        try:
            self.record.decode_agreement = self.decode_agreement(ctx)
        except Exception as e:  # noqa: BLE001 - the timed samples are worth keeping whatever broke here
            self.record.decode_agreement = DecodeAgreement(note=f"not measured: {describe(e, 200)}")
        out["compile"] = self.record.model_dump(mode="json")
        return out

