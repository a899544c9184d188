"""`lessonkit bench llamacpp-spec`: speculative decoding in the production engine beside lessonkit's (issue 54).

Each engine is measured against its OWN plain greedy decode, on the same GGUF (smollm2-135m, Q4_1 + Q8_0 as
shipped) and the same requests (the input-grounded ones of lesson 1, in the model's chat template), at
temperature 0 / top-k 1 and one seed:

  llama.cpp   llama-completion (plain), llama-lookup with no drafts (a control: plain decoding in the
              speculating program), llama-lookup (prompt n-grams) and llama-speculative with the target
              itself as draft model (no smaller GGUF of smollm2's vocabulary ships with lessonkit), built by
              `lessonkit bench llamacpp --build` (lessonkit.bench.llamacpp)
  lessonkit   generate (plain), speculative_generate with prompt lookup, with the target itself as drafter,
              and with the distilled smollm2-draft (as `bench spec` measures them)

Every contender runs every request once per repeat, interleaved (load drift hits all alike); the decode
phase's seconds are summed over the requests and the medians over repeats compared. Speed-up: the
contender's decode tokens/s over its engine's plain decode tokens/s. Greedy speculative output must equal
plain greedy output: each request whose output differs is reported with the position where it forks.

llama.cpp prints text, not token ids, so its forks are found in the text and given as a character offset
and as the token count of the common prefix re-tokenised with the GGUF's tokenizer; lessonkit's are token
positions. llama-speculative and llama-lookup may end their last step past -n (they check the count after a
verify): an output that runs on past plain greedy's, where plain greedy stopped at -n, is the same output.
"""
from __future__ import annotations

import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from lessonkit.bench import llamacpp
from lessonkit.bench.common import goal, machine_info
from lessonkit.engine import kernel
from lessonkit.engine.generate import generate
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.errors import LessonkitError
from lessonkit.models.gguf_loader import apply_chat_template, smollm2_gguf_path
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import ModelDrafter, NGramDrafter
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.grounded import GROUNDED_REQUESTS

MODEL = "smollm2-135m"
SEED = 42
DEPTH = 4                                   # draft tokens per step, both engines
SIZES = {"full": (48, None), "smoke": (8, 2)}     # (new tokens per request, requests: None = all)
ISSUE_URL = "https://github.com/ggml-org/llama.cpp/issues/27407"


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


# ---- the requests ----------------------------------------------------------------------------------------
def request_texts(engine, n: int | None) -> list[str]:
    """The input-grounded requests in the model's chat template: the text both engines are given."""
    return [apply_chat_template(engine, [{"role": "user", "content": t}]) for t in GROUNDED_REQUESTS[:n]]


# ---- llama.cpp's side ------------------------------------------------------------------------------------
# name -> (tool, draft depth). "no drafts" is llama-lookup with --spec-draft-n-max 0: one token per step, plain
# decoding in the program that speculates, which splits the prompt's forward as llama-speculative does (all but
# the last token, then the last alone) where llama-completion runs it whole; it tells a fork that speculation
# makes from one that the program's own prompt batching makes.
CONTROL = "no drafts (llama-lookup, k=0)"
LLAMACPP_TOOLS = {"plain greedy": ("llama-completion", 0), CONTROL: ("llama-lookup", 0),
                  "prompt lookup": ("llama-lookup", DEPTH), "self-draft": ("llama-speculative", DEPTH)}


def llamacpp_command(tool: str, gguf: str, prompt: str, n_new: int, threads: int, depth: int = DEPTH,
                     extra: tuple[str, ...] = ()) -> list[str]:
    """The command line of one request: greedy (temperature 0, top-k 1), one seed, one context size; `extra`
    options after those."""
    cmd = [str(llamacpp.binary(tool)), "-m", gguf, "-p", prompt, "-n", str(n_new), "-t", str(threads),
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


def require_built() -> None:
    if not llamacpp.is_built():
        raise LessonkitError(f"llama.cpp is not built in {llamacpp.home()}: run `lessonkit bench llamacpp --build` "
                             "once (downloads the llama-cpp-python sdist and compiles llama-completion, "
                             "llama-lookup and llama-speculative; minutes)")


def llamacpp_contenders(prompts: list[str], n_new: int, threads: int, eos: str) -> dict:
    require_built()
    gguf = str(smollm2_gguf_path())
    return {("llama.cpp", name): (lambda i, tool=tool, k=k: run_llamacpp(tool, gguf, prompts[i], n_new, threads, eos, k))
            for name, (tool, k) in LLAMACPP_TOOLS.items()}


# ---- lessonkit's side ------------------------------------------------------------------------------------
def _sample(result, drafted: bool) -> Sample:
    st = result.stats
    return Sample(result.token_ids, st["new_tokens"] - 1, st["wall_s"] - st["ttft_s"],
                  st.get("num_draft_tokens") if drafted else None,
                  st.get("num_accepted_tokens") if drafted else None,
                  st.get("finish_reason", "length") == "length")


def lessonkit_contenders(target, prompts: list[list[int]], n_new: int, threads: int, notes: list) -> dict:
    """Plain greedy, prompt lookup, the target drafting for itself and the distilled smollm2-draft, all k=DEPTH."""
    pin_torch_threads(1)             # lessonkit's threads are the kernel's (as `bench llamacpp`)
    kernel.set_threads(threads)
    drafters = {"prompt lookup": NGramDrafter(), "self-draft": ModelDrafter(target, name="self")}
    try:
        drafters["distilled draft"] = ModelDrafter(load_model("smollm2-draft"), name="smollm2-draft")
    except LessonkitError as e:
        notes.append(f"lessonkit distilled-draft row skipped: {e}")
    out = {("lessonkit", "plain greedy"): lambda i: _sample(generate(target, prompts[i], n_new), False)}
    for name, d in drafters.items():
        out["lessonkit", name] = lambda i, d=d: _sample(speculative_generate(target, d, prompts[i], n_new, k=DEPTH,
                                                                              seed=SEED), True)
    return out


# ---- comparing outputs -----------------------------------------------------------------------------------
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


def forks(plain: list[Sample], other: list[Sample], token_at=None) -> list[dict]:
    """The requests whose output differs from plain greedy: index, fork position (tokens; for text also the
    character, and `token_at(text, char)`: the token of plain's text, re-tokenised, that holds it) and the
    two continuations."""
    out = []
    for i, (p, o) in enumerate(zip(plain, other)):
        at = fork_position(p.output, o.output, plain_at_limit=p.at_limit, other_at_limit=o.at_limit)
        if at is None:
            continue
        row = {"request": i}
        if isinstance(p.output, str):
            row |= {"fork_char": at, "fork_token": token_at(p.output, at) if token_at else None,
                    "plain": p.output[at:at + 24], "speculative": o.output[at:at + 24]}
        else:
            row |= {"fork_token": at, "plain": p.output[at:at + 4], "speculative": o.output[at:at + 4]}
        out.append(row)
    return out


def token_at(tokenizer):
    """(text, char) -> the index of the token that holds text[char] as `tokenizer` (a tokenizers.Tokenizer)
    splits text; len(tokens) for char == len(text)."""
    def at(text: str, char: int) -> int:
        enc = tokenizer.encode(text, add_special_tokens=False)
        i = enc.char_to_token(char) if char < len(text) else None
        return len(enc.ids) if i is None else i
    return at


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
    if not llamacpp.is_built():
        return {"built": False, "rows": [], "note": f"llama.cpp is not built here ({llamacpp.home()}): "
                "`lessonkit bench llamacpp --build` builds it once (minutes), then this cell counts its completions"}
    gguf = str(smollm2_gguf_path())
    rows = []
    for i, text in enumerate(texts):
        out = [(d, run_llamacpp("llama-speculative" if d else "llama-completion", gguf, text, n_new, t, EOS_TEXT, d,
                                QUIET)) for d, t in runs]
        rows.append({"prompt": i, "runs": len(out), "distinct_completions": distinct([s for _, s in out]),
                     "distinct_speculative": distinct([s for d, s in out if d])})
    return {"built": True, "rows": rows, "note": f"llama.cpp {llamacpp.VERSION}, {Path(gguf).name}, {n_new} new tokens",
            "runs": ", ".join(f"{f'verify width {d + 1}' if d else 'plain'} x {t} thread(s)" for d, t in runs)}


# ---- the benchmark ---------------------------------------------------------------------------------------
def measure(fns: dict, n_requests: int, repeats: int) -> dict:
    """{key: [[Sample per request] per repeat]}: every contender over all requests, in turn within a repeat."""
    runs = {key: [] for key in fns}
    for r in range(repeats):
        for key, fn in fns.items():
            runs[key].append([fn(i) for i in range(n_requests)])
        print(f"repeat {r + 1}/{repeats} done", file=sys.stderr)
    return runs


def summarise(runs: dict, token_at=None) -> list[dict]:
    """One row per contender: median decode tokens/s, speed-up over its engine's plain greedy, acceptance, and
    how many requests' output differs from plain greedy's (first repeat) and where; `stable`: every repeat
    gave the first repeat's outputs. Where the engine has the no-drafts control, the speed-up over it and the
    requests that differ from its output too (a fork that the drafts make, not the program)."""
    rate = {key: statistics.median(sum(s.new_tokens for s in rep) / sum(s.decode_s for s in rep) for rep in reps)
            for key, reps in runs.items()}
    rows = []
    for (engine, name), reps in runs.items():
        plain = runs[engine, "plain greedy"][0]
        diff = forks(plain, reps[0], token_at)
        drafted = sum(s.drafted or 0 for s in reps[0])
        rows.append({"engine": engine, "name": name, "requests": len(reps[0]),
                     "new_tokens": sum(s.new_tokens for s in reps[0]), "decode_tok_s": rate[engine, name],
                     "speedup": rate[engine, name] / rate[engine, "plain greedy"],
                     "acceptance": sum(s.accepted or 0 for s in reps[0]) / drafted if drafted else None,
                     "requests_differing": len(diff), "fork_tokens": [f["fork_token"] for f in diff], "forks": diff,
                     "stable": all([s.output for s in rep] == [s.output for s in reps[0]] for rep in reps)})
        if (engine, CONTROL) in runs:
            rows[-1] |= {"speedup_over_no_drafts": rate[engine, name] / rate[engine, CONTROL],
                         "requests_differing_from_no_drafts": len(forks(runs[engine, CONTROL][0], reps[0]))}
    return rows


def targets_of(rows: list[dict]) -> list[dict]:
    return [goal(f"{r['engine']} {r['name']}: requests whose greedy output differs from its own plain greedy",
                 r["requests_differing"], "0", r["requests_differing"] == 0)
            for r in rows if r["name"] != "plain greedy"]


def bench(args) -> dict:
    smoke = bool(getattr(args, "smoke", False))
    repeats = 1 if smoke else max(1, getattr(args, "repeats", None) or 3)
    threads = (getattr(args, "threads", None) or [1])[0]
    n_new, n_req = SIZES["smoke" if smoke else "full"]
    build_info = llamacpp.build() if getattr(args, "build", False) else None
    require_built()
    notes = ["smoke sizes (8 new tokens, 2 requests, 1 repeat): not the figures"] if smoke else []
    target = load_model(MODEL)
    texts = request_texts(target, n_req)
    fns = llamacpp_contenders(texts, n_new, threads, target.decode(target.config.eos_ids[:1]))
    fns |= lessonkit_contenders(target, [target.encode(t) for t in texts], n_new, threads, notes)
    rows = summarise(measure(fns, len(texts), repeats), token_at(target.tokenizer))
    forks_of = {f"{r['engine']} {r['name']}": r.pop("forks") for r in rows}
    notes.append(f"llama.cpp on a GPU forked from its plain output on 76-80% of requests ({ISSUE_URL}); "
                 "the rows above are this CPU")
    return {"bench": "llamacpp-spec", "model": MODEL, "machine": machine_info(), "kernel": kernel.backend(),
            "weights": target.weights, "gguf": str(smollm2_gguf_path()),
            "llamacpp": {"version": llamacpp.VERSION, "dir": str(llamacpp.home()), "built": llamacpp.is_built(),
                         "build": build_info, "commands": {
                             name: llamacpp_command(tool, str(smollm2_gguf_path()), "REQUEST", n_new, threads, k)
                             for name, (tool, k) in LLAMACPP_TOOLS.items()}},
            "threads": threads, "repeats": repeats, "new_tokens_per_request": n_new, "draft_depth": DEPTH,
            "seed": SEED, "rows": rows, "forks": forks_of, "targets": targets_of(rows), "notes": notes}
