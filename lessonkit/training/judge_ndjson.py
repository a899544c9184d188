"""Trained judges answering in NDJSON: every answer parsed and checked against JUDGE_SCHEMA (the count the
judge's card records, `lessonkit train judge`).

Each item is judged by the capstone's Judge (lessonkit.stack) behind a prefix cache, with grammar drafting and
prompt lookup: all lossless, so the answers are the plain engine's greedy answers, written faster.
The grammar only drafts; nothing forces the model, so a parse failure would be the model's own.
"""
from __future__ import annotations

import tempfile
import time

from tqdm.auto import tqdm

from lessonkit.errors import LessonkitError
from lessonkit.prefix_cache.cache import PrefixCache
from lessonkit.stack import Judge
from lessonkit.semcache.judge import trained_prompt
from lessonkit.workloads.triage import follows_schema, needs_action


def ndjson_answers(engine, texts, max_new_tokens: int = 40, progress: bool = True) -> dict:
    """The trained judge `engine` answers every distinct text; counts of answers that parse and follow the
    schema, and the answers themselves (text -> line)."""
    spec = trained_prompt(engine.name)
    if spec is None:
        raise LessonkitError(f"{engine.name} is not a trained judge (no judge.json)")
    t0 = time.perf_counter()
    answers = {}
    with tempfile.TemporaryDirectory(prefix="lessonkit-judge-pc-") as d:     # the prefix is prefilled once
        judge = Judge(engine, spec["prefix"], max_new_tokens=max_new_tokens, grammar=True, model_drafter="ngram",
                      prefix_cache=PrefixCache(d, engine, fsync=False))
        for t in tqdm(list(dict.fromkeys(texts)), desc=f"{engine.name}: NDJSON answers", disable=not progress):
            answers[t] = judge(t).text
        judge.close()
    ok = sum(follows_schema(a) for a in answers.values())
    return {"items": len(answers), "parsed": ok, "non_empty": sum(bool(a.strip()) for a in answers.values()),
            "yes": sum(needs_action(a) for a in answers.values()), "seconds": round(time.perf_counter() - t0, 1),
            "note": "greedy answers, grammar drafting + prompt lookup, no constraint", "answers": answers,
            "max_new_tokens": max_new_tokens}
