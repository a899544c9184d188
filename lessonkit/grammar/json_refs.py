"""References across embedded schema resources: `$id` below the root, relative and absolute URIs.

A `$id` starts a schema resource whose URI, resolved against the enclosing base URI, is what
references inside it are relative to: `#/$defs/x` inside `{"$id": "nested.json", ...}` means that
resource's `$defs`, not the document's. `resolve_references` walks the schema positions (not data
such as `const`, `enum`, `default`), records every resource and `$anchor`, and rewrites each `$ref`
to a pointer from the document root, so the compiler sees only document-local references. A
reference to a resource the document does not hold (a remote one) is left as its absolute URI and
refused later by the compiler, naming it; `$dynamicRef` is not touched (the compiler refuses it).
"""
from __future__ import annotations

import urllib.parse

# keywords whose value is a schema, a list of schemas, or a map from names to schemas
ONE = ("additionalProperties", "items", "contains", "propertyNames", "not", "if", "then", "else",
       "unevaluatedItems", "unevaluatedProperties")
MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
ROOT_BASE = "https://lessonkit.invalid/schema.json"     # the base URI of a document without a root $id


def _ptr(base: str, *parts) -> str:
    return base + "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def subschemas(s: dict, where: str):
    """(subschema, pointer) for every schema position directly inside `s`."""
    for k in ONE:
        if k in s:
            yield s[k], _ptr(where, k)
    for k in MANY:
        if isinstance(s.get(k), list):
            for i, x in enumerate(s[k]):
                yield x, _ptr(where, k, i)
    for k in NAMED:
        if isinstance(s.get(k), dict):
            for name, x in s[k].items():
                yield x, _ptr(where, k, name)


def _join(base: str, ref: str) -> str:
    """`ref` resolved against `base`; a fragment-only reference keeps the base whatever its scheme
    (urljoin leaves 'urn:...' bases alone and would return the bare fragment)."""
    if ref.startswith("#") or not ref:
        return base + ref
    return urllib.parse.urljoin(base, ref)


def _base_of(s: dict, base: str) -> str:
    sid = s.get("$id")
    return urllib.parse.urldefrag(_join(base, sid))[0] if isinstance(sid, str) else base


def _register(s, where: str, base: str, resources: dict, anchors: dict) -> None:
    stack = [(s, where, base)]
    while stack:
        s, where, base = stack.pop()
        if not isinstance(s, dict):
            continue
        base = _base_of(s, base)
        if "$id" in s:
            resources.setdefault(base, where)
        if isinstance(s.get("$anchor"), str):
            anchors.setdefault((base, s["$anchor"]), []).append(where)
        stack += [(x, w, base) for x, w in subschemas(s, where)]


def _target(ref: str, base: str, resources: dict, anchors: dict) -> str | None:
    """'#pointer' from the document root for `ref` seen under `base`, or None if the document lacks it."""
    uri, frag = urllib.parse.urldefrag(_join(base, ref))
    if uri not in resources:
        return None
    frag = urllib.parse.unquote(frag)
    if frag and not frag.startswith("/"):
        found = anchors.get((uri, frag), [])
        if len(found) != 1:
            return None
        pointer = found[0]
    else:
        pointer = resources[uri] + frag
    return urllib.parse.quote(pointer, safe="#/~!$&'()*+,;=:@")


def resolve_references(root):
    """A copy of `root` whose `$ref`s are pointers from the document root ('#/...'), nested `$id` and
    `$anchor` dropped (their work is done); unresolvable references keep their text (root resource)
    or become absolute URIs (inside a nested resource), which the compiler refuses by name."""
    if not isinstance(root, dict) or not _needs_resolving(root):
        return root
    base = _base_of(root, ROOT_BASE)
    resources, anchors = {base: "#"}, {}
    _register(root, "#", ROOT_BASE, resources, anchors)
    return _rewrite(root, "#", ROOT_BASE, base, resources, anchors)


def _needs_resolving(root: dict) -> bool:
    """A nested `$id`, or a reference that is not a plain '#...' fragment."""
    stack = [(root, "#")]
    while stack:
        s, where = stack.pop()
        if isinstance(s, dict):
            if where != "#" and isinstance(s.get("$id"), str):
                return True
            if isinstance(s.get("$ref"), str) and not s["$ref"].startswith("#"):
                return True
            stack += list(subschemas(s, where))
    return False


def _rewrite(s, where: str, base: str, root_base: str, resources: dict, anchors: dict):
    if not isinstance(s, dict):
        return s
    base = _base_of(s, base)
    out = dict(s)
    if where != "#":
        out.pop("$id", None)
        out.pop("$anchor", None)
    if isinstance(s.get("$ref"), str):
        target = _target(s["$ref"], base, resources, anchors)
        if target is not None:
            out["$ref"] = target
        elif base != root_base:
            out["$ref"] = _join(base, s["$ref"])
    for k in ONE:
        if k in s:
            out[k] = _rewrite(s[k], _ptr(where, k), base, root_base, resources, anchors)
    for k in MANY:
        if isinstance(s.get(k), list):
            out[k] = [_rewrite(x, _ptr(where, k, i), base, root_base, resources, anchors) for i, x in enumerate(s[k])]
    for k in NAMED:
        if isinstance(s.get(k), dict):
            out[k] = {n: _rewrite(x, _ptr(where, k, n), base, root_base, resources, anchors) for n, x in s[k].items()}
    return out
