"""Object and array rules of the JSON-Schema compiler (lessonkit.grammar.json_schema): properties in the
schema's order, required and additional keys, pattern properties, min/max properties, items, prefixItems
and contains. A mixin of SchemaCompiler: it uses the compiler's rule(), seq(), schema() and helpers."""
from __future__ import annotations

import re

from lessonkit.grammar.gbnf import byte_class, literal, repeat_suffix
from lessonkit.grammar.json_rewrite import _ptr
from lessonkit.grammar.json_rules import json_string_content
from lessonkit.grammar.regex import RegexCompiler

EMPTY = '""'


class ContainerRules:
    """Grammar rules for objects and arrays (mixed into SchemaCompiler)."""

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
        for k in dict.fromkeys(required):
            if k in props:
                continue
            if addl is False:   # the name must be present but no schema allows it
                raise self.err(_ptr(where, "required"), f"required property {k!r} is not in properties and "
                               "additionalProperties is false: no instance is valid (unsatisfiable schema)")
            entries.append((k, addl, True))     # a name outside properties follows additionalProperties
        kvs = []
        for name, sub, req in entries:
            if sub is False:
                if req:
                    raise self.err(_ptr(where, "properties", name), f"required property {name!r} has schema false: "
                                   "no instance is valid (unsatisfiable schema)")
                continue
            value = self.schema(sub, _ptr(where, "properties", name) if name in props
                                else _ptr(where, "additionalProperties"))
            kvs.append((self.seq(literal('"' + json_string_content(name) + '"'), W, '":"', W, value), req))
        sep = self.seq(W, '","', W)
        pattern_extra = self.pattern_properties(s, [name for name, _, _ in entries], where)
        if pattern_extra is not None:
            extra = pattern_extra
        elif addl is False:
            extra = None
        else:
            if addl is not True and not isinstance(addl, dict):
                raise self.err(_ptr(where, "additionalProperties"), "additionalProperties must be a boolean or a schema")
            value = self.schema(addl, _ptr(where, "additionalProperties"))
            key = self.key_not_in([name for name, _, _ in entries], _ptr(where, "additionalProperties"))
            extra = self.rule(where + "-extra", self.seq(key, W, '":"', W, value))
        if "minProperties" in s or "maxProperties" in s:
            return self.counted_obj(s, kvs, extra, sep, where)
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

    def pattern_properties(self, s: dict, names: list[str], where: str) -> str | None:
        """The member rule for keys matching the one pattern of patternProperties, or None when there is
        none. Exact only with additionalProperties: false and no declared name matching the pattern (an
        extra key could then repeat a declared one); anything else is refused."""
        pp = s.get("patternProperties")
        ptr = _ptr(where, "patternProperties")
        if pp is None or pp == {}:
            return None
        if not isinstance(pp, dict):
            raise self.err(ptr, "patternProperties must be an object")
        if len(pp) != 1:
            raise self.err(ptr, "patternProperties with more than one pattern is not compiled (a key may match several)")
        if s.get("additionalProperties", True) is not False:
            raise self.err(ptr, "patternProperties is compiled only next to additionalProperties: false (keys no "
                                "pattern matches would need the pattern's complement)")
        (pat, sub), = pp.items()
        try:
            rx = re.compile(pat)
        except re.error:
            raise self.err(ptr, f"pattern {pat!r} is not a valid regex") from None
        clash = [n for n in names if rx.search(n)]
        if clash:
            raise self.err(ptr, f"the declared property {clash[0]!r} matches the pattern {pat!r} (not compiled)")
        if sub is False:
            return None
        W = self.W
        key = RegexCompiler(pat, self, _ptr(ptr, pat)).compile()
        value = self.schema(sub, _ptr(ptr, pat))
        return self.rule(where + "-pattern-member", self.seq('"\\""', key, '"\\""', W, '":"', W, value))

    def counted_obj(self, s: dict, kvs: list, extra: str | None, sep: str, where: str) -> str:
        """Members with minProperties/maxProperties. R(i, d): members from declared index i on, d declared
        members emitted. Extra keys may repeat one another (json.loads keeps the last), so toward
        minProperties all extras together count as one; toward maxProperties each counts."""
        lo, hi = s.get("minProperties", 0), s.get("maxProperties")
        for k, v in (("minProperties", lo), ("maxProperties", hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise self.err(_ptr(where, k), f"{k} must be a non-negative integer")
        cap = hi if hi is not None else max(lo, 1)
        memo: dict = {}

        def tail(d):
            a = 0 if d >= lo else (1 if d == lo - 1 and extra is not None else None)
            b = None if hi is None else hi - d
            if a is None or b is not None and b < a:
                return None
            if extra is None or b == 0:
                return ""
            if d > 0:
                return f"( {sep} {extra} )" + repeat_suffix(a, b)
            body = f"{extra} ( {sep} {extra} )" + repeat_suffix(0, None if b is None else b - 1)
            return body if a else f"( {body} )?"

        def R(i, d):
            d = min(d, cap)
            if (i, d) not in memo:
                if i == len(kvs):
                    memo[i, d] = tail(d)
                else:
                    kv, req = kvs[i]
                    alts = []
                    if hi is None or d + 1 <= hi:
                        nxt = R(i + 1, d + 1)
                        if nxt is not None:
                            alts.append(self.seq(sep if d else "", kv, nxt))
                    if not req:
                        nxt = R(i + 1, d)
                        if nxt is not None:
                            alts.append(nxt or EMPTY)
                    if not alts:
                        memo[i, d] = None
                    elif len(alts) == 1:
                        memo[i, d] = f"( {alts[0]} )" if alts[0] != EMPTY else ""
                    else:
                        memo[i, d] = self.rule(f"{where}-n{i}-{d}", " | ".join(alts))
            return memo[i, d]

        body = R(0, 0)
        if body is None:
            k = "minProperties" if "minProperties" in s else "maxProperties"
            why = ("the declared properties plus one additional key cannot reach it (additional keys may "
                   "repeat one another, so a grammar cannot count them as distinct)" if extra is not None and
                   k == "minProperties" else "no object fits it (unsatisfiable schema)")
            raise self.err(_ptr(where, k), f"{k}: {why}")
        W = self.W
        return self.rule(where + "-obj", self.seq('"{"', W, body, W, '"}"'))

    def key_not_in(self, names: list[str], where: str) -> str:
        """A JSON string key whose (canonical) content is none of `names`."""
        if not names:
            return self.helper("string")
        raws = [json_string_content(n).encode("utf-8") for n in names]
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
                alts.append(f"{literal(bytes([b]))} {node_rule(node[b], prefix + bytes([b]))}")
            other = set(range(0x20, 0x80)) - {0x22, 0x5C} - set(kids)
            if other:
                alts.append(f"{byte_class(other)} {tail}")
            alts.append(f'utf8 {tail}')
            alts.append(f'"\\\\" kesc {tail}')   # no escape of a printable ASCII (name) character
            self.helper("kesc")
            return self.rule(where + "-key", " | ".join(alts))

        return self.seq('"\\""', node_rule(trie, b""))

    # -- arrays
    def array(self, s: dict, where: str) -> str | None:
        W = self.W
        if "contains" in s and s.get("minContains", 1) != 0:
            return self.contains(s, where)
        s = {k: v for k, v in s.items() if k not in ("contains", "minContains")}   # minContains 0, or no contains
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
            if p is False:      # nothing may stand at position i, so the array ends before it
                k = i
                hi = k if hi is None else min(hi, k)
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
                tail = f"( {sep} {item} )" + repeat_suffix(a, b)
            else:
                rest = f"( {sep} {item} )" + repeat_suffix(max(a - 1, 0), None if b is None else b - 1)
                tail = f"{item} {rest}".strip()
                if a == 0:
                    tail = f"( {tail} )?"
        A = tail
        for i in range(k - 1, -1, -1):
            body = self.seq(sep if i > 0 else "", elems[i], A)
            A = self.rule(f"{where}-a{i}", f'{body} | ""') if i >= lo else f"( {body} )"
        return self.rule(where + "-arr", self.seq('"["', W, A, W, '"]"'))

    def contains(self, s: dict, where: str) -> str | None:
        """Arrays where at least minContains (default 1) items also satisfy `contains`:
        [ X H (, X H){m-1} (, I)* ] with X = (I ,)*, H = I and C; None if no array fits.
        Exact for uniform items; next to prefixItems or item counts: refused."""
        ptr = _ptr(where, "contains")
        m = s.get("minContains", 1)
        if not isinstance(m, int) or isinstance(m, bool) or m < 0:
            raise self.err(_ptr(where, "minContains"), "minContains must be a non-negative integer")
        for k in ("prefixItems", "minItems", "maxItems"):
            if k in s and not (k == "minItems" and s[k] <= m):
                raise self.err(ptr, f"unsupported keyword 'contains' next to {k!r}")
        items = s.get("items", True)
        both = self.conjoin(items, s["contains"], ptr)
        if both is False:
            return None
        W, sep = self.W, self.seq(self.W, '","', self.W)
        item = self.schema(items, _ptr(where, "items")) if items is not False else None
        hit = self.schema(both, ptr)
        if item is None:
            body = self.seq(hit, f"( {sep} {hit} )" + repeat_suffix(m - 1, None))
        else:
            x_hit = f"( {item} {sep} )* {hit}"
            body = self.seq(x_hit, f"( {sep} {x_hit} )" + repeat_suffix(m - 1, m - 1), f"( {sep} {item} )*")
        return self.rule(where + "-contains", self.seq('"["', W, body, W, '"]"'))
