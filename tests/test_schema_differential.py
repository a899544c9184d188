"""Differential harness: the compiled grammar never accepts an instance that jsonschema rejects.

For every schema in tests/schemas and for hypothesis-generated schemas over the compiler's subset,
seed instances (a schema-directed sampler, plus hypothesis-jsonschema for the test schemas) are
mutated in schema-directed ways: a required key dropped, an extra key added (declared-looking ones
too), a value of the wrong type, numbers just outside their range, strings one character too long
or too short (ASCII, two-byte, and non-BMP characters, which json.dumps writes as surrogate-pair
escapes), an array one item longer, and for each `oneOf` a value built to match two branches.
Each candidate is serialised several ways: compact and spaced, ensure_ascii on and off, schema key
order, reversed and sorted key order, and every string character written as a \\u escape. jsonschema
(with its format checker) is the oracle; a grammar that accepts a text whose value jsonschema
rejects is a soundness hole, and the test lists every such (schema, text). Valid seeds in the
schema's key order and canonical compact form must be accepted.

A schema the compiler refuses is not checked here: refusing is the safe answer.
"""
import copy
import math
import os
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from lessonkit.errors import LessonkitError
from lessonkit.grammar.json_refs import resolve_references
from lessonkit.grammar.json_schema import order_like_schema, schema_grammar

SCHEMA_DIR = Path(__file__).parent / "schemas"
SCHEMAS = sorted(p.stem for p in SCHEMA_DIR.glob("*.json"))
# hypothesis-jsonschema cannot satisfy prefixItems nor resolve recursive $ref: sampler seeds only
NO_HYPOTHESIS_SEEDS = {"geo_point", "rgb_tuple", "expression_tree", "linked_list", "tree"}
CHARS = ["a", "Z", "0", " ", "é", "ß", "€", "\U0001F4A9", "\U00010348", '"', "\\", "/", "\n", "\x01", "\u2028"]
POOL = [None, True, False, 0, 1, -1, 2.5, -0.5, 1.0, 10 ** 6, "", "a", "\U0001F4A9", [], [None], {}, {"zz": 1}]
PATTERN_KEYS = ["xa", "ab", "zy", "é", "x", "y", "abc", "xéy", "\U0001F4A9y", "q"]
FORMAT_SEEDS = {"date": ["2024-02-29", "2023-02-29"], "date-time": ["2024-01-01T00:00:00Z", "2024-01-01"],
                "uuid": ["12345678-1234-1234-1234-1234567890ab", "1234"], "email": ["a@b.c", "ab"]}


# ----------------------------------------------------------------------------- schema helpers

def deref(s, root):
    for _ in range(64):
        if not (isinstance(s, dict) and "$ref" in s):
            return s
        target = root
        for part in s["$ref"][1:].split("/")[1:]:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target[int(part)] if isinstance(target, list) else target[part]
        s = target
    return s


def types_of(s) -> list[str]:
    t = s.get("type")
    if isinstance(t, str):
        return [t]
    if isinstance(t, list) and t:
        return list(t)
    if {"properties", "required", "additionalProperties", "patternProperties"} & set(s):
        return ["object"]
    if {"items", "prefixItems", "minItems", "maxItems"} & set(s):
        return ["array"]
    if {"minLength", "maxLength", "pattern", "format"} & set(s):
        return ["string"]
    if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"} & set(s):
        return ["number"]
    return ["null", "boolean", "integer", "number", "string", "array", "object"]


def text_of(rnd, n: int) -> str:
    return "".join(rnd.choice(CHARS) for _ in range(max(n, 0)))


# ----------------------------------------------------------------------------- seeds

def sample(s, root, rnd: random.Random, depth: int = 0):
    """A random instance aimed at s (often valid, not always: jsonschema decides)."""
    s = deref(s, root)
    if s is True or s is False or not isinstance(s, dict) or depth > 5:
        return copy.deepcopy(rnd.choice(POOL))
    if "const" in s:
        return copy.deepcopy(s["const"])
    if "enum" in s and s["enum"]:
        return copy.deepcopy(rnd.choice(s["enum"]))
    for comb in ("anyOf", "oneOf", "allOf"):
        if comb in s and s[comb]:
            return sample(rnd.choice(s[comb]), root, rnd, depth + 1)
    t = rnd.choice(types_of(s))
    if t == "null":
        return None
    if t == "boolean":
        return rnd.random() < 0.5
    if t in ("integer", "number"):
        lo = s.get("minimum", s.get("exclusiveMinimum", -50))
        hi = s.get("maximum", s.get("exclusiveMaximum", lo + 100))
        a = math.ceil(lo)
        x = rnd.randint(a, max(math.floor(hi), a))
        return x if t == "integer" or rnd.random() < 0.5 else x + 0.25
    if t == "string":
        if s.get("format") in FORMAT_SEEDS:
            return rnd.choice(FORMAT_SEEDS[s["format"]])
        lo = s.get("minLength", 0)
        return text_of(rnd, rnd.randint(lo, s.get("maxLength", lo + 4)))
    if t == "array":
        out = [sample(p, root, rnd, depth + 1) for p in s.get("prefixItems", [])]
        lo = s.get("minItems", 0)
        for _ in range(rnd.randint(lo, min(s.get("maxItems", lo + 3), lo + 3))):
            out.append(sample(s.get("items", True), root, rnd, depth + 1))
        return out
    props, out = s.get("properties", {}), {}
    addl = s.get("additionalProperties", True)
    for k, sub in props.items():
        if k in s.get("required", []) or rnd.random() < 0.6:
            out[k] = sample(sub, root, rnd, depth + 1)
    for k in s.get("required", []):
        if k not in out:
            out[k] = sample(addl, root, rnd, depth + 1)
    if addl is not False and rnd.random() < 0.3:
        out["x" + text_of(rnd, 1)] = sample(addl, root, rnd, depth + 1)
    for pat, sub in s.get("patternProperties", {}).items():
        keys = [k for k in PATTERN_KEYS if re.search(pat, k) and k not in props]
        for k in rnd.sample(keys, min(len(keys), rnd.randint(0, 2))):
            out[k] = sample(sub, root, rnd, depth + 1)
    return out


# ----------------------------------------------------------------------------- mutations

def nodes(v, s, root, path=()):
    """(path, value, schema) for every node of v reached through properties/items (first oneOf match)."""
    s = deref(s, root)
    yield path, v, s
    if not isinstance(s, dict):
        return
    for comb in ("anyOf", "oneOf"):
        for b in s.get(comb, []):
            bb = deref(b, root)
            if bb is not False and jsonschema.Draft202012Validator(root).evolve(schema=bb).is_valid(v):
                yield from nodes(v, bb, root, path)
                break
    if isinstance(v, dict):
        props = s.get("properties", {})
        for k, x in v.items():
            yield from nodes(x, props.get(k, s.get("additionalProperties", True)), root, path + (k,))
    elif isinstance(v, list):
        prefix = s.get("prefixItems", [])
        for i, x in enumerate(v):
            yield from nodes(x, prefix[i] if i < len(prefix) else s.get("items", True), root, path + (i,))


def replaced(v, path, new):
    if not path:
        return new
    v = copy.deepcopy(v)
    node = v
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = new
    return v


def edits(x, s, root, rnd):
    """Schema-directed replacements for one node x with schema s."""
    out = [copy.deepcopy(rnd.choice(POOL)) for _ in range(2)]
    if not isinstance(s, dict):
        return out
    if isinstance(x, dict):
        for k in list(x) + list(s.get("required", [])):
            out.append({kk: vv for kk, vv in x.items() if kk != k})           # drop a (required) key
        for k in ["zz", *PATTERN_KEYS[:4], *s.get("required", []), *s.get("properties", {})]:
            for val in (None, 1, "s", [], {}):
                out.append({**x, k: val})                                     # extra / retyped key
    if isinstance(x, list):
        out += [x + [None], x + [1], x + [x[-1] if x else "a"], x[:-1], x[1:]]
    if isinstance(x, str):
        lo, hi = s.get("minLength"), s.get("maxLength")
        for n in {lo, hi, None if lo is None else lo - 1, None if hi is None else hi + 1, len(x) + 1, len(x) - 1}:
            if n is not None and n >= 0:
                out += [c * n for c in ("a", "é", "\U0001F4A9", "\n")] + [text_of(rnd, n)]
        out += [x + "\U0001F4A9", x[:-1], x.upper(), x + "\\"]
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            if isinstance(s.get(k), (int, float)):
                b = s[k]
                out += [b, b - 1, b + 1, b - 0.5, b + 0.5, float(b)]
        out += [x + 0.5, -x - 1, float(x), str(x), x * 10 ** 6]
    for comb in ("oneOf", "anyOf"):                    # a value built to match two branches
        bs = [deref(b, root) for b in s.get(comb, [])]
        for i, a in enumerate(bs):
            for b in bs[i + 1:]:
                va, vb = sample(a, root, rnd), sample(b, root, rnd)
                out += [va, vb]
                if isinstance(va, dict) and isinstance(vb, dict):
                    out += [{**va, **vb}, {**vb, **va}]
    return out


def candidates(seed, schema, rnd, limit=120):
    out = [seed]
    for path, x, s in list(nodes(seed, schema, schema)):
        for new in edits(x, s, schema, rnd):
            out.append(replaced(seed, path, new))
    rnd.shuffle(out)
    return [seed] + out[:limit]


# ----------------------------------------------------------------------------- serialisations

def escape_all(v):
    """JSON text with every string character (keys too) written as a \\u escape."""
    def esc(t):
        return '"' + "".join("\\u%04x" % u for u in
                             [int.from_bytes(t.encode("utf-16-be")[i:i + 2], "big")
                              for i in range(0, len(t.encode("utf-16-be")), 2)]) + '"'
    if isinstance(v, dict):
        return "{" + ",".join(esc(k) + ":" + escape_all(x) for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(escape_all(x) for x in v) + "]"
    return esc(v) if isinstance(v, str) else json.dumps(v)


def reorder(v, key):
    if isinstance(v, dict):
        return {k: reorder(v[k], key) for k in key(list(v))}
    if isinstance(v, list):
        return [reorder(x, key) for x in v]
    return v


def serialisations(v, schema):
    """(text, compact?) pairs: the same value written several ways."""
    orders = [order_like_schema(v, schema), v, reorder(v, lambda ks: ks[::-1]), reorder(v, sorted)]
    out = []
    for o in orders:
        for ascii_ in (False, True):
            out.append((json.dumps(o, ensure_ascii=ascii_, separators=(",", ":")), True))
            out.append((json.dumps(o, ensure_ascii=ascii_, separators=(", ", ": ")), False))
        out.append((json.dumps(o, indent=2), False))
        out.append((escape_all(o), True))
    return out


# ----------------------------------------------------------------------------- the check

class Checker:
    def __init__(self, schema, source="<schema>"):
        self.schema = schema
        self.compact = schema_grammar(schema, whitespace="compact", source=source)
        self.flex = schema_grammar(schema, whitespace="flexible", source=source)
        self.validator = jsonschema.Draft202012Validator(
            schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        self.plain = resolve_references(schema)       # document-local references, for the sampler
        self.holes, self.rejected_valid, self.cases = [], [], 0

    def check(self, v, strict: bool):
        try:
            valid = self.validator.is_valid(v)
        except (jsonschema.exceptions.SchemaError, RecursionError):
            return
        for text, compact in serialisations(v, self.schema):
            data = text.encode()
            self.cases += 1
            for g in (self.compact, self.flex) if compact else (self.flex,):
                if not valid and g.matches(data):
                    self.holes.append(text)
        # 1.0 is an integer to JSON Schema, not to the grammar; hypothesis seeds may hold what the
        # grammar rejects on purpose (see docs/grammar.md: email, Infinity, Unicode digits)
        if valid and strict and not has_integral_float(v):
            canonical = json.dumps(order_like_schema(v, self.schema), ensure_ascii=False, separators=(",", ":"))
            if not self.compact.matches(canonical.encode()):
                self.rejected_valid.append(canonical)

    def run(self, seeds, rnd, strict: bool = True):
        for seed in seeds:
            for c in candidates(seed, self.plain, rnd):
                self.check(c, strict)


def has_integral_float(v) -> bool:
    if isinstance(v, float):
        return v.is_integer()
    if isinstance(v, dict):
        return any(has_integral_float(x) for x in v.values())
    return isinstance(v, list) and any(has_integral_float(x) for x in v)


def load(name):
    return json.loads((SCHEMA_DIR / f"{name}.json").read_text())


@pytest.mark.parametrize("name", SCHEMAS)
def test_test_schemas_accept_no_invalid_instance(name):
    schema = load(name)
    chk = Checker(schema, name)
    rnd = random.Random(name)
    chk.run([sample(schema, schema, rnd) for _ in range(4)], rnd)

    @settings(max_examples=4, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(from_schema(copy.deepcopy(schema), custom_formats={"uuid": st.uuids().map(str)}))
    def seeded(inst):
        chk.run([inst], rnd, strict=False)

    if name not in NO_HYPOTHESIS_SEEDS:
        seeded()
    assert not chk.holes, f"{name}: {len(chk.holes)} invalid texts accepted, e.g. {chk.holes[:5]}"
    assert chk.cases > 500
    assert not chk.rejected_valid, f"{name}: valid canonical texts rejected, e.g. {chk.rejected_valid[:3]}"


# ----------------------------------------------------------------------------- generated schemas

NAMES = st.sampled_from(["a", "b", "kind", "x-y"])
CONSTS = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.5, "a", "b", "é", [1], {"a": 1}]))


def leaves():
    lengths = st.tuples(st.integers(0, 3), st.integers(0, 3)).map(sorted)
    return st.one_of(
        st.just(True), st.just(False),
        st.sampled_from([{"type": t} for t in ("null", "boolean", "integer", "number", "string")]),
        lengths.map(lambda lh: {"type": "string", "minLength": lh[0], "maxLength": lh[1]}),
        st.integers(0, 3).map(lambda n: {"type": "string", "minLength": n}),
        CONSTS.map(lambda c: {"const": c}),
        st.lists(CONSTS, min_size=1, max_size=3).map(lambda e: {"enum": e}),
        st.just({"type": ["string", "null"], "maxLength": 1}),
        st.builds(lambda t, d: {"type": t, "multipleOf": d}, st.sampled_from(["integer", "number"]),
                  st.integers(1, 12)),
        st.builds(lambda t, b: {"type": t, **b}, st.sampled_from(["integer", "number"]),
                  st.dictionaries(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
                                  st.one_of(st.integers(-12, 12), st.sampled_from([0.5, -2.5, 3.0])), max_size=2)),
    )


def composites(child):
    obj = st.builds(
        lambda props, req, addl: {"type": "object", "properties": props, "required": req,
                                  **({} if addl is None else {"additionalProperties": addl})},
        st.dictionaries(NAMES, child, max_size=3), st.lists(NAMES, max_size=2, unique=True),
        st.one_of(st.none(), st.just(False), child))
    arr = st.builds(
        lambda prefix, items, lo, extra: {"type": "array", "prefixItems": prefix, "minItems": lo,
                                          **({} if items is None else {"items": items}),
                                          **({} if extra is None else {"maxItems": lo + extra})},
        st.lists(child, max_size=3), st.one_of(st.none(), st.just(False), child),
        st.integers(0, 2), st.one_of(st.none(), st.integers(0, 2)))
    tagged = st.lists(st.tuples(st.sampled_from(["p", "q", "r"]), child), min_size=2, max_size=3).map(
        lambda bs: {"oneOf": [{"type": "object", "properties": {"kind": {"const": t}, "v": c},
                               "required": ["kind"]} for t, c in bs]})
    return st.one_of(obj, arr, tagged,
                     st.lists(child, min_size=1, max_size=3).map(lambda bs: {"anyOf": bs}),
                     st.lists(child, min_size=2, max_size=3).map(lambda bs: {"oneOf": bs}),
                     st.lists(child, min_size=1, max_size=3).map(lambda bs: {"allOf": bs}),
                     st.builds(lambda o, bs: {**o, "anyOf": bs}, obj, st.lists(child, min_size=1, max_size=2)),
                     st.builds(lambda o, p, c: {**o, "patternProperties": {p: c}, "additionalProperties": False},
                               obj, st.sampled_from(["^x", "y$", "^[a-c]+$", "é"]), child),
                     st.builds(lambda o, u: {k: v for k, v in {**o, "unevaluatedProperties": u}.items()
                                             if k != "additionalProperties"}, obj, child),
                     st.builds(lambda a, u: {**a, "unevaluatedItems": u}, arr, child),
                     st.builds(lambda i, c, m: {"type": "array", "items": i, "contains": c, "minContains": m},
                               child, child, st.integers(0, 2)),
                     st.builds(lambda o, p: {**o, "additionalProperties": False, "propertyNames": p}, obj,
                               st.sampled_from([True, False, {"maxLength": 1}, {"pattern": "^[ab]"}])),
                     st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, st.booleans(), child, child),
                     st.builds(lambda o, b: {**o, **b}, obj, st.dictionaries(
                         st.sampled_from(["minProperties", "maxProperties"]), st.integers(0, 3), min_size=1)),
                     st.builds(lambda o, d: {**o, "dependentSchemas": d}, obj,
                               st.dictionaries(NAMES, child, min_size=1, max_size=2)),
                     st.builds(lambda o, d: {**o, "dependentRequired": d}, obj,
                               st.dictionaries(NAMES, st.lists(NAMES, max_size=2), min_size=1, max_size=2)),
                     st.builds(lambda c, t: {"allOf": [c], "not": {"type": t}}, child,
                               st.sampled_from(["null", "string", "object", "number", "integer"])),
                     # a nested resource: its "#/$defs/x" is its own x, not the decoy beside it
                     st.builds(lambda c, d, n: {"$defs": {"x": d, "r": {"$id": f"r{n}/s.json", "$defs": {"x": c},
                                                                         "$ref": "#/$defs/x"}}, "$ref": f"r{n}/s.json"},
                               child, child, st.integers(0, 10 ** 6)))


GENERATED_EXAMPLES = int(os.environ.get("LESSONKIT_HYPOTHESIS_EXAMPLES", "25")) * 6
SCHEMAS_ST = st.recursive(leaves(), composites, max_leaves=6)


@settings(max_examples=GENERATED_EXAMPLES, deadline=None, database=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(SCHEMAS_ST, st.randoms(use_true_random=False))
def test_generated_schemas_accept_no_invalid_instance(schema, rnd):
    try:
        chk = Checker(schema)
    except LessonkitError:
        return                                   # refused: the safe answer
    chk.run([sample(chk.plain, chk.plain, rnd) for _ in range(2)], rnd)
    assert not chk.holes, f"{json.dumps(schema)}: invalid texts accepted, e.g. {chk.holes[:5]}"
    assert not chk.rejected_valid, f"{json.dumps(schema)}: valid texts rejected, e.g. {chk.rejected_valid[:3]}"


# ----------------------------------------------------------------------------- the official suite

SUITE = os.environ.get("LESSONKIT_SCHEMA_SUITE")   # path to JSON-Schema-Test-Suite/tests/draft2020-12


@pytest.mark.skipif(not SUITE, reason="set LESSONKIT_SCHEMA_SUITE to JSON-Schema-Test-Suite/tests/draft2020-12")
def test_official_suite():
    """Every schema of the suite compiles or is refused; a compiled one accepts no text the suite
    marks invalid. Prints the share compiled (52% when last measured: 200 of 383)."""
    compiled = total = 0
    holes = []
    for f in sorted(Path(SUITE).glob("*.json")):
        for group in json.loads(f.read_text()):
            total += 1
            try:
                g = schema_grammar(group["schema"])
            except LessonkitError:
                continue
            compiled += 1
            for t in group["tests"]:
                for text, _ in serialisations(t["data"], group["schema"]):
                    if not t["valid"] and g.matches(text.encode()):
                        holes.append((f.name, group["description"], t["description"], text))
    print(f"official suite: {compiled}/{total} schemas compiled ({100 * compiled / total:.0f}%)")
    assert not holes, holes[:5]
