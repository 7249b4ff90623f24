"""`llmopt tune`: the vLLM serving configuration that holds the most load under the SLO, with its
quality kept (docs/tune.md).

    space.py      the search space file (its knobs, the settings every trial shares) and a point in it
    constraints.py what vLLM needs or refuses in a configuration (paired, known, learned refusals)
    record.py     what a tune run keeps: every trial as it ends, the winner, the defaults (tune.json)
    server_capacity.py the one place tune meets the capacity search (load/, scenarios/serving/run.py)
    trial.py      one configuration: its server, its quality, its ceiling and capacity rung by rung
    confirm.py    vLLM's own client at the winner's capacity
    study.py      the plan: one-knob neighbours, the knobs that helped, their combinations, halving
    tuner.py      the search within its budget (defaults, screen, narrow, combine, confirm), resumable
    answer.py     the winner against the defaults, run.json's results
    report.py     tune.md and its chart: every trial, the Pareto front, the winner against the defaults
    command.py    the command from start to end: the FP16 reference, the search, the answer

It sits under the CLI and above render and the run machinery: it drives the runner (the FP16
quality reference), servers of its own and the serving scenario, and writes its own report;
nothing below imports it."""
