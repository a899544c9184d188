"""Speculative decoding: draft k tokens cheaply, verify them in one (k+1)-row forward of the target.

  drafters  the drafter protocol (reset / propose / update) and three drafters: a small model,
            prompt lookup (n-gram), and an oracle with a dialled-in error rate
  verify    greedy and rejection-sampling verification, and the speculative loop
  gate      expected tokens per verify step, the verify cost curve, and the depth gate (k="auto")
  vocab     a drafter's output layer over the target's most frequent tokens only (FR-Spec)
  acceptance  a drafter's measured acceptance and draft cost, the figures its model card reports
  depth     the draft depth type: k in 0 .. K_MAX = 15 or "auto" (the gate), parsed once (--draft-k)

The MTP head and the grammar are drafters too (lessonkit.mtp, lessonkit.grammar); lessonkit.stack
names every drafter for `--draft` in one dict. Drafters are trained in lessonkit.training.
Imports: the engine, models and workloads; never a trainer, the stack, a lesson, benchmark or the CLI.
"""
