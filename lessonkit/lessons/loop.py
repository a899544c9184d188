"""The greedy speculative loop in view (issue 59, item 2). Lesson 1 prints the source of `greedy_speculative`: plain
greedy decoding with the lines that speculative decoding adds marked `# + speculative`. It is the loop of
`lessonkit.speculative.verify.speculative_generate` without its statistics, sampling, stop strings and depth gate;
tests/test_loop.py checks that both give the same tokens, and plain greedy's."""
from __future__ import annotations

import inspect


def greedy_speculative(target, drafter, prompt: list[int], max_new_tokens: int, k: int = 4) -> list[int]:
    cache = target.new_cache(len(prompt) + max_new_tokens + k + 1)
    logits = target.forward(list(prompt), cache, last_only=True)[-1]       # prefill the prompt
    out = [int(logits.argmax())]                                           # greedy: the most likely token
    drafter.reset(list(prompt))                                            # + speculative
    while len(out) < max_new_tokens:
        context = list(prompt) + out                                       # cached: all but out[-1]
        room = min(k, max_new_tokens - len(out) - 1)                       # + speculative
        draft = list(drafter.propose(context, room).tokens)[:room] if room else []   # + speculative: guesses
        rows = target.forward([out[-1], *draft], cache)                    # ONE forward, 1 + len(draft) rows
        picks = [int(r.argmax()) for r in rows]                            # the target's pick after each row
        n = 0                                                              # + speculative
        while n < len(draft) and draft[n] == picks[n]:                     # + speculative: longest agreeing prefix
            n += 1                                                         # + speculative
        cache.rollback(len(context) + n)                                   # + speculative: drop rejected rows
        out += draft[:n] + [picks[n]]                                      # accepted drafts, then the target's own
        drafter.update(list(prompt) + out, n)                              # + speculative
    return out[:max_new_tokens]


def source(fn=greedy_speculative) -> str:
    """The function's source as lesson 1 prints it, with how many of its lines speculative decoding adds."""
    text = inspect.getsource(fn)
    added = sum("# + speculative" in line for line in text.splitlines())
    return f"{text}\n# {added} of {len(text.splitlines())} lines are speculative decoding's; the rest is plain greedy"
