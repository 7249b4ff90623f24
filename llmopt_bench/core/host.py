"""The host a run ran on, as run.json's `env` records it (run/envprobe.py measures it, the
runner adds the fingerprint and the command): one type for a GPU host and a CPU host.

Open (extra="allow"): a key a newer probe writes (or one this code never reads) is kept, read
back and written out again, so a run written by any llmopt loads and round-trips. A record
writes back only the keys it was given: a CPU host has no `gpus`, and an older run.json
rewritten (a resumed run, a re-rendered report) gains no nulls."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer, model_validator


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")

    @model_serializer(mode="wrap")
    def _as_given(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        given = self.model_fields_set | set(self.model_extra or {})
        return {k: v for k, v in data.items() if k in given}


class Gpu(_Open):
    name: str
    memory_bytes: int | None = None
    compute_capability: str | None = None
    multiprocessors: int | None = None


class Ceilings(_Open):
    """What the probe measured of the device (not datasheet figures): copy bandwidth and dense
    matmul FLOP/s, the headline and per dtype (runs recorded before per-dtype ceilings have
    only the headline)."""

    mem_bandwidth_bytes_s: float | None = None
    matmul_flops: float | None = None  # the headline figure, in matmul_dtype
    matmul_dtype: str | None = None
    matmul_flops_by_dtype: dict[str, float] | None = None
    matmul_not_measured: dict[str, str] | None = None  # dtype -> why
    method: str | None = None

    def roof(self) -> tuple[float | None, float | None]:
        """(copy bandwidth, headline matmul FLOP/s): the roofline chart's roof."""
        return self.mem_bandwidth_bytes_s, self.matmul_flops


class Host(_Open):
    device: str | None = None  # "cuda" or "cpu": where the stages ran
    gpu: str | None = None  # the first GPU's name; None on a CPU host
    gpus: list[Gpu] | None = None
    cpu: str | None = None
    cpu_count: int | None = None
    driver: str | None = None
    cudnn: int | None = None
    torch_cuda: str | None = None
    torch_threads: int | None = None
    python: str | None = None
    platform: str | None = None
    llmopt: str | None = None
    llmopt_commit: str | None = None
    versions: dict[str, str] | None = None  # package -> version, the installed ones
    command: str | None = None
    ceilings: Ceilings | None = None

    @model_validator(mode="before")
    @classmethod
    def _none_is_unknown(cls, value: Any) -> Any:
        return {} if value is None else value  # a record built without a host (tests, older tools)

    @property
    def machine(self) -> str | None:
        """What the run ran on, in one name: the GPU's, else the CPU's (None: not recorded)."""
        return self.gpu or self.cpu
