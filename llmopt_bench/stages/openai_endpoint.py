"""openai-endpoint: the serving load (scenarios/serving/run.py) on a server the user runs, any
OpenAI-compatible /v1/completions endpoint (vLLM, SGLang, TGI, TensorRT-LLM, llama.cpp's server,
a remote deployment). llmopt did not start it, so it claims no GPU, memory, energy or engine
figure for it (Stage.owns_device = False) and measures no quality.

The API key is read from the environment variable the params name (api_key_env), sent as a
header and never written anywhere. An endpoint that cannot be used (connection refused, a key
refused, an unknown model, a server that does not stream) is found before any load runs and
the stage is skipped with the reason and the fix; a request that fails later fails alone."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field

from llmopt_bench.client.cluster import client_processes
from llmopt_bench.client.errors import error_kind, fix_for
from llmopt_bench.client.http_load import HTTPLoad
from llmopt_bench.client.openai_http import Endpoint, OpenAIClient, TokenCounter
from llmopt_bench.client.workers import WorkerConfig
from llmopt_bench.core.contract import Stage, StageContext, StageSkipped
from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import Block, LoadInfo, QualityRecord, StageRun
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.load.plans import PlanLoad
from llmopt_bench.scenarios.serving import report as R
from llmopt_bench.scenarios.serving.record import ServingExtra, ServingParams
from llmopt_bench.scenarios.serving.run import ServingRun, serving_plans
from llmopt_bench.workloads.text import PromptTexts

NO_QUALITY = "a server llmopt did not start: its weights are not known to llmopt, so quality is not measured"


class EndpointParams(ServingParams):
    endpoint: str = Field(description="the server's base URL, http://host:port or .../v1")
    model: str = Field(description="the model name the server answers to (its /v1/models lists them)")
    api_key_env: str | None = None  # the NAME of the environment variable that holds the key, never the key
    tokenizer: str | None = None  # the server model's tokenizer (a path or hub id): prompts and token counts
    force_length: bool = True  # send ignore_eos + min_tokens (vLLM, SGLang); off for servers that refuse unknown fields
    return_token_ids: bool = True  # ask for token ids in the stream (vLLM): exact counts
    prompt_format: Literal["text", "tokens"] = "text"  # text: any server tokenizes it; tokens: servers that take ids
    replicas: list[str] = Field(default_factory=list)  # more base URLs serving the same model: requests round-robin over all


class OpenAIEndpointStage(Stage):
    name = "openai-endpoint"
    description = "any OpenAI-compatible server the user runs, under the serving load over HTTP"
    changes = "the engine is the user's: the same load on any server"
    own_workload = True
    any_workload = True
    owns_device = False
    Params = EndpointParams
    Extra = ServingExtra

    def load(self, model, params, ctx: StageContext) -> LoadInfo:  # params: an EndpointParams (Params)
        from transformers import AutoTokenizer

        self.params: EndpointParams = params
        notes = []
        try:
            self.tok = AutoTokenizer.from_pretrained(params.tokenizer or model.path)
        except (OSError, ValueError) as e:
            raise StageSkipped(f"tokenizer {params.tokenizer!r} cannot be loaded: {str(e).splitlines()[0][:200]}",
                               "pass the server model's tokenizer directory (or hub id) as tokenizer") from None
        if not params.tokenizer:
            notes.append(f"prompts built with the run's model tokenizer ({model.source}), not the server's: prompt "
                         "lengths are approximate, the server's usage field gives the counted ones")
        self.endpoint = Endpoint(params.endpoint, params.model, api_key_env=params.api_key_env,
                                 request_timeout_s=params.request_timeout_s, force_length=params.force_length,
                                 return_token_ids=params.return_token_ids, sampling=params.sampling(),
                                 kernel_clock=params.kernel_clock)
        served = self._check(ctx)
        return LoadInfo(implementation={"engine": "openai-endpoint", "url": params.endpoint, "model": params.model,
                                        "served_models": served, "api_key_env": params.api_key_env,
                                        "tokenizer": params.tokenizer or f"the run's model ({model.source})"},
                        notes=notes + [R.NOT_OWNED])

    def _check(self, ctx: StageContext) -> list[str]:
        """The endpoint answers, knows the model, accepts the key and streams: one short request."""
        ctx.progress(f"checking {self.params.endpoint}", None, None)

        async def go():
            async with OpenAIClient(self.endpoint) as client:
                served = await client.check_model()
                return served, await client.complete("check", "check", "Hello", 2)
        try:
            served, sample = asyncio.run(go())
        except UsageError as e:  # connection refused, a key refused, an unknown model, no model list
            raise StageSkipped(e.message, e.fix) from None
        if not sample.ok:
            kind = error_kind(sample) or "protocol"
            raise StageSkipped(f"{self.params.endpoint}: the first request failed: {sample.error}", fix_for(kind, self.endpoint))
        return served

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        p = self.params
        encode = lambda text: self.tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
        plan, tp_plan = serving_plans(workload, self.tok, None, encode, None, p)
        # text of the asked length on this tokenizer: exact where it is the server's (the rows' prompt_count say)
        texts = PromptTexts(self.tok, workload.seed) if p.prompt_format == "text" else None
        replicas = [replace(self.endpoint, base_url=url) for url in p.replicas]
        count = TokenCounter(self.tok) if p.tokenizer else None
        processes = client_processes(p.client_workers, p.client_cluster, p.client_nodes,
                                     WorkerConfig((self.endpoint, *replicas), texts=texts, count_text=count))
        client = HTTPLoad(self.endpoint, texts=texts, count_text=count, replicas=replicas, **processes)
        target = {"kind": "OpenAI-compatible endpoint (not started by llmopt)", "url": p.endpoint, "model": p.model,
                  "api_key_env": p.api_key_env, **({"replicas": ", ".join(p.replicas)} if p.replicas else {})}
        serving = ServingRun(client, target, p, PlanLoad(plan), PlanLoad(tp_plan), ctx, workload.seed,
                             expected_tokens=p.force_length and p.return_token_ids)
        try:
            samples, extra, facts = serving.run()
        finally:
            client.close()
        facts.workload = None if workload.from_prompt_file else plan.record()
        extra.owns_device = False
        quality = QualityRecord(perplexity_meaningful=False, perplexity_note=NO_QUALITY, agreement_note=NO_QUALITY,
                                engine="openai-endpoint")
        return StageRun(samples=samples, requests=serving.requests, extra=extra.model_dump(mode="json", exclude_none=True),
                        quality=quality, facts=facts)

    @classmethod
    def report_blocks(cls, result, run) -> list[Block]:
        return R.serving_blocks(result)

    @classmethod
    def charts(cls, result, run, out_dir: Path) -> list[Path]:
        path = R.curve_chart(result, out_dir / f"{result.name}_load.png")
        return [path] if path else []
