"""The answer of a tune run, from its record: the winner (the highest held capacity among the
trials that may win: the quality gate passed, and judged where the weights are real and the
configuration changes their precision), its ratio to the defaults with the interval both
capacities allow (each known within [capacity, upper end)), run.json's two results (tune-defaults, tune-winner: what `llmopt recommend`,
`report` and `compare` read), and tune.md with its chart (tune/report.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from llmopt_bench.core.results import MemoryRecord, StageResult
from llmopt_bench.run.rundir import RunDir
from llmopt_bench.tune.record import Ratio, TrialRecord, TuneRecord
from llmopt_bench.tune.space import DEFAULT, Config
from llmopt_bench.tune.trial import Measured


def changes_precision(config: Config) -> bool:
    """Whether a configuration changes the precision of the weights or the KV cache (FP8, AWQ)."""
    quant, kv = config.get("quantization", DEFAULT), config.get("kv_cache_dtype", DEFAULT)
    return quant not in (DEFAULT, None) or (isinstance(kv, str) and kv.startswith("fp8"))


def quality_allows(t: TrialRecord, real_weights: bool) -> bool:
    """The quality gate lets this configuration win: it did not fail it, and where the weights are
    real and their precision or the KV cache's changes (FP8, AWQ), it was judged and passed
    (random weights: "not judged", speed only)."""
    if not t.quality_ok:
        return False
    if real_weights and changes_precision(t.config):
        return t.quality is not None and t.quality.quality_regression is False
    return True


def eligible(t: TrialRecord, real_weights: bool) -> bool:
    """A held capacity the quality gate lets win."""
    return t.outcome == "held" and t.held_rung is not None and quality_allows(t, real_weights)


def winner_of(trials: list[TrialRecord], real_weights: bool) -> TrialRecord | None:
    """The highest held capacity among the trials that may win (the defaults where tied)."""
    held = [t for t in trials if eligible(t, real_weights)]
    return max(held, key=lambda t: (t.held_rung.capacity_rps or 0, t.defaults), default=None)  # type: ignore[union-attr]


def stage_result(rec: TrialRecord, m: Measured, name: str) -> StageResult:
    """A held trial as run.json keeps a vllm-serve result: its hold's samples, its facts (the
    capacity, held, with its interval; the `vllm serve` line), its quality."""
    from llmopt_bench.analysis.metrics import compact, compute

    facts = m.facts.model_copy(update={"serve_command": rec.command, "devices": 1})
    memory = MemoryRecord(process_peak_bytes=rec.memory.gpu_used_bytes, nvml=rec.memory.gpu_used_bytes is not None,
                          note="the server's card memory after its start (NVML), read by llmopt tune") \
        if rec.memory.gpu_used_bytes else MemoryRecord()
    return StageResult(name=name, stage="vllm-serve", description=f"vLLM's server, configuration of llmopt tune trial {rec.number}",
                       changes=rec.label, own_workload=True, status="ok", params={k: v for k, v in rec.config.items() if v != DEFAULT},
                       load=m.load, metrics=compute(m.samples), samples=compact(m.samples), memory=memory, quality=rec.quality,
                       facts=facts, extra=m.extra.model_dump(mode="json", exclude_none=True), log=rec.log)


def conclude(out: Path, record: TuneRecord) -> None:
    """The winner, the ratio to the defaults, run.json's two results, tune.md and its chart."""
    from llmopt_bench.tune.report import write_report

    winner = winner_of(record.trials, bool(record.settings.real_weights))
    record.winner = winner.number if winner else None
    defaults = record.trial(record.defaults)
    record.ratio = ratio(winner, defaults) if winner and defaults else None
    put_results(out, record)
    try:
        write_report(out, record)
    except Exception as e:  # noqa: BLE001 - tune.json holds every trial: the report can be written again
        print(f"warning: tune.md not written ({type(e).__name__}: {e})", file=sys.stderr)


def ratio(winner: TrialRecord, defaults: TrialRecord) -> Ratio | None:
    w, d = winner.held_rung or winner.last, defaults.held_rung or defaults.last
    if not (w and d and w.capacity_rps and d.capacity_rps):
        return None
    return Ratio(value=w.capacity_rps / d.capacity_rps, lo=w.capacity_rps / d.top if d.top else None,
                 hi=w.top / d.capacity_rps if w.top else None)


def put_results(out: Path, record: TuneRecord) -> None:
    """run.json's tune-defaults and tune-winner: the held results llmopt recommend and compare read."""
    from llmopt_bench.analysis.quality_gate import apply_gate

    rd = RunDir(out)
    if not rd.run_json.is_file():
        return
    run = rd.load()
    run.stages = [s for s in run.stages if not s.name.startswith("tune-")]
    roles = [("tune-defaults", record.defaults)] + ([("tune-winner", record.winner)] if record.winner != record.defaults else [])
    for name, number in roles:
        path = out / "trials" / f"{number or 0:03d}" / "result.json"
        if number is not None and path.is_file():
            run.stages.append(StageResult.model_validate_json(path.read_text()).model_copy(update={"name": name}))
    apply_gate(run, run.min_quality)
    run.status = "interrupted" if record.status == "interrupted" else run.status
    rd.save(run)
