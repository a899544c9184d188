"""`lessonkit bench llamacpp-spec`: speculative decoding in the production engine beside lessonkit's (issue 54).

Each engine is measured against its OWN plain greedy decode, on the same GGUF (smollm2-135m, Q4_1 + Q8_0 as
shipped) and the same requests (the input-grounded ones of lesson 1, in the model's chat template), at
temperature 0 / top-k 1 and one seed:

  llama.cpp   llama-completion (plain), llama-lookup with no drafts (a control: plain decoding in the
              speculating program), llama-lookup (prompt n-grams) and llama-speculative with the target
              itself as draft model (no smaller GGUF of smollm2's vocabulary ships with lessonkit), built by
              `lessonkit bench llamacpp --build` (lessonkit.bench.bench_llamacpp)
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

import statistics
import sys

from lessonkit.bench import bench_llamacpp
from lessonkit.bench.common import goal
from lessonkit.engine import kernel
from lessonkit.engine.active import describe
from lessonkit.engine.generate import generate
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.errors import LessonkitError
from lessonkit.measure.llamacpp import DEPTH, SEED, Sample, fork_position, llamacpp_command, run_llamacpp
from lessonkit.models.gguf_loader import apply_chat_template, smollm2_gguf_path
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import ModelDrafter, NGramDrafter
from lessonkit.speculative.verify import speculative_generate
from lessonkit.workloads.grounded import GROUNDED_REQUESTS
from lessonkit.engine.machine import machine_record

MODEL = "smollm2-135m"
SIZES = {"full": (48, None), "smoke": (8, 2)}     # (new tokens per request, requests: None = all)
ISSUE_URL = "https://github.com/ggml-org/llama.cpp/issues/27407"


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


def require_built() -> None:
    if not bench_llamacpp.is_built():
        raise LessonkitError(f"llama.cpp is not built in {bench_llamacpp.home()}: run "
                             "`lessonkit bench llamacpp --build` "
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
    build_info = bench_llamacpp.build() if getattr(args, "build", False) else None
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
    return {"bench": "llamacpp-spec", "model": MODEL, "machine": machine_record(), "kernel": describe(),
            "weights": target.weights, "gguf": str(smollm2_gguf_path()),
            "llamacpp": {"version": bench_llamacpp.VERSION, "dir": str(bench_llamacpp.home()),
                         "built": bench_llamacpp.is_built(),
                         "build": build_info, "commands": {
                             name: llamacpp_command(tool, str(smollm2_gguf_path()), "REQUEST", n_new, threads, k)
                             for name, (tool, k) in LLAMACPP_TOOLS.items()}},
            "threads": threads, "repeats": repeats, "new_tokens_per_request": n_new, "draft_depth": DEPTH,
            "seed": SEED, "rows": rows, "forks": forks_of, "targets": targets_of(rows), "notes": notes}
