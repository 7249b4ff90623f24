"""vllm-serve: vLLM's OpenAI-compatible server (`vllm serve`) with the engine params of the
offline vLLM stages, under load over HTTP (scenarios/serving/run.py): a concurrency sweep, open-loop
points, the capacity under an SLO, the throughput point; then the quality through the server's
prompt log-probs, the same measures as the offline stage (engines/vllm/served_quality.py).

The stage's process runs in llmopt's interpreter (httpx); the server runs in vLLM's
(LLMOPT_VLLM_PYTHON), in the stage's session so that its GPU memory is sampled and a stage
killed on timeout takes it along. Several configurations (FP16, quantization = "fp8", an AWQ
checkpoint) are labelled entries of this one stage: journeys/serving.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from llmopt_bench.client.cluster import client_processes
from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.openai_http import Endpoint
from llmopt_bench.client.workers import WorkerConfig
from llmopt_bench.core.contract import Requirements, Stage, StageContext
from llmopt_bench.core.records import Block, Claim, LoadInfo, QualityRecord, StageRun
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.engines.awq.weights import AWQCheckpointParams
from llmopt_bench.engines.vllm.params import VLLMEngineParams, worker_ranks
from llmopt_bench.engines.vllm.served import Served
from llmopt_bench.engines.vllm.server import ServerStop, VLLMServer
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.scenarios.serving import report as R
from llmopt_bench.scenarios.serving.caching_report import caching_claim, comparison_blocks
from llmopt_bench.scenarios.serving.record import CachingArm, PrefixCachingRecord, ServingExtra, ServingParams
from llmopt_bench.scenarios.serving.run import ServingRun, serving_plans
from llmopt_bench.workloads.text import PromptTexts


class VLLMServeParams(VLLMEngineParams, ServingParams):
    awq: AWQCheckpointParams | None = None  # serve AWQ weights (`awq = {}`: made as awq-int4 makes them)
    quality: bool = True  # perplexity (real weights) and agreement with the reference, through the server
    server_timeout_s: float = Field(900.0, gt=0)  # start-up until /health answers
    api_key_env: str | None = None  # start the server with the key in this variable (its NAME)


class VLLMServeStage(Stage):
    name = "vllm-serve"
    description = "vLLM's OpenAI-compatible server (vllm serve) under load over HTTP: sweep, capacity under an SLO"
    changes = "the deployment: vLLM behind its HTTP API, requests arriving like users"
    own_workload = True
    any_workload = True
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm", child_in_engine=False)
    prefetch = ("httpx", "transformers:AutoTokenizer")  # its own process: the client and the tokenizer, not vLLM
    Params = VLLMServeParams
    Extra = ServingExtra

    server: VLLMServer | None = None
    served: Served | None = None
    _texts: PromptTexts | None = None

    def load(self, model, params, ctx: StageContext) -> LoadInfo:  # params: a VLLMServeParams (Params)
        from transformers import AutoTokenizer

        self.params: VLLMServeParams = params
        self.model_info, self.ctx = model, ctx
        log = ctx.log_path.with_suffix(".server.log") if ctx.log_path else ctx.stage_dir / "server.log"
        self.served = Served(model, params, device=ctx.device, log_path=log, awq=params.awq, ctx=ctx,
                             api_key_env=params.api_key_env)
        self.server = self.served.server
        ctx.progress(f"starting vllm serve ({self.served.describe()})", None, None)
        info = self.served.start(timeout_s=params.server_timeout_s)
        self.tok = AutoTokenizer.from_pretrained(model.path)  # the original's: an AWQ checkpoint may lack one
        return info

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def endpoint(self, timeout_s: float = 600.0) -> Endpoint:
        assert self.server is not None
        return Endpoint(self.server.base_url, self.server.served_model_name, api_key_env=self.params.api_key_env,
                        request_timeout_s=timeout_s, sampling=self.params.sampling(), kernel_clock=self.params.kernel_clock)

    def texts(self, workload: WorkloadConfig) -> PromptTexts | None:
        """The prompts as text of their asked length on the server's tokenizer (None: token ids)."""
        if self.params.prompt_format != "text":
            return None
        if self._texts is None or self._texts.seed != workload.seed:
            self._texts = PromptTexts(self.tok, workload.seed)
        return self._texts

    def loads(self, workload: WorkloadConfig) -> tuple[PlanLoad, PlanLoad]:
        """The run's workload as this server's load (its tokenizer, its max_model_len), and the throughput point's."""
        p, max_len = self.params, self.server.cfg.max_model_len if self.server else None
        plans = serving_plans(workload, self.tok, self.model_info.vocab_size, self.encode, max_len, p)
        return PlanLoad(plans[0]), PlanLoad(plans[1])

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        """A few requests one at a time, untimed: the server's first answers pay for lazy set-up."""
        import asyncio

        from llmopt_bench.client.openai_http import OpenAIClient

        texts = self.texts(workload)

        async def go():
            async with OpenAIClient(self.endpoint(self.params.request_timeout_s)) as client:
                for r in self.loads(workload)[0].warmup(max(1, workload.warmup)):  # sent as the load sends them
                    await client.complete(r.id, r.prompt_id, texts.text(r.token_ids) if texts else list(r.token_ids),
                                          r.output_len or workload.max_new_tokens)
        ctx.progress("warm-up", None, None)
        asyncio.run(go())

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        p = self.params
        load, tp_load = self.loads(workload)
        assert self.server is not None and self.served is not None
        caching = self.served.params.enable_prefix_caching
        endpoint, texts = self.endpoint(p.request_timeout_s), self.texts(workload)
        processes = client_processes(p.client_workers, p.client_cluster, p.client_nodes, WorkerConfig((endpoint,), texts=texts))
        client = HTTPLoad(endpoint, texts=texts, reset_cache_each_point=caching, watch_cache=True, **processes)
        target = {"kind": "vllm serve (started by llmopt)", "url": self.server.base_url, "model": self.server.served_model_name,
                  "command": self.server.reproduce(), "entry": " ".join(self.server.entry)}
        serving = ServingRun(client, target, p, load, tp_load, ctx, workload.seed)
        try:
            samples, extra, facts = serving.run()
        finally:
            client.close()
        facts.workload = None if workload.from_prompt_file else load.record
        quality = self.quality(ctx) if p.quality else None
        facts.devices = worker_ranks(self.served.params)
        facts.serve_command = self.server.reproduce()
        extra.server = self.stop()
        return StageRun(samples=samples, requests=serving.requests, extra=extra.model_dump(mode="json", exclude_none=True),
                        quality=quality, facts=facts)

    def quality(self, ctx: StageContext) -> QualityRecord:
        from llmopt_bench.core.errors import describe
        from llmopt_bench.engines.vllm.served_quality import served_quality

        assert self.served is not None
        dummy = self.served.params.load_format == "dummy"
        try:
            return QualityRecord(**served_quality(self.endpoint(), self.encode, ctx.reference_file, ctx.reference_name,
                                                  self.served.model.real_weights and not dummy, ctx.progress, dummy=dummy))
        except Exception as e:  # noqa: BLE001 - the load points are worth keeping whatever broke here
            return QualityRecord(reference=ctx.reference_name, error=describe(e, 300))

    def stop(self) -> ServerStop:
        served, self.server = getattr(self, "served", None), None
        self.served = None
        return served.stop() if served is not None else {}

    def teardown(self) -> None:
        self.stop()

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:
        return R.serving_blocks(result) + R.http_cost_blocks(result, run, engine_keys=ENGINE_KEYS,
                                                             scheduler_keys=SCHEDULER_KEYS)

    @classmethod
    def claims(cls, result, run) -> list[Claim]:
        return [R.qps_claim(result, run)]

    @classmethod
    def charts(cls, result, run, out_dir: Path) -> list[Path]:
        path = R.curve_chart(result, out_dir / f"{result.name}_load.png")
        return [path] if path else []


# What makes two vLLM engines the same for HTTP's cost: the weights and kernels (batch-1 latency),
# and, for throughput at saturation, the scheduler's limits too
ENGINE_KEYS = ("dtype", "load_format", "enforce_eager", "tensor_parallel_size", "pipeline_parallel_size",
               "attention_backend", "enable_prefix_caching", "max_model_len")
SCHEDULER_KEYS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization")


def checked_workload(text: str) -> str:
    """A stage's workload spec, canonical; a bad one is the spec's own one-line error, named as the stage's param."""
    from llmopt_bench.core.errors import UsageError
    from llmopt_bench.workloads.spec import parse_spec

    try:
        return parse_spec(text).canonical()
    except UsageError as e:
        raise UsageError(f"stage prefix-caching: bad param 'workload': {e.message.removeprefix('--workload ')}",
                         (e.fix or "").replace("--workload ", "workload = ")) from None


class PrefixCachingParams(VLLMServeParams):
    # the workload both arms send when the run's is the prompt file (a --workload of a generated kind wins)
    workload: Annotated[str, AfterValidator(checked_workload)] = Field(
        "shared-prefix:groups=4,per_group=8,prefix=1024,suffix=32,out=32", validate_default=True)
    concurrency: list[int] = Field(default_factory=lambda: [1, 16])
    throughput_point: bool = False  # the throughput point sends fixed prompts: nothing to cache
    quality: bool = False  # the weights and kernels are vllm-serve's; the cache changes no output


class PrefixCachingStage(VLLMServeStage):
    """vllm-serve twice on one workload with shared prefixes: the server with prefix caching off,
    then on, every other setting equal; the stage's figures are the "on" arm's, the "off" arm's
    beside them in extra.prefix_caching (scenarios/serving/caching_report.py)."""

    name = "prefix-caching"
    description = "vLLM's server with prefix caching off, then on, on prompts that share a prefix: TTFT and capacity"
    changes = "prefix caching: the KV of a prompt's leading blocks already computed for an earlier prompt is reused"
    Params = PrefixCachingParams

    def load(self, model, params, ctx: StageContext) -> LoadInfo:  # params: a PrefixCachingParams (Params)
        self.both: PrefixCachingParams = params
        return super().load(model, params.model_copy(update={"enable_prefix_caching": False}), ctx)

    def shaped(self, workload: WorkloadConfig) -> WorkloadConfig:
        """The run's workload if it is a generated kind, else the stage's own (params.workload)."""
        if not workload.from_prompt_file:
            return workload
        spec = self.both.workload  # canonical (checked_workload)
        return workload.model_copy(update={"spec": spec, "kind": spec.split(":", 1)[0]})

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        super().warmup(self.shaped(workload), ctx)

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        shaped = self.shaped(workload)
        ctx.progress("prefix caching off", None, None)
        off = super().run(shaped, ctx)  # stops the server
        ctx.progress("prefix caching on: restarting vllm serve", None, None)
        super().load(self.model_info, self.both.model_copy(update={"enable_prefix_caching": True}), ctx)
        super().warmup(shaped, ctx)
        on = super().run(shaped, ctx)
        extra = ServingExtra(**on.extra)
        extra.prefix_caching = PrefixCachingRecord(workload=shaped.spec, arms=[arm(off, False), arm(on, True)])
        on.extra = extra.model_dump(mode="json", exclude_none=True)
        for side, name in ((off, "off"), (on, "on")):  # requests.jsonl keeps both arms' points, each named by its arm
            for sample in side.requests:
                sample.point = f"prefix caching {name}: {sample.point}"
        on.requests = off.requests + on.requests
        return on

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:
        return comparison_blocks(result) + R.serving_blocks(result)

    @classmethod
    def claims(cls, result, run) -> list[Claim]:
        return [caching_claim(result)]


def arm(result: StageRun, on: bool) -> CachingArm:
    x, f = ServingExtra(**result.extra), result.facts
    return CachingArm(enable_prefix_caching=on, curve=x.curve, capacity_rps=f.slo_capacity_rps if f else None,
                      capacity_held=f.slo_capacity_held if f else None, main_point=x.main_point,
                      command=f.serve_command if f else None)
