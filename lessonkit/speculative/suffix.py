"""Suffix drafting: propose what the text went on with the last times it looked like this (SuffixDecoding).

Structured work repeats itself: a model that rewrites records, writes NDJSON lines or scores items behind one
system prompt writes the same shapes again and again (`{"host": "`, `", "level": "`, `"}` + end of turn).
A drafter that remembers the target's own earlier outputs can propose those shapes for free. SuffixDecoding
(Oliaro et al., arXiv 2411.04975) does it with suffix trees over two sources, and so does this module:

  the request   the prompt and the output so far (what prompt lookup sees), grown token by token;
  the store     the target's verified outputs of earlier requests (lessonkit.speculative.suffix_store),
                bounded, kept on disk across restarts, grown only when a run finishes.

The structure is a depth-bounded suffix trie over token ids. Every substring of at most `depth` tokens of
the inserted text is a path from the root; each node counts how many times its substring occurred:

    text  a b a b c          root ─a(2)─b(2)─a(1)─b(1)─c(1)
    depth 5                       │          └─c(1)
                                  ├─b(2)─a(1)─b(1)─c(1)
                                  │     └─c(1)
                                  └─c(1)

Insertion is online: `frontier[i]` is the node of the text's last i tokens; appending a token moves every
frontier node one step down (creating the child or counting one more occurrence): O(depth) per token, no
rebuild. A context's longest match is the deepest frontier node that has children (the request: an earlier
occurrence that went on) or the deepest node the context's suffix reaches in the store's trie.

A new request keeps what it shares with the last one (`reset`): where the new prompt starts with a prefix of the
previous request's text (prompt and output) longer than the rest of that text, the request's trie is cut back to
that prefix (`truncate`: the substrings that end after it lose their count; nodes at 0 go) and only the new tokens
are fed. What is left is the trie the prefix alone builds, down to the order of every node's children (which breaks
ties between equal counts), so every draft is the one a fresh trie gives. Behind the capstone judge's shared prompt
(537 tokens) a reset went from 7-12 ms (19-31 ms on average with the garbage collections its ~11,500 new nodes set
off) to 0.3-0.4 ms (docs/speculative.md, "The capstone's judge").

Proposing, from the match node (`greedy_path`): take the child with the largest count, again and again: the
most frequent continuation. Each step's estimated acceptance is count(child) / count(all children), and
their product p_i estimates the chance that the first i drafts are all accepted; the score sum(p_i) is the
expected number of accepted tokens. The draft stops where p_i < min_prob, and its depth is at most
alpha * (match length): SuffixDecoding's adaptive speculation length (their MAX_SPEC = alpha * p): a long
match is a confident one, a one-token match drafts one token. Of the two sources' drafts, the one with the
larger score is proposed (ties: the longer).

Cost-aware depth (an option, `cost=`, this CPU's answer to "deeper drafts when the match is sure"): on a CPU a
verify row is not free (smollm2-135m: 9 rows cost ~3x one row), so the depth that pays depends on how likely each
drafted token is and on what one more row costs. With the verify cost curve T(1 .. K+1) given, the drafter walks
the most frequent continuation as deep as k and cuts it at the depth d that maximises expected tokens per
verify-second, (1 + q_1 + q_1 q_2 + ... + q_1..q_d) / T(d+1). Each q is an acceptance rate the drafter learns
online per kind of continuation: its source (request or store), whether every earlier occurrence went on the
same way (unanimous) or not, and how long a context it follows (the match plus the drafts before it: up to 2, 3-5,
6 or more tokens; SuffixDecoding's signal that a long match is a sure one), each length's rate drawn towards its
source's over all lengths. Counts alone overstate it: on the held-out structured requests a unanimous store
continuation was accepted ~90% of the time, a unanimous request one ~75%, any continuation that had gone two
ways ~20-40% (the field values, which come from each request's own input; docs/speculative.md, 2026-12-05).
The match length, replayed on three splits of the training requests (a store of one part, the other measured),
gave 3-7% more decode-phase speed-up at the cost curve's prices on smollm2-135m, tiny-moe within 1%
(docs/speculative.md, 2026-12-06).
The rates start from a prior and are updated from what the target emitted after every proposal, whichever
drafter proposed it.

What is simplified against the paper: one path, not a speculation tree (greedy verification here checks one
draft); a trie bounded in depth instead of a compressed suffix tree (short code, O(n * depth) nodes, which
is why the store is bounded in tokens); counts, not recency, break nothing: the target verifies every draft,
so the output is plain greedy's whatever is proposed.
"""
from __future__ import annotations

from lessonkit.errors import LessonkitError
from lessonkit.speculative.drafters import Draft, common_prefix

DEPTH = 24          # the trie's depth: a match (at most MAX_MATCH tokens) plus its continuation
MAX_MATCH = 12      # the longest context suffix looked up
ROOT = 0            # the root's node number in every trie
PARKED = 4          # request tries kept from earlier requests: a new prompt goes on from the one it shares most with
ALPHA = 0.75        # draft depth <= alpha * match length (SuffixDecoding's max_spec_factor; vLLM's default 1.0)
MIN_PROB = 0.7      # stop where the estimated chance the whole draft is accepted falls below this (vLLM's 0.1)
PRIOR = {False: 0.3, True: 0.8}     # cost-aware depth: acceptance before any is seen (went two ways, unanimous)
PRIOR_OFFERED = 4                   # ... worth this many proposed tokens
MATCH_BUCKETS = (2, 5)              # cost-aware depth: context lengths up to 2, 3-5 and 6+ learn their own acceptance
# ALPHA and MIN_PROB are tuned to this CPU's verify cost (a 9-row verify costs ~3x a 1-row one, where a GPU's
# costs about the same): replaying the held-out structured outputs, they gave the most tokens per verify-second
# of the settings tried (alpha 0.5 .. 4, min_prob 0 .. 0.85; docs/speculative.md, "Suffix drafting").


class SuffixTrie:
    """Every substring of the inserted text of at most `depth` tokens, as a path from the root, with counts.

    Nodes are numbers (ROOT = 0) into two lists: count[n], the occurrences of node n's substring, and kids[n], a dict
    token -> child node (None for a leaf: most nodes are). Ints in a list and dicts of int -> int are invisible to
    Python's cyclic garbage collector (CPython tracks neither), so a trie of any size adds nothing to its full passes;
    as one object per node, a warm store's 36,000 nodes and the request tries made a full pass take 83 ms, inside a
    request's drafting. Numbers freed by `truncate` are used again."""

    def __init__(self, depth: int = DEPTH):
        if not 2 <= depth <= 256:
            raise LessonkitError(f"suffix trie depth {depth!r}: expected 2 .. 256")
        self.depth = depth
        self.root = ROOT
        self.count: list[int] = [0]
        self.kids: list[dict | None] = [None]
        self.free: list[int] = []
        self.nodes = 1

    def extend(self, frontier: list[int], token: int) -> list[int]:
        """Append `token` to a text whose frontier (frontier[i]: node of its last i tokens) is given; returns
        the new frontier. Each node on it counts one more occurrence. The hot loop of suffix drafting: the
        substrings seen before come first (shortest first); from the first new one on, every longer one is new too
        (it ends in the new one), so their nodes are made without looking them up."""
        new, count, kids, path = [ROOT], self.count, self.kids, frontier[:self.depth]
        for i, node in enumerate(path):
            ch = kids[node]
            nxt = None if ch is None else ch.get(token)
            if nxt is None:
                self._grow(path[i:], token, new)
                break
            count[nxt] += 1
            new.append(nxt)
        return new

    def _grow(self, path: list[int], token: int, new: list[int]) -> None:
        """New nodes for `token` below each node of `path` (freed numbers first), appended to `new`."""
        count, kids, free = self.count, self.kids, self.free
        for node in path:
            if free:
                nxt = free.pop()
                count[nxt], kids[nxt] = 1, None
            else:
                nxt = len(count)
                count.append(1)
                kids.append(None)
            ch = kids[node]
            if ch is None:
                kids[node] = {token: nxt}
            else:
                ch[token] = nxt
            new.append(nxt)
        self.nodes += len(path)

    def add(self, tokens: list[int]) -> None:
        """Insert a whole sequence (its substrings do not run into the previous sequence's)."""
        frontier = [ROOT]
        for t in tokens:
            frontier = self.extend(frontier, t)

    def remove(self, tokens: list[int]) -> None:
        """Undo `add(tokens)`: one occurrence less on every path."""
        self.truncate(tokens, 0)

    def truncate(self, text: list[int], keep: int) -> list[int]:
        """The trie holds `text` (added as one sequence); undo the extends of text[keep:], leaving the trie that
        text[:keep] alone builds (the same nodes, counts and order of children), and return text[:keep]'s frontier.
        Only the substrings that end at keep or later lose an occurrence: O((len(text) - keep + depth) * depth).
        A node that reaches 0 goes with the chain below it, which this occurrence alone held (a child never counts
        more than its parent)."""
        count, kids = self.count, self.kids
        frontier = [ROOT] + [None] * min(self.depth, keep)
        for i in range(max(0, keep - self.depth), len(text)):
            node, path = ROOT, text[i:i + self.depth]
            for j, t in enumerate(path):
                nxt = kids[node][t]
                if i + j < keep:                # a substring of the kept text: stays
                    if i + j == keep - 1:
                        frontier[keep - i] = nxt
                elif count[nxt] == 1:           # made after keep: goes, with the chain below it
                    del kids[node][t]
                    if not kids[node]:
                        kids[node] = None
                    self._drop(nxt, path[j + 1:])
                    break
                else:
                    count[nxt] -= 1
                node = nxt
        return frontier

    def _drop(self, node: int, below: list[int]) -> None:
        """Free `node` and the chain below it along the tokens `below` (held by one occurrence alone)."""
        kids = self.kids
        for t in below:
            nxt = kids[node][t]
            kids[node] = None
            self.free.append(node)
            node = nxt
        kids[node] = None
        self.free.append(node)
        self.nodes -= len(below) + 1


def follow(trie: SuffixTrie, match: list[int], token: int, max_match: int) -> list[int]:
    """The nodes of the context's suffixes that `trie` holds (match[i]: the last i tokens; lengths are
    prefix-closed: if a suffix is there, so is every shorter one), after the context grew by `token`."""
    new, kids = [match[0]], trie.kids
    for node in match[:max_match]:
        ch = kids[node]
        nxt = ch.get(token) if ch else None
        if nxt is None:
            break
        new.append(nxt)
    return new


def most_frequent_child(trie: SuffixTrie, node: int) -> tuple[int, int, int]:
    """(token, child, total count of all children) of the child with the largest count (the first one on ties)."""
    best_t, best, best_n, total, count = -1, -1, -1, 0, trie.count
    for t, c in trie.kids[node].items():
        n = count[c]
        total += n
        if n > best_n:
            best_t, best, best_n = t, c, n
    return best_t, best, total


def greedy_path(trie: SuffixTrie, node: int, depth: int, min_prob: float = MIN_PROB) -> tuple[list[int], float]:
    """The most frequent continuation below `node`, at most `depth` tokens: (tokens, score). p_i = product of
    count(child) / count(all children) along the path; stops where p_i < min_prob; score = sum of p_i."""
    toks, p, score = [], 1.0, 0.0
    while len(toks) < depth and trie.kids[node]:
        best_t, best, total = most_frequent_child(trie, node)
        p *= trie.count[best] / total
        if p < min_prob:
            break
        toks.append(best_t)
        score += p
        node = best
    return toks, score


def continuation(trie: SuffixTrie, node: int, depth: int) -> tuple[list[int], list[bool]]:
    """The most frequent continuation below `node`, `depth` tokens at most, and for each token whether it was
    unanimous (every earlier occurrence of the path so far went on with it)."""
    toks, unanimous = [], []
    while len(toks) < depth and trie.kids[node]:
        best_t, best, total = most_frequent_child(trie, node)
        toks.append(best_t)
        unanimous.append(trie.count[best] == total)
        node = best
    return toks, unanimous


def best_depth(q: list[float], cost: list[float]) -> tuple[int, float]:
    """The depth d <= len(q) (and < len(cost)) that maximises expected tokens per verify-second,
    (1 + sum_{i<=d} q_1..q_i) / T(d+1): (d, that rate)."""
    e, p, best, depth = 1.0, 1.0, 1.0 / cost[0], 0
    for i, qi in enumerate(q[:len(cost) - 1]):
        p *= qi
        e += p
        if e / cost[i + 1] > best:
            best, depth = e / cost[i + 1], i + 1
    return depth, best


def match_bucket(length: int) -> int:
    """The cost-aware depth's class of a drafted token by the length of the context it follows (MATCH_BUCKETS)."""
    return sum(length > b for b in MATCH_BUCKETS)


def spec_depth(match_len: int, k: int, alpha: float) -> int:
    """Adaptive speculation length: at most alpha * match length drafts (at least one), at most k."""
    return min(k, max(1, int(alpha * match_len)))


class SuffixDrafter:
    """Proposes the most frequent continuation of the longest match in the request or in the store.

    store: a lessonkit.speculative.suffix_store.SuffixStore, or None (the request alone). learn=True: `finish()`
    (called by speculative_generate at the end of every run) adds the run's output, the target's verified
    tokens after the prompt, to the store; autosave=True also saves the store then. A benchmark measures with
    learn=False, so no request is measured against a store that holds its own earlier output.
    cost: the verify cost curve (seconds of 1 .. K+1 rows, e.g. speculative.gate.cost_curve(target, 8)): the
    cost-aware depth (module docstring); None: alpha * match length and min_prob (SuffixDecoding's rule)."""

    name = "suffix"

    def __init__(self, store=None, *, max_match: int = MAX_MATCH, depth: int = DEPTH, alpha: float = ALPHA,
                 min_prob: float = MIN_PROB, learn: bool = True, autosave: bool = False,
                 cost: list[float] | None = None):
        if not 1 <= max_match < depth:
            raise LessonkitError(f"suffix drafter: max_match={max_match!r} must be 1 .. depth-1 (depth {depth})")
        if not alpha > 0 or not 0 <= min_prob <= 1:
            raise LessonkitError(f"suffix drafter: alpha={alpha!r} must be > 0 and min_prob={min_prob!r} in [0, 1]")
        if cost is not None and (len(cost) < 2 or not all(c > 0 for c in cost)):
            raise LessonkitError(f"suffix drafter: cost={cost!r} must be >= 2 positive verify times (1 .. K+1 rows)")
        self.store, self.max_match, self.depth = store, max_match, depth
        self.alpha, self.min_prob, self.learn, self.autosave = alpha, min_prob, learn, autosave
        self.cost = [float(c) for c in cost] if cost is not None else None
        self.sources = {"request": 0, "store": 0, "none": 0}     # which source each proposal came from
        # (source, unanimous, match bucket) -> [accepted, offered]; pooled: (source, unanimous) over every bucket,
        # from a prior of PRIOR_OFFERED proposals (_rate)
        self.acceptance = {(src, u, b): [0, 0] for src in ("request", "store")
                           for u in (False, True) for b in range(len(MATCH_BUCKETS) + 1)}
        self.pooled = {(src, u): [PRIOR[u] * PRIOR_OFFERED, PRIOR_OFFERED] for src in ("request", "store")
                       for u in (False, True)}
        self._pending = None        # the last cost-aware proposal: (context length, [(token, acceptance key)])
        self.seen: list[int] = []   # the text the request's trie holds
        self.parked: list[tuple[list[int], SuffixTrie]] = []    # earlier requests' (text, trie), latest first
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> None:
        """A new request. Its trie (the request's own) goes on from the earlier request's trie (the last one's, or
        one of the PARKED before it: requests of several kinds taking turns) that keeps the most of the new prompt
        (`_kept`), undoing the rest of that request's text; the store's match is found again (the store may have
        learnt since). The rest of the prompt is fed when a draft is first asked for (`_catch_up`): a request the
        utility gate keeps from drafting never indexes it (on tiny-moe in RAM a request's set-up took 0.21-0.26 ms
        with its 32-token prompt indexed, about a plain step)."""
        prompt = list(prompt_ids)
        if self.seen:
            self.parked.insert(0, (self.seen, self.trie))
        keep, at = max(((self._kept(seen, prompt), -i) for i, (seen, _) in enumerate(self.parked)), default=(0, 0))
        if keep:
            seen, self.trie = self.parked.pop(-at)
            self.frontier = self.trie.truncate(seen, keep)
        else:
            self.trie = SuffixTrie(self.depth)
            self.frontier = [ROOT]
        del self.parked[PARKED:]
        self.seen = prompt[:keep]
        self.store_match = None
        if self.store is not None:      # the kept text's longest suffix in the store: its last max_match tokens decide
            self.store_match = [ROOT]
            for t in prompt[max(0, keep - self.max_match):keep]:
                self.store_match = follow(self.store.trie, self.store_match, t, self.max_match)
        self._pending = None
        self._context = None        # the context of the last update, not yet indexed
        self.prompt_len = len(prompt)

    def _kept(self, seen: list[int], prompt: list[int]) -> int:
        """How many tokens of an earlier request's text `seen` its trie keeps for the new prompt: the prefix they
        share, where that is longer than the rest of `seen` (which must be undone); else 0 (build anew)."""
        keep = common_prefix(seen, prompt)
        return keep if keep > len(seen) - keep else 0

    def _feed(self, tokens: list[int]) -> None:
        trie, frontier, match, mm = self.trie, self.frontier, self.store_match, self.max_match
        for t in tokens:
            frontier = trie.extend(frontier, t)
            if match is not None:
                match = follow(self.store.trie, match, t, mm)
        self.frontier, self.store_match = frontier, match
        self.seen.extend(tokens)

    def _catch_up(self, context: list[int]) -> None:
        """Feed the context's tokens not seen yet; a context that does not extend what was seen starts over."""
        n = len(self.seen)
        if len(context) < n or (n and context[n - 1] != self.seen[-1]):
            self.reset(context)
            n = len(self.seen)
        if len(context) > n:
            self._feed(context[n:])

    def _request_draft(self, k: int) -> tuple[list[int], float]:
        f = self.frontier
        for length in range(min(self.max_match, len(f) - 1), 0, -1):     # the longest match that went on
            if self.trie.kids[f[length]]:
                return greedy_path(self.trie, f[length], spec_depth(length, k, self.alpha), self.min_prob)
        return [], 0.0

    def _store_draft(self, k: int) -> tuple[list[int], float]:
        m = self.store_match
        if m is None or len(m) < 2:
            return [], 0.0
        length = len(m) - 1
        return greedy_path(self.store.trie, m[-1], spec_depth(length, k, self.alpha), self.min_prob)

    def continuations(self, context: list[int], k: int) -> list[tuple[str, list[int], list[tuple[bool, int]]]]:
        """Each source's most frequent continuation of the context's longest match there, k tokens at most, uncut:
        [(source, tokens, classes)], a token's class (unanimous, match bucket of the context it follows) (none for a
        source without a match that went on)."""
        self._catch_up(context)
        nodes, f = [], self.frontier
        for length in range(min(self.max_match, len(f) - 1), 0, -1):     # the longest match that went on
            if self.trie.kids[f[length]]:
                nodes.append(("request", self.trie, f[length], length))
                break
        if self.store_match is not None and len(self.store_match) > 1:
            nodes.append(("store", self.store.trie, self.store_match[-1], len(self.store_match) - 1))
        out = []
        for source, trie, node, length in nodes:
            toks, unanimous = continuation(trie, node, k)
            out.append((source, toks, [(u, match_bucket(length + i)) for i, u in enumerate(unanimous)]))
        return out

    def _costed(self, context: list[int], k: int) -> tuple[list[int], list[tuple]]:
        """Cost-aware depth: each source's continuation cut at its best depth; the source with the higher
        expected tokens per verify-second drafts: (tokens, each token's acceptance key)."""
        best = (0.0, [], [])
        for source, toks, classes in self.continuations(context, k):
            keys = [(source, *c) for c in classes]
            q = [self._rate(key) for key in keys]
            d, rate = best_depth(q, self.cost)
            if d and rate > best[0]:
                best = (rate, toks[:d], keys[:d])
        return best[1], best[2]

    def _rate(self, key: tuple) -> float:
        """A kind of continuation's acceptance: its own counts, drawn towards the rate of its source and unanimity
        over every match length (PRIOR_OFFERED proposals' worth), so a bucket that has seen little borrows."""
        a, n = self.acceptance[key]
        pa, pn = self.pooled[key[:2]]
        return (a + PRIOR_OFFERED * pa / pn) / (n + PRIOR_OFFERED)

    def propose(self, context: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft([])
        if self.cost is not None:
            toks, keys = self._costed(context, k)
            self._pending = (len(context), list(zip(toks, keys)))
            self.sources[keys[0][0] if keys else "none"] += 1
            return Draft(toks)
        self._catch_up(context)
        req, store = self._request_draft(k), self._store_draft(k)
        pick, source = (store, "store") if (store[1], len(store[0])) > (req[1], len(req[0])) else (req, "request")
        self.sources[source if pick[0] else "none"] += 1
        return Draft(pick[0])

    def update(self, context: list[int], num_accepted: int) -> None:
        """After a cost-aware proposal, learn from what the target emitted whether each proposed token would have been
        accepted (whichever drafter's draft was verified). The trie catches up with the context when a draft is
        asked for (propose) or the run ends (finish): steps the depth gate runs without drafting index nothing."""
        if self._pending is not None:
            start, proposed = self._pending
            self._pending = None
            for (tok, key), emitted in zip(proposed, context[start:]):
                hit = tok == emitted
                for counts in (self.acceptance[key], self.pooled[key[:2]]):
                    counts[0] += hit
                    counts[1] += 1
                if not hit:
                    break
        self._context = context

    def finish(self) -> None:
        """The run is over: its output (the target's verified tokens) joins the store, when learning."""
        if self._context is not None and self.learn and self.store is not None:
            self._catch_up(self._context)
        self._context = None
        if self.learn and self.store is not None and len(self.seen) > self.prompt_len:
            self.store.add(self.seen[self.prompt_len:])
            if self.autosave:
                self.store.save()
