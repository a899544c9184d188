"""Multi-token-prediction (MTP) heads: a small block on the frozen target that drafts the token after next.

  head      config, weights, the forward (eh_proj + one transformer block + the target's output head),
            and the head's file under data/models/mtp/
  evaluate  teacher-forced acceptance per draft position on the target's own (cached) states
  drafter   MtpDrafter: the head behind the drafter protocol, reading the target's hidden states
  doctor    is a head healthy, and what did quantisation do to it

Training a head on the frozen target is lessonkit.training.mtp_heads. Imports: the engine, workloads and
lessonkit.speculative (the drafter protocol); never a trainer, the stack, a lesson, benchmark or the CLI.
"""
