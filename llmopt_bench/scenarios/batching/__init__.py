"""Continuous batching's scenario: the load curve, the mixed-length and KV-capacity probes, what it
records and how it reports."""
