"""`lessonkit bench llamacpp`: the llama.cpp anchor. llama.cpp on the GGUF as shipped (Q4_1 + Q8_0, its
weakest x86 path), on its Q4_0 requantisation (its fastest format of the same model: the honest ceiling) and on
its F32 requantisation, lessonkit on native blocks and on float32, and transformers float32, side by side:
decode tokens/s (128 tokens) and prefill tokens/s (512 tokens) at the same thread counts, interleaved over
the repeats, medians.

llama.cpp is the one vendored in the llama-cpp-python 0.3.36 sdist, built CPU-only (cmake + ninja,
GGML_NATIVE) into lessonkit_home()/llamacpp-0.3.36 only when asked (`--build`): never by the README
commands or the tests. The same build holds llama-completion, llama-lookup and llama-speculative (llama.cpp's
examples, hence LLAMA_BUILD_EXAMPLES=ON) for `bench llamacpp-spec` (lessonkit.bench.bench_llamacpp_spec).
`--ggml avx2` measures another build instead, made by `--build --ggml avx2` into lessonkit_home()/llamacpp-0.3.36-avx2:
AVX2 without AVX-512 or VNNI, the kernels an AVX2 CPU (AMD Zen 3) runs; with LESSONKIT_KERNEL=avx2 the two engines'
AVX2 paths run side by side on a machine that has AVX-512 (lessonkit.measure.llamacpp.GGML_BUILDS).
`llama-bench -p 512 -n 128 -r 1 -o json` runs its prefill and decode tests one after the other (each with
its own warm-up), the same as `-p 512 -n 0` and `-p 0 -n 128`, loading the model once.
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

from lessonkit.bench.common import decode_rate, goal, prefill_rate
from lessonkit.engine import kernel
from lessonkit.engine.active import describe
from lessonkit.errors import LessonkitError
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.measure.llamacpp import VERSION, binary, build_record, check_ggml, cmake_flags, home, is_built, tools
from lessonkit.models.gguf_loader import load_smollm2, smollm2_gguf_path, to_transformers
from lessonkit.models.registry import load_model
from lessonkit.engine.machine import machine_record

MODEL = "smollm2-135m"
ENGINES = ("llamacpp", "lessonkit", "transformers")
NEEDED = {"a C compiler": ("cc", "gcc", "clang"), "a C++ compiler": ("c++", "g++", "clang++"),
          "cmake": ("cmake",), "ninja": ("ninja",)}
SIZES = {"full": (128, 512), "smoke": (8, 32)}      # (decoded tokens, prefill tokens)


# ---- building llama.cpp ------------------------------------------------------------------------------
def _which(name: str) -> str | None:
    """On PATH, or beside this Python (cmake and ninja pip-installed into a venv that is not activated)."""
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), str(Path(sys.executable).parent)]))


def require_tools() -> dict[str, str]:
    """{what: path} of the compilers, cmake and ninja; one LessonkitError naming all that are missing."""
    found = {what: next((p for n in names if (p := _which(n))), None) for what, names in NEEDED.items()}
    missing = [what for what, p in found.items() if p is None]
    if missing:
        raise LessonkitError(
            f"building llama.cpp for `bench llamacpp` needs a C and C++ compiler, cmake and ninja; missing: "
            f"{', '.join(missing)}. Install cmake and ninja with `pip install cmake ninja` (into .venv) and a "
            "compiler with the system's packages (e.g. `apt-get install build-essential`), then run again")
    return found


def _run_logged(cmd: list[str], log: Path, what: str) -> None:
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise LessonkitError(f"{what} failed (exit {rc}); its output is in {log}")


def safe_extract(tar: tarfile.TarFile, dest: Path, members: list, source) -> None:
    """Extract members under dest and nowhere else, on every Python 3.11: tarfile's "data" filter where it
    exists (3.11.4 on), before that the same rules checked here (no absolute name or `..`, links only to
    inside dest, only files, directories and links, no setuid bits, owned by this user). A member that
    breaks them is one LessonkitError naming it and the archive; dest is then removed."""
    try:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=[_checked_member(m, Path(dest).resolve()) for m in members])
    except _RefusedMember as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise LessonkitError(f"{source}: refusing to unpack member {e.args[0]!r} ({e.args[1]})") from None
    except getattr(tarfile, "FilterError", _RefusedMember) as e:
        shutil.rmtree(dest, ignore_errors=True)
        raise LessonkitError(f"{source}: refusing to unpack member {e.tarinfo.name!r} ({e})") from None


class _RefusedMember(Exception):
    """A member the hand-made data filter refuses (Python 3.11.0 to 3.11.3)."""


def _checked_member(m: tarfile.TarInfo, root: Path) -> tarfile.TarInfo:
    """tarfile's data filter by hand: the member (changed in place) or _RefusedMember(name, why)."""
    def inside(p: str) -> bool:
        return os.path.normpath(os.path.join(root, p)).startswith(str(root) + os.sep)
    name = m.name.replace("\\", "/")
    if name.startswith("/") or ".." in name.split("/") or not inside(name):
        raise _RefusedMember(m.name, "an absolute name or one leading outside the destination")
    if m.issym() and (m.linkname.startswith("/") or not inside(os.path.join(os.path.dirname(name), m.linkname))):
        raise _RefusedMember(m.name, f"a symbolic link to {m.linkname!r}, outside the destination")
    if m.islnk() and (m.linkname.startswith("/") or not inside(m.linkname)):
        raise _RefusedMember(m.name, f"a hard link to {m.linkname!r}, outside the destination")
    if not (m.isreg() or m.isdir() or m.issym() or m.islnk()):
        raise _RefusedMember(m.name, "a device, FIFO or other special file")
    m.mode &= 0o755                                   # no setuid / setgid / sticky bits, no group or other write
    m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
    return m


def fetch_sources(root: Path, log: Path) -> Path:
    """root/llama.cpp: vendor/llama.cpp of the llama-cpp-python sdist, downloaded with pip once."""
    src = root / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    sdists = root / "sdist"
    _run_logged([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                 f"llama-cpp-python=={VERSION}", "-d", str(sdists)], log,
                "pip download of the llama-cpp-python sdist")
    sdist = next(sdists.glob(f"llama_cpp_python-{VERSION}.tar.gz"))
    prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
    partial = root / "llama.cpp.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.name != prefix + ".git"]
        for m in members:
            m.name = m.name[len(prefix):]
            if m.islnk() and m.linkname.startswith(prefix):      # a hard link names a member of the archive
                m.linkname = m.linkname[len(prefix):]
        safe_extract(tar, partial, members, sdist)
    partial.rename(src)
    shutil.rmtree(sdists)           # 74 MB, of which only vendor/llama.cpp is needed
    return src


def build(ggml: str = "native") -> dict:
    """Download, unpack and build the tools of the `ggml` build (CPU only; measure.llamacpp.GGML_BUILDS) unless they
    are there, built with today's flags. The sources are unpacked once, into the native build's folder."""
    root = home(ggml)
    if is_built(ggml):
        return build_record(ggml)
    programs = require_tools()
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    print(f"building llama.cpp {VERSION} ({ggml}; llama-cpp-python sdist) into {root}; log: {log}", file=sys.stderr)
    t0 = time.perf_counter()
    home().mkdir(parents=True, exist_ok=True)
    src = fetch_sources(home(), log)
    _run_logged([programs["cmake"], "-S", str(src), "-B", str(root / "build"), "-G", "Ninja",
                 f"-DCMAKE_MAKE_PROGRAM={programs['ninja']}", *cmake_flags(ggml)], log, "cmake configure")
    _run_logged([programs["cmake"], "--build", str(root / "build"), "--target", *tools(ggml)], log, "cmake build")
    info = {"version": VERSION, "ggml": ggml, "flags": list(cmake_flags(ggml)),
            "build_s": round(time.perf_counter() - t0, 1), "cpu_count": os.cpu_count()}
    (root / "build.json").write_text(json.dumps(info, indent=1), encoding="utf-8")
    print(f"built in {info['build_s']:.0f} s", file=sys.stderr)
    return info


def quantize_command(src: Path, dst: Path, kind: str, ggml: str = "native") -> list[str]:
    return [str(binary("llama-quantize", ggml)), "--allow-requantize", str(src), str(dst), kind]


def requantized(q4: Path, kind: str, ggml: str = "native") -> Path:
    """The GGUF that `llama-quantize --allow-requantize IN OUT KIND` makes from the shipped file, once, into
    home() (one file for every build: the native and AVX2 builds made the same bytes, compared with cmp): written as OUT.partial
    and renamed (removed when the tool fails), reused when present. The `ggml` build's llama-quantize makes it."""
    out = home() / (q4.name.replace("Q4_1", kind) if "Q4_1" in q4.name else f"{q4.stem}.{kind}.gguf")
    if out.is_file():
        return out
    if not binary("llama-quantize", ggml).is_file():
        raise LessonkitError(f"llama-quantize is not in {binary('llama-quantize', ggml).parent}")
    tmp = out.with_suffix(".partial")
    try:
        _run_logged(quantize_command(q4, tmp, kind, ggml), home(ggml) / "quantize.log", f"llama-quantize to {kind}")
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def f32_gguf(q4: Path, ggml: str = "native") -> Path:
    return requantized(q4, "F32", ggml)


def q4_0_gguf(q4: Path, ggml: str = "native") -> Path:
    """Q4_0, llama.cpp's fastest format on x86 (repacked for AVX2 / AVX-512 at load; Q4_1 is not)."""
    return requantized(q4, "Q4_0", ggml)


# ---- measuring -----------------------------------------------------------------------------------------
def parse_bench_json(text: str) -> dict:
    """llama-bench `-o json` output -> {decode_tok_s, prefill_tok_s (those present), build_commit, ...}."""
    try:
        tests = json.loads(text)
    except ValueError as e:
        raise LessonkitError(f"llama-bench printed no JSON list ({e}): {text[:200]!r}") from None
    out = {}
    for t in tests:
        key = "decode_tok_s" if t["n_gen"] > 0 and t["n_prompt"] == 0 else \
            "prefill_tok_s" if t["n_prompt"] > 0 and t["n_gen"] == 0 else None
        if key is None:
            continue
        out[key] = float(t["avg_ts"])
        out |= {"build_commit": t.get("build_commit"), "n_threads": t["n_threads"], "model_type": t.get("model_type")}
    if not {"decode_tok_s", "prefill_tok_s"} & set(out):
        raise LessonkitError(f"llama-bench JSON holds no prefill-only or decode-only test: {text[:200]!r}")
    return out


def llama_bench(model: Path, threads: int, n_gen: int, n_prompt: int, ggml: str = "native") -> dict:
    cmd = [str(binary("llama-bench", ggml)), "-m", str(model), "-t", str(threads), "-p", str(n_prompt),
           "-n", str(n_gen), "-r", "1", "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8")
    if r.returncode != 0:
        raise LessonkitError(f"{' '.join(cmd)} failed (exit {r.returncode}): {r.stderr.strip()[-400:]}")
    return parse_bench_json(r.stdout)


def _llamacpp_contenders(q4: Path, notes: list[str], ggml: str = "native") -> dict:
    """Q4_1 as shipped, Q4_0 and F32, on the `ggml` build. A Q4_0 file that cannot be made is one line (stderr and
    notes) and no Q4_0 row; the other rows run unchanged."""
    if not is_built(ggml):
        flag = "" if ggml == "native" else f" --ggml {ggml}"
        raise LessonkitError(f"llama.cpp ({ggml}) is not built in {home(ggml)}: run `lessonkit bench llamacpp --build"
                             f"{flag}` once (downloads the llama-cpp-python sdist and compiles llama-bench; minutes), "
                             "or leave llamacpp out with --engines lessonkit,transformers")
    f32 = f32_gguf(q4, ggml)
    out = {("llama.cpp", "Q4_1 + Q8_0 (as shipped)", str(q4)): lambda n, g, p: llama_bench(q4, n, g, p, ggml)}
    try:
        q4_0 = q4_0_gguf(q4, ggml)
        out[("llama.cpp", "Q4_0 (llama-quantize)", str(q4_0))] = lambda n, g, p: llama_bench(q4_0, n, g, p, ggml)
    except LessonkitError as e:
        notes.append(f"no llama.cpp Q4_0 row: {e}")
        print(f"bench llamacpp: {notes[-1]}", file=sys.stderr)
    out[("llama.cpp", "F32 (llama-quantize)", str(f32))] = lambda n, g, p: llama_bench(f32, n, g, p, ggml)
    return out


def _lessonkit_contenders(prompt: list[int], prefill: list[int]) -> dict:
    """lessonkit on native blocks and on float32; `engine.weights` names what ran (f32 without the C kernel)."""
    out = {}
    for weights in ("native", "f32"):
        eng = load_model(MODEL, weights=weights)

        def run(n, g, p, eng=eng):
            pin_torch_threads(1)          # lessonkit's threads are the kernel's; more OpenMP threads only contend
            kernel.set_threads(n)
            return {"decode_tok_s": decode_rate(eng, prompt, g), "prefill_tok_s": prefill_rate(eng, prefill[:p])}
        out[("lessonkit", eng.weights, str(eng.model_dir))] = run
    return out


def _transformers_contender(gguf, q4: Path, prompt: list[int], prefill: list[int]) -> dict:
    hf = to_transformers(gguf)

    def run(n, g, p):
        pin_torch_threads(n)
        return {"decode_tok_s": hf_decode_rate(hf, prompt, g), "prefill_tok_s": hf_prefill_rate(hf, prefill[:p])}
    return {("transformers", "float32", str(q4)): run}


def hf_decode_rate(hf, prompt: list[int], n: int) -> float:
    """Greedy decode tokens/s of a transformers model over its KV cache (model(ids, cache), use_cache)."""
    with torch.no_grad():
        out = hf(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
        t0 = time.perf_counter()
        for _ in range(n):
            tok = out.logits[:, -1:].argmax(-1)
            out = hf(tok, cache=out.cache, use_cache=True)
        return n / (time.perf_counter() - t0)


def hf_prefill_rate(hf, ids: list[int]) -> float:
    """Prefill tokens/s of a transformers model (last position's logits only, as llama-bench and lessonkit)."""
    with torch.no_grad():
        t0 = time.perf_counter()
        hf(torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        return len(ids) / (time.perf_counter() - t0)


# ---- the benchmark -------------------------------------------------------------------------------------
def _inputs(gguf, n_prefill: int) -> tuple[list[int], list[int]]:
    """A short prompt for decode, and n_prefill fixed pseudo-random ids (llama-bench prefills random ids)."""
    prompt = gguf.tokenizer.encode("The row-invariant kernel").ids
    ids = torch.randint(100, gguf.hf_config["vocab_size"], (n_prefill,), generator=torch.Generator().manual_seed(0))
    return prompt, ids.tolist()


def contenders(engines: list[str], n_prefill: int, notes: list[str] | None = None, ggml: str = "native") -> dict:
    """{(engine, weights, weights path): run(threads, n_gen, n_prompt) -> {decode_tok_s, prefill_tok_s}}; a row
    left out is a line appended to notes."""
    q4 = smollm2_gguf_path()
    out = _llamacpp_contenders(q4, notes if notes is not None else [], ggml) if "llamacpp" in engines else {}
    if {"lessonkit", "transformers"} & set(engines):
        gguf = load_smollm2(progress=False)
        prompt, prefill = _inputs(gguf, n_prefill)
        if "lessonkit" in engines:
            out |= _lessonkit_contenders(prompt, prefill)
        if "transformers" in engines:
            out |= _transformers_contender(gguf, q4, prompt, prefill)
    return out


def measure(fns: dict, threads: list[int], repeats: int, n_gen: int, n_prompt: int) -> list[dict]:
    """Every contender at every thread count, in turn within each repeat; one row per (threads, contender)."""
    samples = {(n, key): [] for n in threads for key in fns}
    for r in range(repeats):
        for n in threads:
            for key, fn in fns.items():
                samples[n, key].append(fn(n, n_gen, n_prompt))
        print(f"repeat {r + 1}/{repeats} done", file=sys.stderr)
    rows = []
    for (n, (engine, weights, path)), ss in samples.items():
        med = {k: statistics.median([s[k] for s in ss if k in s] or [float("nan")])
               for k in ("decode_tok_s", "prefill_tok_s")}
        rows.append({"threads": n, "engine": engine, "weights": weights, **med, "weights_path": path})
    return rows


def _rate(rows, n, engine, weights_start, key="decode_tok_s"):
    return next((r[key] for r in rows if r["threads"] == n and r["engine"] == engine
                 and r["weights"].lower().startswith(weights_start)), None)


def ratios_and_targets(rows: list[dict], threads: list[int]) -> tuple[list[dict], list[dict]]:
    """Ratios lessonkit native / llama.cpp Q4_1, native / llama.cpp Q4_0 and native / lessonkit float32 per
    thread count, and the issues' figures as goals (only those whose both sides were measured): decode >= 1.0x
    and prefill >= 1.5x llama.cpp's Q4_1 at every thread count (issue 43, the whole step in C); decode >= 1.0x
    and prefill >= 1.0x llama.cpp's Q4_0, its fastest format (issue 61 item 7, on the int8 numerics: the table
    names the numerics); and the native / float32 ratios."""
    ratios, targets = [], []
    for n in threads:
        for key in ("decode_tok_s", "prefill_tok_s"):
            nat = _rate(rows, n, "lessonkit", "native", key)
            other = {f"native / llama.cpp {w.upper()}": _rate(rows, n, "llama.cpp", w, key) for w in ("q4_1", "q4_0")}
            other["native / lessonkit f32"] = _rate(rows, n, "lessonkit", "f32", key)
            ratios.append({"threads": n, "figure": key,
                           **{k: nat / v if nat and v else None for k, v in other.items()}})
    wanted = {("decode_tok_s", "Q4_1"): 1.0, ("prefill_tok_s", "Q4_1"): 1.5,
              ("decode_tok_s", "Q4_0"): 1.0, ("prefill_tok_s", "Q4_0"): 1.0}
    for r in ratios:
        vs_f32 = r["native / lessonkit f32"]
        for (figure, w), at_least in wanted.items():
            if r["figure"] == figure and (v := r[f"native / llama.cpp {w}"]) is not None:
                targets.append(goal(f"{figure.split('_')[0]}, {r['threads']} thread(s): native / llama.cpp {w}",
                                    round(v, 3), f">= {at_least}", v >= at_least))
        if r["figure"] == "decode_tok_s" and r["threads"] == 1 and vs_f32 is not None:
            targets.append(goal("decode, 1 thread: native / lessonkit float32", round(vs_f32, 3), ">= 2.5",
                                vs_f32 >= 2.5))
        if r["figure"] == "prefill_tok_s" and vs_f32 is not None:
            targets.append(goal(f"prefill, {r['threads']} thread(s): native / lessonkit float32", round(vs_f32, 3),
                                ">= 0.8", vs_f32 >= 0.8))
    return ratios, targets


def parse_engines(text: str | None) -> list[str]:
    names = [e.strip() for e in (text or ",".join(ENGINES)).split(",") if e.strip()]
    bad = [e for e in names if e not in ENGINES]
    if bad or not names:
        raise LessonkitError(f"--engines: unknown {', '.join(bad) or '(none given)'}; "
                             f"choose from {', '.join(ENGINES)}")
    return names


def bench(args) -> dict:
    engines = parse_engines(getattr(args, "engines", None))
    threads = list(getattr(args, "threads", None) or [1, 2])
    smoke = bool(getattr(args, "smoke", False))
    repeats = 1 if smoke else max(1, getattr(args, "repeats", None) or 5)
    n_gen, n_prompt = SIZES["smoke" if smoke else "full"]
    ggml = check_ggml(getattr(args, "ggml", None) or "native")
    build_info = build(ggml) if getattr(args, "build", False) else None
    left_out = [] if ggml == "native" or kernel.isa() == ggml else [
        f"llama.cpp's {ggml} build beside lessonkit's {kernel.isa()} path: LESSONKIT_KERNEL={ggml} puts the two "
        f"engines' {ggml} paths side by side"]
    fns = contenders(engines, n_prompt, left_out, ggml)
    rows = measure(fns, threads, repeats, n_gen, n_prompt)
    ratios, targets = ratios_and_targets(rows, threads)
    notes = ["smoke sizes (8 decoded, 32 prefilled, 1 repeat): not the issue's figures"] if smoke else []
    notes += left_out + [f"{r['figure']}, {r['threads']} thread(s): " + ", ".join(
        f"{k} {v:.2f}x" for k, v in r.items() if k not in ("threads", "figure") and v is not None)
        for r in ratios if any(v is not None for k, v in r.items() if k not in ("threads", "figure"))]
    return {"bench": "llamacpp", "model": MODEL, "machine": machine_record(), "kernel": describe(),
            "llamacpp": {"version": VERSION, "ggml": ggml, "dir": str(home(ggml)), "built": is_built(ggml),
                         "build": build_info, "flags": list(cmake_flags(ggml))},
            "engines": engines, "threads": threads, "repeats": repeats, "decode_tokens": n_gen,
            "prefill_tokens": n_prompt, "rows": rows, "ratios": ratios, "targets": targets, "notes": notes}
