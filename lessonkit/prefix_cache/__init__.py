"""A persistent prefix-KV cache: resume a long prompt from disk, never from a wrong state.

  snapshot  provenance fingerprint, chained block hashes (vLLM style) and the verified file format
  cache     PrefixCache: a directory shared by processes, longest-prefix lookup, crash-safe saves,
            LRU eviction within a byte budget
  generate  the engine behind it: score items behind a shared prefix, generate resuming a prompt
  worker    score() in a fresh process (a real restart)
"""
