"""The engine: a decoder-only transformer that streams MoE experts from disk, and nothing above it.

  config        ModelConfig (Llama and OLMoE / Mixtral families) and named presets
  checkpoint    the streaming layout on disk (dense + packed experts) and loading it
  packed_layout the kernel's packed format (one table with csrc/format.h) and packing blocks into it, in numpy
  blocks        native Q4_1 / Q8_0 weight blocks as torch weights the kernel multiplies
  kernel        the C kernel binding: row-invariant products, the thread pool, ISA dispatch
  c_plan        what the C forward is handed: the plan of weight addresses, the dims, the RoPE tables (numpy)
  c_forward     one C call per forward (dense Llama and OLMoE-style MoE); a draft model's greedy turn in one call
  model         the forward pass and its exactness rules (row-invariant products)
  kv_cache      preallocated KV cache with rollback and snapshots
  expert_store  experts read with one pread each into an LRU cache with a byte budget
  engine        Engine = model + expert store + tokenizer, with a provenance fingerprint
  text          the tokenizer and a token's exact bytes (no torch)
  lean          the torch-free generate: numpy weights and KV cache, every step one C forward
  generate      prefill, decode, greedy / sampled generation: the reference every technique matches
  quant         weight quantisation (int8 / int4, per row or per group)
  attention     the one scaled dot-product attention (grouped by kv head)
  threads       use_threads: --threads is the C kernel's count; torch's is set from it here only

Imports: lessonkit.files and lessonkit.errors only. Named models, conversion and integrity are lessonkit.models.
"""
