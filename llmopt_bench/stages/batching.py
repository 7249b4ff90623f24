"""Continuous batching: requests arrive over time and join vLLM's running batch; the same
arrivals replayed against transformers with static batching show what it buys.

One stage process, in order:
1. vLLM (max_num_seqs, max_num_batched_tokens): a sweep over concurrency (closed loop) or
   arrival rate (Poisson), an optional 256 x 128/128 throughput point, the mixed-length set,
   and the KV-cache capacity from the engine's block count.
2. The engine is shut down; device memory is recorded before, with and after it.
3. transformers in this process: the same requests and arrivals through a static batcher.
4. Isolated probes (one process each, so an OOM ends only the probe): the mixed-length
   pitfall (static-mixed, cap-context, bucketed) and transformers' capacity per context.
See docs/batching.md for the definitions (goodput, closed loop, Poisson) and extra's keys."""

from __future__ import annotations

import gc
import time
from typing import Any, Literal

from pydantic import Field

from llmopt_bench.analysis.metrics import compute, tpot, ttft
from llmopt_bench.engines import hf
from llmopt_bench.engines import vllm as V
from llmopt_bench.engines.lifecycle import cmdline, descendants, device_memory, rss, wait_freed
from llmopt_bench.engines.static_batching import load_model, run_isolated, static_serve
from llmopt_bench.engines.vllm_kv import kv_cache_record
from llmopt_bench.engines.vllm_params import VLLMEngineParams, engine_config, prepare_engine_env
from llmopt_bench.errors import describe, is_oom
from llmopt_bench.scenarios.arrivals_record import BatchingExtra
from llmopt_bench.scenarios.capacity import hf_capacity, vllm_capacity_rows
from llmopt_bench.stage import LoadInfo, RequestSample, Requirements, Stage, StageContext, StageFacts, StageRun
from llmopt_bench.workload import Request, WorkloadConfig, build_requests, fit_length, load_prompts, poisson_arrivals

Attn = Literal["eager", "sdpa", "flash_attention_2"]
H200_REFERENCE = {"vllm_fp16_batch1_ms_per_token": 4.63, "vllm_fp16_256x128_out_tok_s": 11311,
                  "vllm_fp16_batch16_out_tok_s": 2998, "transformers_sdpa_batch16_out_tok_s": 606,
                  "model": "Llama-2-7B shape, FP16, one H200"}


class BatchingParams(VLLMEngineParams):
    max_num_seqs: int | None = 256  # the engine's running-batch limit (the story used 32)
    max_num_batched_tokens: int | None = 4096  # tokens per engine step (prefill chunks + decodes)
    mode: Literal["closed", "poisson"] = "closed"
    concurrency: list[int] = Field(default_factory=lambda: [1, 4, 16, 32, 64])
    rates: list[float] = Field(default_factory=lambda: [1.0, 4.0, 16.0])  # requests/s (poisson mode)
    main_concurrency: int = Field(16, ge=1)  # the point whose samples the stage returns
    main_rate: float | None = None  # poisson mode; default: the middle rate
    min_requests: int = Field(32, ge=1)  # requests per point: max(min_requests, 4 * concurrency)...
    max_requests: int = Field(256, ge=1)  # ...capped here
    poisson_requests: int = Field(64, ge=1)
    input_len: int | None = Field(None, ge=1)  # override the workload's prompt length (e.g. 128)
    output_len: int | None = Field(None, ge=1)  # override --max-new-tokens (e.g. 128)
    slo_ttft_s: float = 2.0
    slo_tpot_s: float = 0.1
    throughput_point: bool = False  # 256 concurrent requests of 128 in / 128 out
    throughput_requests: int = 256
    throughput_input_len: int = 128
    throughput_output_len: int = 128
    static_replay: bool = True
    static_timeout_s: float = 0.05  # a static batch starts when N wait or the oldest waited this long
    static_batch_size: int | None = None  # N; default: the point's concurrency (poisson: main_concurrency)
    static_attn_implementation: Attn = "sdpa"
    capacity: bool = True
    contexts: list[int] = Field(default_factory=lambda: [2048, 4096])
    max_batch: int = 64  # transformers capacity probe: 1, 2, 4, ... up to this (CUDA)
    capacity_attn_implementation: Attn = "eager"
    capacity_decode_steps: int = 4
    mixed: Literal["auto", "on", "off"] = "auto"  # auto: with --workload mixed, or on CUDA
    mixed_batch: int = 32
    cap_context: int = 1024
    long_len: int | Literal["auto"] | None = "auto"  # long docs forced to N tokens; auto: 3584 on CUDA
    bucket_token_budget: int | None = None  # padded prompt tokens per bucketed batch; default mixed_batch * cap_context
    mixed_attn_implementation: Attn = "eager"
    probe_timeout_s: float = 900.0


def summarize(samples: list[RequestSample], *, requested: int, expected_tokens: int, slo_ttft_s: float,
              slo_tpot_s: float, oom: bool = False, **keys: Any) -> dict[str, Any]:
    """One curve row: throughput, latency percentiles and goodput of a point's requests."""
    complete = [s for s in samples if s.ok and s.output_tokens == expected_tokens]
    repeats = max(1, len({s.repeat for s in samples}))
    m = compute(complete) if complete else None
    goodputs = []
    for rep in sorted({s.repeat for s in complete}):
        group = [s for s in complete if s.repeat == rep]
        window = max(s.t_done for s in group) - min(s.t_submit for s in group)
        good = [s for s in group if ttft(s) <= slo_ttft_s and (tpot(s) is None or tpot(s) <= slo_tpot_s)]
        if window > 0:
            goodputs.append(len(good) / window)

    def pct(d: Any, q: str) -> float | None:
        return getattr(d, q) if d is not None else None

    return {**keys, "requests": requested, "completed": len(complete), "repeats": repeats,
            "output_tok_s": m.output_tok_s if m else None, "qps": m.qps if m else None,
            "ttft_p50_s": pct(m and m.ttft_s, "p50"), "ttft_p99_s": pct(m and m.ttft_s, "p99"),
            "tpot_p50_s": pct(m and m.tpot_s, "p50"), "tpot_p99_s": pct(m and m.tpot_s, "p99"),
            "e2e_p50_s": pct(m and m.e2e_s, "p50"), "e2e_p99_s": pct(m and m.e2e_s, "p99"),
            "goodput_rps": sum(goodputs) / len(goodputs) if goodputs else (0.0 if samples or oom else None),
            "failed": requested * repeats - len(complete), "oom": oom}


class ContinuousBatchingStage(Stage):
    name = "continuous-batching"
    description = "vLLM continuous batching under arrivals (closed loop or Poisson) vs the same arrivals statically batched in transformers"
    changes = "scheduling: requests join and leave the running batch every step instead of waiting for a static batch"
    own_workload = True  # arrivals at several concurrencies, not one request at a time
    requires = Requirements(imports={"vllm": "vllm", "transformers": "test", "torch": "test"}, engine="vllm")
    Params = BatchingParams
    Extra = BatchingExtra

    @classmethod
    def claims(cls, result, run):
        from llmopt_bench.scenarios.arrivals_report import batching_claim

        return [batching_claim(result.extra_as(BatchingExtra), run)]

    @classmethod
    def report_blocks(cls, result, run):
        from llmopt_bench.scenarios.arrivals_report import batching_blocks

        return batching_blocks(result.extra_as(BatchingExtra))

    @classmethod
    def charts(cls, result, run, out_dir):
        from llmopt_bench.scenarios.arrivals_report import curve_chart

        path = curve_chart(result.name, result.extra_as(BatchingExtra).curve, out_dir / f"{result.name}-curve.png")
        return [path] if path else []

    # --- load ---------------------------------------------------------------------------------

    def load(self, model, params, ctx: StageContext) -> LoadInfo:
        self.llm, self.hf_model = None, None
        self.params, self.model, self.device, self.ctx = params, model, ctx.device, ctx
        self.notes: list[str] = []
        self.lifecycle: dict[str, Any] = {"device": ctx.device, "before_engine": device_memory(use_torch=False),
                                          "processes_before_engine": len(descendants())}
        prepare_engine_env(params, ctx.device)
        self.cfg = engine_config(params, ctx.device, model.max_position_embeddings)
        ctx.progress(f"starting vLLM ({self.cfg.dtype}, max_num_seqs={params.max_num_seqs}, "
                     f"max_num_batched_tokens={params.max_num_batched_tokens})", None, None)
        self.llm, info = V.build_engine(model.path, self.cfg, ctx.log_path)
        self.tok = self.llm.get_tokenizer()
        self.max_model_len = self.llm.llm_engine.vllm_config.model_config.max_model_len
        info.implementation.update(max_num_seqs=params.max_num_seqs, max_num_batched_tokens=params.max_num_batched_tokens,
                                   static_attn_implementation=params.static_attn_implementation)
        return info

    def _encode(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def _fit(self, reqs: list[Request], new: int) -> list[Request]:
        """Prompts longer than the engine's max_model_len leave room for the output (keep the tail)."""
        room = self.max_model_len - new
        out = []
        for r in reqs:
            if len(r.token_ids) > room:
                out.append(Request(r.id, r.prompt_id, r.token_ids[-room:]))
            else:
                out.append(r)
        cut = sum(1 for a, b in zip(reqs, out) if a is not b)
        if cut:
            note = f"{cut} prompt(s) truncated to {room} tokens to fit max_model_len={self.max_model_len} with {new} new tokens"
            if note not in self.notes:
                self.notes.append(note)
        return out

    def warmup(self, workload: WorkloadConfig, ctx: StageContext) -> None:
        if workload.warmup:
            reqs = build_requests(workload, self._encode, count=max(workload.warmup, 2), tag="w")
            V.serve(self.llm, self._fit(reqs, workload.max_new_tokens), workload.max_new_tokens,
                    concurrency=min(len(reqs), self.params.main_concurrency))

    # --- the sweep ----------------------------------------------------------------------------

    def _points(self, workload: WorkloadConfig) -> list[dict[str, Any]]:
        """Each point: its key, requests, arrivals (poisson) or concurrency (closed loop)."""
        p = self.params
        wl = workload.model_copy(update={"input_len": p.input_len}) if p.input_len else workload
        new = p.output_len or workload.max_new_tokens
        points = []
        if p.mode == "closed":
            levels = sorted(set(p.concurrency) | {p.main_concurrency})
            for c in levels:
                n = min(p.max_requests, max(p.min_requests, 4 * c))
                reqs = self._fit(build_requests(wl, self._encode, count=n), new)
                points.append({"key": {"mode": None, "concurrency": c}, "requests": reqs, "arrivals": None,
                               "concurrency": c, "static_batch": p.static_batch_size or c,
                               "main": c == p.main_concurrency, "new": new})
        else:
            main_rate = p.main_rate if p.main_rate is not None else sorted(p.rates)[len(p.rates) // 2]
            self.main_rate = main_rate
            for k, rate in enumerate(sorted(set(p.rates) | {main_rate})):
                n = min(p.max_requests, p.poisson_requests)
                reqs = self._fit(build_requests(wl, self._encode, count=n), new)
                points.append({"key": {"mode": None, "concurrency": None, "rate_rps": rate}, "requests": reqs,
                               "arrivals": poisson_arrivals(rate, n, seed=workload.seed + k), "concurrency": None,
                               "static_batch": p.static_batch_size or p.main_concurrency,
                               "main": rate == main_rate, "new": new})
        return points

    def _serve(self, point: dict[str, Any], repeat: int = 0) -> list[RequestSample]:
        return V.serve(self.llm, point["requests"], point["new"], arrivals=point["arrivals"],
                       concurrency=point["concurrency"], repeat=repeat,
                       on_done=lambda d: self.ctx.progress(self._label(point, "continuous"), d, len(point["requests"])))

    @staticmethod
    def _label(point: dict[str, Any], mode: str) -> str:
        k = point["key"]
        where = f"concurrency {k['concurrency']}" if k.get("concurrency") and "rate_rps" not in k else f"{k.get('rate_rps')} req/s"
        return f"{mode}: {where}"

    def _row(self, point: dict[str, Any], mode: str, samples: list[RequestSample], oom: bool = False, **more) -> dict[str, Any]:
        p = self.params
        key = {**point["key"], "mode": mode}
        if mode == "static":
            key["static_batch"] = point["static_batch"]
            if point["arrivals"] is None:
                key["concurrency"] = point["concurrency"]
        return summarize(samples, requested=len(point["requests"]), expected_tokens=point["new"],
                         slo_ttft_s=p.slo_ttft_s, slo_tpot_s=p.slo_tpot_s, oom=oom, **key, **more)

    # --- the mixed-length set -----------------------------------------------------------------

    def _mixed_on(self, workload: WorkloadConfig) -> bool:
        return self.params.mixed == "on" or (self.params.mixed == "auto" and (workload.kind == "mixed" or self.device == "cuda"))

    def _mixed_requests(self, workload: WorkloadConfig, new: int) -> tuple[list[Request], int]:
        """mixed_batch requests, a quarter long documents; long ones forced to long_len tokens."""
        p = self.params
        wl = workload.model_copy(update={"kind": "mixed", "input_len": None, "num_prompts": p.mixed_batch})
        reqs = build_requests(wl, self._encode, tag="m")
        kinds = {q.id: q.kind for q in load_prompts(workload.prompts)}
        long_ids = {r.id for r in reqs if kinds.get(r.prompt_id) == "long"}
        if not long_ids:  # no kind labels: the longest quarter
            ranked = sorted(reqs, key=lambda r: -len(r.token_ids))
            long_ids = {r.id for r in ranked[:max(1, len(reqs) // 4)]}
        long_len = (3584 if self.device == "cuda" else None) if p.long_len == "auto" else p.long_len
        if long_len:
            reqs = [Request(r.id, r.prompt_id, tuple(fit_length(list(r.token_ids), long_len))) if r.id in long_ids else r
                    for r in reqs]
        return self._fit(reqs, new), len(long_ids)

    # --- run ----------------------------------------------------------------------------------

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        p = self.params
        points = self._points(workload)
        curve: list[dict[str, Any]] = []
        samples: list[RequestSample] = []
        cont_rows: dict[int, dict[str, Any]] = {}
        for i, point in enumerate(points):
            got: list[RequestSample] = []
            for rep in range(workload.repeats if point["main"] else 1):
                got += self._serve(point, rep)
            if point["main"]:
                samples = got
            cont_rows[i] = self._row(point, "continuous", got)
            curve.append(cont_rows[i])
        extra: dict[str, Any] = {
            "sweep": {"mode": p.mode, "main_concurrency": p.main_concurrency, "main_rate": getattr(self, "main_rate", None),
                      "slo_ttft_s": p.slo_ttft_s, "slo_tpot_s": p.slo_tpot_s,
                      "output_len": points[0]["new"], "input_len": p.input_len or workload.input_len,
                      "static_timeout_s": p.static_timeout_s, "static_attn_implementation": p.static_attn_implementation},
            "engine": {"max_num_seqs": p.max_num_seqs, "max_num_batched_tokens": p.max_num_batched_tokens,
                       "max_model_len": self.max_model_len, "dtype": self.cfg.dtype},
            "h200_reference": H200_REFERENCE,
        }

        tp_point = None
        if p.throughput_point:
            wl = workload.model_copy(update={"input_len": p.throughput_input_len})
            reqs = self._fit(build_requests(wl, self._encode, count=p.throughput_requests, tag="t"), p.throughput_output_len)
            tp_point = {"key": {"mode": None, "concurrency": p.throughput_requests, "input_len": p.throughput_input_len,
                                "output_len": p.throughput_output_len},
                        "requests": reqs, "arrivals": None, "concurrency": p.throughput_requests,
                        "static_batch": p.throughput_requests, "main": False, "new": p.throughput_output_len}
            extra["throughput_point"] = {"continuous": self._row(tp_point, "continuous", self._serve(tp_point)),
                                         "reference_h200_out_tok_s": H200_REFERENCE["vllm_fp16_256x128_out_tok_s"]}

        mixed_on = self._mixed_on(workload)
        mixed_rows: list[dict[str, Any]] = []
        if mixed_on:
            new = points[0]["new"]
            mreqs, n_long = self._mixed_requests(workload, new)
            mpoint = {"key": {"mode": None, "concurrency": p.mixed_batch}, "requests": mreqs, "arrivals": None,
                      "concurrency": p.mixed_batch, "static_batch": p.mixed_batch, "main": False, "new": new}
            t0 = time.perf_counter()
            msamples = self._serve(mpoint)
            wall = time.perf_counter() - t0
            row = self._row(mpoint, "continuous", msamples)
            mixed_rows.append({"config": "continuous", "status": "ok", "requests": len(mreqs), "long_requests": n_long,
                               "max_prompt_len": max(len(r.token_ids) for r in mreqs),
                               "prompt_tokens": sum(len(r.token_ids) for r in mreqs), "padded_prompt_tokens": None,
                               "output_tokens": sum(s.output_tokens for s in msamples), "seconds": round(wall, 4),
                               "all_tokens_produced": row["failed"] == 0, "output_tok_s": row["output_tok_s"],
                               "ttft_p50_s": row["ttft_p50_s"], "e2e_p50_s": row["e2e_p50_s"],
                               "memory_at_oom_bytes": None, "peak_bytes": None,
                               "note": "vLLM: paged KV cache preallocated at start-up, no padding; peak is the engine's footprint (see lifecycle)"})

        kv = kv_cache_record(self.llm, self.model, self.cfg.dtype, ctx.log_path, p.max_num_seqs)
        cap_rows = vllm_capacity_rows(kv, p.contexts, p.max_num_seqs)
        extra["kv_cache"] = kv.model_dump() if kv else None
        self._keep(extra, curve, mixed_rows)

        # --- the engine goes, and its memory with it ---------------------------------------
        engine_pids = descendants()
        self.lifecycle.update(with_engine=device_memory(use_torch=self.device == "cuda"),
                              engine_processes=len(engine_pids), engine_rss_bytes=rss(engine_pids),
                              engine_process_names=[cmdline(pid)[:120] for pid in engine_pids])
        if mixed_rows:
            used = self.lifecycle["with_engine"].get("nvml_used_bytes")
            before = self.lifecycle["before_engine"].get("nvml_used_bytes")
            mixed_rows[0]["peak_bytes"] = (used - before) if used is not None and before is not None else self.lifecycle["engine_rss_bytes"]
        ctx.progress("shutting the vLLM engine down", None, None)
        t0 = time.perf_counter()
        llm, self.llm = self.llm, None
        V.shutdown(llm)
        del llm
        self.lifecycle.update(wait_freed(self.lifecycle["before_engine"], self.device == "cuda"))
        self.lifecycle["shutdown_s"] = round(time.perf_counter() - t0, 3)

        # --- the same arrivals, statically batched ------------------------------------------
        if p.static_replay:
            self._load_hf(p.static_attn_implementation)
            for i, point in enumerate(points):
                curve.append(self._static(point))
            if tp_point is not None:
                extra["throughput_point"]["static"] = self._static(tp_point)
            self._unload_hf()
        extra["curve"] = curve
        self._keep(extra, curve, mixed_rows)
        for row in curve:
            if row["mode"] == "static":
                match = next((r for r in curve if r["mode"] == "continuous" and r.get("concurrency") == row.get("concurrency")
                              and r.get("rate_rps") == row.get("rate_rps")), None)
                if match and match["output_tok_s"] and row["output_tok_s"]:
                    row["continuous_speedup"] = match["output_tok_s"] / row["output_tok_s"]

        # --- isolated probes: the mixed-length pitfall, transformers capacity ---------------
        probe_dir = ctx.stage_dir / "probes"
        if mixed_on:
            budget = p.bucket_token_budget or p.mixed_batch * p.cap_context
            base = {"model_path": self.model.path, "device": self.device, "dtype": self.cfg.dtype,
                    "attn_implementation": p.mixed_attn_implementation, "requests": [list(r.token_ids) for r in mreqs],
                    "max_new_tokens": points[0]["new"], "batch_size": p.mixed_batch, "cap_context": p.cap_context,
                    "bucket_token_budget": budget}
            for config in ("static-mixed", "cap-context", "bucketed"):
                ctx.progress(f"mixed lengths: {config} (own process)", None, None)
                ans = run_isolated("mixed", {**base, "config": config}, p.probe_timeout_s, probe_dir)
                ans.setdefault("config", config)
                ans.setdefault("memory_at_oom_bytes", None)
                mixed_rows.append(ans)
            order = ["static-mixed", "cap-context", "bucketed", "continuous"]
            mixed_rows.sort(key=lambda r: order.index(r["config"]) if r["config"] in order else len(order))
            extra["mixed"] = mixed_rows
            extra["mixed_setup"] = {"requests": len(mreqs), "long_requests": n_long, "batch": p.mixed_batch,
                                    "cap_context": p.cap_context, "bucket_token_budget": budget,
                                    "attn_implementation": p.mixed_attn_implementation,
                                    "long_len": max(len(r.token_ids) for r in mreqs)}
            if self.device != "cuda":
                self.notes.append("mixed lengths on CPU: the configurations ran (peak RSS recorded); "
                                  "the OOM of static-mixed needs the GPU")
            self._keep(extra, curve, mixed_rows)
        if p.capacity:
            rows, probes = hf_capacity(self.model.path, self.device, self.cfg.dtype, p.capacity_attn_implementation,
                                       p.contexts, p.max_batch, p.capacity_decode_steps, p.probe_timeout_s, probe_dir,
                                       progress=lambda m: ctx.progress(m, None, None))
            extra["capacity"] = cap_rows + rows
            extra["capacity_probes"] = probes
        else:
            extra["capacity"] = cap_rows
        extra["lifecycle"] = self.lifecycle
        return StageRun(samples=samples, extra=extra, notes=self.notes, facts=facts(extra, p.main_concurrency if p.mode == "closed" else None))

    def _keep(self, extra: dict[str, Any], curve: list[dict[str, Any]], mixed: list[dict[str, Any]]) -> None:
        """What is measured so far, on disk in the stage's directory: a stage cut off by its
        timeout or a signal still leaves its vLLM sweep (and static replay) behind."""
        import json

        part = {**extra, "curve": curve, "mixed": mixed, "lifecycle": self.lifecycle, "notes": self.notes}
        self.ctx.keep_partial(json.loads(json.dumps(part, default=str)))

    # --- transformers ---------------------------------------------------------------------------

    def _load_hf(self, attn: str) -> None:
        self.ctx.progress(f"loading transformers ({self.cfg.dtype}, {attn}) for the static-batching replay", None, None)
        self.lifecycle["t_transformers_load"] = time.perf_counter()
        self.hf_model, self.hf_tok = load_model(self.model.path, self.device, self.cfg.dtype, attn)
        self.pad_id = self.hf_tok.pad_token_id
        self.lifecycle["transformers_loaded"] = device_memory(use_torch=self.device == "cuda")
        warm = [Request("w0", "w", (1, 2, 3, 4)), Request("w1", "w", (5, 6))]
        hf.generate_batch(self.hf_model, self.pad_id, warm, 4, self.device, streamer=True)

    def _unload_hf(self) -> None:
        """Drop the model and hand its memory back to the device: the probes that follow run in
        other processes and must not find it held in this one's allocator cache."""
        if getattr(self, "hf_model", None) is None:
            return
        self.hf_model = None
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()
        self.lifecycle["transformers_unloaded"] = device_memory(use_torch=self.device == "cuda")

    def _static(self, point: dict[str, Any]) -> dict[str, Any]:
        label = self._label(point, "static")
        n = len(point["requests"])

        def gen(batch, b):
            return hf.generate_batch(self.hf_model, self.pad_id, batch, point["new"], self.device, batch=b)

        msg = None
        try:
            got = static_serve(gen, point["requests"], batch_size=point["static_batch"], timeout_s=self.params.static_timeout_s,
                               arrivals=point["arrivals"], concurrency=point["concurrency"],
                               on_batch=lambda d: self.ctx.progress(label, d, n))
        except BaseException as e:  # noqa: BLE001 - an OOM at this batch size is a result
            if not is_oom(e):
                raise
            msg = describe(e, 200)
        if msg is None:
            return self._row(point, "static", got)
        if self.device == "cuda":  # the failed step's tensors are gone with the exception
            import torch

            torch.cuda.empty_cache()
        return self._row(point, "static", [], oom=True, error=msg)

    def teardown(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        V.shutdown(llm)
        self._unload_hf()


def facts(extra: dict[str, Any], main_concurrency: int | None) -> StageFacts:
    """What the roofline and the scaling table read of the curve: the decode batch of the
    samples, TPOT at concurrency 1, and the saturated throughput (the all-at-once point, else the
    curve's top)."""
    curve = extra.get("curve") or []
    one = next((r for r in curve if r.get("mode") == "continuous" and r.get("concurrency") == 1), None)
    point = ((extra.get("throughput_point") or {}).get("continuous") or {}).get("output_tok_s")
    top = max((r.get("output_tok_s") or 0 for r in curve if r.get("mode") == "continuous"), default=0)
    how = "throughput point (all requests at once)" if point else "top of the load curve" if top else None
    return StageFacts(decode_batch=main_concurrency, batch1_tpot_s=one.get("tpot_p50_s") if one else None,
                      saturated_tok_s=point or top or None, saturated_how=how)
