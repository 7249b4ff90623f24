"""vLLM's own client beside llmopt's: `vllm bench serve` run in one place (bench_serve.py: its
arguments for the same load, the one runner, the one reader of its saved result) and its runs
judged by llmopt's own verdict on a load point (judge.py)."""
