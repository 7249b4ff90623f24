"""core: the records and contracts at the bottom of llmopt, and the conventions every layer shares.

The Stage contract (contract.py) and the records that cross it (records.py), run.json's schema
(results.py, older schemas in migrate.py), model specs (models.py), the workload and its prompt
set (workload.py), the one distribution summary (distribution.py), errors and exit codes
(errors.py), and two conventions: how numbers read (fmt.py) and how charts draw (plotting.py).

May import: nothing of llmopt outside core (pydantic and the standard library; matplotlib only
inside plotting's functions)."""
