"""flash-attn: attention implementations compared by context length, prefill and decode apart,
with the kernel that really ran checked by the profiler.

The story claims FlashAttention gave 2x at 2K context and 4x at 8K. This stage loads the model
once per implementation (transformers `attn_implementation` eager, sdpa, flash_attention_2) and,
for the SDPA variants, forces one backend with `torch.nn.attention.sdpa_kernel` so that a
kernel that cannot run fails loudly instead of falling back to another one. Then, for every
context length and batch size, it generates a prompt of exactly `context` tokens plus
`decode_tokens` tokens with the per-token clock, `repeats` times after one untimed warm-up:

- prefill = TTFT (submit to first token on the host), decode = TPOT over the `decode_tokens`
  tokens after the first;
- peak memory = torch.cuda.max_memory_allocated over the cell (None on CPU: no allocator
  peak to read there).

extra (docs/flash-attn.md):
    sweep      one row per (impl, context, batch): status ok | skipped | failed, the effective
               implementation the profiler saw, ttft_s / tpot_s Distributions, peak_bytes
    speedups   baseline (eager) p50 over impl p50, prefill and decode, with the min/max spread
    claims     "2x at 2K", "4x at 8K": held | not held | not measured
    agreement  final logits and greedy tokens of each implementation against eager at the
               shortest context, batch 1
    kernels    per implementation: requested, effective, the attention ops the profiler saw
samples: batch 1 at the largest measured context, from sdpa-flash if it ran, else eager."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import warnings
from typing import Any, Literal

from pydantic import Field

from llmopt_bench.distribution import Distribution
from llmopt_bench.engines import hf
from llmopt_bench.errors import extra_fix, first_line
from llmopt_bench.measure.timing import make_sync, now
from llmopt_bench.scenarios.context_sweep import ContextSweepExtra, plan_contexts, speedups, sweep_claims
from llmopt_bench.scenarios.context_sweep_report import SweepPresentation
from llmopt_bench.stage import LoadInfo, Requirements, Stage, StageContext, StageRun, StageSkipped, StrictModel
from llmopt_bench.workload import Request, WorkloadConfig, build_requests, fit_length

Impl = Literal["eager", "sdpa-math", "sdpa-flash", "sdpa-efficient", "flash_attention_2"]
DEFAULT_IMPLS: list[str] = ["eager", "sdpa-math", "sdpa-flash", "flash_attention_2"]
ATTN_IMPL = {"eager": "eager", "sdpa-math": "sdpa", "sdpa-flash": "sdpa", "sdpa-efficient": "sdpa",
             "flash_attention_2": "flash_attention_2"}
SDPA_BACKEND = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION"}
# Final-logit agreement to rounding: |diff| <= 20 machine epsilons of the dtype times the logit
# scale, max(1, max |reference logit|). fp16 over 32 layers of a 7B model lands near 10 eps.
EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
TOL_EPS = 20
FLASH_FIX = f"{extra_fix('flash')} on a CUDA machine (flash-attn builds from source: it needs CUDA and nvcc)"

class FlashAttnParams(StrictModel):
    implementations: list[Impl] = Field(default_factory=lambda: list(DEFAULT_IMPLS), min_length=1)
    contexts: list[int] = Field(default_factory=lambda: [512, 2048, 8192], min_length=1)
    batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1)
    decode_tokens: int = Field(32, ge=1)
    repeats: int = Field(3, ge=1)
    warmup: int = Field(1, ge=0, description="untimed generations before each (impl, context, batch) cell")
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    cpu_max_context: int | None = Field(1024, ge=1, description="on CPU, contexts above this are measured at this length instead, with a note; None: no cap")
    verify_kernels: bool = True


def effective_from_ops(names: set[str] | list[str]) -> str:
    """The attention implementation a set of profiler op/kernel names shows."""
    low = [n.lower() for n in names]
    seen = []
    if any("_scaled_dot_product_flash_attention" in n for n in low):
        seen.append("sdpa-flash")
    if any("_scaled_dot_product_efficient_attention" in n for n in low):
        seen.append("sdpa-efficient")
    if any("_scaled_dot_product_cudnn_attention" in n for n in low):
        seen.append("sdpa-cudnn")
    if any("_scaled_dot_product_attention_math" in n for n in low):
        seen.append("sdpa-math")
    if not seen and any("flash_attn" in n or "flash_fwd" in n for n in low):
        seen.append("flash_attention_2")
    if not seen and any("softmax" in n for n in low):
        seen.append("eager")
    if not seen:
        return "unknown"
    return seen[0] if len(seen) == 1 else "mixed:" + "+".join(seen)


# --- the stage --------------------------------------------------------------------------------

class FlashAttnStage(SweepPresentation, Stage):
    name = "flash-attn"
    description = "attention implementations (eager, SDPA math/flash, flash_attention_2) by context length, prefill and decode apart"
    changes = "attention kernel only: same weights, dtype and generate(); each kernel forced and verified by the profiler"
    own_workload = True  # a context-length sweep, not the fixed prompt set
    requires = Requirements(imports={"transformers": "test", "torch": "test"})
    Params = FlashAttnParams
    Extra = ContextSweepExtra

    @classmethod
    def claims(cls, result, run):
        from llmopt_bench.scenarios.context_sweep_report import flash_claim

        return [flash_claim(result.extra_as(ContextSweepExtra))]


    def load(self, model, params: FlashAttnParams, ctx: StageContext) -> LoadInfo:
        import torch
        import transformers
        from transformers import AutoTokenizer

        self.params, self.model_info, self.device = params, model, ctx.device
        self.dtype = hf.resolve_dtype(params.dtype, ctx.device)
        self.model = None
        t0 = now()
        self.tok = AutoTokenizer.from_pretrained(model.path)
        self.contexts, self.notes = plan_contexts(params.contexts, model.max_position_embeddings, ctx.device,
                                                  params.cpu_max_context)
        if not self.contexts:
            raise StageSkipped("no context length left to measure: " + "; ".join(self.notes),
                               "pass contexts within the model's max_position_embeddings (and cpu_max_context on CPU)")
        self.impls = list(dict.fromkeys(params.implementations))
        self.baseline = "eager" if "eager" in self.impls else self.impls[0]
        if self.baseline != "eager":
            self.notes.append(f"eager not requested: speedups and agreement are against {self.baseline}")
        if ctx.device != "cuda":
            self.notes.append("peak_bytes is None on CPU: torch has no allocator peak for host memory")
        return LoadInfo(
            phases_s={"tokenizer_s": round(now() - t0, 4)},
            implementation={"engine": "transformers", "dtype": self.dtype, "device": ctx.device,
                            "implementations": self.impls, "contexts": self.contexts,
                            "batch_sizes": params.batch_sizes, "baseline": self.baseline,
                            "models_loaded": "in run(), once per implementation"},
            versions={"transformers": transformers.__version__, "torch": torch.__version__,
                      "flash_attn": _flash_attn_version() or "not installed"},
            notes=list(self.notes),
        )

    # warm-up is per cell inside run(): each implementation is its own model load.

    def _requests(self, workload: WorkloadConfig, context: int, batch: int, tag: str) -> list[Request]:
        base = build_requests(workload, lambda t: self.tok(t, add_special_tokens=False)["input_ids"], count=batch, tag=tag)
        return [Request(id=r.id, prompt_id=r.prompt_id, token_ids=tuple(fit_length(list(r.token_ids), context)))
                for r in base]

    def _forced(self, impl: str):
        if impl not in SDPA_BACKEND:
            return contextlib.nullcontext()
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([getattr(SDPBackend, SDPA_BACKEND[impl])])

    def _unavailable(self, impl: str) -> str | None:
        if impl == "flash_attention_2":
            if self.device != "cuda":
                return "flash_attention_2 needs CUDA (flash-attn has no CPU kernel)"
            if importlib.util.find_spec("flash_attn") is None:
                return "flash_attn not installed"
        return None

    def _verify(self, impl: str, req: Request) -> dict[str, Any]:
        """Profile a prefill and one decode step; name the attention kernels that ran."""
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        with profile(activities=acts) as prof:
            hf.generate_batch(self.model, self.pad_id, [req], 2, self.device, streamer=False)
        names = {e.name for e in prof.events()}
        attn = sorted(n for n in names if any(k in n.lower() for k in ("scaled_dot_product", "flash", "fmha", "softmax", "attention")))
        return {"effective": effective_from_ops(names), "ops": attn[:40], "profiled_tokens": len(req.token_ids)}

    def run(self, workload: WorkloadConfig, ctx: StageContext) -> StageRun:
        import torch

        p = self.params
        rows: list[dict[str, Any]] = []
        kernels: list[dict[str, Any]] = []
        cell_samples: dict[tuple, list] = {}
        ref: dict[str, Any] = {}  # impl -> (logits, tokens) at the shortest context, batch 1
        agree_batch = 1 if 1 in p.batch_sizes else min(p.batch_sizes)
        short = self.contexts[0]
        total = len(self.impls) * len(self.contexts) * len(p.batch_sizes)
        done = 0
        sync = make_sync(self.device)

        def mark(impl, status, reason):
            nonlocal done
            for c in self.contexts:
                for b in p.batch_sizes:
                    rows.append({"impl": impl, "effective_impl": None, "context": c, "batch": b, "ttft_s": None,
                                 "tpot_s": None, "peak_bytes": None, "status": status, "reason": reason})
                    done += 1
            ctx.progress(f"{impl}: {status} ({reason})", done, total)

        for impl in self.impls:
            why = self._unavailable(impl)
            if why:
                kernels.append({"impl": impl, "requested": impl, "effective": None, "status": "skipped",
                                "reason": why, "fix": FLASH_FIX})
                mark(impl, "skipped", f"{why}; fix: {FLASH_FIX}")
                continue
            ctx.progress(f"{impl}: loading ({self.dtype}, attn_implementation={ATTN_IMPL[impl]})", done, total)
            try:
                self.model, tok, info = hf.load_model(self.model_info.path, self.device, self.dtype, ATTN_IMPL[impl])
            except Exception as e:  # noqa: BLE001 - one implementation failing to load is a row, not the stage
                reason = f"load failed: {type(e).__name__}: {first_line(e, 300)}"
                kernels.append({"impl": impl, "requested": impl, "effective": None, "status": "failed", "reason": reason})
                mark(impl, "failed", reason)
                continue
            self.pad_id = tok.pad_token_id
            loaded_as = info.implementation.get("attn_implementation")
            kinfo: dict[str, Any] = {"impl": impl, "requested": impl, "attn_implementation": loaded_as,
                                     "sdpa_backend": SDPA_BACKEND.get(impl), "load_s": info.phases_s.get("tokenizer_and_weights_s")}
            effective: str | None = None
            seen: list = []
            try:
                with self._forced(impl), warnings.catch_warnings(record=True) as seen:
                    warnings.simplefilter("always")
                    if p.verify_kernels:
                        ctx.progress(f"{impl}: verifying the kernel with the profiler", done, total)
                        v = self._verify(impl, self._requests(workload, short, 1, "v")[0])
                        kinfo.update(v)
                        effective = v["effective"]
                    else:
                        effective = impl if loaded_as == ATTN_IMPL[impl] else f"{loaded_as}?"
                        kinfo.update(effective=effective, ops=[], note="verify_kernels=false: not profiled")
            except Exception as e:  # noqa: BLE001 - a forced kernel that cannot run fails loudly here
                reason = f"{type(e).__name__}: {first_line(e, 300)}" + _torch_says(seen)
                kinfo.update(status="failed", reason=reason, effective=None)
                kernels.append(kinfo)
                mark(impl, "failed", reason)
                self._free()
                continue
            mismatch = None if effective == impl else f"requested {impl} but the profiler saw {effective} ({', '.join(kinfo.get('ops', [])[:6])})"
            kinfo.update(status="ok" if mismatch is None else "failed", reason=mismatch)
            kernels.append(kinfo)

            for context in self.contexts:
                for batch in p.batch_sizes:
                    label = f"{impl} context {context} batch {batch}"
                    ctx.progress(label, done, total)
                    seen = []
                    try:
                        with self._forced(impl), warnings.catch_warnings(record=True) as seen:
                            warnings.simplefilter("always")
                            row, samples, logits_tokens = self._cell(workload, impl, context, batch, sync,
                                                                     want_ref=(context == short and batch == agree_batch))
                    except Exception as e:  # noqa: BLE001 - OOM or a kernel error at one shape: record, keep going
                        if self.device == "cuda":
                            torch.cuda.empty_cache()
                        oom = "out of memory" in str(e).lower() or type(e).__name__ == "OutOfMemoryError"
                        row = {"ttft_s": None, "tpot_s": None, "peak_bytes": None, "status": "failed",
                               "reason": ("out of memory: " if oom else "") + f"{type(e).__name__}: {first_line(e, 300)}" + _torch_says(seen)}
                        samples, logits_tokens = [], None
                    row = {"impl": impl, "effective_impl": effective, "context": context, "batch": batch, **row}
                    if row["status"] == "ok" and mismatch:
                        row.update(status="failed", reason=mismatch)
                    rows.append(row)
                    cell_samples[(impl, context, batch)] = samples
                    if logits_tokens is not None:
                        ref[impl] = logits_tokens
                    done += 1
                    ctx.progress(label + _summary(row), done, total)
            self._free()

        speeds = speedups(rows, self.baseline)
        extra = {"sweep": rows, "speedups": speeds, "claims": sweep_claims(speeds, self.impls, rows),
                 "agreement": self._agreement(ref, short, agree_batch), "kernels": kernels, "baseline": self.baseline}
        samples, note = self._pick_samples(rows, cell_samples)
        return StageRun(samples=samples, extra=extra, notes=self.notes + [note])

    def _cell(self, workload, impl, context, batch, sync, want_ref):
        import torch

        p = self.params
        reqs = self._requests(workload, context, batch, f"{impl}-{context}-b{batch}-")
        for _ in range(p.warmup):
            hf.generate_batch(self.model, self.pad_id, reqs, p.decode_tokens + 1, self.device, streamer=False)
        cuda = self.device == "cuda"
        samples, ttfts, tpots, peak = [], [], [], None
        tokens: dict[str, list[int]] = {}
        for rep in range(p.repeats):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            out = hf.generate_batch(self.model, self.pad_id, reqs, p.decode_tokens + 1, self.device, repeat=rep,
                                    tokens_out=tokens if rep == 0 else None)
            if cuda:
                peak = max(peak or 0, int(torch.cuda.max_memory_allocated()))
            s = out[0]
            ttfts.append(s.t_first - s.t_submit)
            if s.output_tokens > 1:
                tpots.append((s.t_done - s.t_first) / (s.output_tokens - 1))
            samples.extend(out)
        ref = None
        if want_ref:
            ids = torch.tensor([reqs[0].token_ids], device=self.model.device)
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                    logits_to_keep=1).logits[0, -1].float().cpu()
            sync()
            ref = (logits, tokens[reqs[0].id])
        ttft_d, tpot_d = Distribution.of(ttfts), Distribution.of(tpots)
        row = {"ttft_s": ttft_d.model_dump() if ttft_d else None, "tpot_s": tpot_d.model_dump() if tpot_d else None,
               "peak_bytes": peak, "status": "ok", "reason": None}
        return row, samples, ref

    def _agreement(self, ref: dict[str, Any], context: int, batch: int) -> dict[str, Any]:
        tol_unit = TOL_EPS * EPS.get(self.dtype, 2.0**-10)
        out: dict[str, Any] = {"reference": self.baseline, "context": context, "batch": batch, "dtype": self.dtype,
                               "tolerance": None, "impls": [], "all_agree": None}
        if self.baseline not in ref:
            out["note"] = f"{self.baseline} did not run at context {context}: nothing to compare against"
            return out
        base_logits, base_tokens = ref[self.baseline]
        tol = tol_unit * max(1.0, float(base_logits.abs().max()))
        out["tolerance"] = tol
        for impl in self.impls:
            if impl == self.baseline or impl not in ref:
                continue
            logits, tokens = ref[impl]
            diff = float((logits - base_logits).abs().max())
            n = min(len(tokens), len(base_tokens))
            first = next((i for i in range(n) if tokens[i] != base_tokens[i]), None)
            out["impls"].append({"impl": impl, "max_abs_logit_diff": diff, "same_argmax": int(logits.argmax()) == int(base_logits.argmax()),
                                 "tokens_match": first is None and len(tokens) == len(base_tokens),
                                 "token_match_fraction": sum(a == b for a, b in zip(tokens, base_tokens)) / max(1, n),
                                 "first_mismatch": first, "agree": diff <= tol})
        out["all_agree"] = all(e["agree"] for e in out["impls"]) if out["impls"] else None
        return out

    def _pick_samples(self, rows, cell_samples) -> tuple[list, str]:
        for impl in ("sdpa-flash", self.baseline):
            ok = [r for r in rows if r["impl"] == impl and r["status"] == "ok" and r["batch"] == 1]
            if ok:
                c = max(r["context"] for r in ok)
                return cell_samples[(impl, c, 1)], f"samples (the metrics table): {impl}, batch 1, context {c}"
        return [], "samples: none (neither sdpa-flash nor the baseline ran at batch 1)"

    def _free(self) -> None:
        model, self.model = self.model, None
        if model is not None:
            hf.unload(model)
            del model
        gc.collect()
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass

    def teardown(self) -> None:
        if getattr(self, "model", None) is not None:
            self._free()


def _torch_says(records) -> str:
    """What torch warned about why a forced SDPA kernel could not take these inputs."""
    msgs: list[str] = []
    for w in records or []:
        m = str(w.message).split("(Triggered internally")[0].strip()
        if m and m not in msgs and any(k in m.lower() for k in ("kernel", "require", "support", "only")):
            msgs.append(m)
    return f" (torch: {' '.join(msgs[:4])[:600]})" if msgs else ""


def _summary(row: dict) -> str:
    if row["status"] != "ok":
        return f": {row['status']}"
    t, d = row["ttft_s"], row["tpot_s"]
    return f": ttft {t['p50'] * 1e3:.1f} ms, tpot {d['p50'] * 1e3:.2f} ms/tok" if t and d else ": ok"


def _flash_attn_version() -> str | None:
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        from importlib.metadata import version

        return version("flash-attn")
    except Exception:  # noqa: BLE001
        return "installed"
