"""Workloads written once, run on any engine that offers what they need (docs/architecture.md)."""
