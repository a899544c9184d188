"""Grammars while generating: forced bytes become free drafts (lossless) or a decoding mask (not).

  gbnf         the grammar text format (a GBNF subset over bytes): read into rules, written from parts
  automaton    Grammar, its immutable interned states and the built-in grammars (grammars/*.gbnf)
  json_schema  JSON Schema (draft 2020-12 subset) -> grammar, failing closed; json_rewrite turns
               keywords into equal schemas (allOf via json_merge, not, if, ...) and decides oneOf;
               json_numbers, regex and json_rules are its ranges, `pattern` and JSON value rules
  tokens       a grammar seen through a tokenizer: token bytes, vocabulary trie, masks, span tokens
  drafter      GrammarDrafter (the drafter protocol), ConstrainedDecoder, generate_with_grammar
  measure      forced bytes, span tokenisation, byte sources and the drafting ceiling, without a model
  masks        fast token masks: the vocabulary's byte trie walked level by level
  records      the grammar of the workbook's NDJSON monitoring records

Imports: the engine, workloads and lessonkit.speculative (the drafter protocol); never a trainer, the stack,
a measurement, lesson, benchmark or the CLI.
"""
