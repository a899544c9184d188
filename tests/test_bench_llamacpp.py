"""`lessonkit bench llamacpp` without building anything: its options, the one clear message when the build
tools are missing or llama.cpp is not built, llama-bench's JSON read from a recorded sample, the ratios, and
the interleaving of the contenders."""
import json
import shutil
import subprocess

import pytest

from lessonkit.bench import BENCHES
from lessonkit.bench import bench_llamacpp
from lessonkit.cli import build_parser, main

# `llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -t 1 -p 512 -n 128 -r 1 -o json` as it printed it on
# 2026-12-02 (llama.cpp of llama-cpp-python 0.3.36), trimmed to the fields the bench reads and a few more.
RECORDED = """[
  {
    "build_commit": "unknown",
    "build_number": 0,
    "cpu_info": "Intel(R) Xeon(R) Processor",
    "backends": "CPU",
    "model_filename": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "n_threads": 1,
    "n_prompt": 512,
    "n_gen": 0,
    "avg_ns": 2983379278,
    "avg_ts": 171.617469,
    "samples_ts": [ 171.617 ]
  },
  {
    "build_commit": "unknown",
    "model_type": "llama 256M Q4_1",
    "n_threads": 1,
    "n_prompt": 0,
    "n_gen": 128,
    "avg_ns": 3265226317,
    "avg_ts": 39.200958,
    "samples_ts": [ 39.201 ]
  }
]
"""


def test_registered_and_options_parse():
    assert BENCHES["llamacpp"] == "lessonkit.bench.bench_llamacpp"
    args = build_parser().parse_args(["bench", "llamacpp", "--threads", "1, 2", "--engines", "llamacpp", "--build"])
    assert args.threads == [1, 2] and args.build and bench_llamacpp.parse_engines(args.engines) == ["llamacpp"]
    assert bench_llamacpp.parse_engines(None) == list(bench_llamacpp.ENGINES)


@pytest.mark.parametrize("value", ["0", "1,x", "", "2,-1"])
def test_bad_thread_counts_are_one_clear_error(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "llamacpp", "--threads", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--threads" in err and "Traceback" not in err


def test_unknown_engine_is_one_clear_error(capsys):
    assert main(["bench", "llamacpp", "--engines", "llamacpp,vllm"]) == 2
    assert "--engines: unknown vllm" in capsys.readouterr().err


@pytest.fixture
def no_subprocess(monkeypatch, tmp_path):
    """An empty cache directory, and any attempt to download or compile fails the test."""
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))

    def refuse(*a, **k):
        raise AssertionError(f"ran {a}")
    monkeypatch.setattr(subprocess, "run", refuse)


def test_missing_build_tools_give_one_clear_message(no_subprocess, monkeypatch, capsys):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/bin/cc" if name == "cc" else None)
    assert main(["bench", "llamacpp", "--build", "--engines", "llamacpp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "missing: a C++ compiler, cmake, ninja" in err and "pip install cmake ninja" in err


def test_not_built_says_how_to_build(no_subprocess, capsys):
    assert main(["bench", "llamacpp", "--engines", "llamacpp"]) == 2
    err = capsys.readouterr().err
    assert "not built" in err and "lessonkit bench llamacpp --build" in err


def test_recorded_llama_bench_json_is_read():
    r = bench_llamacpp.parse_bench_json(RECORDED)
    assert r["prefill_tok_s"] == pytest.approx(171.617469) and r["decode_tok_s"] == pytest.approx(39.200958)
    assert r["n_threads"] == 1 and r["build_commit"] == "unknown"
    decode_only = bench_llamacpp.parse_bench_json(json.dumps([json.loads(RECORDED)[1]]))
    assert decode_only["decode_tok_s"] == pytest.approx(39.200958) and "prefill_tok_s" not in decode_only
    for bad in ("", "main: error: failed to load model", "[]"):
        with pytest.raises(bench_llamacpp.LessonkitError):
            bench_llamacpp.parse_bench_json(bad)


def test_contenders_interleave_and_ratios():
    calls = []

    def fake(name, decode, prefill):
        def run(n, g, p):
            calls.append((name, n))
            return {"decode_tok_s": decode * n, "prefill_tok_s": prefill * n}
        return run
    fns = {("llama.cpp", "Q4_1 + Q8_0 (as shipped)", "q4.gguf"): fake("q4", 48.0, 90.0),
           ("lessonkit", "native", "dir"): fake("native", 40.0, 130.0),
           ("lessonkit", "f32", "dir"): fake("f32", 14.0, 180.0)}
    rows = bench_llamacpp.measure(fns, [1, 2], repeats=2, n_gen=8, n_prompt=32)
    assert calls == [("q4", 1), ("native", 1), ("f32", 1), ("q4", 2), ("native", 2), ("f32", 2)] * 2
    assert len(rows) == 6 and {r["threads"] for r in rows} == {1, 2}
    ratios, targets = bench_llamacpp.ratios_and_targets(rows, [1, 2])
    one = next(r for r in ratios if r["threads"] == 1 and r["figure"] == "decode_tok_s")
    assert one["native / llama.cpp Q4_1"] == pytest.approx(40 / 48)
    assert one["native / lessonkit f32"] == pytest.approx(40 / 14)
    met = {t["name"]: t["met"] for t in targets}
    assert not met["decode, 1 thread(s): native / llama.cpp Q4_1"]             # 40 / 48 < 1.0
    assert met["decode, 1 thread: native / lessonkit float32"]
    assert not met["prefill, 1 thread(s): native / lessonkit float32"]        # 130 / 180 < 0.8
    assert not met["prefill, 1 thread(s): native / llama.cpp Q4_1"]           # 130 / 90 < 1.5
