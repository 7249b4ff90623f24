"""procs: the one place that starts, follows and ends processes, and asks interpreters what they
have. The spawner (spawn.py: a child in a session or process group of its own, signalled and
killed whole, its end described with evidence), the wire a stage's worker talks back on (events.py: typed events), one
walk of /proc for sessions, groups and descendants (tree.py), the wait until the card is free
again (gpu.py), and which interpreter runs an engine and what it has (interpreters.py).

May import: measure (NVML, for the GPU wait) and core (the records the events carry)."""
