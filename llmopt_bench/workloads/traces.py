"""Trace replay: a file of (send time, prompt length, output length[, prefix sharing]) rows,
replayed on its own schedule (times / speedup). Three column sets are read (docs/workloads.md):

    llmopt     time_s, input_len, output_len[, prefix_group, prefix_len]   (.jsonl or .csv)
    mooncake   timestamp (ms), input_length, output_length, hash_ids       (Mooncake's FAST'25 JSONL)
    azure      TIMESTAMP (date and time), ContextTokens, GeneratedTokens   (Azure's LLM inference CSV)

Rows are sorted by time and made offsets from the first; start/end (trace seconds) and limit
cut a window, speedup divides the gaps. Token contents are drawn from the seed: a prefix group's
prefix is the head of one stream per group (two rows of a group with different prefix lengths
share their common part), a Mooncake hash id is one block of `block` tokens (rows with the same
leading ids share those blocks; the last block is cut to the row's length)."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path

from llmopt_bench.core.errors import UsageError
from llmopt_bench.core.records import PlanRecord
from llmopt_bench.workloads.plan import Conversation, Turn
from llmopt_bench.workloads.spec import TraceKind
from llmopt_bench.workloads.synth import GeneratedPlan

CHUNK = 64  # a prefix group's stream is drawn in chunks of this many tokens
COLUMNS = {"llmopt": ("time_s", "input_len", "output_len"), "mooncake": ("timestamp", "input_length", "output_length"),
           "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens")}
FIX = "docs/workloads.md lists the trace columns"


@dataclass(frozen=True)
class TraceRow:
    t: float  # seconds (any origin)
    input_len: int
    output_len: int
    group: str | None = None
    prefix_len: int = 0
    hash_ids: tuple[int, ...] | None = None


def trace_text(file: str) -> tuple[str, Path]:
    """The trace's text: a file, or one shipped with llmopt (builtin:example-trace.jsonl)."""
    if file.startswith("builtin:"):
        from importlib import resources

        name = file.split(":", 1)[1]
        res = resources.files("llmopt_bench.data").joinpath(name)
        if not res.is_file():
            raise UsageError(f"no shipped trace {name!r}", "pass trace:file=builtin:example-trace.jsonl or a path")
        return res.read_text(encoding="utf-8"), Path(name)
    path = Path(file)
    if not path.is_file():
        raise UsageError(f"trace file not found: {file}", "pass --workload trace:file=PATH (a .jsonl or .csv, docs/workloads.md)")
    return path.read_text(encoding="utf-8"), path


def _records(text: str, path: Path) -> list[tuple[int, dict]]:
    if path.suffix.lower() == ".csv":
        return list(enumerate(csv.DictReader(text.splitlines()), start=2))
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UsageError(f"{path}:{n}: not valid JSON ({e.msg})", FIX) from None
            if not isinstance(obj, dict):
                raise UsageError(f"{path}:{n}: not a JSON object", FIX)
            out.append((n, obj))
    return out


def detect(first: dict) -> str:
    for fmt, cols in COLUMNS.items():
        if all(c in first for c in cols):
            return fmt
    raise UsageError(f"trace columns {sorted(first)[:8]} are none of llmopt's, Mooncake's or Azure's",
                     "convert it (docs/workloads.md has the recipe) or pass format=")


def _row(fmt: str, rec: dict, where: str) -> TraceRow:
    t_col, in_col, out_col = COLUMNS[fmt]
    try:
        if fmt == "azure":
            t = datetime.fromisoformat(str(rec[t_col]).strip()).timestamp()  # 7 fractional digits: read to the microsecond
        else:
            t = float(rec[t_col]) / (1000.0 if fmt == "mooncake" else 1.0)
        n_in, n_out = int(rec[in_col]), max(1, int(rec[out_col]))  # Azure has answers of 0 tokens
        group = rec.get("prefix_group") or None
        prefix_len = int(rec.get("prefix_len") or 0)
        ids = tuple(int(h) for h in rec["hash_ids"]) if fmt == "mooncake" and rec.get("hash_ids") else None
    except KeyError as e:
        raise UsageError(f"{where}: column {e.args[0]!r} missing", FIX) from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"{where}: {e}", FIX) from None
    if not math.isfinite(t) or n_in < 1 or prefix_len < 0 or prefix_len > n_in or (prefix_len and group is None):
        raise UsageError(f"{where}: a bad row (time {t}, input {n_in}, prefix {prefix_len} of group {group})",
                         "a row has a finite time, input_len >= 1, 0 <= prefix_len <= input_len, and a prefix_group with a prefix_len")
    return TraceRow(t, n_in, n_out, str(group) if group is not None else None, prefix_len, ids)


def read_trace(params: TraceKind) -> tuple[list[TraceRow], str, int]:
    """The rows of the window, sorted, as offsets in replay seconds; the format read; rows in the file."""
    text, path = trace_text(params.file)
    records = _records(text, path)
    if not records:
        raise UsageError(f"{path}: no rows", FIX)
    fmt = params.format if params.format != "auto" else detect(records[0][1])
    rows = sorted((_row(fmt, rec, f"{path}:{n}") for n, rec in records), key=lambda r: r.t)
    t0 = rows[0].t
    eps = 1e-9  # trace times are decimals: 10.2 - 10.0 is 0.19999...
    kept = [r for r in rows if r.t - t0 >= params.start - eps and (params.end is None or r.t - t0 < params.end - eps)]
    kept = kept[: params.limit] if params.limit else kept
    if not kept:
        raise UsageError(f"{path}: no row in the window start={params.start:g} s, end={params.end} s", "widen the window")
    first = kept[0].t
    return [TraceRow((r.t - first) / params.speedup, r.input_len, r.output_len, r.group, r.prefix_len, r.hash_ids)
            for r in kept], fmt, len(rows)


@dataclass
class TracePlan(GeneratedPlan):
    """The trace's rows as single-turn conversations, each with its send time (at_s)."""

    params: TraceKind = field(default_factory=lambda: TraceKind(file=""))

    def __post_init__(self) -> None:
        self.rows, self.format, self.file_rows = read_trace(self.params)
        self.size, self.own_schedule = len(self.rows), True

    @property
    def span_s(self) -> float:
        return self.rows[-1].t

    @property
    def rate_rps(self) -> float | None:
        """The replay's mean arrival rate (after the speed-up); None for a trace of one instant."""
        return (len(self.rows) - 1) / self.span_s if self.span_s > 0 else None

    def conversation(self, i: int) -> Conversation:
        row, cid = self.rows[i], f"r{i:05d}"
        if row.hash_ids is not None:
            ids = self._blocks(row)
        else:
            head = self._group_stream(row.group, row.prefix_len) if row.group else ()
            ids = head + self.draw(row.input_len - len(head), "row", i)
        group = row.group or (f"b{row.hash_ids[0]}" if row.hash_ids else None)
        return Conversation(cid, (Turn(self.fit(cid, ids, row.output_len), row.output_len),), group=group, at_s=row.t)

    def _group_stream(self, group: str, n: int) -> tuple[int, ...]:
        chunks = [self.draw(CHUNK, "group", group, c) for c in range(-(-n // CHUNK))]
        return tuple(t for c in chunks for t in c)[:n]

    def _blocks(self, row: TraceRow) -> tuple[int, ...]:
        """Mooncake: one block per hash id, the last cut; ids missing for the length add unique tokens."""
        assert row.hash_ids is not None
        ids: tuple[int, ...] = ()
        for h in row.hash_ids:
            ids += self.draw(self.params.block, "block", h)
        if len(ids) < row.input_len:
            note = "some rows have fewer hash ids than their length needs: the rest drawn unique"
            if note not in self.notes:
                self.notes.append(note)
            ids += self.draw(row.input_len - len(ids), "tail", row.t, row.input_len)
        return ids[: row.input_len]

    @cached_property
    def file_sha256(self) -> str:
        return hashlib.sha256(trace_text(self.params.file)[0].encode()).hexdigest()[:16]

    def record(self, sent: int | None = None) -> PlanRecord:
        rec = super().record(sent)
        rec.trace = {"file": self.params.file, "sha256": self.file_sha256, "format": self.format, "rows": self.file_rows,
                     "used": len(self.rows), "speedup": self.params.speedup, "window_s": [self.params.start, self.params.end],
                     "span_s": round(self.span_s, 3), "rate_rps": round(self.rate_rps, 4) if self.rate_rps else None}
        return rec
