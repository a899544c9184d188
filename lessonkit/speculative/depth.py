"""Draft depth: how many tokens a drafter may propose per verify step. Parsed once, at the edge.

A draft depth is an int k in 0 .. K_MAX, or AUTO:
  k       every step drafts at most k tokens (0: no drafting, plain decoding through the verify loop).
  "auto"  the utility gate (lessonkit.speculative.gate.UtilityGate, Cascade's test-then-set): short test
          phases run k = 0 and the depth the cost model E(k) / (T(k+1) + k t_draft) ranks first (DepthGate);
          the longer set phase keeps the depth whose measured whole steps gave the most tokens per second,
          k = 0 where no depth promises 10% over it. This is what "auto" means everywhere
          in lessonkit: `--draft-k auto`, `speculative_generate(k="auto")`, `generate_with_grammar(draft_k="auto")`.
  None    (a library argument, never a command-line value) the technique's own default: the depth gate for a
          drafter named by --draft; for the grammar drafter its grammar span, `grammar_depth(max_draft)`
          (lessonkit.grammar.drafter: as far as the grammar forces, up to max_draft, capped at K_MAX), a fixed
          depth that is deliberately not the gate: forced tokens are accepted, so deeper always pays.

K_MAX = 15 is the engine's limit, not a tuning choice: a verify step runs k + 1 rows through the target in
one forward, and only forwards of at most ROWWISE_MAX = 16 rows (lessonkit.engine.kernel) take the
row-invariant path that is bit-identical to decoding one token at a time; that identity is what makes the
speculative output token-identical to plain decoding. (Kept here as a number so the CLI can check it
without importing torch; tests/test_parsing.py holds it equal to ROWWISE_MAX - 1.)
"""
from __future__ import annotations

import argparse
from typing import Literal, Union

from lessonkit.errors import LessonkitError

AUTO = "auto"
K_MAX = 15
DraftDepth = Union[int, Literal["auto"]]


class DraftDepthError(LessonkitError, argparse.ArgumentTypeError):
    """A bad draft depth: a LessonkitError for library callers, and argparse's own type error, so that
    `--draft-k 20` is a one-line usage error naming the option."""


def parse_draft_depth(value) -> DraftDepth:
    """'auto', or an integer 0 .. K_MAX given as an int or its decimal text. The argparse type of every
    --draft-k and the check of every library entry point; the message names the value and the limit."""
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise DraftDepthError(f"{value!r} is not a draft depth: 'auto' or an integer 0 .. {K_MAX}")
    try:
        k = int(value.strip()) if isinstance(value, str) else value
    except ValueError:
        raise DraftDepthError(f"{value!r} is not an integer or 'auto' (a draft depth: 0 .. {K_MAX})") from None
    if not 0 <= k <= K_MAX:
        raise DraftDepthError(f"{value}: the draft depth must be at least 0 and at most {K_MAX} (K_MAX: a verify "
                              f"forward of more than {K_MAX + 1} rows leaves the path that is bit-identical to decoding)")
    return k
