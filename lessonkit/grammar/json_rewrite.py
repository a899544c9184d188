"""Schema rewrites for the schema compiler: references, keywords turned into equal schemas the
grammar emitter knows (allOf merged, not/if/dependentRequired/propertyNames/unevaluated* rewritten),
and the disjointness test that lets oneOf be compiled as alternatives. Fails closed: what cannot be
rewritten exactly raises a LessonkitError naming the keyword and its JSON pointer.
"""
from __future__ import annotations

import urllib.parse

import jsonschema

from lessonkit.errors import LessonkitError
from lessonkit.grammar.json_merge import Conflict, merge
from lessonkit.grammar.json_rules import has_type, json_equal

ANNOTATIONS = {"$schema", "$id", "$comment", "title", "description", "examples", "default",
               "deprecated", "readOnly", "writeOnly", "$defs", "definitions"}


TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
               "patternProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
}


SUPPORTED = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "not", "uniqueItems", "dependentRequired",
             "unevaluatedProperties", "unevaluatedItems", "if", "then", "else", "propertyNames", "contains",
             "minContains", "dependentSchemas", "multipleOf",
             "$anchor"} | set().union(*TYPE_KEYWORDS.values())

# keywords SchemaRewriter.rewrite turns into other keywords
REWRITTEN = {"unevaluatedProperties", "unevaluatedItems", "uniqueItems", "not", "dependentRequired",
             "dependentSchemas", "if", "then", "else", "propertyNames"}

# keywords that apply subschemas in place: their evaluations would count for unevaluated*
IN_PLACE = {"allOf", "anyOf", "oneOf", "not", "$ref", "$dynamicRef", "if", "then", "else", "dependentSchemas"}


JSON_TYPES = ("null", "boolean", "object", "array", "string", "number", "integer")


# kinds of JSON values, disjoint: a number is an integer ("int", 1.0 included) or not ("frac")
KINDS = ("null", "boolean", "object", "array", "string", "int", "frac")
TYPE_KINDS = {"null": {"null"}, "boolean": {"boolean"}, "object": {"object"}, "array": {"array"},
              "string": {"string"}, "integer": {"int"}, "number": {"int", "frac"}}


def value_kind(v) -> str:
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "int" if has_type(v, "integer") else "frac"
    return {type(None): "null", str: "string", dict: "object", list: "array"}[type(v)]


def _ptr(base: str, *parts) -> str:
    return base + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class SchemaRewriter:
    """The schema side of compilation: `root` is the whole document, `source` names it in errors."""

    def __init__(self, root, source: str = "<schema>"):
        self.root, self.source = root, source
        self.depth = 0

    def rewrite(self, s: dict, keys: set, where: str):
        """An equal schema without one keyword the grammar emitter has no form for, or None."""
        if keys & {"unevaluatedProperties", "unevaluatedItems"}:
            return self.unevaluated(s, where)
        if "allOf" in keys or "$ref" in keys:
            return self.flatten(s, where)
        if "uniqueItems" in keys:
            if s["uniqueItems"] is not False:
                raise self.err(_ptr(where, "uniqueItems"), "unsupported keyword 'uniqueItems' (a grammar cannot "
                                                           "compare items; only uniqueItems: false is accepted)")
            return {k: v for k, v in s.items() if k != "uniqueItems"}
        if "not" in keys:
            return self.negation(s, where)
        if "dependentRequired" in keys:
            return self.dependent(s, where)
        if "dependentSchemas" in keys:
            return self.dependent(s, where, "dependentSchemas")
        if keys & {"if", "then", "else"}:
            return self.conditional(s, where)
        if "propertyNames" in keys:
            return self.property_names(s, where)
        return None

    # -- helpers
    def err(self, where: str, msg: str) -> LessonkitError:
        return LessonkitError(f"{self.source}: {msg} at {where}")

    def lookup(self, ref, where: str):
        """The subschema a local reference points to."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise self.err(where, f"only local references ('#...') are supported, not {ref!r}")
        target = self.root
        pointer = urllib.parse.unquote(ref[1:])     # a URI fragment: percent-encoded
        if pointer and not pointer.startswith("/"):
            return self.anchor(pointer, ref, where)
        for part in pointer.split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise self.err(where, f"reference {ref!r} does not resolve")
        return target

    def anchor(self, name: str, ref: str, where: str):
        """The subschema with `$anchor: name`, when no nested $id could change which one is meant."""
        found, ids = [], []

        def walk(x, top):
            if isinstance(x, dict):
                if "$id" in x and not top:
                    ids.append(x["$id"])
                if x.get("$anchor") == name:
                    found.append(x)
                for k, v in x.items():
                    if k not in ("const", "enum", "default", "examples"):
                        walk(v, False)
            elif isinstance(x, list):
                for v in x:
                    walk(v, False)

        walk(self.root, True)
        if ids or len(found) != 1:
            raise self.err(where, f"unsupported reference {ref!r} (an anchor is resolved only when it is "
                                  "unique and no nested $id is present)")
        return found[0]

    def check_no_nested_id(self, x, where: str, top: bool = False) -> None:
        """A `$id` below the root starts a new resource: its `#...` references mean something else."""
        if isinstance(x, dict):
            if isinstance(x.get("$id"), str) and not top:
                raise self.err(_ptr(where, "$id"), "unsupported keyword '$id' below the root (it changes what "
                                                   "references inside it mean)")
            for k, v in x.items():
                if k not in ("const", "enum", "default", "examples"):
                    self.check_no_nested_id(v, _ptr(where, k))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                self.check_no_nested_id(v, _ptr(where, i))

    def check_keys(self, s: dict, where: str) -> None:
        for k in s:
            if k not in SUPPORTED and k not in ANNOTATIONS:
                raise self.err(_ptr(where, k), f"unsupported keyword {k!r}")

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

    # -- allOf, and $ref with siblings: merged into one schema (json_merge), or refused
    def flatten(self, s, where: str):
        """s without allOf and without $ref next to other keywords (True, False or a dict)."""
        self.depth += 1
        try:
            if self.depth > 200:
                raise self.err(where, "schema nests too deep (allOf or $ref merging that recurses)")
            if not isinstance(s, dict):
                return s
            self.check_keys(s, where)
            if "$ref" in s and len([k for k in s if k not in ANNOTATIONS]) > 1:
                target = self.flatten(self.lookup(s["$ref"], _ptr(where, "$ref")), s["$ref"])
                rest = {k: v for k, v in s.items() if k != "$ref"}
                return self.conjoin(target, rest, where)
            if "allOf" in s:
                parts = s["allOf"]
                if not isinstance(parts, list) or not parts:
                    raise self.err(_ptr(where, "allOf"), "allOf must be a non-empty list")
                acc = self.flatten({k: v for k, v in s.items() if k != "allOf"}, where)
                for i, p in enumerate(parts):
                    acc = self.conjoin(acc, p, _ptr(where, "allOf", i))
                return acc
            return s
        finally:
            self.depth -= 1

    def conjoin(self, a, b, where: str):
        """One schema equal to allOf [a, b]; `where` locates b."""
        a = self.flatten(self.deref(a, where), where)
        b = self.flatten(self.deref(b, where), where)
        if a is False or b is False:
            return False
        if b is True:
            return a
        if a is True or not isinstance(a, dict) or not isinstance(b, dict):
            return b if a is True else (a if not isinstance(a, dict) else b)
        try:
            return merge(a, b, lambda sch, v: self.validator(sch).is_valid(v), ANNOTATIONS)
        except Conflict as c:
            raise self.err(_ptr(where, c.keyword), f"allOf: {c}") from None

    # -- oneOf: exclusivity is exact only when no instance can match two branches
    def check_disjoint(self, branches: list, where: str) -> None:
        live = [(i, b) for i, b in enumerate(branches) if b is not False]
        for x, (i, a) in enumerate(live):
            for j, b in live[x + 1:]:
                if not self.disjoint(a, b, where):
                    raise self.err(where, f"oneOf branches {i} and {j} are not provably disjoint (no distinct "
                                          "type, const or enum discriminator), so exclusivity cannot be enforced; "
                                          "use anyOf if overlapping branches are meant")

    def deref(self, s, where: str):
        for _ in range(64):
            if not (isinstance(s, dict) and "$ref" in s and len(s) == 1):
                return s
            s = self.lookup(s["$ref"], where)
        return s

    def values_of(self, s, where: str):
        """The finite list of values s allows (const/enum), or None when not finite or not known."""
        s = self.deref(s, where)
        if s is False:
            return []
        if not isinstance(s, dict) or ("const" not in s and "enum" not in s):
            return None
        vals = [s["const"]] if "const" in s else s["enum"]
        if not isinstance(vals, list):
            return None
        return [v for v in vals if self.validator(s).is_valid(v)]

    def kinds_of(self, s, where: str, depth: int = 0) -> set[str]:
        """The JSON kinds an instance of s may have (an over-approximation)."""
        s = self.deref(s, where)
        if s is False:
            return set()
        if not isinstance(s, dict) or depth > 32:
            return set(KINDS)
        out = set(KINDS)
        vals = self.values_of(s, where)
        if vals is not None:
            out &= {value_kind(v) for v in vals}
        if isinstance(s.get("type"), (str, list)):
            ts = [s["type"]] if isinstance(s["type"], str) else s["type"]
            out &= set().union(*(TYPE_KINDS.get(t, set(KINDS)) for t in ts))
        for comb in ("anyOf", "oneOf"):
            if isinstance(s.get(comb), list):
                out &= set().union(*(self.kinds_of(b, where, depth + 1) for b in s[comb]))
        for b in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
            out &= self.kinds_of(b, where, depth + 1)
        return out

    def validator(self, s):
        return jsonschema.Draft202012Validator(self.root).evolve(schema=s)

    def disjoint(self, a, b, where: str) -> bool:
        a, b = self.deref(a, where), self.deref(b, where)
        common = self.kinds_of(a, where) & self.kinds_of(b, where)
        if not common:
            return True
        for x, y in ((a, b), (b, a)):       # a finite branch none of whose values the other accepts
            vals = self.values_of(x, where)
            if vals is not None and not any(self.validator(y).is_valid(v) for v in vals):
                return True
        if common == {"object"} and isinstance(a, dict) and isinstance(b, dict):
            req = set(a.get("required", [])) & set(b.get("required", []))
            for p in sorted(req):
                va = self.values_of(a.get("properties", {}).get(p), where)
                vb = self.values_of(b.get("properties", {}).get(p), where)
                if va is not None and vb is not None and not any(json_equal(u, v) for u in va for v in vb):
                    return True
        return False

    def unevaluated(self, s: dict, where: str) -> dict:
        """Without in-place applicators, unevaluatedProperties is additionalProperties and
        unevaluatedItems is items (or nothing, where those are present: everything is evaluated)."""
        out = dict(s)
        for k, plain in (("unevaluatedProperties", "additionalProperties"), ("unevaluatedItems", "items")):
            if k not in s:
                continue
            applied = sorted(IN_PLACE & set(s))
            if applied:
                raise self.err(_ptr(where, k), f"unsupported keyword {k!r} next to {applied[0]!r} (what the "
                                               "applicator evaluates is not tracked)")
            v = out.pop(k)
            if plain not in s:
                out[plain] = v
        return out

    def conditional(self, s: dict, where: str):
        """if/then/else where the condition is decided: `then`/`else` without `if`, or `if` alone, are
        ignored (as the spec says); `if: true` keeps `then`, `if: false` keeps `else`. Else refused."""
        rest = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
        if "if" not in s or ("then" not in s and "else" not in s):
            return rest
        cond = self.deref(s["if"], _ptr(where, "if"))
        if cond is True or cond == {}:
            return self.conjoin(rest, s.get("then", True), _ptr(where, "then"))
        if cond is False:
            return self.conjoin(rest, s.get("else", True), _ptr(where, "else"))
        raise self.err(_ptr(where, "if"), "unsupported keyword 'if' (only a condition that is true or false "
                                          "for every instance is compiled)")

    def property_names(self, s: dict, where: str):
        """propertyNames on a closed object (no additional keys): the declared names it rejects are
        forbidden. `true` is dropped; `false` forbids every key. Objects with additional keys: refused."""
        pn, rest = s["propertyNames"], {k: v for k, v in s.items() if k != "propertyNames"}
        ptr = _ptr(where, "propertyNames")
        if pn is True or pn == {}:
            return rest
        if pn is False:
            return self.conjoin(rest, {"additionalProperties": False}, ptr)
        if rest.get("additionalProperties", True) is not False or rest.get("patternProperties"):
            raise self.err(ptr, "unsupported keyword 'propertyNames' (compiled only where additionalProperties "
                                "is false and there are no patternProperties)")
        names = list(rest.get("properties", {})) + [n for n in rest.get("required", []) if isinstance(n, str)]
        bad = {n: False for n in names if not self.validator(pn).is_valid(n)}
        return self.conjoin(rest, {"properties": bad}, ptr) if bad else rest

    def negation(self, s: dict, where: str):
        """s without `not`, where `not` is trivially decidable: false, or a bare `type` (types removed)."""
        n, rest = self.deref(s["not"], _ptr(where, "not")), {k: v for k, v in s.items() if k != "not"}
        if n is False:
            return rest
        if n is True or n == {}:
            raise self.err(_ptr(where, "not"), "`not: true` allows nothing (unsatisfiable schema)")
        if isinstance(n, dict) and {k for k in n if k not in ANNOTATIONS} == {"not"}:
            return self.conjoin(rest, n["not"], _ptr(where, "not", "not"))       # double negation
        if not isinstance(n, dict) or {k for k in n if k not in ANNOTATIONS} != {"type"}:
            raise self.err(_ptr(where, "not"), "unsupported keyword 'not' (only `not: false` and `not` of a bare "
                                               "`type` are compiled)")
        gone = set(self.types(n, _ptr(where, "not")))
        if "number" in gone:
            gone.add("integer")
        kept = [t for t in self.types(rest, where) if t not in gone]
        if "integer" in gone and "number" in kept:
            raise self.err(_ptr(where, "not"), "`not` integer within number (non-integral numbers) is not compiled")
        if not kept:
            raise self.err(_ptr(where, "not"), "`not` removes every type (unsatisfiable schema)")
        return {**rest, "type": kept}

    def dependent(self, s: dict, where: str, key: str = "dependentRequired"):
        """dependentRequired {k: [names]} as anyOf [k absent, k and names present], and dependentSchemas
        {k: S} as anyOf [k absent, k present and S], one entry at a time."""
        deps = s[key]
        ptr = _ptr(where, key)
        if not isinstance(deps, dict) or key == "dependentRequired" and not all(
                isinstance(v, list) and all(isinstance(x, str) for x in v) for v in deps.values()):
            raise self.err(ptr, f"{key} must map names to " + ("lists of names" if key == "dependentRequired"
                                                                  else "schemas"))
        if len(deps) > 4:
            raise self.err(ptr, f"more than 4 {key} entries (the grammar doubles with each)")
        rest = {k: v for k, v in s.items() if k != key}
        if not deps:
            return rest
        (k, dep), *more = deps.items()
        if more:
            rest[key] = dict(more)
        if key == "dependentRequired":
            present = self.conjoin(rest, {"required": [k, *dep]}, ptr)
        else:
            present = self.conjoin(self.conjoin(rest, {"required": [k]}, ptr), dep, _ptr(ptr, k))
        if isinstance(rest.get("required"), list) and k in rest["required"]:
            return present
        absent = self.conjoin(rest, {"properties": {k: False}}, ptr)
        if present is False:
            return absent
        return {"anyOf": [absent, present]}
