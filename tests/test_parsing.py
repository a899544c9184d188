"""One parser per value, at the edge: draft depth, threads, and what `lessonkit run` tells a notebook."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lessonkit.cli import COMMANDS, build_parser, main
from lessonkit.errors import LessonkitError
from lessonkit.speculative.depth import AUTO, K_MAX, parse_draft_depth

ROOT = Path(__file__).resolve().parents[1]
GEN = ["generate", "--model", "tiny-moe", "--prompt", "hi", "--draft", "ngram"]


def test_k_max_is_the_row_invariant_limit():
    """K_MAX is kept as a number (the CLI must not import torch); it must stay the engine's limit."""
    from lessonkit.engine.row_weight import ROWWISE_MAX
    assert K_MAX == ROWWISE_MAX - 1 == 15


@pytest.mark.parametrize("value", ["20", "16", "-1", "x", "1.5", ""])
def test_draft_k_out_of_range_is_an_argparse_error_naming_the_option(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(GEN + ["--draft-k", value])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--draft-k" in err and str(K_MAX) in err and "Traceback" not in err


def test_draft_k_20_names_the_limit(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(GEN + ["--draft-k", "20"])
    err = capsys.readouterr().err
    assert "argument --draft-k" in err and "at most 15" in err


@pytest.mark.parametrize("value,parsed", [("auto", AUTO), ("0", 0), ("15", 15), ("4", 4)])
def test_draft_k_parses(value, parsed):
    assert build_parser().parse_args(GEN + ["--draft-k", value]).draft_k == parsed


def test_draft_k_default_is_the_techniques_own():
    assert build_parser().parse_args(GEN).draft_k is None


def test_every_draft_k_option_uses_the_one_parser():
    def walk(table):
        for entry in table.values():
            if isinstance(entry[1], dict):
                yield from walk(entry[1])
            else:
                yield from (kw for a in entry[2] if a[0] != "one of" for flags, kw in [a] if "--draft-k" in flags)
    found = list(walk(COMMANDS))
    assert found and all(kw["type"] is parse_draft_depth for kw in found)


@pytest.mark.parametrize("bad", [16, -1, True, 2.0, None, "auto ", "Auto"])
def test_library_callers_get_a_lessonkit_error_naming_value_and_limit(bad):
    with pytest.raises(LessonkitError, match="15"):
        parse_draft_depth(bad)


def test_verify_refuses_a_deep_gate_naming_the_limit():
    from lessonkit.speculative.verify import _draft_width
    with pytest.raises(LessonkitError, match=r"k_max=20.*K_MAX=15"):
        _draft_width(None, None, AUTO, 20, None, 16, True)
    with pytest.raises(LessonkitError, match=r"20.*at most 15"):
        _draft_width(None, None, 20, 8, None, 16, True)
    assert _draft_width(None, None, 15, 8, None, 16, True) == (None, 15)


def test_grammar_depth_is_not_auto():
    from lessonkit.grammar.drafter import grammar_depth
    assert grammar_depth(24) == K_MAX and grammar_depth(3) == 3 and grammar_depth(0) == 1


# ---- threads ---------------------------------------------------------------------------------------
def test_max_threads_is_the_kernels_limit():
    """engine.threads.MAX_THREADS, which every --threads is checked against, is the C kernel's own limit."""
    import re

    from lessonkit.engine import kernel
    from lessonkit.engine.threads import MAX_THREADS
    src = (ROOT / "csrc" / "kernel_impl.h").read_text(encoding="utf-8")
    assert int(re.search(r"#define MAXT\s+(\d+)", src).group(1)) == MAX_THREADS      # rk_max_threads() returns it
    if kernel._rowkernel is not None:
        assert kernel._rowkernel.max_threads == MAX_THREADS


@pytest.mark.parametrize("argv", [["generate", "--model", "m", "--prompt", "p"], ["run"], ["bench", "engine"],
                                  ["train", "tiny-moe"], ["train-mtp", "--model", "m"]])
def test_threads_past_the_kernels_limit_is_an_argparse_error_naming_it(argv, capsys):
    from lessonkit.engine.threads import MAX_THREADS
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv + ["--threads", str(MAX_THREADS + 1)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--threads" in err and f"at most {MAX_THREADS}" in err and "Traceback" not in err
    assert build_parser().parse_args(argv + ["--threads", str(MAX_THREADS)]).threads in (MAX_THREADS, [MAX_THREADS])

def test_threads_mean_kernel_threads_everywhere():
    """Every --threads help says C kernel threads; no command handler sets torch threads itself."""
    def walk(table):
        for entry in table.values():
            if isinstance(entry[1], dict):
                yield from walk(entry[1])
            else:
                yield from (a[1] for a in entry[2] if a[0] != "one of" and "--threads" in a[0])
    helps = [kw.get("help", "") for kw in walk(COMMANDS)]
    assert len(helps) >= 5 and all("C kernel thread" in h for h in helps), helps
    assert "set_num_threads" not in (ROOT / "lessonkit" / "commands.py").read_text()


def test_use_threads_sets_kernel_and_torch(monkeypatch):
    import torch

    from lessonkit.engine import kernel
    from lessonkit.engine.threads import use_threads
    old_torch, old_kernel = torch.get_num_threads(), kernel.THREADS
    try:
        assert use_threads(2) == kernel.THREADS and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old_torch)
        kernel.set_threads(old_kernel)


# ---- lessonkit run: papermill parameters, not environment variables --------------------------------
def test_run_passes_papermill_parameters_and_no_environment(tmp_path, monkeypatch):
    import papermill

    from lessonkit.report import runner
    seen = []

    def fake_execute(nb, out, parameters, **kw):
        seen.append((Path(nb).name, dict(parameters), {k: v for k, v in os.environ.items() if k.startswith("LESSONKIT_")}))
        Path(out).write_text(json.dumps({"cells": []}))

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    monkeypatch.setattr(runner, "write_summary", lambda *a, **k: None)
    before = {k: v for k, v in os.environ.items() if k.startswith("LESSONKIT_")}
    monkeypatch.setattr("sys.argv", ["lessonkit"])
    assert main(["run", "--build-dir", str(tmp_path / "b"), "--smoke", "--only", "00_engine", "--threads", "3",
                 "--numerics", "int8"]) == 0
    assert [s[0] for s in seen] == ["00_engine.ipynb"]
    params, env = seen[0][1], seen[0][2]
    assert params["SETTINGS"]["threads"] == 3 and params["SETTINGS"]["numerics"] == "int8"      # one parameter
    assert params["SMOKE"] is True and params["INTERACTIVE"] is False
    assert set(params["SETTINGS"]) == {"kernel", "numerics", "threads", "weights", "forward"}
    assert params["BUILD_DIR"] == str((tmp_path / "b").resolve())
    assert env == before and {k: v for k, v in os.environ.items() if k.startswith("LESSONKIT_")} == before


def test_lesson_notebooks_declare_and_use_the_run_parameters():
    from lessonkit.report.runner import lesson_notebooks, run_parameters
    names = set(run_parameters(smoke=True, build_dir=Path("b"), settings=None))
    for nb in lesson_notebooks():
        code = ["".join(c["source"]) for c in json.loads(nb.read_text(encoding="utf-8"))["cells"]
                if c["cell_type"] == "code"]
        for name in names:
            assert f"\n{name} = " in "\n" + code[0], f"{nb.name}: parameters cell lacks {name}"
        text = "\n".join(code)
        assert "build_dir=BUILD_DIR" in text and "\nadopt(SETTINGS)" in text, nb.name     # engine.active.adopt
        assert "LESSONKIT_THREADS" not in text and "LESSONKIT_BUILD" not in text, nb.name


def test_nothing_talks_to_notebooks_through_lessonkit_environment_variables():
    for p in ("lessonkit/commands.py", "lessonkit/report/runner.py", "lessonkit/lessons/results.py"):
        text = (ROOT / p).read_text()
        assert "LESSONKIT_THREADS" not in text and "LESSONKIT_BUILD" not in text, p
