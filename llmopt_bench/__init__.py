"""llmopt: replay the LLM inference optimization journey on your own GPU and model."""

__version__ = "0.1.0"
