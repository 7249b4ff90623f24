"""vLLM as llmopt's engines, one module per job: the offline engine and its step loop (offline),
that engine as an engine of the load machine (engine), its options (params), its start log
(startlog), its KV cache (kv), its attention backends (attention), its quality through prompt log-probs
(quality, offline; served_quality, through the server), the model-class cache the probe fills
(modelinfo) and the OpenAI-compatible server as a child process (server). The prefix cache's
counters are read with the server's clock (client/prefix_cache.py).

Nothing is imported here: `python -m llmopt_bench.engines.vllm.modelinfo` runs in vLLM's
interpreter and pays only for what it uses."""
