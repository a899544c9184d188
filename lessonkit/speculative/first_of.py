"""Drafters in order of cost: the first one that has a long enough draft drafts (the drafter protocol).

Prompt lookup and a suffix store cost nothing and are often right for many tokens in a row, but have nothing to
say on most steps; a learned drafter (the feature head) always has a guess, at a price. TensorRT-LLM's suffix
automaton in front of EAGLE-3 and SuffixDecoding's hybrid mode combine them this way: a free match when it is long
enough, the head otherwise. Every drafter sees every reset and update, and the target's states when it reads
them (speculative.states), so each keeps its own state in step.
"""
from __future__ import annotations

from lessonkit.speculative.drafters import Draft
from lessonkit.speculative.states import record_parts, union_of


class FirstOf:
    """drafters: [(drafter, min_tokens)], cheapest first; the last one's min_tokens is usually 1."""

    def __init__(self, drafters: list[tuple[object, int]], name: str | None = None):
        self.drafters = drafters
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

    def propose(self, context, k: int) -> Draft:
        for i, (d, least) in enumerate(self.drafters):
            draft = d.propose(context, k) if k > 0 else Draft([])
            if len(draft) >= min(least, k) and len(draft):
                self.used[getattr(d, "name", str(i))] += 1
                return draft
        return Draft([])

    def update(self, context, num_accepted: int) -> None:
        for d, _ in self.drafters:
            d.update(context, num_accepted)

    def finish(self) -> None:
        for d, _ in self.drafters:
            getattr(d, "finish", lambda: None)()
