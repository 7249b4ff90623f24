"""A real slower build for the regression gate's calibration (scripts/gate/gate-pairs.sh,
docs/regression.md "Calibration"): the transformers stages with `slower_by = F`, which makes
every forward pass of the model (the prefill and each decode step) take (1 + F) times its own
time: after the pass, the stage's main thread spins for F times what the pass took. The extra
is host work, done per token, in proportion to the step: what a build with a slower decode step
does, of a known size whatever the host's speed at that moment (a fixed extra delay would be a
different share of a slow and a fast token). Registered as a plugin (entry points
`hf-fp16-slower`, `bnb-nf4-slower`) by scripts/gate/gate-pairs.sh; nothing in llmopt imports it.

On a GPU the pass returns before its kernels finish: the hooks synchronize the device before
and after it, so that F scales the whole step, kernels included (transformers' generate() waits
on each step's token anyway, to stream it). vLLM's stages run their model in processes of their
own: no hook reaches them, and a slower build of theirs is not made here."""

from __future__ import annotations

import time

from llmopt_bench.engines.hf.engine import HFEngineParams
from llmopt_bench.scenarios.fixed.run import FixedParams
from llmopt_bench.stages.bnb import BnbNF4Stage, NF4Params
from llmopt_bench.stages.hf_fp16 import HFFP16Stage


class Slower:
    """Forward hooks that stretch each pass of `model` by `fraction` of its own time."""

    def __init__(self, model, fraction: float):
        import torch

        self.fraction, self.started = fraction, 0.0
        cuda = next(model.parameters()).device.type == "cuda"
        self.sync = torch.cuda.synchronize if cuda else (lambda: None)
        model.register_forward_pre_hook(self.before)
        model.register_forward_hook(self.after)

    def before(self, module, args) -> None:
        self.sync()
        self.started = time.perf_counter()

    def after(self, module, args, output) -> None:
        self.sync()
        now = time.perf_counter()
        until = now + self.fraction * (now - self.started)
        while time.perf_counter() < until:  # host work, as a slower step is: a sleep would free the core
            pass


class SlowerStart:
    """Mixed into a transformers stage: its engine, slowed by the `slower_by` param."""

    def start_engine(self, model, params, ctx):
        engine, info = super().start_engine(model, params, ctx)  # type: ignore[misc]
        if params.slower_by > 0:
            Slower(engine.model, params.slower_by)
        return engine, info


class SlowerHFParams(HFEngineParams, FixedParams):
    slower_by: float = 0.0


class SlowerHF(SlowerStart, HFFP16Stage):
    name = "hf-fp16-slower"
    description = "hf-fp16 with every forward pass (1 + slower_by) times as long: the gate's calibration"
    Params = SlowerHFParams


class SlowerNF4Params(NF4Params):
    slower_by: float = 0.0


class SlowerNF4(SlowerStart, BnbNF4Stage):
    name = "bnb-nf4-slower"
    description = "bnb-nf4 with every forward pass (1 + slower_by) times as long: the gate's calibration"
    Params = SlowerNF4Params
