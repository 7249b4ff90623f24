"""run: the run machinery. The runner (runner.py) plays a journey: the environment probe
(envprobe.py) first, then each stage group through its supervisor (supervisor.py, the parent's
side of one stage child), whose child is the worker (worker.py). Beside them: the registry of
stages, journeys and presets (registry.py), the run directory (rundir.py), how long stages took
before (durations.py), the machine's fingerprint (fingerprint.py) and the run history (history.py).

May import: stages and everything below them (scenarios, engines, checkpoints, analysis, measure,
procs, core); never cli or render."""
