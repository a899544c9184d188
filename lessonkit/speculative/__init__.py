"""Speculative decoding: draft k tokens cheaply, verify them in one (k+1)-row forward of the target.

  drafters  the drafter protocol (reset / propose / update) and three drafters: a small model,
            prompt lookup (n-gram), and an oracle with a dialled-in error rate
  verify    greedy and rejection-sampling verification, and the speculative loop
  gate      expected tokens per verify step, the verify cost curve, and the depth gate (k="auto")
  depth     the draft depth type: k in 0 .. K_MAX = 15 or "auto" (the gate), parsed once (--draft-k)

The MTP head and the grammar are drafters too (lessonkit.mtp, lessonkit.grammar); lessonkit.stack
names every drafter for `--draft` in one dict.
"""
