"""The fuzz layer (issue 35): hostile arguments for every `lessonkit` command, built from the command
table lessonkit.cli.COMMANDS, and hostile files for every file the workbook reads, run under a memory
limit and a timeout with a victim tree hashed around each case.

Two pieces here (tests/fuzz_run.py runs them and checks the rules):
* `any_command_argv()` / `case_lists(n)`: hypothesis strategies of argument lists for the commands of
  the table. Numbers come from each option's own `number(...)` bounds (lo, hi, one past them, 0, -0,
  NaN, inf, 1e308, 1e-300, 2**63, 2**64, 2**70, 5,000 digits, Arabic-Indic digits, ...), text from a
  list of hostile strings (empty, 100,000 characters, invalid UTF-8 as argv delivers it: lone
  surrogates via os.fsdecode / surrogateescape, leading dashes, newlines).
* `materialise(spec)`: every path argument names a file built for the case: valid, missing, empty,
  truncated, bit-flipped, the wrong JSON type, nested 100,000 deep, invalid UTF-8, 8 MB, a directory,
  a FIFO, a symlink to the victim tree, a dangling symlink into it, a symlink loop; for a directory
  argument (a model, a prefix cache, Epoch's data) one member file gets the damage, or the directory
  itself is replaced; 15% of the files get a name that is not UTF-8. A quarter of the executed cases
  also damage $LESSONKIT_HOME/verified.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from lessonkit.cli import COMMANDS  # noqa: E402

# commands the fuzz executes; the others (training, the main job, benchmarks, ...) take minutes a case
# and are fuzzed at the parsing level only (every value reaches its argparse type)
EXECUTED = {("models",), ("generate",), ("compare",), ("export",), ("gap",), ("grammar", "compile"),
            ("grammar", "check"), ("prefix-cache",)}
# path arguments (argparse dest) -> the kind of file the workbook reads or writes there
PATH_KIND = {"model": "model", "name": "model", "grammar": "gbnf", "schema": "schema", "prefix_cache": "pcdir",
             "dir": "pcdir", "old": "summary", "new": "summary", "out_dir": "outdir", "out": "outdir",
             "build_dir": "outdir", "data": "epoch", "files": "jsondoc", "store": "sqlite", "head": "safetensors"}
# cheap values for the arguments that set how much work a case does (executed cases only)
WORK = {"max_new_tokens": ["0", "1", "3"], "boot": ["1", "2", "5"], "repeats": ["1"], "limit": ["5"]}
FILE_VARIANTS = ("valid", "missing", "empty", "truncated", "bitflip", "wrong_type", "deep", "invalid_utf8",
                 "huge", "directory", "fifo", "symlink_victim", "dangling", "loop")
DIR_VARIANTS = ("valid", "missing", "empty_dir", "file", "symlink_victim", "member")


# ---- the command table ---------------------------------------------------------------------------------------------
def commands(table=COMMANDS, prefix=()):
    """(command words, [(flags, kw, group)]) for every leaf command; group: index of a mutually exclusive
    group (or None)."""
    out = []
    for name, entry in table.items():
        if isinstance(entry[1], dict):
            out += commands(entry[1], prefix + (name,))
            continue
        args = []
        for i, a in enumerate(entry[2]):
            if a[0] == "one of":
                args += [(flags, kw, (i, a[2])) for flags, kw in a[1]]
            else:
                args.append((a[0], a[1], None))
        out.append((prefix + (name,), args))
    return out


def dest(flags, kw) -> str:
    if "dest" in kw:
        return kw["dest"]
    long = [f for f in flags if f.startswith("--")]
    return (long[0] if long else flags[0]).lstrip("-").replace("-", "_")


def bounds(parse) -> dict | None:
    """The lo/hi/integer of a cli.number(...) parser (its attributes); {} for int; None otherwise."""
    from lessonkit.cli import number
    if parse is int:
        return {"integer": True, "lo": None, "hi": None}
    if isinstance(parse, number):
        return {n: getattr(parse, n) for n in ("lo", "hi", "integer", "zero_or_from")}
    return None


# ---- hostile values ------------------------------------------------------------------------------------------------
HOSTILE_TEXT = ["", " ", "-", "--", "-x", "x" * 100_000, os.fsdecode(b"caf\xe9\xff"), os.fsdecode(b"\xc3"),
                "\u202e", "a\nb", "é" * 50, "../../../etc/passwd", "%s%n{0}", "nan", "ngram:0",
                "model:/nonexistent", "oracle:2", "mtp:x", "grammar:nope", "tiny-moe"]


def hostile_numbers(b: dict) -> list[str]:
    vals = ["0", "-0", "-1", "1", "nan", "-inf", "inf", "1e308", "-1e308", "1e-300", str(2**63), str(2**64),
            str(2**70), str(-(2**63) - 1), "9" * 5000, "\u0661\u0662", "0x10", "1_000", " 7 ", "1e5", "0.5", ""]
    for edge in (b.get("lo"), b.get("hi"), b.get("zero_or_from")):
        if edge is not None:
            vals += [repr(edge), repr(edge - 1), repr(edge + 1)]
            if not b.get("integer"):
                vals += [repr(edge * (1 - 1e-12)), repr(edge * (1 + 1e-12) + 1e-300)]
    return vals


PLAUSIBLE = {"prompt": ["The river keeps", "{"], "stop": [".", "\n"], "draft": ["ngram", "ngram:3", "tiny-draft"],
             "draft_k": ["auto", "2", "0"], "quant": ["none", "int8"], "only": ["engine"], "preset": ["test"]}


def accepted(parse, text: str) -> bool:
    try:
        parse(text)
        return True
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False


def choose_value(rnd, flags, kw, hostile: bool):
    """What one argument receives: a value its type accepts (edges included: 1e-300 for a top-p, 1e308
    for a budget) or, if hostile, any of the hostile ones; a path argument gets a file placeholder."""
    d = dest(flags, kw)
    b = bounds(kw.get("type"))
    if "choices" in kw:
        good, bad = list(kw["choices"]), HOSTILE_TEXT
    elif d in PATH_KIND:
        return choose_file(rnd, PATH_KIND[d], hostile)
    elif b is not None:
        bad = hostile_numbers(b)
        good = [v for v in bad if accepted(kw["type"], v)] or bad
    else:
        good, bad = PLAUSIBLE.get(d, ["x"]), HOSTILE_TEXT
    return rnd.choice(bad if hostile else good)


def choose_file(rnd, kind: str, hostile: bool):
    """A placeholder {"file": kind, "variant": ..., "member": i, "at": fraction} that materialise builds."""
    variants = DIR_VARIANTS if kind in ("model", "pcdir", "epoch") else FILE_VARIANTS
    if kind == "outdir":
        variants = ("missing", "empty_dir", "file", "symlink_victim", "dangling", "loop", "nonempty")
    if kind == "model" and (not hostile or rnd.random() < 0.2):  # a registered name mostly: the model loads
        return "tiny-moe" if not hostile else rnd.choice(HOSTILE_TEXT)
    if kind == "gbnf" and not hostile and rnd.random() < 0.5:
        return rnd.choice(["json", "ndjson-compact"])
    variant = rnd.choice(variants) if hostile else "missing" if kind == "outdir" else "valid"
    return {"file": kind, "variant": variant, "member": rnd.randrange(8), "odd_name": rnd.random() < 0.15,
            "member_variant": rnd.choice(FILE_VARIANTS[1:]), "at": rnd.random()}


def build_argv(rnd, path: tuple, args: list, executed: bool = False) -> list:
    """An argument list for one command: required arguments always, each optional one half the time (a
    third when executed), one member of an exclusive group (always if it is required), flags as given.
    Executed cases get 0, 1 or 2 hostile values (so that the rest of the command runs), parse-level ones
    any number."""
    chosen, groups = [], {}
    for flags, kw, group in args:
        if group is not None:
            groups.setdefault(group, []).append((flags, kw))
        elif not flags[0].startswith("-") or kw.get("required") or rnd.random() < (0.3 if executed else 0.5) or (
                executed and dest(flags, kw) in ("model", *WORK)):
            chosen.append((flags, kw))
    for (_, required), members in groups.items():
        if required or rnd.random() < 0.5:
            chosen.append(rnd.choice(members))
    if executed:
        bad = set(rnd.sample(range(len(chosen)), min(len(chosen), rnd.choice([0, 0, 1, 1, 1, 2]))))
    else:
        bad = {i for i in range(len(chosen)) if rnd.random() < 0.3}
    argv = list(path)
    for i, (flags, kw) in enumerate(chosen):
        argv += arg_words(rnd, flags, kw, i in bad, executed)
    return argv


def arg_words(rnd, flags, kw, hostile: bool, executed: bool) -> list:
    if kw.get("action") == "store_true":
        return [flags[0]]
    d = dest(flags, kw)
    if executed and d in WORK:
        values = [rnd.choice(WORK[d])]
    else:
        values = [choose_value(rnd, flags, kw, hostile) for _ in range(1 + (kw.get("nargs") == "+" and rnd.random() < 0.3))]
    if not flags[0].startswith("-") or len(values) > 1:
        return values
    v = values[0]                              # --flag=-x: a value that starts with a dash is still a value
    return [f"{flags[0]}={v}"] if isinstance(v, str) and v.startswith("-") else [flags[0], v]


def random_argv(rnd, executed_only: bool = False) -> list:
    """An argv for any command of the table (parse level), or for an executed one."""
    table = [(p, a) for p, a in commands() if not executed_only or p in EXECUTED]
    return build_argv(rnd, *rnd.choice(table), executed_only)


def any_command_argv(executed_only: bool = False):
    """The hypothesis strategy: hypothesis draws the seed of a random.Random (fixed in the short run,
    derandomised), the choices are made with it, so every command, value and file variant is as likely
    as listed (a long list drawn element by element ran out of hypothesis's buffer and repeated its
    simplest element)."""
    return st.randoms(use_true_random=True).map(lambda rnd: random_argv(rnd, executed_only))


def case_lists(n: int):
    """n executed cases from one drawn seed; a quarter of them also damage $LESSONKIT_HOME/verified.json,
    the hash memo every model load reads."""
    def cases(rnd):
        return [{"argv": random_argv(rnd, True),
                 "home": choose_file(rnd, "memo", True) if rnd.random() < 0.25 else None} for _ in range(n)]
    return st.randoms(use_true_random=True).map(cases)


# ---- fixed cases: each defect class a long run found, run by every fuzz run (the short one in the suite too) --------
_MEMO_DAMAGED = {"file": "memo", "variant": "truncated", "member": 0, "odd_name": False, "member_variant": "missing",
                 "at": 0.5}
FIXED_CASES = [
    # issue 60: exit 0 under the fuzz's limits, exit 2 on its clean twin run after it in the same worker: the twin
    # ran out of address space (the case had started 63 OpenMP and 63 kernel threads) and the failed mmap was
    # reported as a corrupt dense.safetensors. Exit 0 and these tokens are right (the command is valid: a budget
    # past the model's size keeps every expert); the twin now gives them too
    {"argv": ["generate", "--model", "tiny-moe", "--prompt", "{", "--max-new-tokens", "3", "--expert-budget-mb",
              "1099511627775", "--draft", "ngram:3", "--threads", "64", "--weights", "native"], "home": None},
    # issue 60: `models` with a damaged memo built merged models under the limit (a 113 MB float32 layer: traceback)
    {"argv": ["models", "--json"], "home": _MEMO_DAMAGED},
    # issue 60: --threads 64 started torch's OpenMP threads (libgomp: Thread creation failed); --prefetch's thread
    {"argv": ["generate", "--model", "tiny-moe", "--prompt", "The river", "--max-new-tokens", "3", "--threads", "64",
              "--json"], "home": _MEMO_DAMAGED},
    {"argv": ["generate", "--model", "tiny-moe", "--prompt", "The river", "--max-new-tokens", "3", "--prefetch",
              "--expert-budget-mb", "2", "--json"], "home": None},
]


# ---- clean twins (the answer check) ----------------------------------------------------------------------------------
# files whose damage the workbook must detect or repair (checksums, manifests, rebuilds): a case that exits 0
# gives the answer of its clean twin. The others' content is the question (a damaged schema asks another one).
INTEGRITY_KINDS = {"model", "pcdir", "memo", "outdir"}


def clean_case(case: dict) -> dict:
    """The same command with every file valid (an output directory missing) and no damaged memo."""
    def clean(a):
        if not isinstance(a, dict):
            return a
        return {"file": a["file"], "variant": "missing" if a["file"] == "outdir" else "valid", "member": 0,
                "odd_name": a.get("odd_name", False), "member_variant": "missing", "at": 0.0}
    return {"argv": [clean(a) for a in case["argv"]], "home": None}


def content_damaged(case: dict) -> bool:
    return any(isinstance(a, dict) and a["file"] not in INTEGRITY_KINDS and a["variant"] != "valid"
               for a in case["argv"])


# ---- hostile files -------------------------------------------------------------------------------------------------
def _template(kind: str) -> bytes | Path:
    if kind == "schema":
        return (ROOT / "tests" / "schemas" / "address.json").read_bytes()
    if kind == "jsondoc":
        return b'{"a": [1, 2.5, "x\\u00e9", null, true], "b": {"c": -0.0}}'
    if kind == "gbnf":
        return (ROOT / "lessonkit" / "grammar" / "grammars" / "json.gbnf").read_bytes()
    if kind == "summary":
        return json.dumps({"lessons": {"engine": {"figures": {"tok_s": 10.5, "name": "x", "n": 3}}}}).encode()
    if kind == "model":
        return ROOT / "data" / "models" / "tiny-moe"
    if kind == "epoch":
        return ROOT / "data" / "epoch"
    if kind == "safetensors":
        return (ROOT / "data" / "models" / "tiny-draft" / "dense.safetensors").read_bytes()[:4096]
    return b"SQLite format 3\x00" + bytes(100) if kind == "sqlite" else b"{}"       # memo: verified.json


def damage(data: bytes, variant: str, at: float) -> bytes:
    """The bytes of a damaged copy of `data` (variants that are not about bytes return data)."""
    i = min(int(at * len(data)), max(len(data) - 1, 0))
    if variant == "empty":
        return b""
    if variant == "truncated":
        return data[:i]
    if variant == "bitflip" and data:
        return data[:i] + bytes([data[i] ^ (1 << int(at * 8) % 8)]) + data[i + 1:]
    if variant == "wrong_type":
        return [b"[]", b"42", b'"text"', b"null", b'{"lessons": [1], "sha256": 5, "a": {"b": []}}'][int(at * 4.99)]
    if variant == "deep":
        return b"[" * 100_000 + b"]" * 100_000 if at < 0.5 else b'{"a":' * 50_000 + b"1" + b"}" * 50_000
    if variant == "invalid_utf8":
        return data[:i] + b"\xff\xfe\xed\xa0\x80" + data[i:]
    if variant == "huge":
        return data + b" " * (8 << 20) if at < 0.5 else data * max(1, (8 << 20) // max(len(data), 1))
    return data


def materialise(spec, where: Path, victim: Path) -> str:
    """Build the file or directory a placeholder names under `where`; return its path."""
    if isinstance(spec, str):
        return spec
    kind, variant, at = spec["file"], spec["variant"], spec["at"]
    p = where / f"{kind}-{variant}-{len(os.listdir(where))}"
    if spec.get("odd_name"):                  # a name that is not UTF-8 (bytes 0xff 0xfe), as argv gives it
        p = p.with_name(p.name + os.fsdecode(b"-\xff\xfe"))
    tmpl = _template(kind)
    if kind == "pcdir" and variant in ("valid", "member"):
        tmpl = prefix_cache_template(where.parent)
    if isinstance(tmpl, Path) or kind in ("outdir", "pcdir"):
        return _directory(p, tmpl if isinstance(tmpl, Path) else None, spec, victim)
    return _file(p, tmpl, variant, at, victim)


def _file(p: Path, data: bytes, variant: str, at: float, victim: Path) -> str:
    if variant == "missing":
        return str(p)
    if variant == "directory":
        p.mkdir(parents=True)
    elif variant == "fifo":
        os.mkfifo(p)
    elif variant == "symlink_victim":
        p.symlink_to(victim / "secret.txt")
    elif variant == "dangling":
        p.symlink_to(victim / "not-there" / p.name)
    elif variant == "loop":
        p.symlink_to(p)
    else:
        p.write_bytes(damage(data, variant, at))
    return str(p)


def _directory(p: Path, tmpl: Path | None, spec: dict, victim: Path) -> str:
    variant = spec["variant"]
    if variant in ("missing",):
        return str(p)
    if variant in ("file",):
        p.write_text("not a directory")
    elif variant == "symlink_victim" and spec["file"] in ("outdir", "pcdir"):
        (p.parent / "linked").mkdir()        # a directory given through a link is the directory given:
        p.symlink_to(p.parent / "linked")    # writing there is allowed, so the link stays inside the case
    elif variant == "symlink_victim":
        p.symlink_to(victim, target_is_directory=True)
    elif variant in ("dangling", "loop"):
        p.symlink_to(victim / "not-there" if variant == "dangling" else p)
    elif variant in ("empty_dir",) or tmpl is None:
        p.mkdir(parents=True)
        if variant == "nonempty":
            (p / "config.json").write_text('{"mine": true}')
    else:
        shutil.copytree(tmpl, p)
        if variant == "member":
            members = sorted(f for f in p.rglob("*") if f.is_file())
            m = members[spec["member"] % len(members)]
            data = m.read_bytes()
            m.unlink()
            _file(m, data, spec["member_variant"], spec["at"], victim)
    return str(p)


def prefix_cache_template(root: Path) -> Path:
    """A real prefix cache (one snapshot of tiny-moe), made once per sandbox by the worker."""
    t = root / "prefix-cache-template"
    if not t.exists():
        import contextlib
        import io

        from lessonkit.cli import main
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            main(["generate", "--model", "tiny-moe", "--prompt", "The river keeps its own counsel", "--max-new-tokens",
                  "1", "--json", "--prefix-cache", str(t)])
    return t


# ---- the victim tree and the shipped data ----------------------------------------------------------------------------
def make_victim(root: Path) -> Path:
    v = root / "victim"
    (v / "sub").mkdir(parents=True, exist_ok=True)
    (v / "secret.txt").write_text("outside every directory lessonkit may write\n")
    (v / "sub" / "config.json").write_text('{"keep": 1}')
    (v / "sub" / "index.json").write_text("{}")
    return v


def tree_digest(d: Path, content: bool = True) -> dict:
    """path -> sha256 (or size and mtime for content=False), symlinks as their targets; names every
    entry, so a file or directory created under d changes the digest too."""
    out = {}
    for p in sorted(Path(d).rglob("*")):
        key = str(p.relative_to(d))
        if p.is_symlink():
            out[key] = "-> " + os.readlink(p)
        elif p.is_file():
            st_ = p.stat()
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest() if content else f"{st_.st_size}:{st_.st_mtime_ns}"
        else:
            out[key] = "dir"
    return out
