"""Issue 35, part B: hostile values and files that gave a traceback, a hang or a MemoryError now get one
clear line and exit 2 (or, where the value has a sensible meaning, the right answer). Each case here
failed on the code before the fix."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lessonkit.cli import main

ROOT = Path(__file__).resolve().parents[1]
GEN = ["generate", "--model", "tiny-moe", "--prompt", "The river keeps", "--max-new-tokens", "4", "--json"]
BAD_UTF8 = os.fsdecode(b"caf\xe9 \xff")          # what argv holds for bytes that are not UTF-8


# ---- refused while parsing the command line (before any model loads) ------------------------------------------
PARSE_CASES = [
    (GEN + ["--temperature", "1", "--seed", str(2**70)], "--seed", "at most 9,223,372,036,854,775,807"),
    (["gap", "--seed", "-1"], "--seed", "at least 0"),
    (["gap", "--boot", str(10**12)], "--boot", "at most 100,000"),
    (["semcache", "run", "--seed", str(2**64)], "--seed", "at most"),
    (GEN + ["--draft", ""], "--draft", "names no drafter"),
    (GEN + ["--grammar", ""], "--grammar", "names no grammar"),
    (GEN + ["--schema", ""], "--schema", "names no file"),
    (GEN + ["--prefix-cache", ""], "--prefix-cache", "names no directory"),
    (["generate", "--model", "tiny-moe", "--prompt", BAD_UTF8], "--prompt", "not valid UTF-8 (byte 0xe9 at character 3)"),
    (GEN + ["--stop", BAD_UTF8], "--stop", "not valid UTF-8"),
    (GEN + ["--draft", BAD_UTF8], "--draft", "not valid UTF-8"),
    # found by the fuzz layer's long run (tests/test_fuzz.py)
    (GEN + ["--draft-k", "\u202e", "--schema", "s.json"], "--draft-k", "is not an integer"),
    (GEN + ["--draft-k", "100000"], "--draft-k", "at most 15"),
    (GEN + ["--prompt=--"], "--prompt=--", "'--' cannot be a value"),
    (GEN + ["--dtype=--"], "--dtype=--", "'--' cannot be a value"),
]


@pytest.mark.parametrize("argv,option,message", PARSE_CASES, ids=[" ".join(c[0][-2:])[:40] for c in PARSE_CASES])
def test_bad_value_is_refused_while_parsing(argv, option, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and option in err and message in err and "Traceback" not in err


def test_invalid_utf8_prompt_in_a_fresh_process_is_one_line():
    """Through a real argv (bytes), as a shell passes them."""
    r = subprocess.run([os.fsencode(sys.executable), b"-m", b"lessonkit", b"generate", b"--model", b"tiny-moe",
                        b"--prompt", b"\xff\xfe"], cwd=ROOT, capture_output=True)
    assert r.returncode == 2 and b"Traceback" not in r.stderr and b"not valid UTF-8" in r.stderr


# ---- sampling at the edges ----------------------------------------------------------------------------------
def test_tiny_top_p_keeps_the_top_token():
    """1e-300 rounds to 0 in float32: no token was kept and the probabilities were 0/0 = NaN."""
    from lessonkit.engine.generate import probs_from_logits
    logits = torch.tensor([[1.0, 3.0, 2.0, -1.0]])
    p = probs_from_logits(logits, 1.0, 1e-300)
    assert torch.isfinite(p).all() and p.tolist() == [[0.0, 1.0, 0.0, 0.0]]


def _tokens(capsys, *extra) -> list[int]:
    assert main(GEN + list(extra)) == 0
    return json.loads(capsys.readouterr().out)["token_ids"]


def test_tiny_top_p_and_huge_budget_generate(capsys):
    greedy = _tokens(capsys)
    assert _tokens(capsys, "--temperature", "1", "--top-p", "1e-300") == greedy      # only the top token is left
    assert _tokens(capsys, "--expert-budget-mb", "1e12") == greedy                    # every expert fits


def test_budget_below_one_expert_names_the_expert_size(capsys):
    assert main(GEN + ["--expert-budget-mb", "1e-9"]) == 2
    err = capsys.readouterr().err
    assert "smaller than one expert (1179648 bytes = 1.125 MB)" in err and "must be positive" not in err


# ---- gap --data: damaged ECI files ---------------------------------------------------------------------------
ECI = "epoch_capabilities_index.csv"


def _epoch_copy(tmp_path: Path, eci_bytes: bytes) -> Path:
    d = tmp_path / "epoch"
    d.mkdir()
    for f in (ROOT / "data" / "epoch").glob("*.csv"):
        shutil.copy(f, d)
    (d / ECI).write_bytes(eci_bytes)
    return d


@pytest.mark.parametrize("cut,message", [
    (lambda b: b[: len(b) // 50], "no usable rows for mmlu"),                       # truncated
    (lambda b: b.split(b"\n")[0] + b"\n", "no usable rows for eci"),                # header only
    (lambda b: b.split(b"\n")[0] + b'\n"' + b"x" * 200_000 + b'"\n', "field larger than field limit"),
])
def test_damaged_eci_csv_is_one_clear_error(tmp_path, capsys, cut, message):
    d = _epoch_copy(tmp_path, cut((ROOT / "data" / "epoch" / ECI).read_bytes()))
    assert main(["gap", "--data", str(d), "--boot", "2"]) == 2
    err = capsys.readouterr().err
    assert message in err and str(d) in err and "Traceback" not in err


# ---- grammar: nesting and literal limits, lone surrogates -----------------------------------------------------
def _limited(code: str, mem_mb: int) -> subprocess.CompletedProcess:
    pre = f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({mem_mb << 20}, {mem_mb << 20}))\n"
    return subprocess.run([sys.executable, "-c", pre + textwrap.dedent(code)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_two_megabytes_of_brackets_and_a_five_megabyte_enum_stop_early(tmp_path):
    """MemoryError at 4 GiB after minutes before; now one line each under 1 GiB."""
    deep = tmp_path / "deep.json"
    deep.write_bytes(b"[" * 1_000_000 + b"]" * 1_000_000)
    schema, big = tmp_path / "s.json", tmp_path / "big.json"
    schema.write_text(json.dumps({"enum": ["x" * 5_000_000]}))
    big.write_text(json.dumps("x" * 5_000_000))
    r = _limited(f"""
        from lessonkit.cli import main
        print(main(["grammar", "check", "--grammar", "json", {str(deep)!r}]))
        print(main(["grammar", "check", "--schema", {str(schema)!r}, {str(big)!r}]))
        """, mem_mb=1024)
    assert r.stdout.split() == ["2", "2"] and "Traceback" not in r.stderr, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert f"{deep}: byte 24998: json.gbnf: the input nests deeper than" in lines[0]
    assert "/enum/0: a string of 5,000,000 characters" in lines[1]


@pytest.mark.parametrize("text", [
    'root ::= ("a"{10000}){10000}',                          # 10**8 positions: MemoryError before
    'root ::= "' + "x" * 100_001 + '"',
])
def test_huge_gbnf_is_one_clear_error(text):
    from lessonkit.errors import LessonkitError
    from lessonkit.grammar.automaton import Grammar
    with pytest.raises(LessonkitError, match="too large|limit is 100,000"):
        Grammar(text, "g.gbnf")


SURROGATE = '"\\ud800"'
SURROGATE_SCHEMAS = {
    "const": '{"const": %s}' % SURROGATE,
    "enum": '{"enum": ["a", %s]}' % SURROGATE,
    "pattern": '{"type": "string", "pattern": "a\\ud800"}',
    "property name": '{"type": "object", "properties": {%s: {"type": "integer"}}}' % SURROGATE,
}


@pytest.mark.parametrize("name", list(SURROGATE_SCHEMAS))
@pytest.mark.parametrize("command", ["compile", "check"])
def test_lone_surrogate_in_a_schema_is_one_clear_error(tmp_path, capsys, name, command):
    s = tmp_path / "s.json"
    s.write_text(SURROGATE_SCHEMAS[name])
    doc = tmp_path / "x.json"
    doc.write_text('"a"')
    argv = ["grammar", "compile", str(s)] if command == "compile" else ["grammar", "check", "--schema", str(s), str(doc)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "lone surrogate" in err and str(s) in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["export", "x" * 100_000, "{tmp}/out"],
                                  ["grammar", "check", "--grammar", "json", "{tmp}/" + "y" * 5000]])
def test_a_path_the_os_refuses_is_one_short_line(tmp_path, capsys, argv):
    """A name too long for the file system (ENAMETOOLONG) escaped Path.exists() as a traceback."""
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    err = capsys.readouterr().err
    assert "File name too long" in err and "characters)..." in err and len(err) < 400 and "Traceback" not in err


def test_export_of_a_model_with_a_truncated_tokenizer_is_one_clear_error(tmp_path, capsys):
    """Found by the fuzz layer's long run: the tokenizers library's bare Exception escaped export."""
    d = tmp_path / "m"
    shutil.copytree(ROOT / "data" / "models" / "tiny-moe", d)
    tok = d / "tokenizer.json"
    tok.write_bytes(tok.read_bytes()[: tok.stat().st_size // 2])
    assert main(["export", str(d), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{tok}: cannot load tokenizer" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_a_file_name_that_is_not_utf8_is_printed_as_its_bytes(tmp_path):
    """Found while writing the fuzz layer: on a strict UTF-8 stdout (any UTF-8 locale but C.UTF-8) the
    name reached print() as lone surrogates and was a UnicodeEncodeError."""
    name = os.fsencode(tmp_path) + b"/caf\xe9\xff.json"
    with open(name, "wb") as f:
        f.write(b"[1]")
    r = subprocess.run([os.fsencode(sys.executable), b"-m", b"lessonkit", b"grammar", b"check", b"--grammar", b"json",
                        name], cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert r.returncode == 0 and r.stdout == name + b": ok\n" and b"Traceback" not in r.stderr
