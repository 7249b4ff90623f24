"""transformers (with bitsandbytes) as llmopt's engines: load, generate with a clock per token,
compile, attention variants, static batching."""
