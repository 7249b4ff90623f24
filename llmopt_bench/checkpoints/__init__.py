"""checkpoints: a model spec made files on disk, once, in the cache (prepare.py): synthetic Llama
weights (synthetic.py) with their locally trained tokenizer (tokenizer.py), the bundled SmolLM2
converted from GGUF, a hub snapshot.

May import: core."""
