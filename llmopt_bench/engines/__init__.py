"""Thin adapters over the engines (transformers, vLLM) that the stages share."""
