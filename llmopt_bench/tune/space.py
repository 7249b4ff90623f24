"""The search space of `llmopt tune`: a TOML file of the vLLM server's knobs, each with the values
to try, beside the settings every trial shares (docs/tune.md):

    [fixed]     # every trial's engine params (the vllm-serve stage's), the defaults' included
    max_model_len = 4096

    [space]     # the knobs and their candidates; every knob may also stay at vLLM's own default
    max_num_seqs = [128, 256, 512, 1024]
    kv_cache_dtype = ["fp8"]
    quantization = ["fp8", "awq"]

    [load]      # each trial's load: the serving scenario's params (SLO and hold come from the command)
    requests_per_point = 64

    [search]    # the screen and the rungs (SearchSettings)
    short_precision = 0.25

    [baseline]  # optional: where the search starts and what it is measured against, where that is
    max_num_seqs = 64   # not vLLM's own defaults (your deployment); each value also tried

A configuration is one value per knob; "default" leaves the knob to the installed vLLM (its flag
is not passed), so the configuration of all defaults is vLLM's own and is always the first
trial (with a [baseline], the baseline's values instead of "default" for its knobs). What this
device cannot run at all (FP8 weights below compute capability 8.9, AWQ without a checkpoint) is
taken out of the space before the search, and said; what vLLM is known to need or refuse is
applied or not started (tune/constraints.py); what else the server refuses is found by starting
it, and recorded as the trial's outcome with its root cause."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomllib
from pydantic import Field, ValidationError

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.freeform import Table
from llmopt_bench.core.records import StrictModel
from llmopt_bench.engines.awq.weights import AWQCheckpointParams
from llmopt_bench.engines.vllm.params import VLLMEngineParams
from llmopt_bench.scenarios.serving.record import ServingParams
from llmopt_bench.tune.constraints import paired

DEFAULT = "default"
# the knobs a space may search, and what each changes (the report's legend)
KNOBS = {
    "max_num_seqs": "sequences the scheduler runs at once",
    "max_num_batched_tokens": "tokens one scheduler step may take (prefill chunks and decodes together)",
    "enable_chunked_prefill": "long prompts cut into chunks that share steps with decodes",
    "kv_cache_dtype": "the KV cache's precision (fp8: half the bytes, twice the tokens)",
    "quantization": "the weights' precision (fp8; awq: 4-bit AWQ weights)",
    "gpu_memory_utilization": "the card's share vLLM takes (weights, activations, KV cache)",
}
AWQ = "awq"
# the load settings a trial sets itself: the command's SLO and hold, and the search's own steps
OWN_LOAD = ("slo", "hold_s", "capacity_search", "search_precision", "search_max_probes", "search_start_rps",
            "throughput_point", "concurrency", "rates")

Config = dict[str, Any]  # knob -> value, DEFAULT where vLLM chooses


class SearchSettings(StrictModel):
    """The screen and the rungs, cheapest first (tune/tuner.py): every configuration's ceiling
    (one all-at-once point), then the capacity under the SLO only where the ceiling leaves room to
    beat the best held so far: short points to a coarse precision, narrowed, held."""

    screen_noise: float = Field(0.1, ge=0, lt=1)  # a ceiling counts as higher than another only beyond this share (one point's noise)
    short_precision: float = Field(0.25, gt=0, lt=1)  # rung 0: the capacity to this precision...
    short_point_s: float = Field(8.0, gt=0)  # ...with points this short (at least)
    short_probes: int = Field(6, ge=2)  # ...in at most this many trials of the search
    precision: float = Field(0.05, gt=0, lt=1)  # rung 1: narrowed to this precision
    point_s: float = Field(15.0, gt=0)  # ...with points this long (at least)
    probes: int = Field(6, ge=1)  # ...in at most this many more
    start_concurrency: int = Field(16, ge=1)  # without a ceiling point: the start rate, half this closed-loop point's req/s
    reduction_factor: int = Field(3, ge=2)  # successive halving's eta: each phase narrows at most the best 1/eta of what it screened
    rounds: int = Field(2, ge=1)  # screen-and-combine rounds: the second starts from the first's winner
    combinations: int = Field(8, ge=0)  # combinations of the knobs that helped screened a round at most, most promising first
    confirm: bool = True  # the winner confirmed by `vllm bench serve` (its time kept back from the start)


class Space(StrictModel):
    path: str
    fixed: Config = Field(default_factory=dict)  # the vllm-serve params every trial sets alike
    knobs: dict[str, list[Any]]  # each knob's values, DEFAULT first
    load: Table = Field(default_factory=dict)  # free-form here: the space file's [load] table, ServingParams validates it (tune/command.py)
    search: SearchSettings = Field(default_factory=SearchSettings)
    awq: AWQCheckpointParams = Field(default_factory=AWQCheckpointParams)
    removed: dict[str, str] = Field(default_factory=dict)  # "knob=value" -> why this device cannot run it
    baseline: Config = Field(default_factory=dict)  # knob -> the defaults' value where it is not vLLM's own ([baseline])
    device: str | None = None  # set by for_device: the settings a configuration brings with it depend on it

    def defaults(self) -> Config:
        return {k: self.baseline.get(k, DEFAULT) for k in self.knobs}

    def reference_name(self) -> str:
        """What the answer is measured against, in words."""
        if not self.baseline:
            return "vLLM's defaults"
        return f"the baseline ({', '.join(f'{k}={v}' for k, v in self.baseline.items())}; vLLM's defaults otherwise)"

    def size(self) -> int:
        n = 1
        for values in self.knobs.values():
            n *= len(values)
        return n


def _bad(path: Path, where: str, why: str, fix: str | None = None) -> UsageError:
    return UsageError(f"--space {path}: {where}: {why}", fix or "see docs/tune.md for the file's tables and keys")


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    return f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}"


def read_space(path: Path) -> Space:
    """The space file, every table checked before anything starts (a bad one: one line, exit 2)."""
    if not path.is_file():
        raise UsageError(f"--space {path}: no such file", "pass a space file (journeys/tune.toml, journeys/tune-cpu.toml: docs/tune.md)")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise _bad(path, "not valid TOML", str(e), "fix the file's syntax") from None
    unknown = set(data) - {"fixed", "space", "load", "search", "awq", "baseline"}
    if unknown:
        raise _bad(path, f"unknown table(s) {', '.join(sorted(unknown))}",
                   "a space file has [fixed], [space], [load], [search], [awq], [baseline]")
    fixed, knobs = data.get("fixed", {}), data.get("space", {})
    if not knobs:
        raise _bad(path, "[space]", "no knob to search", f"list some of {', '.join(KNOBS)} with the values to try")
    for key in knobs:
        if key not in KNOBS:
            raise _bad(path, f"[space] {key}", "not a knob tune searches", f"use {', '.join(KNOBS)}")
        if key in fixed:
            raise _bad(path, f"[space] {key}", "also in [fixed]", "a knob is either searched or fixed: keep one")
    _check(path, "[fixed]", lambda: VLLMEngineParams(**fixed))
    baseline = data.get("baseline", {})
    for key, v in baseline.items():
        if key not in knobs:
            raise _bad(path, f"[baseline] {key}", "not a knob of [space]", "a baseline value is a searched knob's starting value")
        if v == DEFAULT:
            raise _bad(path, f"[baseline] {key}", "\"default\" is already where the search starts", "drop it, or give a value")
    values = {k: _values(path, k, [baseline[k], *v] if k in baseline and isinstance(v, list) else v, fixed,
                         vllm_default=k not in baseline) for k, v in knobs.items()}
    load = data.get("load", {})
    own = [k for k in load if k in OWN_LOAD]
    if own:
        raise _bad(path, f"[load] {own[0]}", "set by llmopt tune itself", "--slo and --hold set the SLO and the hold; [search] the rungs")
    _check(path, "[load]", lambda: ServingParams(**load))
    search = _check(path, "[search]", lambda: SearchSettings(**data.get("search", {})))
    awq = _check(path, "[awq]", lambda: AWQCheckpointParams(**data.get("awq", {})))
    return Space(path=str(path), fixed=fixed, knobs=values, load=load, search=search, awq=awq, baseline=baseline)


def _check(path: Path, table: str, build: Any) -> Any:
    try:
        return build()
    except ValidationError as e:
        raise _bad(path, table, _first_error(e)) from None
    except TypeError as e:
        raise _bad(path, table, str(e)) from None


def _values(path: Path, knob: str, given: Any, fixed: Config, vllm_default: bool = True) -> list[Any]:
    """A knob's candidates, checked as the engine param they become, each once; DEFAULT first
    (vLLM's own), or, for a knob of [baseline], the baseline's value first (DEFAULT then only where listed)."""
    if not isinstance(given, list) or not given:
        raise _bad(path, f"[space] {knob}", "not a non-empty list of values", f"write {knob} = [value, ...]")
    out: list[Any] = [DEFAULT] if vllm_default else []
    for v in given:
        if v == DEFAULT and not vllm_default and v not in out:
            out.append(v)
            continue
        if v == DEFAULT or v in out:
            continue
        if knob == "quantization" and v == AWQ:
            out.append(v)
            continue
        _check(path, f"[space] {knob} = {v!r}", lambda v=v: VLLMEngineParams(**{**fixed, knob: v}))
        out.append(v)
    return out


def settings(space: Space, config: Config) -> Config:
    """The vLLM settings a configuration passes: [fixed] and its knobs, vLLM's own defaults left out."""
    return {**space.fixed, **{k: v for k, v in config.items() if v != DEFAULT}}


def pairs(space: Space, config: Config) -> dict[str, tuple[Any, str]]:
    """The settings this configuration brings with it on this device, each with why (tune/constraints.py)."""
    return paired(settings(space, config), space.device)


def engine_params(space: Space, config: Config) -> tuple[VLLMEngineParams, bool]:
    """The engine params of a configuration (with the settings it brings with it), and whether it
    serves AWQ weights."""
    chosen = {**settings(space, config), **{k: v for k, (v, _) in pairs(space, config).items()}}
    awq = chosen.get("quantization") == AWQ
    if awq:
        chosen.pop("quantization")
    return VLLMEngineParams(**chosen), awq


def label(config: Config, base: Config | None = None) -> str:
    """A configuration in a few words: the knobs it sets otherwise than base (vLLM's defaults where
    none is given): "vLLM defaults", or "baseline" where it is a [baseline]."""
    base = base or {}
    set_ = [f"{k}={v}" for k, v in config.items() if v != base.get(k, DEFAULT)]
    return ", ".join(set_) or ("baseline" if any(v != DEFAULT for v in base.values()) else "vLLM defaults")


def fp8_weights_problem(device: str) -> str | None:
    """Why this device cannot run FP8 weights (the vllm-serve stage's check: compute capability 8.9+)."""
    from llmopt_bench.core.contract import StageSkipped
    from llmopt_bench.engines.vllm.served import check_fp8

    try:
        check_fp8(VLLMEngineParams(quantization="fp8"), device)
    except StageSkipped as e:
        return e.reason
    return None


def awq_problem(model: Any, params: AWQCheckpointParams, device: str) -> str | None:
    """Why no AWQ checkpoint is at hand: tune never calibrates one (minutes to an hour, more
    than a trial), it serves one that exists (engines/awq/weights.py's order)."""
    import json

    from llmopt_bench.engines.awq import checkpoint as awq

    src = Path(model.path)
    if awq.quant_method(src) in ("awq", "compressed-tensors") or params.checkpoint:
        return None
    if not model.real_weights and device == "cuda" and params.dummy_weights != "off":
        return None  # an AWQ-shaped checkpoint of random weights, written in seconds
    config = json.loads((src / "config.json").read_text())
    group = params.group_size or awq.pick_group_size(config)
    cached = group is not None and (awq.calibrated_dir(src, group, params.calibration_samples, params.calibration_seq_len)
                                    / "llmopt_awq.json").is_file()
    return None if cached else ("no AWQ checkpoint of this model (tune serves one, never calibrates: "
                                "run `llmopt bench --stages awq-int4` once to calibrate and cache it, or set [awq] checkpoint)")


def for_device(space: Space, model: Any, device: str) -> Space:
    """The space without the values this device cannot run, each with its reason."""
    why = {("quantization", "fp8"): fp8_weights_problem(device), ("quantization", AWQ): None}
    if AWQ in space.knobs.get("quantization", []):
        why["quantization", AWQ] = awq_problem(model, space.awq, device)
    knobs, removed = {}, dict(space.removed)
    for knob, values in space.knobs.items():
        keep = []
        for v in values:
            reason = why.get((knob, v))
            if reason:
                removed[f"{knob}={v}"] = reason
            else:
                keep.append(v)
        knobs[knob] = keep
    for knob, v in space.baseline.items():
        if f"{knob}={v}" in removed:
            raise UsageError(f"--space {space.path}: [baseline] {knob} = {v!r}: {removed[f'{knob}={v}']}",
                             "start the search from what this device runs: drop that baseline value")
    return space.model_copy(update={"knobs": knobs, "removed": removed, "device": device})
