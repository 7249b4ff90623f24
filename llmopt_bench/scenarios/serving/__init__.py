"""The serving scenario, one module per job: the load it runs on an engine (run: sweep, open
points, capacity search, hold), what it takes and keeps (record), what it makes of the measured
points (rows), and how a serving stage presents itself in the report (report).

Nothing is imported here, so reading a record does not load the load machine."""
