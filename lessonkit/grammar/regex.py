"""JSON Schema `pattern` (ECMA-262 regex subset) -> grammar text, for SchemaCompiler. Fails closed."""
from __future__ import annotations

import re

from lessonkit.errors import LessonkitError
from lessonkit.grammar.gbnf import MAX_NESTING, byte_class, literal, repeat_suffix
from lessonkit.grammar.json_rules import json_string_content


class RegexCompiler:
    """Python-regex subset -> grammar over the raw JSON string content.

    Supports literals, escapes of metacharacters, ., [...] and [^...] with ranges, \\d \\w \\s
    (ASCII only: stricter than Python's Unicode classes), groups ( ), (?: ), (?P<n> ), alternation,
    * + ? {m} {m,} {m,n} (lazy forms too), ^ at the start and $ at the end. JSON Schema patterns
    are unanchored searches, so a missing ^ or $ becomes "any characters" on that side.
    `comp` is the SchemaCompiler whose rules the pattern's helper rules join.
    """

    META = set("\\^$.|?*+()[]{}")

    def __init__(self, pattern: str, comp, where: str):
        self.p, self.i, self.c, self.where = pattern, 0, comp, where
        self.depth = 0

    def err(self, msg: str) -> LessonkitError:
        shown = self.p if len(self.p) <= 80 else self.p[:77] + "..."
        return self.c.err(self.where, f"pattern {shown!r}: {msg} (at character {self.i})")

    def compile(self) -> str:
        anchored_start = self.p.startswith("^")
        if anchored_start:
            self.i = 1
        body = self.alternation()
        anchored_end = False
        if self.i < len(self.p) and self.p[self.i] == "$" and self.i == len(self.p) - 1:
            anchored_end = True
            self.i += 1
        if self.i != len(self.p):
            raise self.err(f"unsupported construct {self.p[self.i]!r}")
        anyc = self.c.helper("jchar") + "*"
        return self.c.seq("" if anchored_start else anyc, f"( {body} )", "" if anchored_end else anyc)

    def peek(self) -> str:
        return self.p[self.i] if self.i < len(self.p) else ""

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.peek() == "|":
            self.i += 1
            alts.append(self.sequence())
        return " | ".join(a or '""' for a in alts)

    def sequence(self) -> str:
        parts = []
        while self.i < len(self.p) and self.peek() not in "|)":
            if self.peek() == "$" and self.i == len(self.p) - 1:
                break
            parts.append(self.quantified(self.atom()))
        return " ".join(parts)

    def atom(self) -> str:
        ch = self.peek()
        if ch == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?P<", self.i):
                j = self.p.find(">", self.i)
                if j < 0:
                    raise self.err("unterminated group name")
                self.i = j + 1
            elif self.peek() == "?":
                raise self.err("unsupported group (lookaround, flags or backreference)")
            self.depth += 1
            if self.depth > MAX_NESTING:
                raise self.err(f"groups nest deeper than {MAX_NESTING} levels")
            body = self.alternation()
            self.depth -= 1
            if self.peek() != ")":
                raise self.err("missing ')'")
            self.i += 1
            return f"( {body} )"
        if ch == "[":
            return self.char_set(*self.bracket())
        if ch == ".":
            self.i += 1
            return self.char_set(set(range(0x80)) - {0x0A}, True)
        if ch in ("^", "$"):
            raise self.err(f"anchor {ch!r} only supported at the start/end")
        if ch in "*+?{":
            raise self.err(f"nothing to repeat before {ch!r}")
        if ch == "\\":
            self.i += 1
            chars = self.escape()
            return self.char_set(chars, False)
        self.i += 1
        return literal(json_string_content(ch))

    def escape(self) -> set[int]:
        if self.i >= len(self.p):
            raise self.err("trailing backslash")
        e = self.p[self.i]
        self.i += 1
        classes = {"d": set(range(48, 58)), "w": set(range(48, 58)) | set(range(65, 91)) | set(range(97, 123)) | {95},
                   "s": {9, 10, 11, 12, 13, 32}}
        if e in classes:
            return classes[e]
        simple = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11}
        if e in simple:
            return {simple[e]}
        if e in "DWSbBAZ0123456789":
            raise self.err(f"unsupported escape \\{e}")
        if e in ("x", "u"):
            width = 2 if e == "x" else 4
            digits = self.p[self.i:self.i + width]
            if len(digits) != width or not all(c in "0123456789abcdefABCDEF" for c in digits):
                raise self.err(f"bad \\{e} escape")
            self.i += width
            return {int(digits, 16)}
        if e.isalnum():
            raise self.err(f"unsupported escape \\{e}")
        return {ord(e)}

    def bracket(self) -> tuple[set[int], bool]:
        self.i += 1
        negate = self.peek() == "^"
        if negate:
            self.i += 1
        chars: set[int] = set()
        first = True
        while True:
            if self.i >= len(self.p):
                raise self.err("unterminated character class")
            ch = self.peek()
            if ch == "]" and not first:
                self.i += 1
                break
            first = False
            if ch == "\\":
                self.i += 1
                lo_set = self.escape()
            else:
                self.i += 1
                lo_set = {ord(ch)}
            if self.peek() == "-" and self.p[self.i + 1:self.i + 2] not in ("]", "") and len(lo_set) == 1:
                self.i += 1
                hch = self.peek()
                if hch == "\\":
                    self.i += 1
                    hi_set = self.escape()
                    if len(hi_set) != 1:
                        raise self.err("bad range")
                    hi = next(iter(hi_set))
                else:
                    self.i += 1
                    hi = ord(hch)
                lo = next(iter(lo_set))
                if hi < lo:
                    raise self.err("bad range")
                if hi - lo > 5000:
                    raise self.err("character range too large")
                chars |= set(range(lo, hi + 1))
            else:
                chars |= lo_set
        if negate:
            if any(c >= 0x80 for c in chars):
                raise self.err("negated classes with non-ASCII characters are not supported")
            return set(range(0x80)) - chars, True
        return chars, False

    def char_set(self, chars: set[int], any_non_ascii: bool) -> str:
        """Alternatives matching one character from `chars` (plus every non-ASCII one if asked)."""
        plain = {c for c in chars if c < 0x80 and c >= 0x20 and c not in (0x22, 0x5C)}
        alts = []
        if plain:
            alts.append(byte_class(plain))
        for c in sorted(c for c in chars if c < 0x80 and c not in plain):
            alts.append(literal(json_string_content(chr(c))))
        if any_non_ascii:
            alts.append(self.c.helper("utf8"))
        else:
            big = sorted(c for c in chars if c >= 0x80)
            if len(big) > 256:
                raise self.err("character class with more than 256 non-ASCII characters")
            alts += [literal(chr(c)) for c in big if not 0xD800 <= c <= 0xDFFF]
        if not alts:
            raise self.err("empty character class")
        return alts[0] if len(alts) == 1 else "( " + " | ".join(alts) + " )"

    def quantified(self, atom: str) -> str:
        while True:
            ch = self.peek()
            if ch in ("*", "+", "?"):
                self.i += 1
                q = ch
            elif ch == "{":
                m = re.match(r"\{(\d*)(,?)(\d*)\}", self.p[self.i:])
                if not m or not m.group(1) and not m.group(3):
                    raise self.err("bad {m,n}")
                self.i += m.end()
                lo = int(m.group(1) or 0)
                hi = lo if not m.group(2) else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    raise self.err("bad {m,n}: max < min")
                q = repeat_suffix(lo, hi) if (lo, hi) != (1, 1) else ""
            else:
                return atom
            if self.peek() == "?":      # lazy: same language
                self.i += 1
            elif self.peek() == "+":
                raise self.err("possessive quantifiers are not supported")
            atom = f"( {atom} ){q}" if q else atom
