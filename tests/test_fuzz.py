"""The fuzz layer (issues 35 and 45; the strategies are in tests/fuzz_cli.py, the runners in tests/fuzz_run.py,
docs/faults.md says what it found). Hostile arguments for every command of lessonkit.cli.COMMANDS and hostile files for every
file the workbook reads; each case must end with exit code 0, 1 or 2, no traceback, no hang, no file
changed outside its own directories (a victim tree and the shipped data/ are hashed around every case)
and peak memory under fuzz_run.RSS_BOUND_MB, under an address-space limit of fuzz_run.MEM_LIMIT_MB.
An executed case that exits 0 (or 1 with a verdict) must give the answer of the same command on clean
inputs (fuzz_run.check_answer); a prefix cache a case touched must then restore a plain prefill's tokens;
every file a case wrote must be whole (fuzz_run.torn_files). The kill tests are in tests/test_kill.py.

The short version (the suite, about a minute on one core) parses a few hundred argument lists for every
command in-process, runs a few dozen cases of the executed commands in one worker process (torch is
imported once) and a few real `python -m lessonkit` processes with argv as bytes. LESSONKIT_FUZZ=long
runs many more, with fresh random seeds, and writes build/fuzz/report.json (counts per command and
per outcome; per component: cases, answers checked, wrong answers, torn files, the failed cases).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import time
from pathlib import Path
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings

import fuzz_cli as fz
import fuzz_run as fr
from lessonkit.cli import build_parser
from lessonkit.files.atomic import atomic_write

LONG = os.environ.get("LESSONKIT_FUZZ") == "long"
# short: derandomised (the same cases every run); long: random, many
PARSE_EXAMPLES, WORKER_CASES, SUBPROCESS_CASES = (10000, 1200, 20) if LONG else (300, 20, 3)
if LONG and os.environ.get("LESSONKIT_FUZZ_SIZE"):      # a smaller long run: PARSES,WORKER,SUBPROCESS
    PARSE_EXAMPLES, WORKER_CASES, SUBPROCESS_CASES = map(int, os.environ["LESSONKIT_FUZZ_SIZE"].split(","))
FAST = settings(max_examples=PARSE_EXAMPLES, derandomize=not LONG, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
ONCE = settings(max_examples=1, derandomize=not LONG, deadline=None, database=None, phases=[Phase.generate],
                suppress_health_check=list(HealthCheck))
REPORT: dict = {}


def test_the_table_reaches_every_command():
    paths = [p for p, _ in fz.commands()]
    assert ("generate",) in paths and ("grammar", "check") in paths and ("stack", "run") in paths
    assert fz.EXECUTED <= set(paths)
    numbers = [d for _, args in fz.commands() for f, kw, _ in args if fz.bounds(kw.get("type")) is not None
               for d in [fz.dest(f, kw)]]
    assert {"max_new_tokens", "temperature", "top_p", "seed", "boot", "audit_rate"} <= set(numbers)


@FAST
@given(argv=fz.any_command_argv())
def test_every_command_parses_hostile_arguments(argv):
    """Parse level, every command: argparse's types refuse what they must with exit 2 (one line), and
    anything they accept is a value the handler was written for."""
    argv = [a if isinstance(a, str) else f"/nonexistent/{a['file']}" for a in argv]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            ns = build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code in (0, 2) and "Traceback" not in err.getvalue()
        _count("parse", argv, "refused" if e.code else "help")
        return
    assert isinstance(ns, argparse.Namespace) and callable(ns.func)
    _count("parse", argv, "accepted")


def _count(stage: str, argv: list, outcome: str) -> None:
    words = [a for a in argv[:2] if isinstance(a, str) and not a.startswith("-")]
    command = " ".join(ascii(w)[1:-1][:24] for w in words[:2])       # a hostile subcommand: cut, escaped
    REPORT.setdefault(stage, Counter())[command + ": " + outcome] += 1


@ONCE
@given(cases=fz.case_lists(WORKER_CASES))
def test_executed_commands_on_hostile_arguments_and_files(cases, tmp_path_factory):
    results = _once("worker", cases, lambda: fr.run_worker(cases, tmp_path_factory.mktemp("fuzz"),
                                                           timeout_s=600 if not LONG else 3600))
    bad = fr.defects(results)
    assert not bad, "\n".join(bad)


@ONCE
@given(cases=fz.case_lists(SUBPROCESS_CASES))
def test_real_processes_with_argv_as_bytes(cases, tmp_path_factory):
    box = tmp_path_factory.mktemp("fuzz-sub")
    results = _once("subprocess", cases, lambda: [fr.run_subprocess({"argv": c["argv"]}, box / str(i))
                                                  for i, c in enumerate(cases)])
    bad = fr.defects(results)
    assert not bad, "\n".join(bad)


def test_the_fixed_cases(tmp_path_factory):
    """The defect classes long runs found (fuzz_cli.FIXED_CASES), in one worker under the memory limit, in order:
    each follows the last in the same process, as in a long run, and each answer is its clean twin's."""
    results = _once("fixed", fz.FIXED_CASES, lambda: fr.run_worker(fz.FIXED_CASES, tmp_path_factory.mktemp("fixed"),
                                                                   timeout_s=600))
    bad = fr.defects(results)
    assert not bad, "\n".join(bad)
    assert [r["answer"] for r in results] == ["right"] * len(results), [(fr.short(r["argv"]), r["answer"]) for r in results]


def test_the_wrong_answer_of_issue_60_under_tighter_limits(tmp_path, monkeypatch):
    """fuzz_cli.FIXED_CASES[0] alone in a worker under tighter address-space limits: exit 0 with its clean twin's
    answer, or one line and exit 2 (not checked). Before issue 60 its twin, run after it in the worker, ran out of
    the address space the case's 126 threads had taken (a wrong answer at 2,900 MB), or the case itself died
    (libgomp: Thread creation failed; an ImportError: failed to map segment)."""
    for as_mb in (1300, 2000, 2900):
        monkeypatch.setenv("LESSONKIT_FUZZ_AS_MB", str(as_mb))
        [r] = fr.run_worker(fz.FIXED_CASES[:1], tmp_path / str(as_mb), timeout_s=300)
        assert not fr.defects([r]), (as_mb, fr.defects([r]))
        assert r["answer"] == "right" or r["code"] == 2 and r["stderr"].count("lessonkit: error:") == 1, (as_mb, r)


_DONE: dict = {}


def _once(stage: str, cases: list, run) -> list[dict]:
    """Run the cases once: hypothesis calls a failing test again with the same cases to report it, and
    that replay gets the results already measured (a long run's worker takes minutes)."""
    key = json.dumps(cases, sort_keys=True)
    if key not in _DONE:
        t0 = time.time()
        _DONE[key] = run()
        _record(stage, _DONE[key], time.time() - t0)
    return _DONE[key]


def _record(stage: str, results: list[dict], seconds: float) -> None:
    for r in results:
        outcome = "defect" if fr.defects([r]) else f"exit {r['code']}"
        _count(stage, [a for a in r["argv"] if isinstance(a, str)], outcome)
        for a in [*r["argv"], r.get("home")]:
            if isinstance(a, dict):
                REPORT.setdefault(stage + " files", Counter())[f"{a['file']}:{a['variant']}: {outcome}"] += 1
    for r in results:
        if "component" in r:
            _tally(r["component"], r, fr.defects([r]))
    REPORT.setdefault("seconds", {})[stage] = round(seconds, 1)
    REPORT.setdefault("peak_rss_mb", {})[stage] = max([r["rss_mb"] for r in results] or [0])
    REPORT.setdefault("defects", []).extend(fr.defects(results))
    write_report()


def _tally(comp: str, r: dict, bad: list) -> None:
    """Per component: cases run, answers checked, wrong answers, torn files, and the failed cases."""
    c = REPORT.setdefault("components", {}).setdefault(comp, {"cases": 0, "answers_checked": 0, "wrong_answers": 0,
                                                               "torn_files": 0, "not_checked": {}, "failed": []})
    c["cases"] += 1
    a = r.get("answer", "not checked: ?")
    if a.startswith("not checked"):
        c["not_checked"][a[13:]] = c["not_checked"].get(a[13:], 0) + 1
    else:
        c["answers_checked"] += 1
        c["wrong_answers"] += a.startswith("WRONG")
    c["torn_files"] += len(r.get("torn", []))
    c["failed"] += bad


def write_report() -> None:
    """build/fuzz/report.json (long runs; report-short.json for the suite's), rewritten after each stage so
    that a cut-off run keeps its counts."""
    out = fz.ROOT / "build" / "fuzz" / ("report.json" if LONG else "report-short.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    REPORT["size"] = {"parses": PARSE_EXAMPLES, "worker_cases": WORKER_CASES, "subprocess_cases": SUBPROCESS_CASES}
    doc = {k: dict(v) if isinstance(v, Counter) else v for k, v in REPORT.items()}
    with contextlib.suppress(OSError, ValueError, AttributeError, KeyError, TypeError):     # tests/test_kill.py's counts stay
        doc["kill"] = json.loads(out.read_text(encoding="utf-8"))["kill"]
    text = json.dumps(doc, indent=1, sort_keys=True)
    atomic_write(out, text.encode("utf-8"))


@pytest.fixture(scope="module", autouse=True)
def report_at_the_end():
    yield
    write_report()


# ---- the checks themselves can fail ------------------------------------------------------------------------------------
def test_a_served_wrong_answer_is_a_defect(tmp_path, monkeypatch):
    """A fault that makes generate serve another token (here: in the case's directory only, not in the clean
    twin's) exits 0 and is reported as a wrong answer."""
    import lessonkit.commands as commands
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path / "home"))
    real = commands._print_json

    def served(doc):
        if Path.cwd().name.startswith("case") and "token_ids" in doc:
            doc = {**doc, "token_ids": doc["token_ids"][:-1] + [doc["token_ids"][-1] + 1]}
        real(doc)
    monkeypatch.setattr(commands, "_print_json", served)
    case = {"argv": ["generate", "--model", {"file": "model", "variant": "valid", "member": 0, "odd_name": False,
                                             "member_variant": "missing", "at": 0.0},
                     "--prompt", "The river keeps", "--max-new-tokens", "2", "--json"], "home": None}
    victim = fz.make_victim(tmp_path)
    r = fr.run_one(case, tmp_path / "case0", victim)
    assert r["code"] == 0 and r["answer"].startswith("WRONG"), r["answer"]
    assert any("wrong answer" in d for d in fr.defects([r]))
    monkeypatch.setattr(commands, "_print_json", real)
    assert fr.run_one(case, tmp_path / "case1", victim)["answer"] == "right"


def test_torn_files_are_found(tmp_path):
    from safetensors.torch import save_file
    import torch
    before = fz.tree_digest(tmp_path, content=False)
    save_file({"x": torch.zeros(100)}, tmp_path / "whole.safetensors")
    data = (tmp_path / "whole.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-7])
    (tmp_path / "index.json").write_text('{"entries": {"a": ', encoding="utf-8")
    (tmp_path / ".tmp-123-abc.part").write_bytes(b"x")
    (tmp_path / "ok.json").write_text("{}", encoding="utf-8")
    assert sorted(fr.torn_files(tmp_path, before)) == [".tmp-123-abc.part", "cut.safetensors", "index.json"]
