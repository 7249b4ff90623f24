"""The engines llmopt measures, by family: hf/ (transformers, bitsandbytes, compiled, static
batching), vllm/ (the offline engine, the server as a child, its quality), awq/ (AWQ's checkpoint
producer); beside them what every family shares: the processes and memory an engine holds
(lifecycle), one engine kept for several stages (engine_pool), an engine's variants (variants)."""
