"""allOf as one schema: the conjunction of two schemas written as a single schema, exactly, or a
Conflict naming the keyword that cannot be merged. For the schema compiler.

Keyword by keyword (a and b both have it): `type` intersects (integer within number), `required`
unites, bounds take the tighter, `enum`/`const` keep the values the other part accepts, and the
per-name rules of objects and arrays pair up: property k gets allOf(a's schema for k, b's schema for
k), where a part's schema for a name it does not declare is its `additionalProperties`; position i
of an array gets allOf(a's schema for i, b's) in the same way with `prefixItems`/`items`. Equal
values merge trivially; anything else is a Conflict (refused, never approximated).
"""
from __future__ import annotations

from lessonkit.grammar.json_rules import json_equal

MAX = {"minLength", "minItems", "minimum", "exclusiveMinimum", "minProperties"}
MIN = {"maxLength", "maxItems", "maximum", "exclusiveMaximum", "maxProperties"}


OBJECT_NAMES = ("properties", "additionalProperties", "patternProperties")


class Conflict(Exception):
    def __init__(self, keyword: str, why: str):
        super().__init__(why)
        self.keyword = keyword


def both(x, y):
    """allOf of two schemas, simplified where one is trivially true or false."""
    if x is True or x == {}:
        return y
    if y is True or y == {}:
        return x
    if x is False or y is False:
        return False
    return {"allOf": [x, y]}


def _types(t) -> set[str]:
    t = {t} if isinstance(t, str) else set(t)
    return t | {"integer"} if "number" in t else t


def merge(a: dict, b: dict, accepts, annotations) -> dict:
    """One schema equal to allOf [a, b] (dicts without $ref); `accepts(schema, value)` is the oracle
    used to filter enum/const values."""
    out = {k: v for k, v in a.items() if k not in annotations}
    for k, v in b.items():
        if k in annotations:
            continue
        if k not in out or out[k] == v:
            out[k] = v
        elif k == "type":
            t = _types(out[k]) & _types(v)      # integer lies within number
            if not t:
                raise Conflict("type", f"allOf parts have no type in common ({out[k]!r}, {v!r})")
            out[k] = sorted(t)
        elif k == "required":
            out[k] = list(dict.fromkeys(out[k] + v))
        elif k in MAX:
            out[k] = max(out[k], v)
        elif k in MIN:
            out[k] = min(out[k], v)
        elif k in ("enum", "const"):
            continue                      # handled below, with both parts' values
        elif k not in ("properties", "additionalProperties", "prefixItems", "items"):
            raise Conflict(k, f"allOf parts disagree on {k!r} and cannot be merged")
    for k in ("unevaluatedProperties", "unevaluatedItems"):
        if k in a or k in b:              # what counts as evaluated changes with the merge
            raise Conflict(k, f"{k} inside allOf or next to a merged keyword is not compiled")
    for x, y in ((a, b), (b, a)):        # per-name pairing below does not know about patterns
        if "patternProperties" in x and any(k in y for k in OBJECT_NAMES):
            raise Conflict("patternProperties", "allOf parts with patternProperties and other per-name rules")
    _values(out, a, b, accepts)
    _objects(out, a, b)
    _arrays(out, a, b)
    return out


def _values(out: dict, a: dict, b: dict, accepts) -> None:
    finite = [s for s in (a, b) if "enum" in s or "const" in s]
    if not finite:
        return
    base = finite[0]
    values = [base["const"]] if "const" in base else list(base["enum"])
    values = [v for v in values if accepts(a, v) and accepts(b, v)]
    uniq = []
    for v in values:
        if not any(json_equal(v, u) and type(v) is type(u) for u in uniq):
            uniq.append(v)
    out.pop("const", None)
    out["enum"] = uniq


def _objects(out: dict, a: dict, b: dict) -> None:
    if not any(k in s for s in (a, b) for k in ("properties", "additionalProperties")):
        return
    pa, pb = a.get("properties", {}), b.get("properties", {})
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    out["properties"] = {n: both(pa.get(n, xa), pb.get(n, xb)) for n in dict.fromkeys([*pa, *pb])}
    addl = both(xa, xb)
    if addl is True:
        out.pop("additionalProperties", None)
    else:
        out["additionalProperties"] = addl


def _arrays(out: dict, a: dict, b: dict) -> None:
    if not any(k in s for s in (a, b) for k in ("prefixItems", "items")):
        return
    qa, qb = a.get("prefixItems", []), b.get("prefixItems", [])
    ia, ib = a.get("items", True), b.get("items", True)
    n = max(len(qa), len(qb))
    prefix = [both(qa[i] if i < len(qa) else ia, qb[i] if i < len(qb) else ib) for i in range(n)]
    out.pop("prefixItems", None)
    if prefix:
        out["prefixItems"] = prefix
    items = both(ia, ib)
    if items is True:
        out.pop("items", None)
    else:
        out["items"] = items
