"""Measurement: experiments and instruments that return data (dicts, tables), never a plot.

  timing        median wall time of repeats
  roofline      bytes per token against the machine's copy bandwidth
  grounded      speculation on grounded prompts (lesson 1, bench spec)
  grammar       grammar-forced drafting A/B and schema compile times (lesson 3, bench grammar)
  mtp           MTP speed comparison (lesson 2, bench mtp)
  semcache      semantic-cache hit and judge timings (lesson 5, bench semcache)
  stack         the capstone's ablation (lesson 6, bench stack)

The lessons draw what these return; the benchmarks report it. Imports: everything up to the stack, nothing
that draws (matplotlib, ipywidgets): `lessonkit bench` runs without them.
"""
