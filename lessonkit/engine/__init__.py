"""The engine: a decoder-only transformer that streams MoE experts from disk, and nothing above it.

  config        ModelConfig (Llama and OLMoE / Mixtral families) and named presets
  kv_cache      preallocated KV cache with rollback and snapshots
  expert_store  experts read with one pread each into an LRU cache with a byte budget
  model         the forward pass and its exactness rules (row-invariant products)
  engine        Engine = model + expert store + tokenizer, with a provenance fingerprint
  generate      prefill, decode, greedy / sampled generation: the reference every technique matches
  registry      named models and checkpoint directories -> Engine
  checkpoint    the streaming layout on disk, conversion from / to Hugging Face
  gguf_loader   SmolLM2's GGUF file in Hugging Face form, and chat templates
  quant         weight quantisation (int8 / int4, per row or per group)
  attention     the one scaled dot-product attention (grouped by kv head)
  kernel        row-invariant products for short forwards (the C kernel or MKL row groups)
  roofline      bytes per token against the machine's copy bandwidth
  atomic        crash-safe writes (temporary file, fsync, rename, directory fsync)
  threads       use_threads: --threads is the C kernel's count; torch's is set from it here only
  timing        median wall time of repeats
  errors        LessonkitError, the one exception for bad input

Nothing here imports a technique, a lesson, a benchmark or the CLI.
"""
