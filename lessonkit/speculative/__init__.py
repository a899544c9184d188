"""Speculative decoding: draft k tokens cheaply, verify them in one (k+1)-row forward of the target.

  drafters  the drafter protocol (reset / propose / update) and three drafters: a small model,
            prompt lookup (n-gram), and an oracle with a dialled-in error rate
  verify    greedy and rejection-sampling verification, and the speculative loop
  gate      expected tokens per verify step, the verify cost curve, and the depth gate (k="auto")

The MTP head and the grammar are drafters too (lessonkit.mtp, lessonkit.grammar); lessonkit.stack
names every drafter for `--draft` in one dict.
"""
