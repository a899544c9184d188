"""Byte-level context-free grammars run by a set-of-stacks pushdown automaton.

The automaton (as in llama.cpp and Colibri's c/grammar.h) keeps a *set of stacks*, one per live
parse. A stack is a sequence of positions in a flat element table; its top is always a byte-class
element, and the empty stack means "this parse is complete". Repetition lowers to right-recursive
helper rules and a rule reference in tail position is not pushed (tail-call), so loops do not grow
the stacks. States are interned and their transitions memoised, so a state is an immutable,
hashable value: keeping one for backtracking costs nothing.

Stacks are interned cons cells: a stack is an int naming (top position, the stack below) in the
grammar's node table, 0 the empty stack. A push or pop is O(1) and stacks share their common part,
so a document nested d deep costs memory linear in its length. (Stacks as tuples copied the whole
stack at every byte: n bytes nested d deep kept n * d positions alive; 20 KB of brackets nested
10,000 deep took 5.6 GB.)

Answers: ``allowed_bytes()``, ``advance(byte)``, ``is_complete`` and ``forced_continuation()`` (the
longest run of bytes that is the only legal way on, stopping where the parse could end). The text
format is read by lessonkit.grammar.gbnf; the built-in grammars are the .gbnf files in grammars/.
"""
from __future__ import annotations

from pathlib import Path

from lessonkit.errors import LessonkitError
from lessonkit.files.resources import PACKAGE_DIR
from lessonkit.grammar.gbnf import AnyChar, Cls, Group, Lit, Ref, Rep, parse_rules, range_mask

END, CHAR, RULE = 0, 1, 2
GRAMMAR_DIR = PACKAGE_DIR / "grammar" / "grammars"
BUILTIN_GRAMMARS = ("json", "json-compact", "ndjson", "ndjson-compact")
# Limits that turn hostile input into one clear error long before memory runs out (issue 35):
MAX_LITERAL = 100_000           # bytes in one literal
MAX_POSITIONS = 2_000_000       # element positions in a compiled grammar (an enum of 200,000 integers: 1.3 M)
MAX_STACK_DEPTH = 50_000        # stack frames of one parse (JSON takes 2 per nesting level; ~4 KiB each)
MAX_STATES = 200_000            # memoised automaton states kept; past this, or past
MAX_MEMO_STACKS = 2_000_000     # this many stacks in them all, the memo starts again

# UTF-8 encoded scalar values (no overlongs, no surrogates), as byte-class sequences.
_UTF8_SEQS = [
    [(0x00, 0x7F)],
    [(0xC2, 0xDF), (0x80, 0xBF)],
    [(0xE0, 0xE0), (0xA0, 0xBF), (0x80, 0xBF)],
    [(0xE1, 0xEC), (0x80, 0xBF), (0x80, 0xBF)],
    [(0xED, 0xED), (0x80, 0x9F), (0x80, 0xBF)],
    [(0xEE, 0xEF), (0x80, 0xBF), (0x80, 0xBF)],
    [(0xF0, 0xF0), (0x90, 0xBF), (0x80, 0xBF), (0x80, 0xBF)],
    [(0xF1, 0xF3), (0x80, 0xBF), (0x80, 0xBF), (0x80, 0xBF)],
    [(0xF4, 0xF4), (0x80, 0x8F), (0x80, 0xBF), (0x80, 0xBF)],
]


class NestingTooDeep(LessonkitError):
    """A parse stack past MAX_STACK_DEPTH frames."""


def mask_bytes(mask: int) -> bytes:
    """The byte values set in a 256-bit mask, ascending."""
    out = bytearray()
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return bytes(out)


class Grammar:
    """A compiled grammar: flat element table plus rule -> alternative start positions."""

    def __init__(self, text: str, source: str = "<grammar>"):
        self.source = source
        self.text = text
        self.line_oriented = False      # one document per line (NDJSON): a drafter may resync at a newline
        try:
            self._lower(parse_rules(text, source))
        except RecursionError:              # a backstop: parse_rules bounds the nesting it knows of
            raise LessonkitError(f"{source}: the grammar nests too deeply to compile") from None
        self._check_left_recursion()
        self._interned: dict[frozenset, GrammarState] = {}
        self._memo_stacks = 0
        self._top, self._below, self._depth = [-1], [0], [0]   # node table: stack id -> (top, below, depth)
        self._node: dict[tuple[int, int], int] = {}
        self._initial = self._state(self._closure([self._push(self._root_ref, 0)]))

    # -- construction
    def _lower(self, ast: dict[str, list]) -> None:
        low = _Lowering(ast, self.source)
        kind, arg, alts_start = _flatten(low.rules)
        # synthetic start: [RULE root, END]
        self._root_ref = len(kind)
        kind += [RULE, END]
        arg += [low.ids["root"], 0]
        self.kind, self.arg, self.alts, self.rule_names = kind, arg, alts_start, low.rule_names
        self.root = low.ids["root"]
        self.rules_ast = low.rules

    def _check_left_recursion(self) -> None:
        rules = self.rules_ast
        nullable = [False] * len(rules)
        changed = True
        while changed:
            changed = False
            for r, alts in enumerate(rules):
                if not nullable[r] and any(all(k == RULE and nullable[a] for k, a in e) for e in alts):
                    nullable[r] = changed = True
        left = [set() for _ in rules]
        for r, alts in enumerate(rules):
            for elems in alts:
                for k, a in elems:
                    if k == CHAR:
                        break
                    left[r].add(a)
                    if not nullable[a]:
                        break
        color = [0] * len(rules)
        for start in range(len(rules)):
            if color[start]:
                continue
            stack = [(start, iter(left[start]))]
            color[start] = 1
            while stack:
                r, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    color[r] = 2
                    stack.pop()
                elif color[nxt] == 1:
                    raise LessonkitError(
                        f"{self.source}: rule {self.rule_names[nxt]!r} is left-recursive (it can reach "
                        "itself without consuming a byte); rewrite it with repetition")
                elif color[nxt] == 0:
                    color[nxt] = 1
                    stack.append((nxt, iter(left[nxt])))

    # -- automaton
    def _push(self, pos: int, below: int) -> int:
        """The stack id of `pos` pushed on stack `below` (interned: equal stacks have equal ids)."""
        key = (pos, below)
        i = self._node.get(key)
        if i is None:
            depth = self._depth[below] + 1
            if depth > MAX_STACK_DEPTH:
                raise NestingTooDeep(f"{self.source}: the input nests deeper than the matcher's limit of "
                                     f"{MAX_STACK_DEPTH:,} grammar stack frames (JSON takes 2 per level)")
            i = self._node[key] = len(self._top)
            self._top.append(pos)
            self._below.append(below)
            self._depth.append(depth)
        return i

    def _closure(self, stacks) -> frozenset:
        kind, arg, alts, top, below, push = self.kind, self.arg, self.alts, self._top, self._below, self._push
        out, seen, work = set(), set(), list(stacks)
        while work:
            st = work.pop()
            if st in seen:
                continue
            seen.add(st)
            if not st:
                out.add(st)
                continue
            pos = top[st]
            k = kind[pos]
            if k == CHAR:
                out.add(st)
            elif k == END:
                work.append(below[st])
            else:
                rest = below[st]
                if kind[pos + 1] != END:
                    rest = push(pos + 1, rest)
                for a in alts[arg[pos]]:
                    work.append(push(a, rest))
        return frozenset(out)

    def _state(self, stacks: frozenset) -> GrammarState:
        s = self._interned.get(stacks)
        if s is None:
            self._memo_stacks += len(stacks)
            if len(self._interned) > MAX_STATES or self._memo_stacks > MAX_MEMO_STACKS:
                for old in self._interned.values():  # unlink the memo too, or the states stay reachable
                    old._next.clear()                # from each other (a 5 MB walk kept 770 B per byte)
                    old._forced = None
                self._interned.clear()
                self._memo_stacks = len(stacks)
            s = self._interned[stacks] = GrammarState(self, stacks)
        return s

    def _step(self, state: GrammarState, b: int) -> GrammarState | None:
        moved = self._move(state.stacks, b)
        return self._state(self._closure(moved)) if moved else None

    def _move(self, stacks, b: int) -> list[int]:
        """The stacks whose top accepts byte b, with that byte consumed (before the closure)."""
        bit = 1 << b
        arg, top, below, push = self.arg, self._top, self._below, self._push
        return [push(top[st] + 1, below[st]) for st in stacks if st and arg[top[st]] & bit]

    # -- public
    def initial(self) -> GrammarState:
        return self._initial

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._initial)

    def matches(self, data: bytes) -> bool:
        """True if ``data`` as a whole is in the grammar's language."""
        s = self._initial.advance_bytes(data)
        return s is not None and s.is_complete

    def first_error(self, data: bytes, name: str = "input") -> int | None:
        """Offset of the first byte that cannot be accepted, len(data) if it stops early, None if ok.
        Input nested past MAX_STACK_DEPTH is a LessonkitError naming `name` and the byte."""
        s, i = self._initial, 0
        try:
            for i, b in enumerate(data):
                s = s.advance(b)
                if s is None:
                    return i
        except NestingTooDeep as e:
            raise LessonkitError(f"{name}: byte {i}: {e}") from None
        return None if s.is_complete else len(data)

    def __repr__(self) -> str:
        return f"Grammar({self.source!r}, {len(self.alts)} rules)"


class _Lowering:
    """Rules as alternatives of (kind, arg) elements: literals become byte classes, groups and
    repetitions become helper rules (star: R ::= body R | ""; optional chain: R_k ::= body R_{k-1} | "")."""

    def __init__(self, ast: dict[str, list], source: str = "<grammar>"):
        names = list(ast)
        self.source, self.size = source, 0
        self.ids = {n: i for i, n in enumerate(names)}
        self.rules: list[list[list[tuple[int, int]]]] = [[] for _ in names]
        self.rule_names = list(names)
        self._any_char: int | None = None
        for n in names:
            self.rules[self.ids[n]] = [self.seq(a, n) for a in ast[n]]

    def grow(self, n: int) -> None:
        """Count n more element positions; past MAX_POSITIONS the grammar is refused before it is built."""
        self.size += n
        if self.size > MAX_POSITIONS:
            raise LessonkitError(f"{self.source}: the grammar is too large to compile (over {MAX_POSITIONS:,} "
                                 "positions: long literals, or a long item under a large repetition count)")

    def new_rule(self, tag: str) -> int:
        self.rules.append([])
        self.rule_names.append(tag)
        return len(self.rules) - 1

    def any_char_rule(self) -> int:
        if self._any_char is None:
            rid = self._any_char = self.new_rule("_utf8_char")
            self.rules[rid] = [[(CHAR, range_mask(lo, hi)) for lo, hi in seq] for seq in _UTF8_SEQS]
        return self._any_char

    def seq(self, items, owner: str) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for it in items:
            out += self.item(it, owner)
        return out

    def item(self, it, owner: str) -> list[tuple[int, int]]:
        if isinstance(it, Lit):
            if len(it.data) > MAX_LITERAL:
                raise LessonkitError(f"{self.source}: a literal of {len(it.data):,} bytes in rule {owner!r} "
                                     f"(the limit is {MAX_LITERAL:,})")
            self.grow(len(it.data))
            return [(CHAR, 1 << b) for b in it.data]
        if isinstance(it, Cls):
            return [(CHAR, it.mask)]
        if isinstance(it, AnyChar):
            return [(RULE, self.any_char_rule())]
        if isinstance(it, Ref):
            if it.name not in self.ids:
                raise LessonkitError(f"{it.where}: rule {owner!r} refers to undefined rule {it.name!r}")
            return [(RULE, self.ids[it.name])]
        if isinstance(it, Group):
            alts = [self.seq(a, owner) for a in it.alts]
            if len(alts) == 1:
                return alts[0]
            rid = self.new_rule(f"{owner}_group")
            self.rules[rid] = alts
            return [(RULE, rid)]
        assert isinstance(it, Rep)
        return self.repeat(it, owner)

    def repeat(self, it: Rep, owner: str) -> list[tuple[int, int]]:
        body = self.item(it.item, owner)
        self.grow(len(body) * (it.lo + (1 if it.hi is None else it.hi - it.lo)))
        out = body * it.lo
        if it.hi is None:               # star: R ::= body R | ""
            rid = self.new_rule(f"{owner}_star")
            self.rules[rid] = [body + [(RULE, rid)], []]
            return out + [(RULE, rid)]
        prev = None                      # optional chain: R_k ::= body R_{k-1} | ""
        for _ in range(it.hi - it.lo):
            rid = self.new_rule(f"{owner}_opt")
            self.rules[rid] = [body + ([(RULE, prev)] if prev is not None else []), []]
            prev = rid
        return out + ([(RULE, prev)] if prev is not None else [])


def _flatten(rules) -> tuple[list[int], list[int], list[list[int]]]:
    """(kind, arg, alternative start positions per rule): every alternative's elements then an END."""
    kind: list[int] = []
    arg: list[int] = []
    alts_start: list[list[int]] = []
    for alts in rules:
        starts = []
        for elems in alts:
            starts.append(len(kind))
            for k, a in elems:
                kind.append(k)
                arg.append(a)
            kind.append(END)
            arg.append(0)
        alts_start.append(starts)
    return kind, arg, alts_start


class GrammarState:
    """One automaton state (a set of parse stacks). Immutable and interned: keep it to backtrack."""

    __slots__ = ("grammar", "stacks", "mask", "is_complete", "_next", "_forced")

    def __init__(self, grammar: Grammar, stacks: frozenset):
        self.grammar = grammar
        self.stacks = stacks
        mask, arg, top = 0, grammar.arg, grammar._top
        for st in stacks:
            if st:
                mask |= arg[top[st]]
        self.mask = mask
        self.is_complete = 0 in stacks
        self._next: dict[int, GrammarState | None] = {}
        self._forced = None

    def allowed_bytes(self) -> bytes:
        """The legal next bytes, ascending."""
        return mask_bytes(self.mask)

    def allows(self, b: int) -> bool:
        return bool(self.mask >> b & 1)

    def advance(self, b: int) -> GrammarState | None:
        """The state after byte ``b``, or None if ``b`` is not legal here."""
        try:
            return self._next[b]
        except KeyError:
            nxt = self.grammar._step(self, b) if self.mask >> b & 1 else None
            self._next[b] = nxt
            return nxt

    def successors(self) -> list[tuple[int, GrammarState]]:
        """(byte mask, next state) for every legal byte: one closure per group of bytes that move the same
        stacks (inside a JSON string all printable ASCII bytes are one group), memoised like advance."""
        gr = self.grammar
        arg, top, below, tops = gr.arg, gr._top, gr._below, [st for st in self.stacks if st]
        groups = [self.mask] if self.mask else []
        for st in tops:
            m = arg[top[st]]
            groups = [part for g in groups for part in (g & m, g & ~m) if part]
        out = []
        for g in groups:
            nxt = gr._state(gr._closure([gr._push(top[st] + 1, below[st]) for st in tops if arg[top[st]] & g]))
            for b in mask_bytes(g):
                self._next[b] = nxt
            out.append((g, nxt))
        return out

    def advance_bytes(self, data: bytes) -> GrammarState | None:
        s = self
        for b in data:
            s = s.advance(b)
            if s is None:
                return None
        return s

    def forced(self, max_bytes: int = 256) -> tuple[bytes, GrammarState]:
        """(forced bytes, state after them). Forced: exactly one byte is legal and the parse cannot end."""
        if self._forced is not None and len(self._forced[0]) < max_bytes:
            return self._forced
        out = bytearray()
        s = self
        while len(out) < max_bytes and not s.is_complete:
            m = s.mask
            if m == 0 or m & (m - 1):
                break
            b = m.bit_length() - 1
            out.append(b)
            s = s.advance(b)
        res = (bytes(out), s)
        if len(out) < max_bytes:
            self._forced = res
        return res

    def forced_continuation(self, max_bytes: int = 256) -> bytes:
        return self.forced(max_bytes)[0]

    def __repr__(self) -> str:
        shown = self.allowed_bytes()[:16]
        return f"GrammarState({len(self.stacks)} stacks, allowed={shown!r}, complete={self.is_complete})"


class GrammarMatcher:
    """Mutable wrapper over an immutable state: accept bytes one at a time; clone() is O(1)."""

    __slots__ = ("state",)

    def __init__(self, state: GrammarState):
        self.state = state

    def accept(self, b: int) -> bool:
        nxt = self.state.advance(b)
        if nxt is None:
            return False
        self.state = nxt
        return True

    def accept_bytes(self, data: bytes) -> bool:
        """All or nothing: on failure the state is unchanged."""
        nxt = self.state.advance_bytes(data)
        if nxt is None:
            return False
        self.state = nxt
        return True

    def allowed_bytes(self) -> bytes:
        return self.state.allowed_bytes()

    @property
    def is_complete(self) -> bool:
        return self.state.is_complete

    def forced_continuation(self, max_bytes: int = 256) -> bytes:
        return self.state.forced_continuation(max_bytes)

    def clone(self) -> GrammarMatcher:
        return GrammarMatcher(self.state)


# ----------------------------------------------------------------------------- loading

_LOADED: dict[str, Grammar] = {}


def load_grammar(name_or_path: str) -> Grammar:
    """A built-in grammar by name (json, json-compact, ndjson, ndjson-compact) or a .gbnf file."""
    if name_or_path in BUILTIN_GRAMMARS:
        if name_or_path not in _LOADED:
            path = GRAMMAR_DIR / f"{name_or_path}.gbnf"
            g = Grammar(path.read_text(encoding="utf-8"), f"{name_or_path}.gbnf")
            g.line_oriented = name_or_path.startswith("ndjson")
            _LOADED[name_or_path] = g
        return _LOADED[name_or_path]
    path = Path(name_or_path)
    if not path.is_file():
        raise LessonkitError(f"grammar {name_or_path!r} is neither a built-in "
                             f"({', '.join(BUILTIN_GRAMMARS)}) nor an existing file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LessonkitError(f"{path}: not UTF-8 text") from None
    return Grammar(text, str(path))
