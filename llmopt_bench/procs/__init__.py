"""procs: the one place that starts, follows and ends processes: the spawner (spawn.py, a child in
a session of its own, killed whole, its end described with evidence) and the wire a child talks
back on (events.py).

May import: core."""
