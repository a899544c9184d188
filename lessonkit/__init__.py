"""lessonkit: a workbook for the lossless acceleration stack of local LLM inference.

Layers, bottom up: the engine (config, kv_cache, expert_store, model, engine, generate, registry),
the techniques on top (drafters, speculative, mtp, grammar, prefix_cache, semcache), and the
notebooks on top of those. Nothing in the engine imports a technique.
"""
__version__ = "0.1.0"
