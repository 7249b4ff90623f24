"""Workloads written once, independent of the engine that serves them: load that looks like
users (arrival schedules, closed and open loops), and capacity under a latency SLO."""
