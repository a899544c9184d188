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


# ---- llama.cpp's fastest format of the same model: Q4_0 (issue 61 item 7) ---------------------------------
def test_q4_0_is_made_by_llama_quantize_once_atomically(monkeypatch, tmp_path):
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))
    q4 = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    q4.write_bytes(b"q4_1")
    ran = []

    def fake_run(cmd, **k):
        ran.append(cmd)
        assert not (bench_llamacpp.home() / "SmolLM2-135M-Instruct.Q4_0.gguf").exists()   # written aside first
        open(cmd[3], "wb").write(b"q4_0")
        return subprocess.CompletedProcess(cmd, 0)
    monkeypatch.setattr(subprocess, "run", fake_run)
    _fake_quantize_binary()
    out = bench_llamacpp.q4_0_gguf(q4)
    assert out == bench_llamacpp.home() / "SmolLM2-135M-Instruct.Q4_0.gguf" and out.read_bytes() == b"q4_0"
    assert ran == [[str(bench_llamacpp.binary("llama-quantize")), "--allow-requantize", str(q4),
                    str(out.with_suffix(".partial")), "Q4_0"]]
    assert bench_llamacpp.q4_0_gguf(q4) == out and len(ran) == 1                # reused when present
    assert not list(bench_llamacpp.home().glob("*.partial"))


def _fake_quantize_binary():
    tool = bench_llamacpp.binary("llama-quantize")
    tool.parent.mkdir(parents=True)
    tool.write_bytes(b"")


def _built(monkeypatch, tmp_path, quantize_rc: int):
    """A build that is there, an F32 file already made, and llama-quantize exiting with quantize_rc."""
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))
    monkeypatch.setattr(bench_llamacpp, "is_built", lambda ggml="native": True)
    monkeypatch.setattr(bench_llamacpp, "f32_gguf", lambda q4, ggml="native": tmp_path / "m.F32.gguf")
    _fake_quantize_binary()
    monkeypatch.setattr(subprocess, "run", lambda cmd, **k: subprocess.CompletedProcess(cmd, quantize_rc))
    return tmp_path / "m.Q4_1.gguf"


@pytest.mark.parametrize("rc", [1, None])
def test_q4_0_that_cannot_be_made_is_one_line_and_q4_1_still_runs(monkeypatch, tmp_path, capsys, rc):
    q4 = _built(monkeypatch, tmp_path, rc or 0)
    if rc is None:                                     # llama-quantize absent from the build
        monkeypatch.setattr(bench_llamacpp, "binary", lambda name, ggml="native": tmp_path / "no" / name)
    notes = []
    fns = bench_llamacpp._llamacpp_contenders(q4, notes)
    assert [w for _, w, _ in fns] == ["Q4_1 + Q8_0 (as shipped)", "F32 (llama-quantize)"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Q4_0" in err and "Traceback" not in err
    assert len(notes) == 1 and "Q4_0" in notes[0] and not (bench_llamacpp.home() / "m.Q4_0.partial").exists()


def test_q4_0_row_when_made(monkeypatch, tmp_path, capsys):
    q4 = _built(monkeypatch, tmp_path, 0)
    (bench_llamacpp.home() / "m.Q4_0.gguf").write_bytes(b"made before")
    notes = []
    fns = bench_llamacpp._llamacpp_contenders(q4, notes)
    assert [w for _, w, _ in fns] == ["Q4_1 + Q8_0 (as shipped)", "Q4_0 (llama-quantize)", "F32 (llama-quantize)"]
    assert notes == [] and capsys.readouterr().err == ""


def _fake_contenders(engines, n_prefill, notes=None, ggml="native"):
    def rate(decode, prefill):
        return lambda n, g, p: {"decode_tok_s": decode * n, "prefill_tok_s": prefill * n}
    return {("llama.cpp", "Q4_1 + Q8_0 (as shipped)", "q4.gguf"): rate(160.0, 250.0),
            ("llama.cpp", "Q4_0 (llama-quantize)", "q4_0.gguf"): rate(240.0, 900.0),
            ("lessonkit", "native", "dir"): rate(320.0, 700.0)}


def test_ratios_and_targets_against_q4_0():
    rows = bench_llamacpp.measure(_fake_contenders(None, 32), [1, 2], repeats=1, n_gen=8, n_prompt=32)
    ratios, targets = bench_llamacpp.ratios_and_targets(rows, [1, 2])
    two = next(r for r in ratios if r["threads"] == 2 and r["figure"] == "prefill_tok_s")
    assert two["native / llama.cpp Q4_0"] == pytest.approx(700 / 900)
    assert two["native / llama.cpp Q4_1"] == pytest.approx(700 / 250)
    goals = {t["name"]: t for t in targets}
    for n in (1, 2):
        assert goals[f"decode, {n} thread(s): native / llama.cpp Q4_0"]["met"]          # 320 / 240 >= 1.0
        pre = goals[f"prefill, {n} thread(s): native / llama.cpp Q4_0"]                  # 700 / 900 < 1.0
        assert not pre["met"] and pre["target"] == ">= 1.0" and pre["value"] == round(700 / 900, 3)


def test_json_carries_the_q4_0_rows(monkeypatch, capsys):
    monkeypatch.setattr(bench_llamacpp, "contenders", _fake_contenders)
    assert main(["bench", "llamacpp", "--smoke", "--threads", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    q4_0 = [r for r in out["rows"] if r["weights"] == "Q4_0 (llama-quantize)"]
    assert len(q4_0) == 1 and q4_0[0]["decode_tok_s"] == 240.0 and q4_0[0]["weights_path"] == "q4_0.gguf"
    assert all("native / llama.cpp Q4_0" in r for r in out["ratios"])
    assert "decode, 1 thread(s): native / llama.cpp Q4_0" in {t["name"] for t in out["targets"]}
    assert any("native / llama.cpp Q4_0 1.33x" in n for n in out["notes"])


# ---- the AVX2 build: an AVX2 CPU's kernels beside LESSONKIT_KERNEL=avx2 (issue 61) ---------------------------------
def test_the_avx2_build_is_its_own_folder_and_flags(monkeypatch, tmp_path):
    from lessonkit.measure import llamacpp
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))
    monkeypatch.setattr(llamacpp.platform, "machine", lambda: "x86_64")
    flags = llamacpp.cmake_flags("avx2")
    assert "-DGGML_NATIVE=ON" not in flags and {"-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON", "-DGGML_AVX512=OFF"} <= set(flags)
    assert llamacpp.home("avx2") != llamacpp.home() and llamacpp.home("avx2").parent == llamacpp.home().parent
    for tool in llamacpp.tools("avx2"):                  # llama-bench and llama-quantize, with the native flags: stale
        llamacpp.binary(tool, "avx2").parent.mkdir(parents=True, exist_ok=True)
        llamacpp.binary(tool, "avx2").write_text("")
    (llamacpp.home("avx2") / "build.json").write_text(json.dumps({"flags": list(llamacpp.CMAKE_FLAGS)}))
    assert not llamacpp.is_built("avx2") and not llamacpp.is_built()
    (llamacpp.home("avx2") / "build.json").write_text(json.dumps({"flags": list(flags)}))
    assert llamacpp.is_built("avx2") and not llamacpp.is_built()


def test_an_unknown_build_is_one_clear_error(no_subprocess, capsys):
    assert main(["bench", "llamacpp", "--engines", "llamacpp", "--ggml", "avx512vnni"]) == 2
    err = capsys.readouterr().err
    assert "--ggml 'avx512vnni'" in err and "native, avx2" in err and "Traceback" not in err


def test_the_avx2_build_not_built_says_how(no_subprocess, capsys, monkeypatch):
    from lessonkit.measure import llamacpp
    monkeypatch.setattr(llamacpp.platform, "machine", lambda: "x86_64")
    assert main(["bench", "llamacpp", "--engines", "llamacpp", "--ggml", "avx2"]) == 2
    err = capsys.readouterr().err
    assert "lessonkit bench llamacpp --build --ggml avx2" in err and "llamacpp-0.3.36-avx2" in err
