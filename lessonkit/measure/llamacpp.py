"""llama.cpp's programs, run and read: where its build lives, one request's command line and output, and
how many different completions a set of runs gives. `lessonkit bench llamacpp` builds it (only when asked) and
times it; `bench llamacpp-spec` compares its speculative decoding with lessonkit's; lesson 1's appendix A
counts its completions here (a notebook never imports a benchmark).

llama.cpp is the one vendored in the llama-cpp-python 0.3.36 sdist, built CPU-only into
lessonkit_home()/llamacpp-0.3.36 with CMAKE_FLAGS; `is_built` says whether TOOLS are there, built with today's
flags. It prints text, not token ids: outputs are compared as text (`fork_position`), and an output that runs
on past -n (llama-speculative and llama-lookup finish the verify step they are in) is the same output.
"""
from __future__ import annotations

import json
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lessonkit.errors import LessonkitError
from lessonkit.files.resources import lessonkit_home
from lessonkit.models.gguf_loader import smollm2_gguf_path

SEED = 42
DEPTH = 4                                   # draft tokens per step, both engines
VERSION = "0.3.36"
# llama-bench and llama-quantize for the decode anchor; llama-speculative, llama-lookup and llama-completion
# (its plain greedy decode with the same sampling options) for the speculative comparison (issue 54).
TOOLS = ("llama-bench", "llama-quantize", "llama-speculative", "llama-lookup", "llama-completion")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF",
               "-DGGML_BLAS=OFF", "-DGGML_VULKAN=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=ON",
               "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON")
# x86: no AMX tile kernels. Machines (VMs) that report AMX without enabling its tile state crash in them
# (llama-bench SIGSEGV in ggml_backend_amx_mul_mat on the machine of docs/kernel.md); the anchor is the
# AVX2 / AVX-512 path that every x86 machine runs.
if platform.machine().lower() in ("x86_64", "amd64"):
    CMAKE_FLAGS += ("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")


# The builds `bench llamacpp --ggml` measures: native (GGML_NATIVE: this CPU's best kernels, every tool) and avx2
# (AVX2 without AVX-512 or VNNI: the kernels an AVX2 CPU such as AMD Zen 3 runs, built on any x86-64 machine; only
# what bench llamacpp runs). Beside LESSONKIT_KERNEL=avx2 it puts the two engines' AVX2 paths side by side on a
# machine that has AVX-512 (issue 61's prefill figure "on every CPU").
GGML_BUILDS = ("native", "avx2")
AVX2_FLAGS = ("-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
              "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF")
BENCH_TOOLS = ("llama-bench", "llama-quantize")


def check_ggml(ggml: str) -> str:
    if ggml not in GGML_BUILDS:
        raise LessonkitError(f"--ggml {ggml!r}: the llama.cpp builds are {', '.join(GGML_BUILDS)}")
    if ggml != "native" and platform.machine().lower() not in ("x86_64", "amd64"):
        raise LessonkitError(f"--ggml {ggml}: an x86-64 build; this machine is {platform.machine()}")
    return ggml


def cmake_flags(ggml: str = "native") -> tuple[str, ...]:
    if check_ggml(ggml) == "native":
        return CMAKE_FLAGS
    return tuple(f for f in CMAKE_FLAGS if f != "-DGGML_NATIVE=ON") + AVX2_FLAGS


def tools(ggml: str = "native") -> tuple[str, ...]:
    return TOOLS if check_ggml(ggml) == "native" else BENCH_TOOLS


def home(ggml: str = "native") -> Path:
    """The build's folder: llamacpp-VERSION (native) or llamacpp-VERSION-avx2; the sources live in the native one."""
    return lessonkit_home() / (f"llamacpp-{VERSION}" + ("" if check_ggml(ggml) == "native" else f"-{ggml}"))


def binary(name: str, ggml: str = "native") -> Path:
    return home(ggml) / "build" / "bin" / name


def build_record(ggml: str = "native") -> dict:
    path = home(ggml) / "build.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def is_built(ggml: str = "native") -> bool:
    """The build's tools are there, built with today's flags."""
    return all(binary(t, ggml).is_file() for t in tools(ggml)) and build_record(ggml).get("flags") == list(cmake_flags(ggml))


@dataclass
class Sample:
    """One request's run: its new output (token ids, or text for llama.cpp), the decode phase's tokens and
    seconds, drafted and accepted tokens (None for plain decode), and whether it stopped at the token limit."""
    output: list[int] | str
    new_tokens: int
    decode_s: float
    drafted: int | None = None
    accepted: int | None = None
    at_limit: bool = False


def llamacpp_command(tool: str, gguf: str, prompt: str, n_new: int, threads: int, depth: int = DEPTH,
                     extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of one request: greedy (temperature 0, top-k 1), one seed, one context size; `extra`
    options after those."""
    cmd = [str(binary(tool)), "-m", gguf, "-p", prompt, "-n", str(n_new), "-t", str(threads),
           "-c", "1024", "--temp", "0", "--top-k", "1", "-s", str(SEED), *extra]
    if tool == "llama-completion":
        cmd += ["-no-cnv", "--no-display-prompt"]
    if tool == "llama-speculative":
        cmd += ["-md", gguf]
    if tool in ("llama-speculative", "llama-lookup"):
        cmd += ["--spec-draft-n-max", str(depth)]
    return cmd


DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
EVAL = re.compile(r"print:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs")
SAMPLING = re.compile(r"sampling time =\s+([\d.]+) ms")
DRAFT_COUNTS = re.compile(r"\bn_(drafted|accept)\s+=\s+(\d+)")


def generated_text(stdout: str, prompt: str, tool: str, eos: str) -> tuple[str, bool]:
    """(the new text, whether it ended at the end-of-sequence token) of a tool's stdout. llama-completion
    prints only the new text (--no-display-prompt), then " [end of text]" at the end of sequence; llama-lookup
    and llama-speculative echo the prompt, print the end-of-sequence token's text (`eos`) and finish the
    verify step it came in, so their output is cut there."""
    if tool == "llama-completion":
        text, mark, _ = stdout.partition(" [end of text]")
        return (text, True) if mark else (text.removesuffix("\n\n"), False)
    at = stdout.find(prompt)
    if at < 0:
        raise LessonkitError(f"{tool}: the prompt is not echoed in its output: {stdout[:200]!r}")
    text, mark, _ = stdout[at + len(prompt):].partition(eos)
    return (text, True) if mark else (text.removesuffix("\n\n\n\n"), False)


def decode_stats(stderr: str, tool: str) -> dict:
    """{new_tokens, decode_s, drafted, accepted} from a tool's log. llama-speculative and llama-lookup time
    their decode loop ("decoded N tokens in T seconds"); llama-completion's decode is its eval time (one
    forward per token after the prompt's, which gave the first) plus its sampling time."""
    if tool == "llama-completion":      # N tokens: the first from the prompt's forward, then N - 1 eval runs
        ev, sm = EVAL.search(stderr), SAMPLING.search(stderr)
        if not ev or not sm:
            raise LessonkitError(f"{tool}: no eval or sampling time in its log: {stderr[-300:]!r}")
        return {"new_tokens": int(ev.group(2)) + 1, "decode_s": (float(ev.group(1)) + float(sm.group(1))) / 1e3,
                "drafted": None, "accepted": None}
    dec = DECODED.search(stderr)
    counts = {k: int(v) for k, v in DRAFT_COUNTS.findall(stderr)}
    if not dec or set(counts) != {"drafted", "accept"}:
        raise LessonkitError(f"{tool}: no decode time or draft counts in its log: {stderr[-300:]!r}")
    return {"new_tokens": int(dec.group(1)), "decode_s": float(dec.group(2)), "drafted": counts["drafted"],
            "accepted": counts["accept"]}


def run_llamacpp(tool: str, gguf: str, prompt: str, n_new: int, threads: int, eos: str, depth: int = DEPTH,
                 extra: tuple[str, ...] = ()) -> Sample:
    cmd = llamacpp_command(tool, gguf, prompt, n_new, threads, depth, extra)
    r = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace")
    if r.returncode != 0:
        raise LessonkitError(f"{tool} failed (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    st = decode_stats(r.stderr, tool)
    text, at_eos = generated_text(r.stdout, prompt, tool, eos)
    return Sample(text, st["new_tokens"], st["decode_s"], st["drafted"], st["accepted"], not at_eos)


def fork_position(plain, other, *, plain_at_limit: bool = False, other_at_limit: bool = False) -> int | None:
    """Where `other` (tokens or text) leaves `plain`: the first index at which they differ; None when they do
    not. One a prefix of the other forks at the shorter's end, except when the shorter stopped at the token
    limit (the same output, cut earlier: llama-lookup and llama-speculative stop past -n)."""
    n = min(len(plain), len(other))
    at = next((i for i in range(n) if plain[i] != other[i]), None)
    if at is not None:
        return at
    shorter_at_limit = plain_at_limit if len(plain) < len(other) else other_at_limit
    if len(plain) == len(other) or shorter_at_limit:
        return None
    return n


# ---- lesson 1's appendix A: distinct completions under verify widths and thread counts ---------------------
EOS_TEXT = "<|im_end|>"      # the shipped GGUF's end-of-sequence token (its tokenizer.ggml.eos_token_id)
QUIET = ("--poll", "0")      # idle threads sleep: busy-polling ones stall a second thread on shared cores


def distinct(samples: list[Sample]) -> int:
    """How many different completions: two outputs are one where they agree up to where one stopped at -n."""
    kept: list[Sample] = []
    for s in samples:
        if all(fork_position(k.output, s.output, plain_at_limit=k.at_limit, other_at_limit=s.at_limit) is not None
               for k in kept):
            kept.append(s)
    return len(kept)


# (draft depth, threads) of each run: depth 0 is llama-completion (plain greedy), depth d llama-speculative drafting
# for itself, its verifies d + 1 rows wide; four runs, as a full product of widths and threads would cost minutes
RUNS = ((0, 1), (0, 2), (3, 1), (7, 2))


def distinct_completions(texts: list[str], *, runs=RUNS, n_new: int = 16) -> dict:
    """Lesson 1's appendix A count in llama.cpp, on the shipped smollm2-135m GGUF: each text decoded once per
    (draft depth, threads) in `runs` (depth 0: llama-completion, plain greedy; depth d: llama-speculative with
    the GGUF as its own draft model, so that every verify is d + 1 rows wide, as an oracle makes lessonkit's),
    and the distinct completions per text counted, over all runs and over the speculative runs alone. Where
    llama.cpp is not built: {"built": False, "note": one line saying how to build it}."""
    if not is_built():
        return {"built": False, "rows": [], "note": f"llama.cpp is not built here ({home()}): "
                "`lessonkit bench llamacpp --build` builds it once (minutes), then this cell counts its completions"}
    gguf = str(smollm2_gguf_path())
    rows = []
    for i, text in enumerate(texts):
        out = [(d, run_llamacpp("llama-speculative" if d else "llama-completion", gguf, text, n_new, t, EOS_TEXT, d,
                                QUIET)) for d, t in runs]
        rows.append({"prompt": i, "runs": len(out), "distinct_completions": distinct([s for _, s in out]),
                     "distinct_speculative": distinct([s for d, s in out if d])})
    return {"built": True, "rows": rows, "note": f"llama.cpp {VERSION}, {Path(gguf).name}, {n_new} new tokens",
            "runs": ", ".join(f"{f'verify width {d + 1}' if d else 'plain'} x {t} thread(s)" for d, t in runs)}
