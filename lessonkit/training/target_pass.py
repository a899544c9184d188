"""The target pass of a feature head's training (lessonkit.training.feature_head, step 1): the target answers the
TRAIN requests of lessonkit.workloads.requests greedily (a model of the corpus, tiny-moe, continues openings of the
corpus' train split instead), on the engine itself (the numerics the head will draft beside), and every position's
states at the taps and the top, and the target's greedy pick after it, are kept (bfloat16 states); then
teacher-forced windows of the corpus' train split the same way.

Shards of SHARD items are written atomically under $LESSONKIT_HOME/feature-head/, in a folder keyed by the target's
fingerprint, the numerics, the data settings and the inputs' tokens: a killed pass resumes at the first missing
shard. The missing shards may run on several processes (lessonkit.training.pass_workers): a shard's bits depend on
neither the process nor the kernel's thread count. `tc` below is the head's HeadTrainConfig
(lessonkit.training.feature_head, which imports this module): its data fields choose the pass.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lessonkit.engine import kernel
from lessonkit.errors import LessonkitError
from lessonkit.files.atomic import atomic_write
from lessonkit.files.resources import lessonkit_home
from lessonkit.workloads.corpus import EOT, KINDS, load_documents, prompts_by_kind, spread_slots
from lessonkit.workloads.requests import requests

SHARD = 40                    # items (requests or windows) per shard of the target pass


def greedy_with_states(target, prompt: list[int], max_new: int, taps: tuple[int, ...]) -> dict:
    """The target's greedy answer to `prompt` and, for every position but the last, its states [n - 1, S, D]
    (bfloat16: taps then top) and its greedy pick after that position."""
    cache = target.new_cache(len(prompt) + max_new + 1)
    logits, top, tapped = target.forward(prompt, cache, taps=taps)
    states = [torch.stack([*tapped, top], 1).to(torch.bfloat16)]
    picks = [logits.argmax(-1)]
    tokens = list(prompt)
    eos = set(target.config.eos_ids or [])
    for _ in range(max_new - 1):
        t = int(picks[-1][-1])
        tokens.append(t)
        if t in eos:
            break
        logits, top, tapped = target.forward([t], cache, taps=taps)
        states.append(torch.stack([*tapped, top], 1).to(torch.bfloat16))
        picks.append(logits.argmax(-1))
    else:
        tokens.append(int(picks[-1][-1]))
    return {"tokens": torch.tensor(tokens), "states": torch.cat(states)[:len(tokens) - 1],
            "picks": torch.cat(picks)[:len(tokens) - 1], "prompt_len": len(prompt)}


def text_with_states(target, tokens: list[int], taps: tuple[int, ...]) -> dict:
    """One teacher-forced window: the target's states and greedy picks at every position but the last."""
    logits, top, tapped = target.forward(tokens, target.new_cache(len(tokens)), taps=taps)
    return {"tokens": torch.tensor(tokens), "states": torch.stack([*tapped, top], 1)[:-1].to(torch.bfloat16),
            "picks": logits.argmax(-1)[:-1], "prompt_len": 1}


def text_windows(target, tc) -> list[tuple[str, list[int]]]:
    """(kind, tokens) of `text_windows` windows per kind, seeded slots spread over the corpus' whole train split."""
    out = []
    for kind in KINDS:
        ids = [t for d in load_documents(kind, "train") if d.strip() for t in target.encode(d + EOT)]
        slots = len(ids) // tc.window
        for s in spread_slots(slots, min(tc.text_windows, slots), tc.seed):
            out.append((f"text-{kind}", ids[s * tc.window:(s + 1) * tc.window]))
    return out


def pass_inputs(target, tc) -> tuple[dict[str, list[list[int]]], list[tuple[str, list[int]]]]:
    """What the target pass runs: the prompts by category (TRAIN requests, openings to continue) and the corpus
    windows."""
    reqs = requests(target, "train", tc.per_category, seed=tc.seed) if tc.per_category else {}
    if tc.continuations:
        reqs |= {f"cont-{kind}": ps for kind, ps in
                 prompts_by_kind(target, n=tc.continuations, max_tokens=48, seed=tc.seed, split="train").items()}
    return reqs, text_windows(target, tc)


def pass_dir(target, tc, taps, inputs=None) -> Path:
    """The shards' folder, keyed by everything the pass depends on, its inputs' tokens included: a change of the
    workload's lists or of the corpus gets a new folder, never the shards of other inputs."""
    reqs, windows = inputs or pass_inputs(target, tc)
    digest = hashlib.sha256(json.dumps([sorted(reqs.items()), windows]).encode()).hexdigest()[:12]
    key = json.dumps({**tc.data_key(), "taps": list(taps), "numerics": kernel.NUMERICS,
                      "rope": _table_digest(target), "inputs": digest}, sort_keys=True)
    return (lessonkit_home() / "feature-head" /
            f"{target.name}-{target.fingerprint()[:12]}-{hashlib.sha256(key.encode()).hexdigest()[:10]}")


def _table_digest(target) -> str:
    """The RoPE tables' bytes: the states depend on them as much as on the weights (a change of tables, as in
    9fef46f, must not reuse shards computed with the old ones)."""
    m = target.model
    return hashlib.sha256(m.cos.numpy().tobytes() + m.sin.numpy().tobytes()).hexdigest()[:12]


def pass_items(reqs: dict[str, list[list[int]]], windows: list[tuple[str, list[int]]]) -> list[tuple]:
    """The pass as data, in shard order: ("answer", category, prompt) per request, then ("text", kind, window)."""
    return [("answer", cat, p) for cat, ps in reqs.items() for p in ps] + [("text", cat, w) for cat, w in windows]


def states_of(target, item: tuple, max_new: int, taps) -> dict:
    """One item's tokens, states and greedy picks, with its category."""
    how, cat, tokens = item
    run = (greedy_with_states(target, tokens, max_new, taps) if how == "answer" else
           text_with_states(target, tokens, taps))
    return {**run, "category": cat}


def compute_shard(target, path: Path, items: list[tuple], max_new: int, taps, tick=lambda n: None) -> int:
    """One shard's items through the target, written atomically to `path` (a kill leaves no torn shard)."""
    shard = []
    for item in items:
        shard.append(states_of(target, item, max_new, taps))
        tick(1)
    atomic_write(path, lambda tmp: torch.save(shard, tmp))
    del shard          # nothing computed stays: small tensors kept between the forwards' large temporaries
                       # fragmented glibc's heap (about 20 MB a window; a 3,000-sequence pass was killed at 22 GB)
    return len(items)


def target_pass(target, tc, taps, progress: bool = True, inputs=None, workers: int = 1) -> list[dict]:
    """Every TRAIN request's greedy answer and states, then the teacher-forced corpus windows, from the shards on
    disk where they exist; the missing shards on `workers` processes (pass_workers: the same bits)."""
    inputs = inputs or pass_inputs(target, tc)
    items = pass_items(*inputs)
    folder = pass_dir(target, tc, taps, inputs)
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(folder / f"shard-{s // SHARD:04d}.pt", items[s:s + SHARD]) for s in range(0, len(items), SHARD)]
    missing = [(path, its) for path, its in jobs if not path.exists()]
    done = len(items) - sum(len(its) for _, its in missing)
    with tqdm(total=len(items), initial=done, desc=f"{target.name} on the training requests and text",
              disable=not progress) as bar:
        if workers > 1 and len(missing) > 1:
            from lessonkit.training.pass_workers import run_shards
            run_shards(target, compute_shard, missing, tc.max_new_tokens, taps, workers, bar.update)
        else:
            for path, its in missing:
                compute_shard(target, path, its, tc.max_new_tokens, taps, bar.update)
    return [seq for path, _ in jobs for seq in _shard(path)]      # computed or not, every shard read back the same way


def _shard(path: Path) -> list[dict]:
    try:
        return torch.load(path, weights_only=True)
    except Exception as e:
        raise LessonkitError(f"{path}: unreadable shard of the target pass ({e}); delete it to recompute") from None
