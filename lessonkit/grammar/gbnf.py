"""The grammar text format: a GBNF subset over bytes, read into rules and written from parts.

The format follows llama.cpp's GBNF::

    root   ::= object                      # comments run to the end of the line
    object ::= "{" ( pair ( "," pair )* )? "}"
    pair   ::= string ":" value
    digit  ::= [0-9]                       # character class (single bytes), [^...] negates
    hex4   ::= [0-9a-fA-F]{4}              # repetition: * + ? {m} {m,} {m,n}

Simplified on purpose: the grammar is over *bytes*. Literals are UTF-8 encoded; a character class
matches one byte (write non-ASCII bytes as \\xHH); ``.`` matches one valid UTF-8 character.

`parse_rules(text, source)` returns {rule name: alternatives} of the parts below (Lit, Cls, Ref,
Group, Rep, AnyChar); `literal`, `byte_class` and `repeat_suffix` write grammar text (the JSON
Schema compiler builds its grammars with them).
"""
from __future__ import annotations

import bisect

from dataclasses import dataclass

from lessonkit.errors import LessonkitError

ALL_BYTES = (1 << 256) - 1


def range_mask(lo: int, hi: int) -> int:
    """The 256-bit mask of the bytes lo..hi."""
    return ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)


# ----------------------------------------------------------------------------- reading

@dataclass
class Lit:
    data: bytes


@dataclass
class Cls:
    mask: int


@dataclass
class Ref:
    name: str
    where: str


@dataclass
class Group:
    alts: list


@dataclass
class Rep:
    item: object
    lo: int
    hi: int | None


@dataclass
class AnyChar:
    pass


_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "'": 39, "[": 91, "]": 93, "-": 45,
            "/": 47, "^": 94, "0": 0, "f": 12, "b": 8, "v": 11, "a": 7, "e": 27, "|": 124,
            ".": 46, "(": 40, ")": 41, "{": 123, "}": 125, "*": 42, "+": 43, "?": 63}


MAX_REPEAT = 10_000

MAX_NESTING = 100                  # groups inside groups, or quantifiers on quantifiers: deeper is an error


class _Parser:
    def __init__(self, text: str, source: str):
        self.s, self.i, self.source = text, 0, source
        self.depth = 0
        self._newlines: list[int] | None = None

    def err(self, msg: str) -> LessonkitError:
        if self._newlines is None:           # line starts, once: each error (and each Ref's location) is O(log n)
            self._newlines = [i for i, c in enumerate(self.s) if c == "\n"]
        line = bisect.bisect_left(self._newlines, self.i)
        col = self.i - (self._newlines[line - 1] + 1 if line else 0) + 1
        return LessonkitError(f"{self.source}:{line + 1}:{col}: {msg}")

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
        c = self.s[self.i] if self.i < len(self.s) else ""
        if not (c.isascii() and (c.isalnum() or c in "_-")):
            return False
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
            return Lit(self.literal())
        if c == "[":
            return Cls(self.char_class())
        if c == "(":
            self.i += 1
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.err(f"groups nest deeper than {MAX_NESTING} levels")
            alts = self.alternatives(top=False)
            self.depth -= 1
            self.skip_ws()
            if self.i >= len(self.s) or self.s[self.i] != ")":
                raise self.err("expected ')' to close the group")
            self.i += 1
            return Group(alts)
        if c == ".":
            self.i += 1
            return AnyChar()
        where = self.err("").args[0].rstrip(": ")
        return Ref(self.name(), where)

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
                mask |= range_mask(lo, hi)
            else:
                mask |= 1 << lo
        return ALL_BYTES ^ mask if negate else mask

    def quantified(self, item):
        for n in range(len(self.s)):
            if self.i >= len(self.s):
                break
            if n > MAX_NESTING:
                raise self.err(f"more than {MAX_NESTING} quantifiers on one item")
            c = self.s[self.i]
            if c in "*+?":
                self.i += 1
                item = Rep(item, {"*": 0, "+": 1, "?": 0}[c], None if c != "?" else 1)
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
                item = Rep(item, lo, hi)
            else:
                break
        return item


def parse_rules(text: str, source: str = "<grammar>") -> dict[str, list]:
    """{rule name: [alternative, ...]}, each alternative a list of parts; raises LessonkitError with line:col."""
    return _Parser(text, source).parse()


# ----------------------------------------------------------------------------- writing
def literal(data: str | bytes) -> str:
    """A GBNF string literal for these exact bytes."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    out = []
    for b in data:
        c = chr(b)
        if c in '"\\':
            out.append("\\" + c)
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\x{b:02X}")
    return '"' + "".join(out) + '"'


def byte_class(chars: set[int]) -> str:
    """A GBNF byte class for a set of byte values (non-empty)."""
    items, vals, i = [], sorted(chars), 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        lo, hi = vals[i], vals[j]
        items.append(f"\\x{lo:02X}" if lo == hi else f"\\x{lo:02X}-\\x{hi:02X}")
        i = j + 1
    return "[" + "".join(items) + "]"


def repeat_suffix(a: int, b: int | None) -> str:
    if b is None:
        return "*" if a == 0 else ("+" if a == 1 else f"{{{a},}}")
    if a == b:
        return "" if a == 1 else f"{{{a}}}"
    if a == 0 and b == 1:
        return "?"
    return f"{{{a},{b}}}"
