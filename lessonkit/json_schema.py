"""JSON Schema (draft 2020-12 subset) -> grammar text for lessonkit.grammar. Fails closed.

Every keyword is either compiled exactly, ignored because it is an annotation (title, description,
examples, default, ...), or rejected with a LessonkitError naming the keyword and its JSON-pointer
location. Nothing is skipped silently (llama.cpp's converter does skip; see docs/grammar.md).

Simplifications, all in the safe direction (the grammar may reject a valid instance, never accepts
an invalid one, except where noted in docs/grammar.md):
- object keys come in the schema's `properties` order (then `required`-only names, then any
  additional properties); `order_like_schema` puts an instance's keys in that order;
- keys, enum/const values and `pattern` strings are matched in their canonical serialisation
  (json.dumps(..., ensure_ascii=False): only `"`, `\\` and control characters escaped);
- integers are written as JSON integers (no 1.0, no 1e2); numbers as JSON numbers, no ranges;
- anyOf and oneOf both become alternatives (oneOf's exclusivity is not enforced).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from lessonkit.engine.errors import LessonkitError
from lessonkit.grammar import Grammar

ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "examples", "default",
               "deprecated", "readOnly", "writeOnly", "$defs", "definitions"}
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
}
SUPPORTED = {"type", "enum", "const", "anyOf", "oneOf", "$ref"} | set().union(*TYPE_KEYWORDS.values())
EMPTY = '""'
FORMATS = ("date", "date-time", "uuid", "email")
JSON_TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")

# Helper rules the compiled grammar may use; each lists the helpers it needs.
_HELPERS = {
    "jchar": ('[\\x20-\\x21\\x23-\\x5B\\x5D-\\x7F] | utf8 | "\\\\" ( ["\\\\/bfnrt] | "u" hex{4} )',
              ["utf8", "hex"]),
    "utf8": ('[\\xC2-\\xDF] cont | "\\xE0" [\\xA0-\\xBF] cont | [\\xE1-\\xEC\\xEE\\xEF] cont cont'
             ' | "\\xED" [\\x80-\\x9F] cont | "\\xF0" [\\x90-\\xBF] cont cont'
             ' | [\\xF1-\\xF3] cont cont cont | "\\xF4" [\\x80-\\x8F] cont cont', ["cont"]),
    "cont": ("[\\x80-\\xBF]", []),
    "hex": ("[0-9a-fA-F]", []),
    "string": ('"\\"" jchar* "\\""', ["jchar"]),
    "integer": ('"-"? ( "0" | [1-9] [0-9]* )', []),
    "number": ('"-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?', []),
    "boolean": ('"true" | "false"', []),
    "value": ('object | array | string | number | "true" | "false" | "null"',
              ["object", "array", "string", "number"]),
    "object": ('"{" ws ( member ( ws "," ws member )* ws )? "}"', ["member", "ws"]),
    "member": ('string ws ":" ws value', ["string", "value", "ws"]),
    "array": ('"[" ws ( value ( ws "," ws value )* ws )? "]"', ["value", "ws"]),
    # formats
    "date": ('year "-" mmdd | leapyear "-02-29"', ["year", "mmdd", "leapyear"]),
    "year": ('"0" ( "0" ( "0" [1-9] | [1-9] [0-9] ) | [1-9] [0-9] [0-9] ) | [1-9] [0-9] [0-9] [0-9]', []),
    "leapyear": ('[0-9] [0-9] y4 | y4 "00"', ["y4"]),
    "y4": ('"0" [48] | [2468] [048] | [13579] [26]', []),
    "mmdd": ('( "01" | "03" | "05" | "07" | "08" | "10" | "12" ) "-" ( d28 | "29" | "30" | "31" )'
             ' | ( "04" | "06" | "09" | "11" ) "-" ( d28 | "29" | "30" ) | "02-" d28', ["d28"]),
    "d28": ('"0" [1-9] | "1" [0-9] | "2" [0-8]', []),
    "date-time": ('date [Tt] hh ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]+ )? ( [Zz] | [-+] hh ":" [0-5] [0-9] )',
                  ["date", "hh"]),
    "hh": ('[01] [0-9] | "2" [0-3]', []),
    "uuid": ('hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12}', ["hex"]),
    "email": ('elocal ( "." elocal )* "@" elabel ( "." elabel )*', ["elocal", "elabel"]),
    "elocal": ("[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+", []),
    "elabel": ('[A-Za-z0-9] ( [A-Za-z0-9-]* [A-Za-z0-9] )?', []),
}


def _lit(data: str | bytes) -> str:
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


def _class(chars: set[int]) -> str:
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


def _raw(s: str) -> str:
    """The canonical raw JSON-string content of s (without the quotes)."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def _ptr(base: str, *parts) -> str:
    return base + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class SchemaCompiler:
    def __init__(self, schema, *, whitespace: str = "flexible", ndjson: bool = False,
                 source: str = "<schema>"):
        if whitespace not in ("compact", "flexible"):
            raise LessonkitError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
        self.root, self.source, self.ndjson = schema, source, ndjson
        self.compact = whitespace == "compact"
        self.W = "" if self.compact else "ws "
        self.rules: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.ref_names: dict[str, str] = {}
        self.used: set[str] = set()

    # -- helpers
    def err(self, where: str, msg: str) -> LessonkitError:
        return LessonkitError(f"{self.source}: {msg} at {where}")

    def helper(self, name: str) -> str:
        self.used.add(name)
        return name

    def rule(self, hint: str, body: str) -> str:
        if body in self.by_body:
            return self.by_body[body]
        name = self.fresh(hint)
        self.rules[name] = body
        self.by_body[body] = name
        return name

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9-]+", "-", hint).strip("-") or "s"
        base = "s-" + base[-40:].strip("-")
        name, n = base, 1
        while name in self.rules or name in _HELPERS:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = ""
        return name

    def seq(self, *parts: str) -> str:
        return " ".join(p for p in parts if p)

    # -- entry
    def compile(self) -> str:
        body = self.schema(self.root, "#")
        W = self.W
        if self.ndjson:
            root = f'( {W}{body} {W}"\\n" )*'
        else:
            root = f"{W}{body} {W}".strip()
        lines = [f"# compiled from {self.source} ({'compact' if self.compact else 'flexible'} whitespace"
                 f"{', NDJSON' if self.ndjson else ''})", f"root ::= {root}"]
        lines += [f"{n} ::= {b}" for n, b in self.rules.items()]
        if self.compact:
            ws = '""'
        else:
            ws = "[ \\t]*" if self.ndjson else "[ \\t\\n\\r]*"
        lines.append(f"ws ::= {ws}")
        todo, done = sorted(self.used), set()
        while todo:
            h = todo.pop()
            if h in done or h == "ws":
                continue
            done.add(h)
            body, deps = _HELPERS[h]
            lines.append(f"{h} ::= {body}")
            todo += deps
        return "\n".join(lines) + "\n"

    # -- schemas
    def schema(self, s, where: str) -> str:
        if s is True:
            return self.helper("value")
        if s is False:
            raise self.err(where, "schema `false` (no instance is valid) cannot be compiled")
        if not isinstance(s, dict):
            raise self.err(where, f"a schema must be an object or boolean, not {type(s).__name__}")
        for k in s:
            if k not in SUPPORTED and k not in ANNOTATIONS:
                raise self.err(_ptr(where, k), f"unsupported keyword {k!r}")
        keys = {k for k in s if k not in ANNOTATIONS}
        if not keys:
            return self.schema(True, where)
        if "$ref" in keys:
            if len(keys) > 1:
                other = sorted(keys - {"$ref"})[0]
                raise self.err(_ptr(where, other), f"unsupported keyword {other!r} next to $ref")
            return self.ref(s["$ref"], _ptr(where, "$ref"))
        comb = [k for k in ("anyOf", "oneOf") if k in keys]
        if comb:
            if len(keys) > 1:
                other = sorted(keys - {comb[0]})[0]
                raise self.err(_ptr(where, other), f"unsupported keyword {other!r} next to {comb[0]}")
            branches = s[comb[0]]
            if not isinstance(branches, list) or not branches:
                raise self.err(_ptr(where, comb[0]), f"{comb[0]} must be a non-empty list")
            alts = [self.schema(b, _ptr(where, comb[0], i)) for i, b in enumerate(branches) if b is not False]
            if not alts:
                raise self.err(_ptr(where, comb[0]), "no branch can match")
            return self.rule(where + "-alt", " | ".join(alts))
        types = self.types(s, where)
        if "enum" in keys or "const" in keys:
            return self.enum(s, types, where)
        alts = []
        for t in types:
            if t == "null":
                alts.append('"null"')
            elif t == "boolean":
                alts.append(self.helper("boolean"))
            elif t == "integer":
                alts.append(self.helper("integer"))
            elif t == "number":
                alts.append(self.helper("number"))
            elif t == "string":
                alts.append(self.string(s, where))
            elif t == "object":
                alts.append(self.obj(s, where))
            elif t == "array":
                alts.append(self.array(s, where))
        if len(alts) == 1:
            return alts[0]
        return self.rule(where + "-types", " | ".join(alts))

    def types(self, s: dict, where: str) -> list[str]:
        t = s.get("type")
        if t is None:
            types = list(JSON_TYPES)
        elif isinstance(t, str):
            types = [t]
        elif isinstance(t, list) and t and all(isinstance(x, str) for x in t):
            types = list(t)
        else:
            raise self.err(_ptr(where, "type"), "type must be a string or a non-empty list of strings")
        for x in types:
            if x not in JSON_TYPES:
                raise self.err(_ptr(where, "type"), f"unknown type {x!r}")
        if "number" in types and "integer" in types:
            types.remove("integer")
        return types

    def ref(self, ref, where: str) -> str:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.err(where, f"only local references ('#...') are supported, not {ref!r}")
        if ref in self.ref_names:
            return self.ref_names[ref]
        target = self.root
        pointer = ref[1:]
        if pointer and not pointer.startswith("/"):
            raise self.err(where, f"unsupported reference {ref!r} (anchors are not supported)")
        for part in pointer.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise self.err(where, f"reference {ref!r} does not resolve")
        name = self.fresh("ref-" + (pointer.rsplit("/", 1)[-1] or "root"))
        self.ref_names[ref] = name
        body = self.schema(target, ref)
        self.rules[name] = body
        return name

    # -- enum / const
    def enum(self, s: dict, types: list[str], where: str) -> str:
        extra = {k for k in s if k not in ANNOTATIONS} - {"enum", "const", "type"}
        if extra:
            k = sorted(extra)[0]
            raise self.err(_ptr(where, k), f"unsupported keyword {k!r} next to enum/const")
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise self.err(_ptr(where, "enum"), "enum must be a non-empty list")
            values = list(s["enum"])
        else:
            values = [s["const"]]
        if "const" in s and "enum" in s:
            values = [v for v in values if _json_equal(v, s["const"])]
        if "type" in s:
            values = [v for v in values if any(_has_type(v, t) for t in types)]
        if not values:
            raise self.err(where, "no enum/const value satisfies the schema")
        alts = []
        for v in values:
            alt = self.value_literal(v)
            if alt not in alts:
                alts.append(alt)
        return self.rule(where + "-enum", " | ".join(alts))

    def value_literal(self, v) -> str:
        W = self.W
        if isinstance(v, dict):
            if not v:
                return self.seq('"{"', W, '"}"')
            members = [self.seq(_lit(json.dumps(k, ensure_ascii=False)), W, '":"', W, self.value_literal(x))
                       for k, x in v.items()]
            return "( " + self.seq('"{"', W, f' {W}"," {W}'.join(members), W, '"}"') + " )"
        if isinstance(v, list):
            if not v:
                return self.seq('"["', W, '"]"')
            return "( " + self.seq('"["', W, f' {W}"," {W}'.join(self.value_literal(x) for x in v),
                                   W, '"]"') + " )"
        return _lit(json.dumps(v, ensure_ascii=False))

    # -- strings
    def string(self, s: dict, where: str) -> str:
        fmt, pattern = s.get("format"), s.get("pattern")
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        for k, v in (("minLength", lo), ("maxLength", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise self.err(_ptr(where, k), f"{k} must be a non-negative integer")
        if hi is not None and hi < lo:
            raise self.err(_ptr(where, "maxLength"), "maxLength < minLength: no string fits")
        length = "minLength" in s or "maxLength" in s
        if fmt is not None:
            if fmt not in FORMATS:
                raise self.err(_ptr(where, "format"), f"unsupported format {fmt!r} (supported: {', '.join(FORMATS)})")
            if pattern is not None or length:
                k = "pattern" if pattern is not None else ("minLength" if "minLength" in s else "maxLength")
                raise self.err(_ptr(where, k), f"unsupported keyword {k!r} next to format")
            return self.seq('"\\""', self.helper(fmt), '"\\""')
        if pattern is not None:
            if length:
                k = "minLength" if "minLength" in s else "maxLength"
                raise self.err(_ptr(where, k), f"unsupported keyword {k!r} next to pattern")
            if not isinstance(pattern, str):
                raise self.err(_ptr(where, "pattern"), "pattern must be a string")
            body = RegexCompiler(pattern, self, _ptr(where, "pattern")).compile()
            return self.rule(where + "-pattern", self.seq('"\\""', body, '"\\""'))
        if not length:
            return self.helper("string")
        ch = self.helper("jchar")
        if hi is None:
            rep = f"{ch}{{{lo},}}" if lo else f"{ch}*"
        else:
            rep = f"{ch}{{{lo},{hi}}}" if hi else ""
        return self.rule(where + "-str", self.seq('"\\""', rep, '"\\""'))

    # -- objects
    def obj(self, s: dict, where: str) -> str:
        W = self.W
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise self.err(_ptr(where, "properties"), "properties must be an object")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise self.err(_ptr(where, "required"), "required must be a list of strings")
        addl = s.get("additionalProperties", True)
        entries = [(k, v, k in required) for k, v in props.items()]
        entries += [(k, True, True) for k in dict.fromkeys(required) if k not in props]
        kvs = []
        for name, sub, req in entries:
            if sub is False:
                if req:
                    raise self.err(_ptr(where, "properties", name), f"required property {name!r} has schema false")
                continue
            value = self.schema(sub, _ptr(where, "properties", name))
            kvs.append((self.seq(_lit('"' + _raw(name) + '"'), W, '":"', W, value), req))
        sep = self.seq(W, '","', W)
        if addl is False:
            extra = None
        else:
            if addl is not True and not isinstance(addl, dict):
                raise self.err(_ptr(where, "additionalProperties"), "additionalProperties must be a boolean or a schema")
            value = self.schema(addl, _ptr(where, "additionalProperties"))
            key = self.key_not_in([name for name, _, _ in entries], _ptr(where, "additionalProperties"))
            extra = self.rule(where + "-extra", self.seq(key, W, '":"', W, value))
        # F: nothing emitted yet; C: something emitted already (each member then starts with a comma)
        if extra is None:
            F = C = ""
        else:
            F = f"( {extra} ( {sep} {extra} )* )?"
            C = f"( {sep} {extra} )*"
        for i in range(len(kvs) - 1, -1, -1):
            kv, req = kvs[i]
            if req:
                F_i, C_i = self.seq(kv, C), self.seq(sep, kv, C)
            else:
                F_i = f"{self.seq(kv, C)} | {F or EMPTY}"
                C_i = f"{self.seq(sep, kv, C)} | {C or EMPTY}"
            F = self.rule(f"{where}-f{i}", F_i) if "|" in F_i else f"( {F_i} )"
            C = self.rule(f"{where}-c{i}", C_i) if "|" in C_i else f"( {C_i} )"
        return self.rule(where + "-obj", self.seq('"{"', W, F, W, '"}"'))

    def key_not_in(self, names: list[str], where: str) -> str:
        """A JSON string key whose (canonical) content is none of `names`."""
        if not names:
            return self.helper("string")
        raws = [_raw(n).encode("utf-8") for n in names]
        for n, r in zip(names, raws):
            if any(b >= 0x80 or b == 0x5C for b in r):
                raise self.err(where, f"additional properties next to the non-ASCII or escaped property "
                                      f"name {n!r} are not supported (set additionalProperties: false)")
        trie: dict = {}
        for r in raws:
            node = trie
            for b in r:
                node = node.setdefault(b, {})
            node[None] = {}
        self.helper("jchar")
        self.helper("utf8")
        tail = 'jchar* "\\""'

        def node_rule(node: dict, prefix: bytes) -> str:
            alts = []
            if None not in node:
                alts.append('"\\""')
            kids = sorted(k for k in node if k is not None)
            for b in kids:
                alts.append(f"{_lit(bytes([b]))} {node_rule(node[b], prefix + bytes([b]))}")
            other = set(range(0x20, 0x80)) - {0x22, 0x5C} - set(kids)
            if other:
                alts.append(f"{_class(other)} {tail}")
            alts.append(f'utf8 {tail}')
            alts.append(f'"\\\\" ( ["\\\\/bfnrt] | "u" hex{{4}} ) {tail}')
            self.helper("hex")
            return self.rule(where + "-key", " | ".join(alts))

        return self.seq('"\\""', node_rule(trie, b""))

    # -- arrays
    def array(self, s: dict, where: str) -> str:
        W = self.W
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise self.err(_ptr(where, "prefixItems"), "prefixItems must be a list")
        items = s.get("items", True)
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        for k, v in (("minItems", lo), ("maxItems", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise self.err(_ptr(where, k), f"{k} must be a non-negative integer")
        k = len(prefix)
        for i, p in enumerate(prefix):
            if p is False:
                k = i
                break
        if items is False:
            hi = k if hi is None else min(hi, k)
        k = min(k, hi) if hi is not None else k
        if hi is not None and lo > hi:
            raise self.err(where, "minItems is larger than the number of items allowed")
        elems = [self.schema(p, _ptr(where, "prefixItems", i)) for i, p in enumerate(prefix[:k])]
        sep = self.seq(W, '","', W)
        # tail: items beyond the prefix, count in [a, b]
        a, b = max(0, lo - k), (None if hi is None else hi - k)
        if b == 0:
            tail = ""
        else:
            item = self.schema(items, _ptr(where, "items"))
            if k > 0:
                tail = f"( {sep} {item} )" + _quant(a, b)
            else:
                rest = f"( {sep} {item} )" + _quant(max(a - 1, 0), None if b is None else b - 1)
                tail = f"{item} {rest}".strip()
                if a == 0:
                    tail = f"( {tail} )?"
        A = tail
        for i in range(k - 1, -1, -1):
            body = self.seq(sep if i > 0 else "", elems[i], A)
            A = self.rule(f"{where}-a{i}", f'{body} | ""') if i >= lo else f"( {body} )"
        return self.rule(where + "-arr", self.seq('"["', W, A, W, '"]"'))


def _quant(a: int, b: int | None) -> str:
    if b is None:
        return "*" if a == 0 else ("+" if a == 1 else f"{{{a},}}")
    if a == b:
        return "" if a == 1 else f"{{{a}}}"
    if a == 0 and b == 1:
        return "?"
    return f"{{{a},{b}}}"


def _has_type(v, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer()
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "object":
        return isinstance(v, dict)
    return isinstance(v, list)


def _json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


# ----------------------------------------------------------------------------- regex subset

class RegexCompiler:
    """Python-regex subset -> grammar over the raw JSON string content.

    Supports literals, escapes of metacharacters, ., [...] and [^...] with ranges, \\d \\w \\s
    (ASCII only: stricter than Python's Unicode classes), groups ( ), (?: ), (?P<n> ), alternation,
    * + ? {m} {m,} {m,n} (lazy forms too), ^ at the start and $ at the end. JSON Schema patterns
    are unanchored searches, so a missing ^ or $ becomes "any characters" on that side.
    """

    META = set("\\^$.|?*+()[]{}")

    def __init__(self, pattern: str, comp: SchemaCompiler, where: str):
        self.p, self.i, self.c, self.where = pattern, 0, comp, where

    def err(self, msg: str) -> LessonkitError:
        return self.c.err(self.where, f"pattern {self.p!r}: {msg} (at character {self.i})")

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
            body = self.alternation()
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
        return _lit(_raw(ch))

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
            alts.append(_class(plain))
        for c in sorted(c for c in chars if c < 0x80 and c not in plain):
            alts.append(_lit(_raw(chr(c))))
        if any_non_ascii:
            alts.append(self.c.helper("utf8"))
        else:
            big = sorted(c for c in chars if c >= 0x80)
            if len(big) > 256:
                raise self.err("character class with more than 256 non-ASCII characters")
            alts += [_lit(chr(c)) for c in big if not 0xD800 <= c <= 0xDFFF]
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
                q = _quant(lo, hi) if (lo, hi) != (1, 1) else ""
            else:
                return atom
            if self.peek() == "?":      # lazy: same language
                self.i += 1
            elif self.peek() == "+":
                raise self.err("possessive quantifiers are not supported")
            atom = f"( {atom} ){q}" if q else atom


# ----------------------------------------------------------------------------- public API

def compile_schema(schema, *, whitespace: str = "flexible", ndjson: bool = False,
                   source: str = "<schema>") -> str:
    """Grammar text (lessonkit GBNF) for a JSON Schema. Raises LessonkitError on unsupported input."""
    return SchemaCompiler(schema, whitespace=whitespace, ndjson=ndjson, source=source).compile()


def schema_grammar(schema, *, whitespace: str = "flexible", ndjson: bool = False,
                   source: str = "<schema>") -> Grammar:
    text = compile_schema(schema, whitespace=whitespace, ndjson=ndjson, source=source)
    g = Grammar(text, source)
    g.line_oriented = ndjson
    return g


def load_schema(path: str | Path):
    p = Path(path)
    if not p.is_file():
        raise LessonkitError(f"{path}: no such schema file")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LessonkitError(f"{path}: not valid JSON ({e})") from None


def compile_schema_file(path, *, whitespace: str = "flexible", ndjson: bool = False) -> str:
    return compile_schema(load_schema(path), whitespace=whitespace, ndjson=ndjson, source=str(path))


def schema_grammar_file(path, *, whitespace: str = "flexible", ndjson: bool = False) -> Grammar:
    return schema_grammar(load_schema(path), whitespace=whitespace, ndjson=ndjson, source=str(path))


def order_like_schema(instance, schema, root=None):
    """A copy of `instance` with object keys in the order the compiled grammar expects."""
    import jsonschema

    root = schema if root is None else root
    if not isinstance(schema, dict):
        return instance
    if "$ref" in schema:
        target = root
        for part in schema["$ref"][1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target[int(part)] if isinstance(target, list) else target[part]
        return order_like_schema(instance, target, root)
    for comb in ("anyOf", "oneOf"):
        if comb in schema:
            base = jsonschema.Draft202012Validator(root)
            for b in schema[comb]:
                if base.evolve(schema=b).is_valid(instance):
                    return order_like_schema(instance, b, root)
            return instance
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        order = list(props) + [k for k in schema.get("required", []) if k not in props]
        keys = [k for k in order if k in instance] + [k for k in instance if k not in order]
        addl = schema.get("additionalProperties", True)
        return {k: order_like_schema(instance[k], props.get(k, addl if k not in order else True), root)
                for k in keys}
    if isinstance(instance, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        return [order_like_schema(x, prefix[i] if i < len(prefix) else items, root)
                for i, x in enumerate(instance)]
    return instance
