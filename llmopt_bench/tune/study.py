"""The Optuna study behind `llmopt tune`: which configuration to try next, and whether one goes on
to its next rung.

- The sampler: every configuration of a small space in a seeded random order, none twice
  (BruteForceSampler), or, for a larger one, TPE (multivariate: the scheduler's limits act
  together), which proposes configurations like the best ones so far.
- The pruner: successive halving (Optuna's SuccessiveHalvingPruner, asynchronous: ASHA). A
  configuration reports its capacity after each rung, at steps 1 (short points, coarse) and 3
  (narrowed to the precision); it goes on only while it is among the best 1/eta of the
  configurations that reached that rung (while fewer than eta have, only the best goes on). The
  held rung ends the trial. vLLM's defaults are the reference: they climb every rung.
- The value: the capacity's lower bound (the highest rate that met the SLO) at the trial's last
  rung, 0 where none did, the configuration was refused, or it failed the quality gate.

The study lives in memory; tune.json is the record. A resumed run rebuilds the study from it
(each finished trial added with its rung values, where the pruner looks for them)."""

from __future__ import annotations

import warnings
from typing import Any

from llmopt_bench.tune.record import TrialRecord
from llmopt_bench.tune.space import Config, Space

STEPS = {"short": 1, "precise": 3}  # the pruner's steps: min_resource 1 x eta^rung (eta = 3 by default)
BRUTE_FORCE_MAX = 24  # a space this small is tried whole, in a random order


def distributions(space: Space) -> dict[str, Any]:  # knob -> optuna distribution (optuna is imported inside)
    from optuna.distributions import CategoricalDistribution

    return {k: CategoricalDistribution(values) for k, values in space.knobs.items()}


def make_study(space: Space, seed: int, finished: list[TrialRecord]) -> Any:
    import optuna
    from optuna.pruners import SuccessiveHalvingPruner
    from optuna.samplers import BruteForceSampler, TPESampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    sampler = BruteForceSampler(seed=seed) if space.size() <= BRUTE_FORCE_MAX else \
        TPESampler(seed=seed, multivariate=True, n_startup_trials=5)
    # step 1 is rung 0 (short), step 3 rung 1 (precise) whatever eta: min_resource 1, eta^rung
    pruner = SuccessiveHalvingPruner(min_resource=1, reduction_factor=space.search.reduction_factor, min_early_stopping_rate=0)
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    dists = distributions(space)
    for rec in finished:
        if all(rec.config.get(k) in dists[k].choices for k in dists) and set(rec.config) == set(dists):
            study.add_trial(frozen(rec, dists))
    return study


def frozen(rec: TrialRecord, dists: dict[str, Any]) -> Any:  # dists: distributions()'s, optuna's types
    """A finished trial as the study would have it: its params, its rung values at their steps
    (and where successive halving reads them), pruned or complete."""
    from optuna.trial import TrialState, create_trial

    values = {STEPS[r.name]: r.capacity_rps or 0.0 for r in rec.rungs if r.name in STEPS}
    attrs = {f"completed_rung_{i}": v for i, v in enumerate(values.values())}
    if rec.outcome in ("pruned", "stopped"):
        return create_trial(state=TrialState.PRUNED, params=rec.config, distributions=dists, intermediate_values=values,
                            system_attrs=attrs)
    return create_trial(state=TrialState.COMPLETE, params=rec.config, distributions=dists, value=rec.value or 0.0,
                        intermediate_values=values, system_attrs=attrs)


def key(config: Config) -> str:
    import json

    return json.dumps(config, sort_keys=True)
