"""`lessonkit bench llamacpp-spec` without llama.cpp: the build record that names its tools, the one clear
message when it is not built, llama-completion's, llama-lookup's and llama-speculative's outputs read from
a real run (tests/llamacpp_outputs), where a speculative output forks from plain greedy, and the summary."""
import json
import subprocess
from pathlib import Path

import pytest

from lessonkit.bench import BENCHES, bench_llamacpp
from lessonkit.bench import bench_llamacpp_spec as spec
from lessonkit.measure import llamacpp as run
from lessonkit.measure.llamacpp import Sample
from lessonkit.cli import main
from lessonkit.errors import LessonkitError

# Recorded on 2026-12-04 (llama.cpp of llama-cpp-python 0.3.36, SmolLM2-135M-Instruct.Q4_1.gguf, 1 thread) with
# run.llamacpp_command(tool, gguf, prompt.txt, n, 1): n = 32 (each ends at <|im_end|>, "eos") and n = 8
# ("limit"); stderr keeps its last 22 lines.
OUTPUTS = Path(__file__).parent / "llamacpp_outputs"
PROMPT = (OUTPUTS / "prompt.txt").read_text(encoding="utf-8")
ANSWER = "The expert cachce keeps the most recently used experts in memmory and streams the rest from disk."
EOS = "<|im_end|>"


def recorded(tool: str, case: str, stream: str) -> str:
    return (OUTPUTS / f"{tool.removeprefix('llama-')}.{case}.{stream}").read_text(encoding="utf-8")


def test_registered_and_built_with_the_speculative_tools():
    assert BENCHES["llamacpp-spec"] == "lessonkit.bench.bench_llamacpp_spec"
    assert {tool for tool, _ in spec.LLAMACPP_TOOLS.values()} <= set(run.TOOLS)
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in run.CMAKE_FLAGS   # llama-speculative, llama-lookup: examples


def _fake_build(flags) -> None:
    for tool in run.TOOLS:
        bench_llamacpp.binary(tool).parent.mkdir(parents=True, exist_ok=True)
        bench_llamacpp.binary(tool).write_text("")
    (bench_llamacpp.home() / "build.json").write_text(json.dumps({"flags": list(flags)}), encoding="utf-8")


def test_build_record_names_todays_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))
    assert not bench_llamacpp.is_built()
    _fake_build([f for f in run.CMAKE_FLAGS if "EXAMPLES" not in f] + ["-DLLAMA_BUILD_EXAMPLES=OFF"])
    assert not bench_llamacpp.is_built()                   # a build of llama-bench alone, before issue 54: rebuilt
    _fake_build(run.CMAKE_FLAGS)
    assert bench_llamacpp.is_built()
    bench_llamacpp.binary("llama-speculative").unlink()
    assert not bench_llamacpp.is_built()


def test_not_built_is_one_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("LESSONKIT_HOME", str(tmp_path))

    def refuse(*a, **k):
        raise AssertionError(f"ran {a}")
    monkeypatch.setattr(subprocess, "run", refuse)
    assert main(["bench", "llamacpp-spec"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "not built" in err and "lessonkit bench llamacpp --build" in err


def test_commands_are_greedy_with_one_seed():
    cmds = {tool: run.llamacpp_command(tool, "m.gguf", "hi", 48, 2) for tool, _ in spec.LLAMACPP_TOOLS.values()}
    for cmd in cmds.values():
        line = " ".join(cmd[1:])
        assert "--temp 0" in line and "--top-k 1" in line and f"-s {run.SEED}" in line and "-t 2" in line
    assert cmds["llama-speculative"][cmds["llama-speculative"].index("-md") + 1] == "m.gguf"
    assert f"--spec-draft-n-max {run.DEPTH}" in " ".join(cmds["llama-lookup"])
    assert "-no-cnv" in cmds["llama-completion"]      # else the chat template is applied a second time
    assert run.llamacpp_command("llama-lookup", "m.gguf", "hi", 48, 2, depth=0)[-2:] == ["--spec-draft-n-max", "0"]


@pytest.mark.parametrize("tool", ["llama-completion", "llama-lookup", "llama-speculative"])
def test_recorded_outputs_are_read(tool):
    text, at_eos = run.generated_text(recorded(tool, "eos", "stdout"), PROMPT, tool, EOS)
    assert (text, at_eos) == (ANSWER, True)          # lookup and speculative ran past <|im_end|>: cut there
    text, at_eos = run.generated_text(recorded(tool, "limit", "stdout"), PROMPT, tool, EOS)
    assert not at_eos and ANSWER.startswith(text) and len(text) >= len("The expert cachce keeps the most")


def test_recorded_decode_times_and_draft_counts():
    assert run.decode_stats(recorded("llama-completion", "eos", "stderr"), "llama-completion") == pytest.approx(
        {"new_tokens": 23, "decode_s": (322.64 + 1.89) / 1e3, "drafted": None, "accepted": None})
    assert run.decode_stats(recorded("llama-speculative", "eos", "stderr"), "llama-speculative") == {
        "new_tokens": 26, "decode_s": 0.867, "drafted": 20, "accepted": 20}
    assert run.decode_stats(recorded("llama-lookup", "limit", "stderr"), "llama-lookup") == {
        "new_tokens": 9, "decode_s": 0.173, "drafted": 4, "accepted": 1}


@pytest.mark.parametrize("tool", ["llama-completion", "llama-lookup", "llama-speculative"])
def test_unreadable_outputs_are_one_clear_error(tool):
    with pytest.raises(LessonkitError, match=tool):
        run.decode_stats("error: invalid argument: --draft-max\n", tool)
    if tool != "llama-completion":
        with pytest.raises(LessonkitError, match="not echoed"):
            run.generated_text("\n\nanother prompt\n", PROMPT, tool, EOS)


@pytest.mark.parametrize("plain, other, at_limit, fork", [
    ([1, 2, 3, 4], [1, 2, 3, 4], False, None),
    ([1, 2, 3, 4], [1, 2, 9, 4], False, 2),
    ([5, 2], [6, 2], False, 0),
    ([1, 2, 3], [1, 2, 3, 4, 5], True, None),       # plain stopped at -n, speculative finished its step
    ([1, 2, 3], [1, 2, 3, 4, 5], False, 3),         # plain stopped at end of sequence, speculative ran on
    ([1, 2, 3, 4], [1, 2], True, 2),                # speculative stopped early, at end of sequence
    ([1, 2, 3, 4], [1, 2], "other", None),          # llama-completion stopped at -n, llama-lookup past it
    ("the cache", "the cash", False, 6),
    ("the cache", "the cache keeps", True, None),
])
def test_fork_position(plain, other, at_limit, fork):
    limits = {"plain_at_limit": at_limit is True, "other_at_limit": at_limit == "other"}
    assert run.fork_position(plain, other, **limits) == fork


def test_forks_name_the_request_and_the_token():
    plain = [Sample([1, 2, 3], 3, 1.0), Sample([4, 5, 6], 3, 1.0, at_limit=True), Sample([7, 8], 2, 1.0)]
    other = [Sample([1, 2, 3], 3, 0.5), Sample([4, 5, 6, 7], 4, 0.5), Sample([7, 9], 2, 0.5)]
    assert spec.forks(plain, other) == [{"request": 2, "fork_token": 1, "plain": [8], "speculative": [9]}]
    def word_at(text, char):                         # a tokenizer of whole words, for the text case
        return len(text[:char].split(" ")) - 1
    text = [Sample("one two three four", 4, 1.0, at_limit=True)]
    f = spec.forks(text, [Sample("one two tree four", 4, 1.0)], word_at)
    assert f == [{"request": 0, "fork_char": 9, "fork_token": 2, "plain": "hree four", "speculative": "ree four"}]


def test_token_at_finds_the_token_that_holds_the_fork():
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({"one": 0, "two": 1, "three": 2, "[UNK]": 3}, "[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    at = spec.token_at(tok)
    assert [at("one two three", c) for c in (0, 4, 9, 13)] == [0, 1, 2, 3]


def test_summary_is_against_each_engines_own_plain_greedy():
    runs = {("e", "plain greedy"): [[Sample([1, 2], 2, 1.0), Sample([3, 4], 2, 1.0)]] * 3,
            ("e", "fast"): [[Sample([1, 2], 2, 0.5), Sample([3, 9], 2, 0.5, drafted=4, accepted=3)]] * 3,
            ("f", "plain greedy"): [[Sample("ab", 2, 2.0), Sample("cd", 2, 2.0)]] * 3,
            ("f", "slow"): [[Sample("ab", 2, 4.0), Sample("cd", 2, 4.0)], [Sample("ab", 2, 4.0), Sample("cx", 2, 4.0)],
                            [Sample("ab", 2, 4.0), Sample("cd", 2, 4.0)]]}
    rows = {(r["engine"], r["name"]): r for r in spec.summarise(runs)}
    assert rows["e", "fast"]["speedup"] == pytest.approx(2.0) and rows["f", "slow"]["speedup"] == pytest.approx(0.5)
    assert rows["e", "fast"]["requests_differing"] == 1 and rows["e", "fast"]["fork_tokens"] == [1]
    assert rows["e", "fast"]["acceptance"] == pytest.approx(0.75) and rows["e", "plain greedy"]["acceptance"] is None
    assert rows["f", "slow"]["requests_differing"] == 0 and not rows["f", "slow"]["stable"]
    assert "speedup_over_no_drafts" not in rows["e", "fast"]
    goals = {t["name"].split(":")[0]: t["met"] for t in spec.targets_of(list(rows.values()))}
    assert goals == {"e fast": False, "f slow": True}


def test_the_no_drafts_control_tells_the_drafts_fork_from_the_programs():
    plain = [Sample("abc", 3, 1.0), Sample("xyz", 3, 1.0)]
    control = [Sample("abc", 3, 0.5), Sample("xzz", 3, 0.5)]          # the program forks without drafts
    runs = {("f", "plain greedy"): [plain], ("f", spec.CONTROL): [control],
            ("f", "lookup"): [[Sample("abc", 3, 1.0), Sample("xzz", 3, 1.0)]],
            ("f", "draft"): [[Sample("abd", 3, 0.25), Sample("xzz", 3, 0.25)]]}
    rows = {r["name"]: r for r in spec.summarise(runs)}
    assert rows["lookup"]["requests_differing"] == 1 and rows["lookup"]["requests_differing_from_no_drafts"] == 0
    assert rows["draft"]["requests_differing"] == 2 and rows["draft"]["requests_differing_from_no_drafts"] == 1
    assert rows["lookup"]["speedup_over_no_drafts"] == pytest.approx(0.5) and rows["lookup"]["speedup"] == 1.0


def test_contenders_interleave():
    calls = []
    fns = {key: (lambda i, key=key: calls.append((key, i)) or Sample([i], 1, 1.0)) for key in ("a", "b")}
    runs = spec.measure(fns, n_requests=2, repeats=2)
    assert calls == [("a", 0), ("a", 1), ("b", 0), ("b", 1)] * 2 and len(runs["a"]) == 2
