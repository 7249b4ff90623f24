"""The context-length sweep, written once for every engine: the plan, the loop, the report."""
