"""Measurement: experiments and instruments that return data (dicts, tables), never a plot.

  timing        median wall time of repeats
  machine       the CPU's name (named with every figure)
  roofline      bytes per token against the machine's copy bandwidth
  engine        one token's path through the layers, a decode's time profile, continuations (lesson 0)
  kernel        BLAS rounding by row count, summation orders, the engines a comparison loads (lessons 0, 1)
  break_even    when speculation pays: verify cost against acceptance, the disk cost model (lesson 1)
  grounded      speculation on grounded prompts (lesson 1, bench spec)
  grammar       grammar-forced drafting A/B and schema compile times (lesson 3, bench grammar)
  mtp           MTP speed comparison (lesson 2, bench mtp)
  prefix_cache  scoring behind a cached prefix, restore against prefill, the refusals (lesson 4)
  semcache      semantic-cache hit and judge timings (lesson 5, bench semcache)
  stack         the capstone's ablation (lesson 6, bench stack)

The lessons draw what these return; the benchmarks report it. Imports: everything up to the stack, nothing
that draws (matplotlib, ipywidgets): `lessonkit bench` runs without them.
"""
