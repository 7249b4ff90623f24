"""transformers' attention implementations as variants of the context sweep (the flash-attn stage).

Each implementation is its own model load (`attn_implementation` eager, sdpa, flash_attention_2);
for the SDPA variants one backend is forced with `torch.nn.attention.sdpa_kernel`, so that a
kernel that cannot run fails loudly instead of falling back to another one. Opening a variant
profiles a prefill and one decode step and names the attention kernel that really ran
(effective_from_ops); a cell generates a prompt of exactly `context` tokens plus
`decode_tokens` with the per-token clock, `repeats` times after `warmup` untimed generations,
and reads CUDA's allocator peak. At the shortest context (batch 1) the last position's logits
and the greedy tokens are kept, to check every implementation against the baseline's."""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from typing import Any, Callable, Iterator, Literal

from typing_extensions import NotRequired, TypedDict

from llmopt_bench.core.errors import describe, extra_fix
from llmopt_bench.core.records import RequestSample
from llmopt_bench.core.workload import Request, WorkloadConfig, build_requests, fit_length
from llmopt_bench.engines.hf import generate as hf
from llmopt_bench.engines.lifecycle import release_cached_memory
from llmopt_bench.engines.variants import CellParams, Measured, Opened, Timed, VariantUnavailable
from llmopt_bench.measure.timing import make_sync, now

Impl = Literal["eager", "sdpa-math", "sdpa-flash", "sdpa-efficient", "flash_attention_2"]
DEFAULT_IMPLS: list[Impl] = ["eager", "sdpa-math", "sdpa-flash", "flash_attention_2"]
ATTN_IMPL = {"eager": "eager", "sdpa-math": "sdpa", "sdpa-flash": "sdpa", "sdpa-efficient": "sdpa",
             "flash_attention_2": "flash_attention_2"}
SDPA_BACKEND = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION"}
# Final-logit agreement to rounding: |diff| <= 20 machine epsilons of the dtype times the logit
# scale, max(1, max |reference logit|). fp16 over 32 layers of a 7B model lands near 10 eps.
EPS = {"float32": 2.0**-23, "bfloat16": 2.0**-7, "float16": 2.0**-10}
TOL_EPS = 20
FLASH_FIX = f"{extra_fix('flash')} on a CUDA machine (flash-attn builds from source: it needs CUDA and nvcc)"


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


def torch_says(records: list | None) -> str:
    """What torch warned about why a forced SDPA kernel could not take these inputs."""
    msgs: list[str] = []
    for w in records or []:
        m = str(w.message).split("(Triggered internally")[0].strip()
        if m and m not in msgs and any(k in m.lower() for k in ("kernel", "require", "support", "only")):
            msgs.append(m)
    return f"(torch: {' '.join(msgs[:4])[:600]})" if msgs else ""


@contextlib.contextmanager
def forced(impl: str) -> Iterator[None]:
    """impl's SDPA backend forced (no fallback), torch's warnings caught: when the work fails,
    torch's words on why are added to the exception as a note (the row's reason ends with them)."""
    with contextlib.ExitStack() as stack:
        if impl in SDPA_BACKEND:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([getattr(SDPBackend, SDPA_BACKEND[impl])]))
        seen = stack.enter_context(warnings.catch_warnings(record=True))
        warnings.simplefilter("always")
        try:
            yield
        except Exception as e:
            if note := torch_says(seen):
                e.add_note(note)
            raise


def reason(e: BaseException) -> str:
    return " ".join([describe(e, 300), *getattr(e, "__notes__", ())])


def flash_attn_version() -> str | None:
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        from importlib.metadata import version

        return version("flash-attn")
    except Exception:  # noqa: BLE001
        return "installed"


class KernelRecord(TypedDict, total=False):
    """One implementation as opened: loaded as, forced backend, what the profiler saw (verified),
    its status; a skipped or failed one says why."""

    impl: str
    requested: str
    attn_implementation: str | None
    sdpa_backend: str | None
    load_s: float | None
    effective: str | None
    ops: list[str]  # the attention ops and kernels the profiler saw
    profiled_tokens: int
    note: str  # not profiled
    status: str
    reason: str | None
    fix: str


class ImplAgreement(TypedDict):
    """One implementation's last logits and greedy tokens against the baseline's."""

    impl: str
    max_abs_logit_diff: float
    same_argmax: bool
    tokens_match: bool
    token_match_fraction: float
    first_mismatch: int | None
    agree: bool


class Agreement(TypedDict):
    reference: str
    context: int
    batch: int
    dtype: str
    tolerance: float | None
    impls: list[ImplAgreement]
    all_agree: bool | None
    note: NotRequired[str]  # the baseline did not run: nothing compared


class HFRecords(TypedDict):
    """What the flash-attn stage's extra keeps of the adapter (ContextSweepExtra)."""

    kernels: list[KernelRecord]
    agreement: Agreement


class HFAttention:
    """transformers as the sweep's engine: one model per attention implementation, the
    kernel verified, the cells timed, the outputs compared with the baseline's."""

    def __init__(self, model_info: Any, device: str, dtype: str, cells: CellParams, *, shortest: int, agree_batch: int,
                 baseline: str, verify: bool, progress: Callable[[str], None] = lambda msg: None):
        from transformers import AutoTokenizer

        self.model_info, self.device, self.dtype, self.cells = model_info, device, dtype, cells
        self.shortest, self.agree_batch, self.baseline, self.verify = shortest, agree_batch, baseline, verify
        self.progress = progress
        self.model: Any = None
        self.pad_id = 0  # open() sets the loaded tokenizer's (hf.load_model gives each one a pad token)
        self.kernels: list[KernelRecord] = []  # per implementation: loaded as, effective, ops the profiler saw
        self.ref: dict[str, tuple[Any, list[int]]] = {}  # impl -> (last logits, greedy tokens) at the shortest context
        t0 = now()
        self.tok = AutoTokenizer.from_pretrained(model_info.path)
        self.tokenizer_s = round(now() - t0, 4)

    def unavailable(self, impl: str) -> str | None:
        if impl == "flash_attention_2":
            if self.device != "cuda":
                return "flash_attention_2 needs CUDA (flash-attn has no CPU kernel)"
            if importlib.util.find_spec("flash_attn") is None:
                return "flash_attn not installed"
        return None

    def requests(self, workload: WorkloadConfig, context: int, batch: int, tag: str) -> list[Request]:
        base = build_requests(workload, lambda t: self.tok(t, add_special_tokens=False)["input_ids"], count=batch, tag=tag)
        return [Request(id=r.id, prompt_id=r.prompt_id, token_ids=tuple(fit_length(list(r.token_ids), context)))
                for r in base]

    def open(self, impl: str, workload: WorkloadConfig) -> Opened:
        why = self.unavailable(impl)
        if why:
            self.kernels.append({"impl": impl, "requested": impl, "effective": None, "status": "skipped",
                                 "reason": why, "fix": FLASH_FIX})
            raise VariantUnavailable("skipped", f"{why}; fix: {FLASH_FIX}")
        self.progress(f"{impl}: loading ({self.dtype}, attn_implementation={ATTN_IMPL[impl]})")
        try:
            self.model, tok, info = hf.load_model(self.model_info.path, self.device, self.dtype, ATTN_IMPL[impl])
        except Exception as e:  # one implementation failing to load is its rows, not the stage
            failed = f"load failed: {describe(e, 300)}"
            self.kernels.append({"impl": impl, "requested": impl, "effective": None, "status": "failed", "reason": failed})
            raise VariantUnavailable("failed", failed) from e
        self.pad_id = tok.pad_token_id
        kinfo: KernelRecord = {"impl": impl, "requested": impl,
                               "attn_implementation": info.implementation.get("attn_implementation"),
                               "sdpa_backend": SDPA_BACKEND.get(impl), "load_s": info.phases_s.get("tokenizer_and_weights_s")}
        try:
            with forced(impl):
                kinfo.update(self.verified(impl, kinfo["attn_implementation"], workload))
        except Exception as e:  # a forced kernel that cannot run fails loudly here
            why = reason(e)
            kinfo.update({"status": "failed", "reason": why, "effective": None})
            self.kernels.append(kinfo)
            raise VariantUnavailable("failed", why) from e
        effective = kinfo["effective"]
        mismatch = None if effective == impl else f"requested {impl} but the profiler saw {effective} ({', '.join(kinfo.get('ops', [])[:6])})"
        kinfo.update({"status": "ok" if mismatch is None else "failed", "reason": mismatch})
        self.kernels.append(kinfo)
        return Opened(effective, mismatch)

    def verified(self, impl: str, loaded_as: str | None, workload: WorkloadConfig) -> KernelRecord:
        """Profile a prefill and one decode step; name the attention kernels that ran (the record's
        effective, ops and profiled_tokens, or a note)."""
        if not self.verify:
            effective = impl if loaded_as == ATTN_IMPL[impl] else f"{loaded_as}?"
            return {"effective": effective, "ops": [], "note": "verify_kernels=false: not profiled"}
        from torch.profiler import ProfilerActivity, profile

        self.progress(f"{impl}: verifying the kernel with the profiler")
        req = self.requests(workload, self.shortest, 1, "v")[0]
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device == "cuda" else [])
        with profile(activities=acts) as prof:
            hf.generate_batch(self.model, self.pad_id, [req], 2, self.device, streamer=False)
        names = {e.name for e in prof.events()}
        attn = sorted(n for n in names if any(k in n.lower() for k in ("scaled_dot_product", "flash", "fmha", "softmax", "attention")))
        return {"effective": effective_from_ops(names), "ops": attn[:40], "profiled_tokens": len(req.token_ids)}

    def measure(self, impl: str, context: int, batch: int, workload: WorkloadConfig, timed: Timed) -> Measured:
        import torch

        reqs = self.requests(workload, context, batch, f"{impl}-{context}-b{batch}-")
        try:
            with forced(impl):
                for _ in range(self.cells.warmup):
                    hf.generate_batch(self.model, self.pad_id, reqs, self.cells.decode_tokens + 1, self.device, streamer=False)
                tokens: dict[str, list[int]] = {}
                peak: list[int] = []
                samples = timed(lambda: self.repeats(reqs, tokens, peak))
                if context == self.shortest and batch == self.agree_batch:
                    self.ref[impl] = (self.last_logits(reqs[0]), tokens[reqs[0].id])
        except Exception:
            if self.device == "cuda":  # an OOM leaves the allocator's cache full: the next cell needs it
                torch.cuda.empty_cache()
            raise
        return Measured(samples, max(peak) if peak else None)

    def repeats(self, reqs: list[Request], tokens: dict[str, list[int]], peak: list[int]) -> list[RequestSample]:
        """The timed generations; the first repeat's tokens, each repeat's allocator peak (CUDA)."""
        import torch

        samples: list[RequestSample] = []
        cuda = self.device == "cuda"
        for rep in range(self.cells.repeats):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            samples += hf.generate_batch(self.model, self.pad_id, reqs, self.cells.decode_tokens + 1, self.device,
                                         repeat=rep, tokens_out=tokens if rep == 0 else None)
            if cuda:
                peak.append(int(torch.cuda.max_memory_allocated()))
        return samples

    def last_logits(self, req: Request) -> Any:
        import torch

        ids = torch.tensor([req.token_ids], device=self.model.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                                logits_to_keep=1).logits[0, -1].float().cpu()
        make_sync(self.device)()
        return logits

    def agreement(self) -> Agreement:
        """Each implementation's last logits and greedy tokens against the baseline's."""
        out: Agreement = {"reference": self.baseline, "context": self.shortest, "batch": self.agree_batch,
                          "dtype": self.dtype, "tolerance": None, "impls": [], "all_agree": None}
        if self.baseline not in self.ref:
            out["note"] = f"{self.baseline} did not run at context {self.shortest}: nothing to compare against"
            return out
        base_logits, base_tokens = self.ref[self.baseline]
        tol = TOL_EPS * EPS.get(self.dtype, 2.0**-10) * max(1.0, float(base_logits.abs().max()))
        out["tolerance"] = tol
        for impl, (logits, tokens) in self.ref.items():
            if impl == self.baseline:
                continue
            diff = float((logits - base_logits).abs().max())
            n = min(len(tokens), len(base_tokens))
            first = next((i for i in range(n) if tokens[i] != base_tokens[i]), None)
            out["impls"].append({"impl": impl, "max_abs_logit_diff": diff, "same_argmax": int(logits.argmax()) == int(base_logits.argmax()),
                                 "tokens_match": first is None and len(tokens) == len(base_tokens),
                                 "token_match_fraction": sum(a == b for a, b in zip(tokens, base_tokens)) / max(1, n),
                                 "first_mismatch": first, "agree": diff <= tol})
        out["all_agree"] = all(e["agree"] for e in out["impls"]) if out["impls"] else None
        return out

    def records(self) -> HFRecords:
        return {"kernels": self.kernels, "agreement": self.agreement()}

    def close(self) -> None:
        if self.model is not None:
            self.model = None  # the last reference: the weights go now, then the allocator's cache
            release_cached_memory()
