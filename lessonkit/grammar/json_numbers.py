"""Numeric ranges as digit grammars, for the schema compiler (`minimum`, `maximum`, exclusive forms).

Integers are exact: a range [lo, hi] becomes the canonical decimal strings in it, split by digit
count and then digit by digit (the classic range-to-regex construction). Numbers are exact for
integer bounds up to 10**6 in size: an instance I.F (no exponent) compares with an integer bound
through its integer part I and whether F is zero. Where a strict bound meets a fraction (x > a with
I = a, x < b with I = b - 1) the fraction is kept at least 1e-9 away from the bound, so that
json.loads' rounding to a double can never land on it (a double's spacing near 10**6 is 1.2e-10);
that rejects a few valid texts, never accepts an invalid one.
"""
from __future__ import annotations

from lessonkit.grammar.gbnf import literal

NUMBER_BOUND_LIMIT = 10 ** 6
F_ANY = '( "." [0-9]+ )?'
F_BELOW_ONE = '( "." ( "9"{0,8} [0-8] [0-9]* | "9"{1,8} ) )?'   # fraction <= 1 - 1e-9
F_NONZERO = '"." [0-9]{0,8} [1-9]'                                # 1e-9 <= fraction <= 1 - 1e-9
F_ZERO = '( "." "0"+ )?'


def _alt(alts: list[str]) -> str:
    alts = [a for a in alts if a]
    if len(alts) <= 1:
        return alts[0] if alts else ""
    return "( " + " | ".join(alts) + " )"


def _digits(lo: str, hi: str) -> str:
    """Decimal strings of one length from lo to hi (strings of equal length, lo <= hi)."""
    if not lo:
        return ""
    if lo[0] == hi[0]:
        return " ".join(x for x in (literal(lo[0]), _digits(lo[1:], hi[1:])) if x)
    n = len(lo) - 1
    tail = f" [0-9]{{{n}}}" if n > 1 else (" [0-9]" if n == 1 else "")
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        return f"[{lo[0]}-{hi[0]}]{tail}"
    alts = [" ".join(x for x in (literal(lo[0]), _digits(lo[1:], "9" * n)) if x)]
    if int(hi[0]) - int(lo[0]) >= 2:
        alts.append(f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]{tail}")
    alts.append(" ".join(x for x in (literal(hi[0]), _digits("0" * n, hi[1:])) if x))
    return _alt(alts)


def uint_range(lo: int, hi: int | None) -> str:
    """Canonical non-negative integers in [lo, hi] (hi None: no upper bound); '' if none."""
    if hi is not None and hi < lo:
        return ""
    top = len(str(hi)) if hi is not None else len(str(lo))
    alts = []
    for n in range(len(str(lo)), top + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = 10 ** n - 1 if hi is None else min(hi, 10 ** n - 1)
        if a <= b:
            alts.append(_digits(str(a), str(b)))
    if hi is None:
        alts.append(f"[1-9] [0-9]{{{top},}}")
    return _alt(alts)


def int_range(lo: int | None, hi: int | None) -> str:
    """Canonical JSON integers in [lo, hi] (None: unbounded); '' if none. '-0' is not written."""
    alts = []
    if hi is None or hi >= 0:
        alts.append(uint_range(max(lo, 0) if lo is not None else 0, hi))
    if lo is None or lo < 0:
        mag = uint_range(max(-hi, 1) if hi is not None else 1, -lo if lo is not None else None)
        if mag:
            alts.append(f'"-" {mag}')
    return _alt(alts)


def magnitude(a: int, a_strict: bool, b: int | None, b_strict: bool) -> str:
    """Texts I.F (no sign, no exponent) for a magnitude m with a <(=) m <(=) b; '' if none."""
    alts = []
    lo_i = a + 1 if a_strict else a
    ints = uint_range(lo_i, None if b is None else b - 1)
    if ints:
        alts.append(f"{ints} {F_BELOW_ONE if b_strict else F_ANY}")
    if a_strict and (b is None or a + 1 <= b):
        alts.append(f"{literal(str(a))} {F_NONZERO}")
    if b is not None and not b_strict and (b > a or b == a and not a_strict):
        alts.append(f"{literal(str(b))} {F_ZERO}")
    return _alt(alts)


def number_range(lo: int | None, lo_strict: bool, hi: int | None, hi_strict: bool) -> str:
    """JSON numbers (no exponent) x with lo <(=) x <(=) hi, integer bounds; '' if none."""
    alts = []
    if hi is None or hi > 0 or hi == 0 and not hi_strict:
        low = (lo, lo_strict) if lo is not None and lo >= 0 else (0, False)
        alts.append(magnitude(*low, hi, hi_strict))
    if lo is None or lo < 0:
        low = (-hi, hi_strict) if hi is not None and hi < 0 else (0, True)
        mag = magnitude(*low, None if lo is None else -lo, lo_strict)
        if mag:
            alts.append(f'"-" {mag}')
    return _alt(alts)


def multiples(d: int) -> tuple[str, dict[str, str]]:
    """Canonical JSON integers divisible by d (1 <= d): a remainder automaton over the digits, as rules
    `m{r}` (the digits still to come, r the remainder so far). Returns (start, {rule: body})."""
    rules = {}
    for r in range(d):
        by_target: dict[int, list[int]] = {}
        for c in range(10):
            by_target.setdefault((10 * r + c) % d, []).append(c)
        alts = ['""'] if r == 0 else []
        alts += [f"[{''.join(str(c) for c in cs)}] m{t}" for t, cs in sorted(by_target.items())]
        rules[f"m{r}"] = " | ".join(alts)
    firsts: dict[int, list[int]] = {}
    for c in range(1, 10):
        firsts.setdefault(c % d, []).append(c)
    mag = " | ".join(f"[{''.join(str(c) for c in cs)}] m{t}" for t, cs in sorted(firsts.items()))
    return f'"-"? ( {mag} ) | "0"', rules
