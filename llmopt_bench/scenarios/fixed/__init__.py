"""The fixed workload: the run's prompt set with the output length forced, repeated."""
