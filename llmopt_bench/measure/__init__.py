"""Measurement primitives: clocks, memory, energy. No torch at import time."""
