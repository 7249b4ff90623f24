"""A stage's job file (run/worker.StageJob): what the supervisor writes is what the worker reads,
its paths relative to the run directory and found again from wherever the run directory is."""

from __future__ import annotations

import json
import shutil

from llmopt_bench.core.models import ModelInfo
from llmopt_bench.core.results import RunResult
from llmopt_bench.core.workload import WorkloadConfig
from llmopt_bench.run.registry import StagePlan, load_stage
from llmopt_bench.run.rundir import RunDir
from llmopt_bench.run.session import ReadyStage, Reference, RunSession
from llmopt_bench.run.supervisor import write_job
from llmopt_bench.run.worker import StageJob, context

MODEL = ModelInfo(source="synthetic:tiny", kind="synthetic", path="$LLMOPT_CACHE/models/tiny", real_weights=False)


def test_the_worker_reads_the_job_its_supervisor_wrote_from_a_moved_run_directory(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.create()
    workload = WorkloadConfig(max_new_tokens=7)
    run = RunResult(run_id="r", created_at="now", command="llmopt bench", workload=workload)
    plan = StagePlan("bnb-twin", {"repeats": 2}, stage="bnb-nf4")
    ref = Reference("hf-fp16", rd.stage_dir("hf-fp16") / "quality_reference.pt")
    session = RunSession(run, rd, MODEL, ref, worker_env={}, reporter=None)  # type: ignore[arg-type]
    spawned = write_job(session, ReadyStage(plan, load_stage("bnb-nf4"), 60.0, share_key="k1"))

    raw = json.loads(rd.job("bnb-twin").read_text())
    assert raw["stage_dir"] == "stages/bnb-twin" and raw["log"] == "logs/bnb-twin.log"  # nothing of this machine's layout
    assert raw["reference_file"] == "stages/hf-fp16/quality_reference.pt"

    moved = tmp_path / "elsewhere"
    shutil.move(rd.root, moved)
    job = StageJob.read(moved / "stages" / "bnb-twin" / "job.json")
    assert (job.stage, job.entry, job.params, job.share_key, job.spawned_at) == (
        "bnb-twin", "llmopt_bench.stages.bnb:BnbNF4Stage", {"repeats": 2}, "k1", spawned)
    assert job.model == MODEL and job.workload == workload and not job.provides_reference

    ctx = context(job, moved / "stages" / "bnb-twin" / "job.json", "cpu", events=None)  # type: ignore[arg-type]
    assert ctx.stage_dir == moved / "stages" / "bnb-twin" and ctx.log_path == moved / "logs" / "bnb-twin.log"
    assert ctx.reference_file == moved / "stages" / "hf-fp16" / "quality_reference.pt" and ctx.reference_name == "hf-fp16"
