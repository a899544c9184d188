"""The target's hidden states for a drafter that reads them (the MTP head, the feature head).

A drafter says what it reads with `needs_states`: the layer counts whose residual stream it reads, () for the last
hidden state alone (absent or None: it reads none). Whoever runs the target over the drafter's sequence runs it
through `forward_for`: the target's own forward, asked for those taps (engine forward(taps=...): the same bits, the
same cache), whose states go to `drafter.record(start, states)`:

    states [T, S, D]   positions start .. start+T-1; S = len(needs_states) + 1, the last slot the input of the
                       target's final norm (what the MTP head reads)

The speculative loop does this for its prefill and every verify; a caller that prefills part of the prompt before
the loop (the capstone's judge: the shared prefix) does it too. Positions a drafter never saw (a prefix restored
from the prefix cache) it recomputes itself, so a caller that skips this costs time, never tokens.
"""
from __future__ import annotations

import torch


def needs_states(drafter) -> tuple[int, ...] | None:
    """The taps a drafter reads (() : the last hidden state alone), or None when it reads no states."""
    taps = getattr(drafter, "needs_states", None) if drafter is not None else None
    return None if taps is None else tuple(taps)


def forward_for(drafter, target, tokens, cache, *, last_only: bool = False) -> torch.Tensor:
    """target.forward(tokens, cache) -> logits, handing `drafter` the states it reads of these positions."""
    taps = needs_states(drafter)
    if taps is None:
        return target.forward(tokens, cache, last_only=last_only)
    start = cache.length
    if taps:
        logits, top, tapped = target.forward(tokens, cache, last_only=last_only, taps=taps)
    else:
        (logits, top), tapped = target.forward(tokens, cache, return_hidden=True, last_only=last_only), []
    drafter.record(start, torch.stack([*tapped, top.float()], 1))
    return logits


def union_of(parts) -> tuple[int, ...] | None:
    """The taps a composite drafter reads: every part's (None when no part reads states)."""
    wanted = [t for t in map(needs_states, parts) if t is not None]
    return tuple(sorted(set().union(*wanted))) if wanted else None


def record_parts(parts, start: int, states: torch.Tensor) -> None:
    """A composite drafter's record(): each part that reads states gets its own slots of the union's."""
    taps = union_of(parts)
    for d in parts:
        own = needs_states(d)
        if own is not None:
            d.record(start, states if own == taps else states[:, [taps.index(t) for t in own] + [len(taps)]])
