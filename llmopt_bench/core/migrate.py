"""run.json from older schema versions, brought to the current one with its numbers unchanged.

Schema 1 -> 2: the quality block leaves `extra` for the typed `quality` field; the quality
reference, named "hf-fp16" in schema 1, becomes a flag on its result; the KV cache's size and
dtype join the load record; what the generic analyses read of a stage's own measurements
(decode batch, batch-1 TPOT, saturated throughput) becomes `facts`; the energy record says it
covered the whole run() (schema 1 read the counter around all of it, untimed work included).

Within schema 2, a recorded name that changed is renamed on read (RENAMED_PHASES), so that every
run, old or new, names one figure one way.

Everything here is run.json's raw JSON (Json): free-form until core/results.parse_run
validates what migrate() returns."""

from __future__ import annotations

import copy

from llmopt_bench.core.freeform import Json  # a run.json object of any schema version, before it is validated

SCHEMA_1_REFERENCE = "hf-fp16"  # the only stage schema 1 compared quality against
SCHEMA_1_ENERGY = "whole run() (schema 1: quality passes, clock checks and sweeps included)"


# load.phases_s: the served engine's weight read was `weights_load_s` until 2026-12-06, when one
# reader of vLLM's start log (engines/vllm/startlog.py) gave the offline engine and the server one name
RENAMED_PHASES = {"weights_load_s": "weights_read_s"}


def migrate(raw: Json) -> Json:
    if raw.get("schema_version") == 1:
        raw = v1_to_v2(raw)
    return renamed_phases(raw)


def renamed_phases(raw: Json) -> Json:
    """The load phases under their current names (RENAMED_PHASES), their values unchanged."""
    def phases(stage: Json) -> Json:
        return (stage.get("load") or {}).get("phases_s") or {}

    if not any(old in phases(s) for s in raw.get("stages", []) for old in RENAMED_PHASES):
        return raw
    out = copy.deepcopy(raw)
    for stage in out["stages"]:
        found = phases(stage)
        for old, new in RENAMED_PHASES.items():
            if old in found:
                found.setdefault(new, found[old])
                del found[old]
    return out


def v1_to_v2(raw: Json) -> Json:
    out = copy.deepcopy(raw)
    for stage in out.get("stages", []):
        _stage_v1_to_v2(stage)
    out["schema_version"] = 2
    return out


def _stage_v1_to_v2(s: Json) -> None:
    extra = s.get("extra") or {}
    quality = extra.pop("quality", None)
    if isinstance(quality, dict):
        s["quality"] = _hide_made_up_agreement(quality, (s.get("load") or {}).get("implementation") or {})
    s["quality_reference"] = (s.get("stage") or s["name"]) == SCHEMA_1_REFERENCE and s.get("status") == "ok"
    kv = extra.get("kv_cache")
    if isinstance(kv, dict) and s.get("load"):
        s["load"]["kv_cache_bytes"] = kv.get("bytes")
        s["load"]["kv_cache_dtype"] = kv.get("kv_dtype")
    s["facts"] = facts_from_v1_extra(extra)
    extra.pop("memory_split", None)  # documented in schema 1, written by no stage
    if isinstance(extra.get("partial"), dict):
        s["partial"] = extra.pop("partial")
    if s.get("energy"):
        s["energy"]["scope"] = SCHEMA_1_ENERGY
    s["extra"] = extra


AGREEMENT_KEYS = ("token_match_rate", "first_divergence_mean", "kl_mean", "nll_delta_mean")
NOT_SAME_WEIGHTS = ("load_format=dummy: the weights are random and not the FP16 reference's, so agreement "
                    "would compare two unrelated models: not measured (speed and memory only)")


def _hide_made_up_agreement(quality: Json, impl: Json) -> Json:
    """Early schema-1 runs measured agreement on weights vLLM made up (load_format=dummy): it
    compares two unrelated models, so the figures go and the note says why."""
    if impl.get("load_format") == "dummy" and any(quality.get(k) is not None for k in AGREEMENT_KEYS):
        quality = {k: v for k, v in quality.items() if k not in AGREEMENT_KEYS}
        quality["agreement_note"] = NOT_SAME_WEIGHTS
    return quality


def facts_from_v1_extra(extra: Json) -> Json:
    """What schema 1's renderers read out of continuous-batching's extra by key."""
    facts: Json = {}
    sweep = extra.get("sweep")
    if isinstance(sweep, dict) and sweep.get("main_concurrency"):
        facts["decode_batch"] = int(sweep["main_concurrency"])
    curve: list[Json] = extra["curve"] if isinstance(extra.get("curve"), list) else []
    one = next((r for r in curve if r.get("mode") == "continuous" and r.get("concurrency") == 1), None)
    if one and one.get("tpot_p50_s"):
        facts["batch1_tpot_s"] = one["tpot_p50_s"]
    point = ((extra.get("throughput_point") or {}).get("continuous") or {}).get("output_tok_s")
    top = max((float(r.get("output_tok_s") or 0.0) for r in curve if r.get("mode") == "continuous"), default=0.0)
    if point:
        facts.update(saturated_tok_s=point, saturated_how="throughput point (all requests at once)")
    elif top:
        facts.update(saturated_tok_s=top, saturated_how="top of the load curve")
    return facts
