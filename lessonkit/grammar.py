"""Byte-level context-free grammars (a GBNF subset) run by a set-of-stacks pushdown automaton.

The text format follows llama.cpp's GBNF::

    root   ::= object                      # comments run to the end of the line
    object ::= "{" ( pair ( "," pair )* )? "}"
    pair   ::= string ":" value
    digit  ::= [0-9]                       # character class (single bytes), [^...] negates
    hex4   ::= [0-9a-fA-F]{4}              # repetition: * + ? {m} {m,} {m,n}

Simplified on purpose: the grammar is over *bytes*. Literals are UTF-8 encoded; a character class
matches one byte (write non-ASCII bytes as \\xHH); ``.`` matches one valid UTF-8 character.

The automaton (as in llama.cpp and Colibri's c/grammar.h) keeps a *set of stacks*, one per live
parse. Each stack is a tuple of positions in a flat element table; its top is always a byte-class
element, and the empty stack means "this parse is complete". Repetition lowers to right-recursive
helper rules and a rule reference in tail position is not pushed (tail-call), so loops do not grow
the stacks. States are interned and their transitions memoised, so a state is an immutable,
hashable value: keeping one for backtracking costs nothing.

Answers: ``allowed_bytes()``, ``advance(byte)``, ``is_complete`` and ``forced_continuation()`` (the
longest run of bytes that is the only legal way on, stopping where the parse could end).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from lessonkit.engine.errors import LessonkitError

END, CHAR, RULE = 0, 1, 2
ALL_BYTES = (1 << 256) - 1
GRAMMAR_DIR = Path(__file__).with_name("grammars")
BUILTIN_GRAMMARS = ("json", "json-compact", "ndjson", "ndjson-compact")

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


def _range_mask(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


def mask_bytes(mask: int) -> bytes:
    """The byte values set in a 256-bit mask, ascending."""
    out = bytearray()
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return bytes(out)


# ----------------------------------------------------------------------------- text format parser

@dataclass
class _Lit:
    data: bytes


@dataclass
class _Cls:
    mask: int


@dataclass
class _Ref:
    name: str
    where: str


@dataclass
class _Group:
    alts: list


@dataclass
class _Rep:
    item: object
    lo: int
    hi: int | None


@dataclass
class _AnyChar:
    pass


_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "'": 39, "[": 91, "]": 93, "-": 45,
            "/": 47, "^": 94, "0": 0, "f": 12, "b": 8, "v": 11, "a": 7, "e": 27, "|": 124,
            ".": 46, "(": 40, ")": 41, "{": 123, "}": 125, "*": 42, "+": 43, "?": 63}
MAX_REPEAT = 10_000


class _Parser:
    def __init__(self, text: str, source: str):
        self.s, self.i, self.source = text, 0, source

    def err(self, msg: str) -> LessonkitError:
        line = self.s.count("\n", 0, self.i) + 1
        col = self.i - (self.s.rfind("\n", 0, self.i) + 1) + 1
        return LessonkitError(f"{self.source}:{line}:{col}: {msg}")

    def skip_ws(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in " \t\r\n":
                self.i += 1
            elif c == "#":
                j = s.find("\n", self.i)
                self.i = n if j < 0 else j + 1
            else:
                break

    def name(self) -> str:
        j = self.i
        while j < len(self.s) and (self.s[j].isascii() and (self.s[j].isalnum() or self.s[j] in "_-")):
            j += 1
        if j == self.i:
            raise self.err(f"expected a rule name, found {self.s[self.i:self.i + 10]!r}")
        name, self.i = self.s[self.i:j], j
        return name

    def at_rule_start(self) -> bool:
        save = self.i
        try:
            self.name()
            self.skip_ws()
            return self.s.startswith("::=", self.i)
        except LessonkitError:
            return False
        finally:
            self.i = save

    def parse(self) -> dict[str, list]:
        rules: dict[str, list] = {}
        self.skip_ws()
        while self.i < len(self.s):
            name = self.name()
            self.skip_ws()
            if not self.s.startswith("::=", self.i):
                raise self.err(f"expected '::=' after rule name {name!r}")
            self.i += 3
            if name in rules:
                raise self.err(f"rule {name!r} is defined twice")
            rules[name] = self.alternatives(top=True)
            self.skip_ws()
        if "root" not in rules:
            raise LessonkitError(f"{self.source}: the grammar has no 'root' rule")
        return rules

    def alternatives(self, top: bool) -> list:
        alts = [self.sequence(top)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            alts.append(self.sequence(top))
        return alts

    def sequence(self, top: bool) -> list:
        items = []
        while True:
            self.skip_ws()
            if self.i >= len(self.s) or self.s[self.i] in "|)":
                return items
            if top and self.at_rule_start():
                return items
            items.append(self.quantified(self.primary()))

    def primary(self):
        c = self.s[self.i]
        if c == '"':
            return _Lit(self.literal())
        if c == "[":
            return _Cls(self.char_class())
        if c == "(":
            self.i += 1
            alts = self.alternatives(top=False)
            self.skip_ws()
            if self.i >= len(self.s) or self.s[self.i] != ")":
                raise self.err("expected ')' to close the group")
            self.i += 1
            return _Group(alts)
        if c == ".":
            self.i += 1
            return _AnyChar()
        where = self.err("").args[0].rstrip(": ")
        return _Ref(self.name(), where)

    def escape(self) -> int:
        """After a backslash: returns a code point."""
        if self.i >= len(self.s):
            raise self.err("unfinished escape")
        c = self.s[self.i]
        self.i += 1
        start = self.i - 2          # the backslash, for error positions
        width = {"x": 2, "u": 4, "U": 8}.get(c)
        if width:
            digits = self.s[self.i:self.i + width]
            if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
                self.i = start
                raise self.err(f"bad \\{c} escape: expected {width} hex digits")
            self.i += width
            return int(digits, 16)
        if c not in _ESCAPES:
            self.i = start
            raise self.err(f"unknown escape \\{c}")
        return _ESCAPES[c]

    def literal(self) -> bytes:
        self.i += 1
        out = bytearray()
        while True:
            if self.i >= len(self.s):
                raise self.err("unterminated string literal")
            c = self.s[self.i]
            if c == '"':
                self.i += 1
                return bytes(out)
            self.i += 1
            if c == "\\":
                esc_kind = self.s[self.i] if self.i < len(self.s) else ""
                cp = self.escape()
                if esc_kind == "x":
                    out.append(cp)
                    continue
                c = chr(cp)
            out += c.encode("utf-8")

    def class_char(self) -> int:
        if self.i >= len(self.s):
            raise self.err("unterminated character class")
        c = self.s[self.i]
        self.i += 1
        if c == "\\":
            cp = self.escape()
        else:
            cp = ord(c)
        if cp > 0xFF or (c != "\\" and cp > 0x7F):
            raise self.err(f"character classes match single bytes; write {c!r} as \\xHH bytes "
                           "or use a literal")
        return cp

    def char_class(self) -> int:
        self.i += 1
        negate = self.s.startswith("^", self.i)
        if negate:
            self.i += 1
        mask = 0
        first = True
        while True:
            if self.i >= len(self.s):
                raise self.err("unterminated character class")
            if self.s[self.i] == "]" and not first:
                self.i += 1
                break
            first = False
            lo = self.class_char()
            if self.s.startswith("-", self.i) and not self.s.startswith("-]", self.i):
                self.i += 1
                hi = self.class_char()
                if hi < lo:
                    raise self.err(f"empty range {chr(lo)!r}-{chr(hi)!r}")
                mask |= _range_mask(lo, hi)
            else:
                mask |= 1 << lo
        return ALL_BYTES ^ mask if negate else mask

    def quantified(self, item):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in "*+?":
                self.i += 1
                item = _Rep(item, {"*": 0, "+": 1, "?": 0}[c], None if c != "?" else 1)
            elif c == "{":
                j = self.s.find("}", self.i)
                if j < 0:
                    raise self.err("unterminated {m,n}")
                body = self.s[self.i + 1:j].replace(" ", "")
                try:
                    if "," in body:
                        a, b = body.split(",", 1)
                        lo, hi = int(a), (int(b) if b else None)
                    else:
                        lo = hi = int(body)
                except ValueError:
                    raise self.err(f"bad repetition {{{body}}}") from None
                if hi is not None and hi < lo:
                    raise self.err(f"bad repetition {{{body}}}: max < min")
                if max(lo, hi or 0) > MAX_REPEAT:
                    raise self.err(f"repetition {{{body}}} exceeds {MAX_REPEAT}")
                self.i = j + 1
                item = _Rep(item, lo, hi)
            else:
                break
        return item


# ----------------------------------------------------------------------------- grammar + automaton

class Grammar:
    """A compiled grammar: flat element table plus rule -> alternative start positions."""

    def __init__(self, text: str, source: str = "<grammar>"):
        self.source = source
        self.text = text
        self.line_oriented = False      # one document per line (NDJSON): a drafter may resync at a newline
        ast = _Parser(text, source).parse()
        self._lower(ast)
        self._check_left_recursion()
        self._interned: dict[frozenset, GrammarState] = {}
        self._initial = self._state(self._closure([(self._root_ref,)]))

    # -- construction
    def _lower(self, ast: dict[str, list]) -> None:
        names = list(ast)
        ids = {n: i for i, n in enumerate(names)}
        rules: list[list[list[tuple[int, int]]]] = [[] for _ in names]
        rule_names = list(names)

        def new_rule(tag: str) -> int:
            rules.append([])
            rule_names.append(tag)
            return len(rules) - 1

        cache: dict[str, int] = {}

        def any_char_rule() -> int:
            if "." not in cache:
                rid = new_rule("_utf8_char")
                rules[rid] = [[(CHAR, _range_mask(lo, hi)) for lo, hi in seq] for seq in _UTF8_SEQS]
                cache["."] = rid
            return cache["."]

        def lower_seq(items, owner: str) -> list[tuple[int, int]]:
            out: list[tuple[int, int]] = []
            for it in items:
                out += lower_item(it, owner)
            return out

        def lower_item(it, owner: str) -> list[tuple[int, int]]:
            if isinstance(it, _Lit):
                return [(CHAR, 1 << b) for b in it.data]
            if isinstance(it, _Cls):
                return [(CHAR, it.mask)]
            if isinstance(it, _AnyChar):
                return [(RULE, any_char_rule())]
            if isinstance(it, _Ref):
                if it.name not in ids:
                    raise LessonkitError(f"{it.where}: rule {owner!r} refers to undefined rule {it.name!r}")
                return [(RULE, ids[it.name])]
            if isinstance(it, _Group):
                alts = [lower_seq(a, owner) for a in it.alts]
                if len(alts) == 1:
                    return alts[0]
                rid = new_rule(f"{owner}_group")
                rules[rid] = alts
                return [(RULE, rid)]
            assert isinstance(it, _Rep)
            body = lower_item(it.item, owner)
            out = body * it.lo
            if it.hi is None:               # star: R ::= body R | ""
                rid = new_rule(f"{owner}_star")
                rules[rid] = [body + [(RULE, rid)], []]
                return out + [(RULE, rid)]
            prev = None                      # optional chain: R_k ::= body R_{k-1} | ""
            for _ in range(it.hi - it.lo):
                rid = new_rule(f"{owner}_opt")
                rules[rid] = [body + ([(RULE, prev)] if prev is not None else []), []]
                prev = rid
            return out + ([(RULE, prev)] if prev is not None else [])

        for n in names:
            rules[ids[n]] = [lower_seq(a, n) for a in ast[n]]

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
        # synthetic start: [RULE root, END]
        self._root_ref = len(kind)
        kind += [RULE, END]
        arg += [ids["root"], 0]
        self.kind, self.arg, self.alts, self.rule_names = kind, arg, alts_start, rule_names
        self.root = ids["root"]
        self.rules_ast = rules

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
    def _closure(self, stacks) -> frozenset:
        kind, arg, alts = self.kind, self.arg, self.alts
        out, seen, work = set(), set(), list(stacks)
        while work:
            st = work.pop()
            if st in seen:
                continue
            seen.add(st)
            if not st:
                out.add(st)
                continue
            pos = st[-1]
            k = kind[pos]
            if k == CHAR:
                out.add(st)
            elif k == END:
                work.append(st[:-1])
            else:
                rest = st[:-1]
                if kind[pos + 1] != END:
                    rest = rest + (pos + 1,)
                for a in alts[arg[pos]]:
                    work.append(rest + (a,))
        return frozenset(out)

    def _state(self, stacks: frozenset) -> GrammarState:
        s = self._interned.get(stacks)
        if s is None:
            if len(self._interned) > 200_000:
                self._interned.clear()
            s = self._interned[stacks] = GrammarState(self, stacks)
        return s

    def _step(self, state: GrammarState, b: int) -> GrammarState | None:
        bit = 1 << b
        arg = self.arg
        moved = [st[:-1] + (st[-1] + 1,) for st in state.stacks if st and arg[st[-1]] & bit]
        if not moved:
            return None
        return self._state(self._closure(moved))

    # -- public
    def initial(self) -> GrammarState:
        return self._initial

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self._initial)

    def matches(self, data: bytes) -> bool:
        """True if ``data`` as a whole is in the grammar's language."""
        s = self._initial.advance_bytes(data)
        return s is not None and s.is_complete

    def first_error(self, data: bytes) -> int | None:
        """Offset of the first byte that cannot be accepted, len(data) if it stops early, None if ok."""
        s = self._initial
        for i, b in enumerate(data):
            s = s.advance(b)
            if s is None:
                return i
        return None if s.is_complete else len(data)

    def __repr__(self) -> str:
        return f"Grammar({self.source!r}, {len(self.alts)} rules)"


class GrammarState:
    """One automaton state (a set of parse stacks). Immutable and interned: keep it to backtrack."""

    __slots__ = ("grammar", "stacks", "mask", "is_complete", "_next", "_forced")

    def __init__(self, grammar: Grammar, stacks: frozenset):
        self.grammar = grammar
        self.stacks = stacks
        mask = 0
        for st in stacks:
            if st:
                mask |= grammar.arg[st[-1]]
        self.mask = mask
        self.is_complete = () in stacks
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

    @property
    def is_dead(self) -> bool:
        return not self.stacks

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


# ----------------------------------------------------------------------------- CLI

def _cmd_compile(args: argparse.Namespace) -> int:
    from lessonkit.json_schema import compile_schema_file
    text = compile_schema_file(args.schema, whitespace=args.whitespace, ndjson=args.ndjson)
    sys.stdout.write(text)
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    if args.schema:
        from lessonkit.json_schema import schema_grammar_file
        grammar = schema_grammar_file(args.schema, whitespace=args.whitespace, ndjson=args.ndjson)
    else:
        grammar = load_grammar(args.grammar)
    results = []
    for f in args.files:
        p = Path(f)
        if not p.is_file():
            raise LessonkitError(f"{f}: no such file")
        data = p.read_bytes()
        err = grammar.first_error(data)
        row = {"file": f, "ok": err is None}
        if err is not None:
            row["error_offset"] = err
            row["reason"] = ("ends before the grammar is complete" if err == len(data)
                             else f"byte {data[err:err + 1]!r} not allowed")
        results.append(row)
    ok = all(r["ok"] for r in results)
    if args.json:
        print(json.dumps({"grammar": grammar.source, "all_ok": ok, "files": results}))
    else:
        for r in results:
            print(f"{r['file']}: " + ("ok" if r["ok"] else f"NOT in language at byte {r['error_offset']} "
                                                        f"({r['reason']})"))
    return 0 if ok else 1


def register_cli(subparsers) -> None:
    """Adds `grammar compile SCHEMA.json` and `grammar check (--schema S | --grammar G) FILE...`."""
    p = subparsers.add_parser("grammar", help="compile JSON Schemas to grammars; check files against them")
    sub = p.add_subparsers(dest="grammar_cmd", required=True)
    c = sub.add_parser("compile", help="print the grammar compiled from a JSON Schema (or the error)")
    c.add_argument("schema", help="JSON Schema file (draft 2020-12 subset, see docs/grammar.md)")
    c.add_argument("--whitespace", choices=["compact", "flexible"], default="flexible",
                   help="compact: no whitespace (best for drafting); flexible: any JSON whitespace")
    c.add_argument("--ndjson", action="store_true", help="one instance per line")
    c.set_defaults(func=_cmd_compile)
    k = sub.add_parser("check", help="say whether each file's whole content is in the grammar's language")
    src = k.add_mutually_exclusive_group(required=True)
    src.add_argument("--schema", help="JSON Schema file")
    src.add_argument("--grammar", help=f"built-in ({', '.join(BUILTIN_GRAMMARS)}) or a .gbnf file")
    k.add_argument("--whitespace", choices=["compact", "flexible"], default="flexible")
    k.add_argument("--ndjson", action="store_true", help="with --schema: one instance per line")
    k.add_argument("files", nargs="+")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.set_defaults(func=_cmd_check)


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (`python -m lessonkit.grammar ...`) until the lead's CLI wires this in."""
    parser = argparse.ArgumentParser(prog="lessonkit")
    register_cli(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LessonkitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
