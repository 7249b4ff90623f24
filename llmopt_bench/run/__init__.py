"""run: the run machinery. The runner (runner.py) plays a journey: the environment probe
(envprobe.py) first, then, with one run session (session.py: what every stage shares), each
stage group through its supervisor (supervisor.py, the parent's side of one stage child), whose
child is the worker (worker.py; its job a StageJob); a stage's result is built by outcomes.py,
the next group's worker started ahead by prefetch.py (its child side: preload.py). Beside them:
the registry of stages, journeys and presets (registry.py), the run directory (rundir.py), how
long stages took before (durations.py), the machine's fingerprint (fingerprint.py) and the run
history (history.py).

May import: stages and everything below them (scenarios, engines, checkpoints, analysis, measure,
procs, core); never cli or render."""
