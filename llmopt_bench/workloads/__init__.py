"""workloads: what a load sends, as users send it (docs/workloads.md).

- dists.py: length and duration distributions, as the short strings the option takes;
- spec.py: the kinds and their parameters, declared once; `--workload KIND:key=value,...` parsed
  and written back canonical;
- plan.py: a plan's conversations and turns, the token space, the digest and the record;
- synth.py: the generated kinds (random, shared-prefix, multi-turn) and the prompt file's list;
- traces.py: trace files (llmopt's, Mooncake's, Azure's columns) replayed on their schedule;
- build.py: the plan of a run's workload on one engine (its tokenizer, its max_model_len).

Pure generation: imports only core. The load machine (load/plans.py) turns a plan into the
dispatcher of a load point."""
