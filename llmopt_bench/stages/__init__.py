"""Built-in stage plugins, registered through the "llmopt.stages" entry points in pyproject.toml."""
