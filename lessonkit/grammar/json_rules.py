"""JSON values for the schema compiler: the value grammar and string formats as GBNF helper rules,
the canonical text of a string, and JSON's own type and equality tests.

Each helper rule lists the helpers it needs; `SchemaCompiler` emits only the ones it reached.
"""
from __future__ import annotations

import json

# Helper rules the compiled grammar may use; each lists the helpers it needs.
HELPER_RULES = {
    # one code point: a surrogate pair written as two escapes is one character; a lone surrogate
    # escape is refused (json.loads accepts it, so this is the safe side)
    "jchar": ('[\\x20-\\x21\\x23-\\x5B\\x5D-\\x7F] | utf8 | "\\\\" ( ["\\\\/bfnrt] | "u" ucode )',
              ["utf8", "ucode"]),
    "ucode": ('[0-9a-cA-CeEfF] hex{3} | [dD] [0-7] hex{2} | [dD] [89abAB] hex{2} "\\\\u" [dD] [c-fC-F] hex{2}',
              ["hex"]),
    # an escape (after the backslash) that cannot denote a printable ASCII character
    "kesc": ('["\\\\bfnrt] | "u" ( "00" [01] hex | "00" [89a-fA-F] hex | "0" [1-9a-fA-F] hex{2}'
             ' | [1-9a-cA-CeEfF] hex{3} | [dD] [0-7] hex{2} | [dD] [89abAB] hex{2} "\\\\u" [dD] [c-fC-F] hex{2} )',
             ["hex"]),
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


def json_string_content(s: str) -> str:
    """The canonical raw JSON-string content of s (without the quotes)."""
    return json.dumps(s, ensure_ascii=False)[1:-1]


def has_type(v, t: str) -> bool:
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


def json_equal(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b
