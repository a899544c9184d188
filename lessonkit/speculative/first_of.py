"""Drafters in order of cost: the first one that has a long enough draft drafts (the drafter protocol).

Prompt lookup and a suffix store cost nothing and are often right for many tokens in a row, but have nothing to
say on most steps; a learned drafter (the feature head) always has a guess, at a price. TensorRT-LLM's suffix
automaton in front of EAGLE-3 and SuffixDecoding's hybrid mode combine them this way: a free match when it is long
enough, the head otherwise. Every drafter sees every reset and update, and the target's states when it reads
them (speculative.states), so each keeps its own state in step.

Depth per source. Under the utility gate (k="auto") the gate's depth suits the learned drafter, whose drafts it
measures; a free match sizes its own draft by how sure it is (the suffix drafter's adaptive depth), and the gate's
depth would cut it short (a gate that switched the head off would switch the match off too). The first
`own_depth` parts are such drafters: the verify loop asks them first (`propose_own`) at up to its widest depth,
outside the gate, and asks the gate for a depth only where none of them matched (`propose(..., start=own_depth)`);
where the gate's step drafts nothing, their shorter match (below its min_tokens) drafts (`take_fallback`). Free to
draft is not free to verify: the gate measures their steps' utility apart (tokens per second over plain decoding's,
the steps they were asked on and matched nothing included) and switches them off for a span where it is below one
(UtilityGate.free_allowed). At a fixed k every part drafts at
most k and the min_tokens hold.
"""
from __future__ import annotations

from lessonkit.errors import LessonkitError
from lessonkit.speculative.drafters import Draft
from lessonkit.speculative.states import record_parts, union_of


class FirstOf:
    """drafters: [(drafter, min_tokens)], cheapest first; the last one's min_tokens is usually 1."""

    def __init__(self, drafters: list[tuple[object, int]], name: str | None = None, own_depth: int = 0):
        if not 0 <= own_depth <= len(drafters):
            raise LessonkitError(f"own_depth={own_depth}: FirstOf has {len(drafters)} drafters")
        self.drafters, self.own_depth, self.fallback = drafters, own_depth, None
        self.name = name or "+".join(getattr(d, "name", type(d).__name__) for d, _ in drafters)
        self.used = {getattr(d, "name", str(i)): 0 for i, (d, _) in enumerate(drafters)}
        self.needs_states = union_of(d for d, _ in drafters)

    def record(self, start: int, states) -> None:
        record_parts([d for d, _ in self.drafters], start, states)

    def reset(self, prompt_ids) -> None:
        for d, _ in self.drafters:
            d.reset(prompt_ids)

    def configure(self, temperature: float, top_p: float = 1.0, seed: int = 0) -> None:
        for d, _ in self.drafters:
            if hasattr(d, "configure"):
                d.configure(temperature, top_p, seed)

    def _first(self, context, k: int, start: int, stop: int) -> Draft | None:
        """The draft of the first of parts start .. stop-1 whose draft is long enough (at most k tokens), else None;
        of the first `own_depth` parts, the first shorter one is kept as `fallback`."""
        for i in range(start, stop):
            d, least = self.drafters[i]
            draft = d.propose(context, k) if k > 0 else Draft([])
            if len(draft) >= min(least, k) and len(draft):
                self.used[getattr(d, "name", str(i))] += 1
                return draft
            if len(draft) and i < self.own_depth and self.fallback is None:
                self.fallback = (getattr(d, "name", str(i)), draft)
        return None

    def propose_own(self, context, k: int) -> Draft | None:
        """The draft of the first part that sizes its own drafts (of the first own_depth) and matched, else None."""
        self.fallback = None
        return self._first(context, k, 0, self.own_depth)

    def take_fallback(self) -> Draft | None:
        """The own parts' shorter match of this step, for a step the gate runs without drafting (else None)."""
        if self.fallback is None:
            return None
        (name, draft), self.fallback = self.fallback, None
        self.used[name] += 1
        return draft

    def propose(self, context, k: int, start: int = 0) -> Draft:
        return self._first(context, k, start, len(self.drafters)) or Draft([])

    def update(self, context, num_accepted: int) -> None:
        for d, _ in self.drafters:
            d.update(context, num_accepted)

    def finish(self) -> None:
        for d, _ in self.drafters:
            getattr(d, "finish", lambda: None)()
