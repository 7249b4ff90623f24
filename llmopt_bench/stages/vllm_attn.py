"""vllm-attn: vLLM's attention backends by context length, prefill and decode apart.

The flash-attn stage compares attention implementations inside transformers; this stage does
the same inside vLLM, where every backend is a FlashAttention-style kernel over the paged KV
cache: FLASH_ATTN (FlashAttention 2/3), TRITON_ATTN, FLASHINFER. Each backend is its own
engine (forced with attention_backend=...), verified from the backend vLLM says it uses, and
shut down, its processes and memory gone, before the next starts. Every cell is one request
at a time with a prompt of exactly `context` tokens, a different prompt each repeat, and
prefix caching off, so each TTFT is a real prefill. Speedups are against the first backend
that ran. docs/flash-attn.md."""

from __future__ import annotations

import importlib.util
from typing import Any

from pydantic import Field

from llmopt_bench.analysis.metrics import tpot, ttft
from llmopt_bench.distribution import Distribution
from llmopt_bench.engines import vllm as V
from llmopt_bench.engines.lifecycle import device_memory, wait_freed
from llmopt_bench.engines.vllm_params import VLLMEngineParams, engine_config, prepare_engine_env
from llmopt_bench.errors import describe
from llmopt_bench.scenarios.context_sweep import ContextSweepExtra, plan_contexts, speedups
from llmopt_bench.scenarios.context_sweep_report import SweepPresentation
from llmopt_bench.stage import LoadInfo, Requirements, Stage, StageContext, StageRun, StageSkipped
from llmopt_bench.workload import Request, WorkloadConfig, build_requests, fit_length

CUDA_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER")
NEEDS = {"FLASHINFER": "flashinfer"}  # backend -> the package it needs in vLLM's interpreter


class VLLMAttnParams(VLLMEngineParams):
    """The engine's options (VLLMEngineParams), and the sweep's."""

    backends: list[str] = Field(default_factory=lambda: list(CUDA_BACKENDS), min_length=1,
                                description="vLLM attention_backend names; 'auto' = vLLM's own choice")
    contexts: list[int] = Field(default_factory=lambda: [512, 2048, 8192], min_length=1)
    decode_tokens: int = Field(32, ge=1)
    repeats: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0)
    cpu_max_context: int | None = Field(1024, ge=1)


def plan_backends(requested: list[str], device: str, has_module) -> tuple[list[str], dict[str, str]]:
    """(backends to start, backend -> why it is skipped). On CPU the CUDA backends are skipped
    and vLLM's own CPU backend ('auto') is measured instead, so the stage still measures something."""
    run, skipped = [], {}
    for b in dict.fromkeys(requested):
        if b != "auto" and device != "cuda":
            skipped[b] = f"{b} is a CUDA backend; vLLM's CPU build has its own (measured as 'auto')"
        elif b in NEEDS and not has_module(NEEDS[b]):
            skipped[b] = f"{NEEDS[b]} not installed in vLLM's interpreter"
        else:
            run.append(b)
    if device != "cuda" and "auto" not in run:
        run.insert(0, "auto")
    return run, skipped


class VLLMAttnStage(SweepPresentation, Stage):
    name = "vllm-attn"
    description = "vLLM attention backends (FLASH_ATTN, TRITON_ATTN, FLASHINFER) by context length, prefill and decode apart"
    changes = "attention backend only, inside vLLM: same weights, dtype and engine; each backend forced and verified"
    requires = Requirements(imports={"vllm": "vllm"}, engine="vllm")
    Params = VLLMAttnParams
    Extra = ContextSweepExtra
    own_workload = True


    def load(self, model, params: VLLMAttnParams, ctx: StageContext) -> LoadInfo:
        self.params, self.model, self.device = params, model, ctx.device
        prepare_engine_env(params, ctx.device)
        self.contexts, self.notes = plan_contexts(params.contexts, model.max_position_embeddings, ctx.device,
                                                  params.cpu_max_context)
        self.contexts = self._within_positions(self.contexts, model.max_position_embeddings)
        if not self.contexts:
            raise StageSkipped("no context length left to measure: " + "; ".join(self.notes),
                               "pass contexts within the model's max_position_embeddings (and cpu_max_context on CPU)")
        self.backends, self.skipped = plan_backends(params.backends, ctx.device,
                                                    lambda m: importlib.util.find_spec(m) is not None)
        if not self.backends:
            raise StageSkipped("no attention backend to start: " + "; ".join(f"{b}: {why}" for b, why in self.skipped.items()),
                               "install what the backends need in vLLM's interpreter, or ask for others in backends")
        if ctx.device != "cuda":
            self.notes.append("CPU: vLLM's CPU build has one attention backend; the CUDA backends are skipped")
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model.path)
        import vllm

        return LoadInfo(implementation={"engine": "vllm", "backends": self.backends, "contexts": self.contexts,
                                        "skipped": self.skipped, "engines_started": "in run(), one per backend"},
                        versions={"vllm": vllm.__version__}, notes=list(self.notes))

    def _within_positions(self, contexts: list[int], max_positions: int | None) -> list[int]:
        """vLLM holds a request's prompt and its new tokens within the model's positions (a longer
        max_model_len is refused, and forced with VLLM_ALLOW_LONG_MAX_MODEL_LEN it reads past
        the rotary table: a device assert on the H200). A context at the limit is measured with
        that many fewer prompt tokens."""
        if not max_positions:
            return contexts
        room = max_positions - (self.params.decode_tokens + 1)
        for c in contexts:
            if c > room:
                self.notes.append(f"context {c} measured with {room} prompt tokens: prompt and {self.params.decode_tokens + 1} "
                                  f"new tokens must fit the model's {max_positions} positions")
        return sorted({min(c, room) for c in contexts})

    def _requests(self, workload: WorkloadConfig, context: int, n: int, tag: str) -> list[Request]:
        base = build_requests(workload.model_copy(update={"num_prompts": n, "input_len": None}),
                              lambda t: self.tok(t, add_special_tokens=False)["input_ids"], count=n, tag=tag)
        return [Request(id=r.id, prompt_id=r.prompt_id, token_ids=tuple(fit_length(list(r.token_ids), context)))
                for r in base]

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        p = self.params
        rows: list[dict[str, Any]] = []
        engines: list[dict[str, Any]] = []
        cells: dict[tuple[str, int], list] = {}
        for b, why in self.skipped.items():
            rows += [self._row(b, c, status="skipped", reason=why) for c in self.contexts]
        max_len = max(self.contexts) + p.decode_tokens + 8
        if self.model.max_position_embeddings:
            max_len = min(max_len, self.model.max_position_embeddings)
        for i, backend in enumerate(self.backends):
            ctx.progress(f"starting vLLM with attention backend {backend} ({i + 1}/{len(self.backends)})", None, None)
            # every TTFT a real prefill: prefix caching off whatever the params say
            cfg = engine_config(p.model_copy(update={"max_model_len": max_len, "enable_prefix_caching": False,
                                                     "attention_backend": None if backend == "auto" else backend}),
                                self.device, None)
            before = device_memory(use_torch=False)
            llm = None
            try:
                llm, info = V.build_engine(self.model.path, cfg, ctx.log_path)
                effective = info.implementation.get("attention_backend")
                engine = {"backend": backend, "effective": effective, "load_s": info.phases_s, "kv_cache": info.implementation.get("kv_cache")}
                if backend != "auto" and effective != backend:
                    raise RuntimeError(f"asked for {backend}, vLLM used {effective}")
                for c in self.contexts:
                    row, samples = self._cell(llm, workload, backend, c, effective)
                    rows.append(row)
                    cells[(backend, c)] = samples
                    ctx.progress(f"{backend} context {c}: {row['status']}" + (
                        f", ttft {row['ttft_s']['p50'] * 1e3:.1f} ms, tpot {row['tpot_s']['p50'] * 1e3:.2f} ms/tok"
                        if row["status"] == "ok" else f" ({row['reason']})"), None, None)
            except Exception as e:  # noqa: BLE001 - one backend failing must not end the sweep
                reason = describe(e, 300)
                engine = {"backend": backend, "error": reason}
                rows += [self._row(backend, c, status="failed", reason=reason) for c in self.contexts
                         if (backend, c) not in cells]
            finally:
                V.shutdown(llm)
                llm = None
                engine["lifecycle"] = wait_freed(before, use_torch=False)
                engines.append(engine)
        ran = [b for b in self.backends if any(r["impl"] == b and r["status"] == "ok" for r in rows)]
        if not ran:  # a stage that measured nothing is not ok
            raise RuntimeError("no attention backend ran: " + "; ".join(f"{e['backend']}: {e.get('error') or 'no cell completed'}"
                                                                      for e in engines))
        base = ran[0]
        extra = {"sweep": rows, "engines": engines, "baseline": base, "speedups": speedups(rows, base)}
        c = max(c for (b, c) in cells if b == base)
        samples = cells[(base, c)]
        self.notes.append(f"samples (the metrics table): {base}, context {c}")
        return StageRun(samples=samples, extra=extra, notes=self.notes)

    def _cell(self, llm, workload: WorkloadConfig, backend: str, context: int, effective: str | None):
        p = self.params
        reqs = self._requests(workload, context, p.warmup + p.repeats, f"{backend}-{context}-")
        if p.warmup:
            V.serve(llm, reqs[:p.warmup], p.decode_tokens + 1, concurrency=1)
        samples = []
        for rep, r in enumerate(reqs[p.warmup:]):
            samples += V.serve(llm, [r], p.decode_tokens + 1, concurrency=1, repeat=rep)
        ok = [s for s in samples if s.ok and s.output_tokens == p.decode_tokens + 1]
        ttft_d = Distribution.of([ttft(s) for s in ok])
        tpot_d = Distribution.of([t for s in ok if (t := tpot(s)) is not None])
        row = self._row(backend, context, status="ok" if ttft_d and tpot_d else "failed",
                        reason=None if ttft_d and tpot_d else f"{len(ok)} of {len(samples)} requests complete")
        row.update(effective_impl=effective, ttft_s=ttft_d.model_dump() if ttft_d else None,
                   tpot_s=tpot_d.model_dump() if tpot_d else None)
        return row, samples

    @staticmethod
    def _row(backend: str, context: int, status: str, reason: str | None) -> dict[str, Any]:
        return {"impl": backend, "effective_impl": None, "context": context, "batch": 1, "ttft_s": None,
                "tpot_s": None, "peak_bytes": None, "status": status, "reason": reason}

    def teardown(self) -> None:
        pass  # every engine is shut down inside run()
