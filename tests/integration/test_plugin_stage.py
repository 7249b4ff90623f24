"""Writing a stage is one file plus one entry point (docs/architecture.md): an out-of-tree
stage, installed the way a third party does, measures with the fixed-workload scenario on the
transformers engine, declares its own typed extra, and adds its own claim, report block and
chart, all without a line of llmopt changed. Run through the real CLI on synthetic:tiny."""

from __future__ import annotations

import json
import textwrap

import pytest
from testkit import read_run, run_cli, write_plugin

PLUGIN = textwrap.dedent('''
    """A stage a third party writes: the fixed workload on transformers, sdpa attention."""
    from pathlib import Path

    from llmopt_bench.engines.hf.engine import HFEngineParams, TransformersEngine
    from llmopt_bench.scenarios.fixed.run import FixedExtra, FixedParams, FixedWorkloadStage
    from llmopt_bench.stage import Block, Claim, Requirements, StageRun


    class SdpaParams(HFEngineParams, FixedParams):
        attn_implementation: str = "sdpa"
        promise_x: float = 1.5


    class SdpaExtra(FixedExtra):
        first_token_ids: list[int] = []


    class SdpaStage(FixedWorkloadStage):
        name = "my-sdpa"
        description = "transformers with SDPA attention (a plugin)"
        changes = "attention: SDPA"
        requires = Requirements(imports={"transformers": "test"})
        Params = SdpaParams
        Extra = SdpaExtra

        def start_engine(self, model, params, ctx):
            return TransformersEngine.start(model, params, ctx)

        def run(self, workload, ctx):
            out = super().run(workload, ctx)
            extra = SdpaExtra(**out.extra, first_token_ids=[t[0] for t in out.extra["greedy_tokens"].values() if t])
            return StageRun(samples=out.samples, extra=extra.model_dump(mode="json"), quality=out.quality)

        @classmethod
        def claims(cls, result, run):
            ref = next(s for s in run.stages if s.quality_reference)
            x = ref.metrics.tpot_s.p50 / result.metrics.tpot_s.p50
            return [Claim(key="sdpa-promise", claim="SDPA speeds up decode", target=">= 1.5x",
                          measured=f"{x:.2f}x", value=x, verdict="held" if x >= 1.5 else "not held")]

        @classmethod
        def report_blocks(cls, result, run):
            extra = result.extra_as(SdpaExtra)
            return [Block(text="First generated token of each request:", headers=["request", "token"],
                          rows=[[i, t] for i, t in enumerate(extra.first_token_ids)])]

        @classmethod
        def charts(cls, result, run, out_dir):
            from llmopt_bench.core.plotting import plt, save

            fig, ax = plt().subplots()
            ax.plot(result.extra_as(SdpaExtra).first_token_ids, "o")
            return [save(fig, Path(out_dir) / f"{result.name}-tokens.png")]
''')


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory, tiny_model):
    tmp = tmp_path_factory.mktemp("plugin-stage")
    env = write_plugin(tmp, "llmopt_sdpa_plugin", {"my-sdpa": "llmopt_sdpa_plugin:SdpaStage"}, PLUGIN)
    out = tmp / "run"
    res = run_cli("bench", "--stages", "hf-fp16,my-sdpa", "--model", "synthetic:tiny", "--num-prompts", "2",
                  "--max-new-tokens", "8", "--repeats", "2", "--warmup", "0", "--output", str(out), env=env)
    return res, out, env


def test_the_plugin_runs_beside_a_builtin_and_its_extra_is_typed(plugin_run):
    res, out, _ = plugin_run
    assert res.returncode == 0, res.stderr
    run = read_run(out)
    mine = next(s for s in run["stages"] if s["name"] == "my-sdpa")
    assert mine["status"] == "ok" and mine["params"]["attn_implementation"] == "sdpa"
    assert mine["load"]["implementation"]["attn_implementation"] == "sdpa"
    # its own field, validated by its own Extra model, next to the scenario's
    assert len(mine["extra"]["first_token_ids"]) == 2 and set(mine["extra"]["greedy_tokens"]) == {"r0000", "r0001"}
    assert mine["quality"]["reference"] == "hf-fp16"  # the reference the built-in declares


def test_its_claim_block_and_chart_are_in_the_report(plugin_run):
    res, out, env = plugin_run
    text = (out / "report.md").read_text()
    assert "| SDPA speeds up decode | >= 1.5x |" in text
    details = text[text.index("### my-sdpa"):]
    assert "First generated token of each request:" in details and "| request | token |" in details
    assert "![my-sdpa: my-sdpa-tokens](charts/my-sdpa-tokens.png)" in details
    assert (out / "charts" / "my-sdpa-tokens.png").stat().st_size > 1000
    # the report command, from run.json alone, writes the same
    again = run_cli("report", str(out), "-f", "md,json", "-o", str(out / "again"), env=env)
    assert again.returncode == 0, again.stderr
    claims = {c["key"]: c for c in json.loads((out / "again" / "report.json").read_text())["claims"]}
    assert claims["sdpa-promise"]["verdict"] in ("held", "not held")


def test_without_the_plugin_the_run_still_reads_and_renders(plugin_run, tmp_path):
    """Someone without the plugin installed opens the run: no hooks, but every number is there."""
    res, out, _ = plugin_run
    again = run_cli("report", str(out), "-f", "md", "-o", str(tmp_path))
    assert again.returncode == 0, again.stderr
    text = (tmp_path / "report.md").read_text()
    assert "### my-sdpa" in text and "SDPA speeds up decode" not in text
