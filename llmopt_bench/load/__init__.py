"""load: the one load machine of llmopt, for every engine (docs/serving.md, docs/batching.md).

- arrivals.py: the arrival schedules (Poisson, gamma with a burstiness, evenly spaced), seeded;
- dispatchers.py: the loops (ClosedLoop: N users; OpenLoop: a schedule, given or drawn), as the
  Dispatcher of core/dispatch.py that an engine drives, and each request's timeline;
- point.py: a load point (LoadPoint) and its figures (summarize -> PointResult), defined once;
- steady.py: whether the server kept up (the steady-state judgement of an open-loop point);
- engine.py: the engine interface (LoadEngine: drive(dispatcher)) and run_point();
- record.py: the row every load stage keeps (PointRow), goodput, the SLO verdict, SLOPoint;
- capacity/ (find.py the entry point: find_capacity; search.py, budget.py, hold.py, params.py):
  the capacity under an SLO, searched from the highest completion rate measured down to a
  precision within a budget of seconds of load, held for longer, with the knee of the latency curve.

The engines' adapters live in engines/ (vllm/engine.VLLMEngine, hf/static_engine.StaticBatcher)
and client/ (http_load.HTTPLoad) and satisfy LoadEngine without importing this package; the
scenarios above (scenarios/batching/, scenarios/serving/) declare the points and keep the records.

May import: analysis, measure, core (never engines nor client: an engine is handed in)."""
