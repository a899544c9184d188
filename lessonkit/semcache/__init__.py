"""Semantic caching above the engine: reuse a judge's earlier answer for a nearly identical item.

  policies  the embedder (all-MiniLM-L6-v2), the content guard, the cache policies (exact,
            two-sided, one-sided, one-sided+guard) and run_stream, which feeds a stream through one
  store     SQLite (WAL) store of entries and hits, scoped by judge, instruction and embedder
  audit     shadow audits of served hits and the Clopper-Pearson bound on the loss rate
  judge     the monitoring judges whose answers the cache reuses (their training is lessonkit.training.judge)
  front     the cache in front of a generative judge (the capstone's first stage, lessonkit.stack)

Imports: the engine, models and workloads; never a trainer, the stack, a lesson, benchmark or the CLI.
"""
