"""JSON Schema (draft 2020-12 subset) -> grammar text for lessonkit.grammar.automaton. Fails closed.

Every keyword is either compiled exactly, ignored because it is an annotation (title, description,
examples, default, ...), or rejected with a LessonkitError naming the keyword and its JSON-pointer
location. Nothing is skipped silently (llama.cpp's converter does skip; see docs/grammar.md).

Simplifications, all in the safe direction (the grammar may reject a valid instance, never accepts
an invalid one, except where noted in docs/grammar.md):
- object keys come in the schema's `properties` order (then `required`-only names, then any
  additional properties); `order_like_schema` puts an instance's keys in that order;
- keys, enum/const values and `pattern` strings are matched in their canonical serialisation
  (json.dumps(..., ensure_ascii=False): only `"`, `\\` and control characters escaped);
- integers are written as JSON integers (no 1.0, no 1e2); ranges become digit grammars
  (json_numbers); bounded numbers have no exponent;
- anyOf becomes alternatives; so does oneOf, but only when its branches are provably disjoint (distinct
  types, const/enum values, or a required const/enum discriminator property): otherwise refused;
- allOf and $ref with siblings are merged into one schema (json_merge) or refused; anyOf/oneOf
  siblings are distributed over the branches; `not` and `dependentRequired` are rewritten likewise.
The support table in docs/grammar.md lists each keyword as exact or refused.
"""
from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import jsonschema

from lessonkit.errors import LessonkitError
from lessonkit.grammar.automaton import MAX_LITERAL, Grammar
from lessonkit.grammar.json_containers import ContainerRules
from lessonkit.grammar.gbnf import literal
from lessonkit.grammar.json_refs import resolve_references
from lessonkit.grammar.json_numbers import NUMBER_BOUND_LIMIT, int_range, multiples, number_range
from lessonkit.grammar.json_rewrite import ANNOTATIONS, REWRITTEN, TYPE_KEYWORDS, SchemaRewriter, _ptr
from lessonkit.grammar.json_rules import HELPER_RULES, has_type, json_equal
from lessonkit.grammar.regex import RegexCompiler

EMPTY = '""'


FORMATS = ("date", "date-time", "uuid", "email")


class SchemaCompiler(ContainerRules, SchemaRewriter):
    """Unlike SchemaRewriter (keyword rewrites, references, oneOf analysis): emits the grammar rules."""

    def __init__(self, schema, *, whitespace: str = "flexible", ndjson: bool = False,
                 source: str = "<schema>"):
        if whitespace not in ("compact", "flexible"):
            raise LessonkitError(f"whitespace must be 'compact' or 'flexible', not {whitespace!r}")
        super().__init__(resolve_references(schema), source)
        self.ndjson = ndjson
        self.compact = whitespace == "compact"
        self.W = "" if self.compact else "ws "
        self.rules: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.ref_names: dict[str, str] = {}
        self.used: set[str] = set()
        self.depth = 0

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
        while name in self.rules or name in HELPER_RULES:
            n += 1
            name = f"{base}-{n}"
        self.rules[name] = ""
        return name

    def seq(self, *parts: str) -> str:
        return " ".join(p for p in parts if p)

    # -- entry
    def compile(self) -> str:
        self.check_no_nested_id(self.root, "#", True)
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
            body, deps = HELPER_RULES[h]
            lines.append(f"{h} ::= {body}")
            todo += deps
        return "\n".join(lines) + "\n"

    # -- schemas
    def schema(self, s, where: str) -> str:
        self.depth += 1
        try:
            if self.depth > 200:
                raise self.err(where, "schema nests too deep (allOf or $ref merging that recurses)")
            return self.schema_body(s, where)
        finally:
            self.depth -= 1

    def schema_body(self, s, where: str) -> str:
        if s is True:
            return self.helper("value")
        if s is False:
            raise self.err(where, "schema `false` (no instance is valid) cannot be compiled")
        if not isinstance(s, dict):
            raise self.err(where, f"a schema must be an object or boolean, not {type(s).__name__}")
        self.check_keys(s, where)
        keys = {k for k in s if k not in ANNOTATIONS}
        if not keys:
            return self.schema(True, where)
        if keys == {"$ref"}:
            return self.ref(s["$ref"], _ptr(where, "$ref"))
        rewritten = self.rewrite(s, keys, where)
        if rewritten is not None:
            return self.schema(rewritten, where)
        comb = [k for k in ("anyOf", "oneOf") if k in keys]
        if comb and len(keys) > 1:          # siblings distribute over the branches, exactly
            branches = s[comb[0]]
            if not isinstance(branches, list) or not branches:
                raise self.err(_ptr(where, comb[0]), f"{comb[0]} must be a non-empty list")
            rest = {k: v for k, v in s.items() if k != comb[0]}
            return self.schema({comb[0]: [self.conjoin(rest, b, _ptr(where, comb[0], i))
                                          for i, b in enumerate(branches)]}, where)
        if comb:
            branches = s[comb[0]]
            if not isinstance(branches, list) or not branches:
                raise self.err(_ptr(where, comb[0]), f"{comb[0]} must be a non-empty list")
            if comb[0] == "oneOf":
                self.check_disjoint(branches, _ptr(where, "oneOf"))
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
            elif t in ("integer", "number"):
                alts.append(self.numeric(s, t, where))
            elif t == "string":
                alts.append(self.string(s, where))
            elif t == "object":
                alts.append(self.obj(s, where))
            elif t == "array":
                arr = self.array(s, where)
                if arr is not None:
                    alts.append(arr)
        if not alts:
            raise self.err(where, "no instance of any allowed type is valid (unsatisfiable schema)")
        if len(alts) == 1:
            return alts[0]
        return self.rule(where + "-types", " | ".join(alts))

    def ref(self, ref, where: str) -> str:
        if isinstance(ref, str) and ref in self.ref_names:
            return self.ref_names[ref]
        target = self.lookup(ref, where)
        name = self.fresh("ref-" + (ref[1:].rsplit("/", 1)[-1] or "root"))
        self.ref_names[ref] = name
        body = self.schema(target, ref)
        self.rules[name] = body
        return name









    # -- enum / const
    def enum(self, s: dict, types: list[str], where: str) -> str:
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise self.err(_ptr(where, "enum"), "enum must be a non-empty list")
            values = list(s["enum"])
        else:
            values = [s["const"]]
        try:
            json.dumps(values, allow_nan=False)
        except ValueError:
            raise self.err(where, "enum/const holds NaN or Infinity, which are not JSON values") from None
        if "const" in s and "enum" in s:
            values = [v for v in values if json_equal(v, s["const"])]
        if "type" in s:
            values = [v for v in values if any(has_type(v, t) for t in types)]
        if {k for k in s if k not in ANNOTATIONS} - {"enum", "const", "type"}:
            values = [v for v in values if self.validator(s).is_valid(v)]    # the other keywords, exactly
        if not values:
            raise self.err(where, "no enum/const value satisfies the schema")
        alts = dict.fromkeys(self.value_literal(v) for v in values)     # duplicates dropped in linear time
        return self.rule(where + "-enum", " | ".join(alts))

    def value_literal(self, v) -> str:
        W = self.W
        if isinstance(v, dict):
            if not v:
                return self.seq('"{"', W, '"}"')
            members = [self.seq(literal(json.dumps(k, ensure_ascii=False)), W, '":"', W, self.value_literal(x))
                       for k, x in v.items()]
            return "( " + self.seq('"{"', W, f' {W}"," {W}'.join(members), W, '"}"') + " )"
        if isinstance(v, list):
            if not v:
                return self.seq('"["', W, '"]"')
            return "( " + self.seq('"["', W, f' {W}"," {W}'.join(self.value_literal(x) for x in v),
                                   W, '"]"') + " )"
        return literal(json.dumps(v, ensure_ascii=False))

    # -- numbers
    def numeric(self, s: dict, t: str, where: str) -> str:
        """integer or number, with minimum/maximum/exclusiveMinimum/exclusiveMaximum compiled exactly."""
        if "multipleOf" in s:
            return self.multiple_of(s, where)
        bounds = {}
        for k in TYPE_KEYWORDS["number"]:
            if k in s:
                v = s[k]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise self.err(_ptr(where, k), f"{k} must be a finite number")
                bounds[k] = Fraction(v)
        if not bounds:
            return self.helper(t)
        lo = max(((v, k == "exclusiveMinimum") for k, v in bounds.items() if k.endswith("inimum")), default=None)
        hi = min(((v, k != "exclusiveMaximum") for k, v in bounds.items() if k.endswith("aximum")), default=None)
        if t == "integer":
            a = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
            b = None if hi is None else (math.ceil(hi[0]) - 1 if not hi[1] else math.floor(hi[0]))
            body = int_range(a, b)
        else:
            for k, v in bounds.items():
                if v.denominator != 1 or abs(v) > NUMBER_BOUND_LIMIT:
                    raise self.err(_ptr(where, k), f"{k!r} {s[k]!r} for type number: only integer bounds up to "
                                                   f"{NUMBER_BOUND_LIMIT} in size are compiled exactly")
            body = number_range(None if lo is None else int(lo[0]), bool(lo and lo[1]),
                                None if hi is None else int(hi[0]), bool(hi and not hi[1]))
        if not body:
            k = sorted(bounds)[0]
            raise self.err(_ptr(where, k), f"the bounds leave no {t} (unsatisfiable schema)")
        return self.rule(where + "-range", body)

    def multiple_of(self, s: dict, where: str) -> str:
        """multipleOf an integer d <= 1000, without bounds: integers divisible by d (also for type number:
        a multiple of an integer is an integer, written here without fraction or exponent)."""
        ptr = _ptr(where, "multipleOf")
        d = s["multipleOf"]
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not math.isfinite(d) or d <= 0:
            raise self.err(ptr, "multipleOf must be a positive number")
        if Fraction(d).denominator != 1 or d > 1000:
            raise self.err(ptr, f"unsupported keyword 'multipleOf' {d!r} (only integer divisors up to 1000)")
        other = sorted(k for k in TYPE_KEYWORDS["number"] if k in s)
        if other:
            raise self.err(ptr, f"unsupported keyword 'multipleOf' next to {other[0]!r}")
        start, rules = multiples(int(d))
        names = {n: self.fresh(f"{where}-mod{int(d)}-{n}") for n in rules}
        for n, body in rules.items():
            self.rules[names[n]] = re.sub(r"\bm(\d+)\b", lambda m: names["m" + m.group(1)], body)
        return self.rule(where + "-multiple", re.sub(r"\bm(\d+)\b", lambda m: names["m" + m.group(1)], start))

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

# ----------------------------------------------------------------------------- public API

def compile_schema(schema, *, whitespace: str = "flexible", ndjson: bool = False,
                   source: str = "<schema>") -> str:
    """Grammar text (lessonkit GBNF) for a JSON Schema. Raises LessonkitError on unsupported input."""
    return _compile(schema, whitespace, ndjson, source)[0]


def schema_grammar(schema, *, whitespace: str = "flexible", ndjson: bool = False,
                   source: str = "<schema>") -> Grammar:
    g = _compile(schema, whitespace, ndjson, source)[1]
    g.line_oriented = ndjson
    return g


def _compile(schema, whitespace: str, ndjson: bool, source: str) -> tuple[str, Grammar]:
    """(grammar text, Grammar). A $ref cycle that consumes no input ({"$ref": "#"} alone, a -> b -> a)
    is named as such, not as a left-recursive rule of the generated grammar; nesting deeper than
    Python's recursion allows is one clear error, never a RecursionError."""
    check_strings(schema, source)
    c = SchemaCompiler(schema, whitespace=whitespace, ndjson=ndjson, source=source)
    try:
        text = c.compile()
        return text, Grammar(text, source)
    except RecursionError:
        raise LessonkitError(f"{source}: the schema nests too deeply to compile") from None
    except LessonkitError as e:
        m = re.search(r"rule '([^']+)' is left-recursive", str(e))
        refs = [r for r, n in c.ref_names.items() if m and n == m.group(1)]
        if not refs:
            raise
        raise LessonkitError(f"{source}: $ref {refs[0]!r} is left-recursive: it refers back to itself before "
                             f"matching any input (a cycle such as {{\"$ref\": \"#\"}} alone has no instances)") from None


_SURROGATE = re.compile("[\ud800-\udfff]")


def check_strings(schema, source: str) -> None:
    """Every string in the schema, keys included, is text a UTF-8 document can hold (a lone surrogate
    escape such as "\\ud800" is not: no instance could match it) and at most MAX_LITERAL characters
    long (grammar memory grows with each literal byte). Iterative: any nesting depth is walked."""
    work = [(schema, "")]
    while work:
        v, where = work.pop()
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(k, str):
                    _check_string(k, where, source)
                work.append((x, _ptr(where, k)))
        elif isinstance(v, list):
            work += [(x, _ptr(where, i)) for i, x in enumerate(v)]
        elif isinstance(v, str):
            _check_string(v, where, source)


def _check_string(s: str, where: str, source: str) -> None:
    if len(s) > MAX_LITERAL:
        raise LessonkitError(f"{source}: {where or '/'}: a string of {len(s):,} characters "
                             f"(strings in a schema are limited to {MAX_LITERAL:,})")
    m = _SURROGATE.search(s)
    if m:
        raise LessonkitError(f"{source}: {where or '/'}: {ascii(s[:40])} holds a lone surrogate escape "
                             f"({ascii(m.group())}), which is not a Unicode character: no UTF-8 text can match it")


def load_schema(path: str | Path):
    p = Path(path)
    if not p.is_file():
        raise LessonkitError(f"{path}: no such schema file")
    try:
        return json.loads(p.read_text(encoding="utf-8"), parse_constant=_not_json)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LessonkitError(f"{path}: not valid JSON ({e})") from None
    except ValueError as e:
        raise LessonkitError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise LessonkitError(f"{path}: nests too deeply to read") from None


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON value")


def compile_schema_file(path, *, whitespace: str = "flexible", ndjson: bool = False) -> str:
    return compile_schema(load_schema(path), whitespace=whitespace, ndjson=ndjson, source=str(path))


def schema_grammar_file(path, *, whitespace: str = "flexible", ndjson: bool = False) -> Grammar:
    return schema_grammar(load_schema(path), whitespace=whitespace, ndjson=ndjson, source=str(path))


def order_like_schema(instance, schema, root=None):
    """A copy of `instance` with object keys in the order the compiled grammar expects."""
    if root is None:
        schema = root = resolve_references(schema)
    if not isinstance(schema, dict):
        return instance
    if "allOf" in schema or "$ref" in schema and len([k for k in schema if k not in ANNOTATIONS]) > 1:
        try:
            schema = SchemaCompiler(root).flatten(schema, "#")
        except LessonkitError:
            return instance
        return order_like_schema(instance, schema, root)
    keys = {k for k in schema if k not in ANNOTATIONS}
    if keys & REWRITTEN:        # the grammar's key order is that of the rewritten schema
        try:
            new = SchemaCompiler(root).rewrite(schema, keys, "#")
        except LessonkitError:
            return instance
        if new is not None:
            return order_like_schema(instance, new, root)
    if "$ref" in schema:
        try:
            target = SchemaCompiler(root).lookup(schema["$ref"], "#")
        except LessonkitError:
            return instance
        return order_like_schema(instance, target, root)
    for comb in ("anyOf", "oneOf"):
        if comb in schema:
            base = jsonschema.Draft202012Validator(root)
            rest = {k: v for k, v in schema.items() if k != comb}
            for b in schema[comb]:
                if base.evolve(schema=b).is_valid(instance):
                    if [k for k in rest if k not in ANNOTATIONS]:
                        try:
                            b = SchemaCompiler(root).conjoin(rest, b, "#")
                        except LessonkitError:
                            return instance
                    return order_like_schema(instance, b, root)
            return instance
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        order = list(props) + [k for k in schema.get("required", []) if k not in props]
        keys = [k for k in order if k in instance] + [k for k in instance if k not in order]
        addl = schema.get("additionalProperties", True)
        return {k: order_like_schema(instance[k], props.get(k, addl), root)
                for k in keys}
    if isinstance(instance, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        return [order_like_schema(x, prefix[i] if i < len(prefix) else items, root)
                for i, x in enumerate(instance)]
    return instance
