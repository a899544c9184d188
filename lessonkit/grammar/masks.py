"""Fast token masks: the vocabulary's byte trie walked level by level with numpy.

The trie is laid out breadth-first in arrays (`TrieLevels`): the nodes of one depth are contiguous
and in lexicographic order, so the children of a node are a contiguous range of the next depth.
A grammar state's mask walks that trie once: at each depth the live nodes' children are gathered
and their states looked up in a transition table (state id x byte -> state id, `StateTable`) that
is filled lazily from the automaton, so a transition costs Python work only the first time it is
seen. The few live nodes left deep in the trie (long tokens) are finished by walking the dict trie
in Python, which is cheaper there than a numpy call per depth. The result is exactly the set of
tokens whose bytes the automaton accepts from the state, as the plain trie walk
(`TokenTrie.allowed_ids`) computes it; tests compare the two with ==.
"""
from __future__ import annotations

import numpy as np

from lessonkit.grammar.automaton import GrammarState, mask_bytes

_DEAD = 0
_UNKNOWN = -1
_PY_NODES = 1500          # at most this many trie nodes under the legal first bytes: walk them in Python
_DENSE_FIRST_BYTES = 16   # more legal first bytes than this: walk whole depths rather than live children
_PY_TAIL = 48          # below this many live nodes the Python walk beats a numpy call per depth


class TrieLevels:
    """The vocabulary's byte trie in breadth-first arrays: per node its byte, parent, child range and
    dict-trie node; per token its terminal node (or the sentinel node, never live)."""

    def __init__(self, table: list[bytes | None], root: tuple[dict, list]):
        prefixes = {b[:k] for b in table if b for k in range(1, len(b) + 1)}
        order = [b""] + sorted(prefixes, key=lambda p: (len(p), p))
        index = {p: i for i, p in enumerate(order)}
        n = len(order)
        self.byte = np.array([p[-1] if p else 0 for p in order], dtype=np.int64)
        parent = np.array([index[p[:-1]] if p else -1 for p in order], dtype=np.int64)
        self.parent = parent
        depth = np.array([len(p) for p in order])
        bounds = np.searchsorted(depth, np.arange(1, depth[-1] + 2))
        self.spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))    # nodes of depth 1, 2, ...
        self.depths = [(lo, hi, parent[lo:hi].astype(np.int32), self.byte[lo:hi].astype(np.int32))
                       for lo, hi in self.spans]
        ids = np.arange(n)
        self.child_start = np.searchsorted(parent, ids, "left")
        self.child_count = np.searchsorted(parent, ids, "right") - self.child_start
        self.sentinel = n
        self.term = np.array([index[b] if b else n for b in table], dtype=np.int64)
        self.dict_nodes = [_dict_node(root, p) for p in order]
        self.root = root
        self.subtree_nodes = [0] * 256                 # trie nodes under each first byte
        for p in prefixes:
            self.subtree_nodes[p[0]] += 1


def _dict_node(root: tuple[dict, list], prefix: bytes) -> tuple[dict, list]:
    node = root
    for b in prefix:
        node = node[0][b]
    return node


class StateTable:
    """Grammar states numbered from 1 (0 is the dead state) and their transitions, filled lazily."""

    def __init__(self):
        self.ids: dict[GrammarState, int] = {}
        self.states: list[GrammarState | None] = [None]
        self.next = np.full((64, 256), _UNKNOWN, dtype=np.int32)
        self.next[_DEAD] = _DEAD

    def id_of(self, state: GrammarState | None) -> int:
        if state is None:
            return _DEAD
        i = self.ids.get(state)
        if i is None:
            i = self.ids[state] = len(self.states)
            self.states.append(state)
            if i >= len(self.next):
                grown = np.full((2 * len(self.next), 256), _UNKNOWN, dtype=np.int32)
                grown[:len(self.next)] = self.next
                self.next = grown
            allowed = np.unpackbits(np.frombuffer(state.mask.to_bytes(32, "little"), np.uint8), bitorder="little")
            self.next[i] = np.where(allowed.astype(bool), _UNKNOWN, _DEAD)
        return i

    def step(self, flat: np.ndarray) -> np.ndarray:
        """next[state, byte] for flat indices state * 256 + byte, filling the rows of states not yet expanded."""
        out = self.next.take(flat)
        if out.size and out.min() == _UNKNOWN:
            unknown = out == _UNKNOWN
            for sid in np.unique(flat[unknown] >> 8).tolist():
                self.expand(sid)
            out[unknown] = self.next.take(flat[unknown])
        return out

    def expand(self, sid: int) -> None:
        """Fill state `sid`'s row: every legal byte's next state (numbered, not yet expanded themselves)."""
        for group, nxt in self.states[sid].successors():
            j = self.id_of(nxt)
            bits = np.unpackbits(np.frombuffer(group.to_bytes(32, "little"), np.uint8), bitorder="little")
            self.next[sid, bits.astype(bool)] = j

    def __len__(self) -> int:
        return len(self.states)


def legal_tokens(levels: TrieLevels, table: StateTable, state: GrammarState) -> np.ndarray:
    """BoolArray[V]: the tokens whose bytes the automaton accepts from `state`. Few trie nodes under the
    legal first bytes: the Python walk (no numpy call overhead); many legal first bytes: whole depths."""
    first = mask_bytes(state.mask)
    if sum(levels.subtree_nodes[b] for b in first) <= _PY_NODES:
        out = np.zeros(len(levels.term), dtype=bool)
        ids = walk_below(levels.root, state)
        out[np.asarray(ids, dtype=np.int64)] = True
        return out
    if len(first) > _DENSE_FIRST_BYTES:
        return _dense_walk(levels, table, state)
    return _sparse_walk(levels, table, state)


def _dense_walk(levels: TrieLevels, table: StateTable, state: GrammarState) -> np.ndarray:
    """Every node of each depth at once (most of the trie lives, as inside a JSON string)."""
    st = np.zeros(levels.sentinel + 1, dtype=np.int32)
    st[0] = table.id_of(state)
    extra: list[int] = []
    prev = (0, 1)
    for lo, hi, parent, byte in levels.depths:
        if hi - lo < _PY_TAIL:
            for node in (np.flatnonzero(st[prev[0]:prev[1]]) + prev[0]).tolist():
                extra += walk_below(levels.dict_nodes[node], table.states[st[node]])
            break
        st[lo:hi] = table.step(st[parent] * 256 + byte)
        prev = (lo, hi)
    out = (st != _DEAD)[levels.term]
    if extra:
        out[np.asarray(extra, dtype=np.int64)] = True
    return out


def _sparse_walk(levels: TrieLevels, table: StateTable, state: GrammarState) -> np.ndarray:
    """Only the children of live nodes, depth by depth (few first bytes are legal)."""
    live = np.zeros(levels.sentinel + 1, dtype=bool)
    nodes = np.zeros(1, dtype=np.int64)
    states = np.array([table.id_of(state)], dtype=np.int64)
    extra: list[int] = []
    while nodes.size:
        if nodes.size < _PY_TAIL and nodes[0]:
            for node, sid in zip(nodes.tolist(), states.tolist()):
                extra += walk_below(levels.dict_nodes[node], table.states[sid])
            break
        counts = levels.child_count[nodes]
        total = int(counts.sum())
        if not total:
            break
        ends = np.cumsum(counts)
        child = np.arange(total) + np.repeat(levels.child_start[nodes] - (ends - counts), counts)
        nxt = table.step(np.repeat(states, counts).astype(np.int64) * 256 + levels.byte[child])
        keep = nxt != _DEAD
        nodes, states = child[keep], nxt[keep]
        live[nodes] = True
    out = live[levels.term]
    if extra:
        out[np.asarray(extra, dtype=np.int64)] = True
    return out


def walk_below(node: tuple[dict, list], state: GrammarState) -> list[int]:
    """Tokens strictly below `node` (whose bytes so far led to `state`) that the automaton accepts."""
    out: list[int] = []
    stack = [(node, state)]
    while stack:
        (children, _), s = stack.pop()
        mask = s.mask
        for b, child in children.items():
            if not mask >> b & 1:
                continue
            s2 = s.advance(b)
            if s2 is None:
                continue
            out += child[1]
            if child[0]:
                stack.append((child, s2))
    return out
