"""Renderers: they only read results (terminal table, progress, markdown, charts)."""
