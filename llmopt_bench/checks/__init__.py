"""The checks against vLLM's own client, as commands (`llmopt check peer`, `llmopt check
capacity`: cli/check.py): llmopt and `vllm bench serve` on one served configuration
(engines/vllm/served.py), vLLM's runs read and judged in one place (scenarios/peer/). Like tune/,
a command's orchestration under the CLI: nothing below imports it."""
