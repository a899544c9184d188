"""A persistent prefix-KV cache: resume a long prompt from disk, never from a wrong state.

  snapshot  provenance fingerprint, chained block hashes (vLLM style) and the verified file format
  cache     PrefixCache: a directory shared by processes, longest-prefix lookup, crash-safe saves,
            LRU eviction within a byte budget
  generate  the engine behind it: score items behind a shared prefix, generate resuming a prompt
  index     the cache's index.json, an acceleration only: a damaged one is rebuilt, never trusted
  faults    full disks, read-only folders and dead writers: the errors told apart, the warning, the counters
  worker    score() in a fresh process (a real restart)

Imports: the engine and lessonkit.models; never a trainer, the stack, a lesson, benchmark or the CLI.
"""
