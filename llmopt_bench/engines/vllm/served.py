"""One served vLLM configuration: the engine params (the vllm-serve stage's, a tune trial's, a
check's flags; engines/vllm/params.VLLMEngineParams, dtype included) made a running `vllm serve`
and the record of its start. The vllm-serve stage, `llmopt tune`'s trials and `llmopt check`
start their servers here and nowhere else, so a served configuration means one thing: the same
checks (FP8 needs Hopper or Ada), the same AWQ weights, the same environment (the CPU build's KV
cache and cores), the same flags (with prefix caching: the cache's counters and its reset), the
same record, and a start that fails says why from the engine's own log (CannotStart: the kind and
the line, engines/vllm/startlog.start_failure).

The server runs in llmopt's session by default (a process group of its own): the client and the
server share one scheduling group, so a busy host does not starve the client through whole
answers (docs/serving.md), the stage's memory sampler sees the server, and a stage killed on
timeout takes it along."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmopt_bench.core.contract import StageContext, StageSkipped
from llmopt_bench.core.errors import ExitCode, LlmoptError
from llmopt_bench.core.records import LoadInfo
from llmopt_bench.engines.vllm.params import VLLMEngineParams, engine_config, prepare_engine_env, weights_estimate
from llmopt_bench.engines.vllm.server import ServerError, ServerStop, VLLMServer
from llmopt_bench.engines.vllm.startlog import start_failure


class CannotStart(LlmoptError):
    """A served configuration whose server did not come up: `kind` (out of memory, invalid
    combination, unsupported here, did not start in time, failed) and the log's line that says why."""

    code = ExitCode.STAGE_FAILED

    def __init__(self, kind: str, said: str, log_path: Path, detail: str):
        super().__init__(f"vllm serve did not start ({kind}): {said}\n{detail}", f"see {log_path}")
        self.kind, self.said = kind, said


def served_name(source: str) -> str:
    """The name the server answers to: the model's source, without the scheme's colon."""
    return source.replace(":", "-")


def check_fp8(params: VLLMEngineParams, device: str) -> None:
    """FP8 weights need Hopper or Ada (compute capability 8.9+), as the vllm-fp8 stage requires."""
    if params.quantization != "fp8":
        return
    from llmopt_bench.measure import nvml

    caps = [d.get("compute_capability") for i in nvml.device_indices() if (d := nvml.device_info(i))] if device == "cuda" else []
    if not caps or tuple(int(x) for x in str(caps[0]).split(".")) < (8, 9):
        raise StageSkipped(f"quantization fp8 needs a GPU of compute capability 8.9+ ({caps[0] if caps else 'no GPU'} here)",
                           "run on a Hopper or Ada GPU, or drop quantization")


def this_device() -> str:
    """cuda where NVML sees a GPU, else cpu (no CUDA context: the server is the one to make it)."""
    from llmopt_bench.measure import nvml

    return "cuda" if nvml.device_indices() else "cpu"


class Served:
    """served = Served(model, params, device=..., log_path=...); info = served.start(); ...; served.stop()

    model: the prepared ModelInfo; params: the engine's (VLLMEngineParams or a subclass);
    awq (AWQCheckpointParams) serves AWQ weights made as awq-int4 makes them (ctx needed for it);
    env: more of the server's environment (a marker tune finds its leftovers by)."""

    def __init__(self, model: Any, params: VLLMEngineParams, *, device: str, log_path: Path, awq: Any = None,
                 ctx: StageContext | None = None, name: str | None = None, api_key_env: str | None = None,
                 env: dict[str, str] | None = None, own_session: bool = False, python: str | None = None):
        from llmopt_bench.engines.awq.weights import awq_engine

        check_fp8(params, device)
        self.awq_meta: dict | None = None
        self.note: str | None = None
        if awq is not None:
            assert ctx is not None, "AWQ weights are made in a stage's context"
            model, params, self.awq_meta, self.note = awq_engine(model, params, awq, ctx)
        self.model, self.params, self.device = model, params, device
        prepare_engine_env(self.params, device)  # the CPU build's KV cache and cores reach the server's environment
        self.cfg = engine_config(self.params, device, model.max_position_embeddings)
        caching = self.params.enable_prefix_caching
        # with prefix caching: each answer's cached tokens in its usage, and the cache emptied before each point
        self.server = VLLMServer(model.path, self.cfg, log_path=log_path, python=python,
                                 served_model_name=name or served_name(model.source), api_key_env=api_key_env,
                                 own_session=own_session,
                                 env={**({"VLLM_SERVER_DEV_MODE": "1"} if caching else {}), **(env or {})},
                                 extra_args=["--enable-prompt-tokens-details"] if caching else None)

    @property
    def base_url(self) -> str:
        return self.server.base_url

    @property
    def name(self) -> str:
        return self.server.served_model_name

    def reproduce(self) -> str:
        """The `vllm serve` line a user types to get this server."""
        return self.server.reproduce()

    def describe(self) -> str:
        """The configuration in a few words, for progress lines."""
        return f"{self.cfg.dtype}{', ' + self.cfg.quantization if self.cfg.quantization else ''}{', AWQ' if self.awq_meta else ''}"

    def start(self, timeout_s: float = 900.0) -> LoadInfo:
        """The server, healthy, and its start's record; CannotStart with the log's root cause."""
        try:
            info = self.server.start(timeout_s=timeout_s)
        except ServerError as e:
            try:
                log = self.server.log_path.read_text(errors="replace")
            except OSError:
                log = e.message
            kind, said = start_failure(log, timed_out="not healthy after" in e.message)
            raise CannotStart(kind, said, self.server.log_path, e.message) from None
        info.implementation.update(load_format=self.cfg.load_format, max_model_len=self.cfg.max_model_len,
                                   server_log=self.server.log_path.name, **({"awq": self.awq_meta} if self.awq_meta else {}))
        if info.weights_bytes is None and self.cfg.load_format != "dummy":  # vLLM-CPU does not log the model's memory
            info.weights_bytes, info.implementation["weights_bytes_source"] = weights_estimate(self.model, self.cfg)
        info.notes += [n for n in (self.note,) if n]
        return info

    def stop(self) -> ServerStop:
        """Stop the server (idempotent); its log written portable (it names the cache's and the home's paths)."""
        from llmopt_bench.core.models import portable_text

        out = self.server.stop()
        try:
            path = self.server.log_path
            path.write_text(portable_text(path.read_text(errors="replace")))
        except OSError:
            pass
        return out
