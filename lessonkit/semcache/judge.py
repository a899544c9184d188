"""The monitoring judge: reads one item and answers whether it needs action (True = "yes").

Its fresh answer is the ground truth a semantic cache must reproduce; it does not need to be right
about the world. Three implementations share one protocol, ``judge(item) -> bool`` plus a
``fingerprint`` string that goes into the cache's scope key:

- ``LogitJudge``: smollm2-135m (instruct) on the lessonkit engine. The item is put into a fixed
  instruction, rendered with the GGUF's chat template (generation prompt on), and the judge
  compares the next-token logits of "yes" against "no" (log-sum-exp over the spellings yes/Yes and
  no/No). The constant part of the prompt is run once and its KV snapshot reused per item.
- ``RuleJudge``: a deterministic fake for fast tests (intended labels, then a keyword rule).
- ``RecordedJudge``: answers read from a ground-truth file of fresh answers that a given judge
  gave earlier (for notebook speed), falling back to that live judge for anything missing.
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lessonkit.files.atomic import atomic_write
from lessonkit.files.resources import workbook_path
from lessonkit.errors import LessonkitError
from lessonkit.models.gguf_loader import apply_chat_template, load_smollm2, to_transformers
from lessonkit.models.registry import MODELS_DIR, load_model

INSTRUCTION = (
    "You triage alerts for an on-call engineer. Answer with one word: yes if an engineer must act "
    "on the monitoring item now, no if nothing needs doing.\n"
    "Does this item need action?\n"
    "Item:\n{item}")
YES_SPELLINGS = ("yes", "Yes")
NO_SPELLINGS = ("no", "No")
JUDGE_BIAS = 0.0    # decision boundary on the log-odds: yes when P(yes) > P(no)
GROUND_TRUTH_PATH = workbook_path("data", "semcache", "judge_answers.json")


def instruction_fingerprint(instruction: str = INSTRUCTION) -> str:
    """Hash of the instruction template and the decision rule (part of the cache scope key)."""
    rule = "argmax logsumexp" + repr((YES_SPELLINGS, NO_SPELLINGS))
    return hashlib.sha256((instruction + "\x00" + rule).encode()).hexdigest()[:16]


class RuleJudge:
    """Deterministic fake judge: a known label if given, else a keyword rule. Fast, for tests."""

    def __init__(self, labels: dict[str, bool] | None = None):
        self.labels = dict(labels or {})
        self.fingerprint = "rule-judge-v1:" + hashlib.sha256(
            json.dumps(sorted(self.labels.items())).encode()).hexdigest()[:12]
        self.calls = 0

    def __call__(self, item: str) -> bool:
        self.calls += 1
        if item in self.labels:
            return self.labels[item]
        t = item.lower()
        negated = bool(re.search(r"\bnot\b|n't\b|\bnever\b", t))
        alarm = bool(re.search(r"fail|error|refused|down|critical|denied|\b5\d\d\b", t))
        return alarm != negated


class LogitJudge:
    """smollm2-135m scoring yes/no after the chat-templated instruction, on the lessonkit engine.

    ``score(item)`` is the log-odds log P(yes) - log P(no) of the next token; the answer is
    ``score > bias`` (bias 0: "yes" when it is the likelier word). The bias is part of the judge
    and of its fingerprint.
    """

    def __init__(self, engine, chat_template_fn, instruction: str = INSTRUCTION,
                 bias: float | None = None, reuse_prefix: bool = True):
        if "{item}" not in instruction:
            raise LessonkitError("judge instruction must contain the placeholder {item}")
        self.engine, self.instruction = engine, instruction
        self.bias = JUDGE_BIAS if bias is None else float(bias)
        marker = "\x00ITEM\x00"
        rendered = chat_template_fn([{"role": "user", "content": instruction.replace("{item}", marker)}])
        if rendered.count(marker) != 1:
            raise LessonkitError("chat template did not keep the item placeholder exactly once")
        self.head, self.tail = rendered.split(marker)
        self.head_ids = engine.encode(self.head)
        self.yes_ids = [self._single_token(s) for s in YES_SPELLINGS]
        self.no_ids = [self._single_token(s) for s in NO_SPELLINGS]
        self.reuse_prefix = reuse_prefix
        self._snapshot = None
        self.score_fingerprint = f"{engine.fingerprint()[:16]}:{instruction_fingerprint(instruction)}"
        self.fingerprint = judge_fingerprint(self.score_fingerprint, self.bias)
        self.calls, self.seconds = 0, 0.0

    def _single_token(self, text: str) -> int:
        ids = self.engine.encode(text)
        if len(ids) != 1:
            raise LessonkitError(f"judge answer word {text!r} is not one token: {ids}")
        return ids[0]

    def input_ids(self, item: str) -> list[int]:
        """The judge's input: the tokenised constant head, then the tokenised item and tail."""
        return self.head_ids + self.engine.encode(item + self.tail)

    def score(self, item: str) -> float:
        """log P(yes) - log P(no) over the spellings, from the next-token logits."""
        t0 = time.perf_counter()
        rest = self.engine.encode(item + self.tail)
        cache = self.engine.new_cache(len(self.head_ids) + len(rest) + 8)
        with torch.inference_mode():
            if self.reuse_prefix:
                if self._snapshot is None:
                    self.engine.forward(self.head_ids, cache, last_only=True)
                    self._snapshot = cache.snapshot()
                else:
                    cache.restore(self._snapshot)
                logits = self.engine.forward(rest, cache, last_only=True)[-1]
            else:
                logits = self.engine.forward(self.head_ids + rest, cache, last_only=True)[-1]
            logp = torch.log_softmax(logits.float(), dim=-1)
            s = float(torch.logsumexp(logp[self.yes_ids], 0) - torch.logsumexp(logp[self.no_ids], 0))
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return s

    def __call__(self, item: str) -> bool:
        return self.score(item) > self.bias


def judge_fingerprint(score_fingerprint: str, bias: float) -> str:
    return f"{score_fingerprint}:bias={bias:+.3f}"


def load_judge(model: str = "smollm2-135m", **kw) -> LogitJudge:
    """The real judge: the lessonkit engine for ``model`` plus its chat template."""
    engine = load_model(model)
    return LogitJudge(engine, lambda msgs: apply_chat_template(engine, msgs, add_generation_prompt=True), **kw)


class RecordedJudge:
    """Fresh scores recorded earlier by one judge (a ground-truth file), with a live fallback.

    The file holds {"score_fingerprint": ..., "scores": {item: log-odds}}; answers are
    ``score > bias``. A live judge whose scores come from another model or instruction is refused:
    its answers would be a different ground truth.
    """

    def __init__(self, scores: dict[str, float], score_fingerprint: str, bias: float | None = None,
                 live: LogitJudge | None = None):
        self.bias = JUDGE_BIAS if bias is None else float(bias)
        if live is not None and live.score_fingerprint != score_fingerprint:
            raise LessonkitError(f"recorded scores are from judge {score_fingerprint}, "
                                 f"not from the live judge {live.score_fingerprint}")
        self.scores, self.score_fingerprint, self.live = dict(scores), score_fingerprint, live
        self.fingerprint = judge_fingerprint(score_fingerprint, self.bias)
        self.calls, self.live_calls = 0, 0

    @classmethod
    def from_file(cls, path: str | Path = GROUND_TRUTH_PATH, bias: float | None = None,
                  live: LogitJudge | None = None):
        path = Path(path)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            return cls(doc["scores"], doc["score_fingerprint"], bias, live)
        except FileNotFoundError:
            raise LessonkitError(f"judge ground-truth file not found: {path}") from None
        except (json.JSONDecodeError, KeyError) as exc:
            raise LessonkitError(f"{path}: not a judge ground-truth file ({exc})") from None

    def score(self, item: str) -> float:
        if item not in self.scores:
            if self.live is None:
                raise LessonkitError(f"no recorded judge score for item {item[:60]!r} and no live judge")
            self.live_calls += 1
            self.scores[item] = self.live.score(item)
        return self.scores[item]

    def __call__(self, item: str) -> bool:
        self.calls += 1
        return self.score(item) > self.bias


def record_scores(judge: LogitJudge, items: list[str], path: str | Path = GROUND_TRUTH_PATH,
                  partial: str | Path | None = None, progress: bool = True) -> Path:
    """Score every distinct item fresh with ``judge`` and write the ground-truth file.

    ``partial`` (a JSONL file) makes the run resumable: scores already there are reused when they
    carry the same score fingerprint.
    """
    unique = list(dict.fromkeys(items))
    scores: dict[str, float] = {}
    if partial is not None and Path(partial).exists():
        for line in Path(partial).read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec["fp"] == judge.score_fingerprint:
                scores[rec["text"]] = rec["score"]
    out = open(partial, "a", encoding="utf-8") if partial is not None else None
    for text in tqdm([t for t in unique if t not in scores], desc="judge (fresh scores)",
                     disable=not progress):
        scores[text] = round(judge.score(text), 5)
        if out:
            out.write(json.dumps({"fp": judge.score_fingerprint, "text": text, "score": scores[text]}) + "\n")
            out.flush()
    if out:
        out.close()
    return write_ground_truth(judge, {t: scores[t] for t in unique}, path, {"computed_with": "engine"})


def write_ground_truth(judge: LogitJudge, scores: dict[str, float], path: str | Path = GROUND_TRUTH_PATH,
                       check: dict | None = None) -> Path:
    doc = {"what": "Ground truth of lesson 5: fresh yes/no log-odds of the monitoring judge "
                   f"({judge.engine.name} on the lessonkit engine) for every distinct item of the shipped "
                   "stream, precomputed so the notebook runs quickly. The judge's answer is "
                   "score > bias. Regenerate with: lessonkit semcache record",
           "score_fingerprint": judge.score_fingerprint, "instruction": judge.instruction,
           "yes_spellings": YES_SPELLINGS, "no_spellings": NO_SPELLINGS, "check": check or {},
           "scores": {t: round(float(v), 5) for t, v in scores.items()}}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, (json.dumps(doc, indent=0, ensure_ascii=False) + "\n").encode("utf-8"))   # old or whole
    return path


def score_batched_transformers(judge: LogitJudge, hf_model, items: list[str], batch_size: int = 16,
                               progress: bool = True) -> dict[str, float]:
    """The judge's scores for ``items``, computed in batches by ``transformers`` on the same weights.

    Same token ids as ``judge.score`` (constant head run once, its KV cache repeated per batch;
    items right-padded, each read at its last real token). Only a faster way to fill the
    ground-truth file on a busy CPU: ``check_against_engine`` compares it with the engine.
    """
    from transformers import DynamicCache
    head = torch.tensor([judge.head_ids])
    with torch.inference_mode():
        head_cache = hf_model(head, use_cache=True, past_key_values=DynamicCache()).past_key_values
    scores = {}
    H = len(judge.head_ids)
    unique = list(dict.fromkeys(items))
    for b in tqdm(range(0, len(unique), batch_size), desc="judge (batched scores)", disable=not progress):
        chunk = unique[b:b + batch_size]
        ids = [judge.engine.encode(t + judge.tail) for t in chunk]
        L = max(map(len, ids))
        inp = torch.zeros(len(ids), L, dtype=torch.long)
        mask = torch.zeros(len(ids), H + L, dtype=torch.long)
        mask[:, :H] = 1
        for r, row in enumerate(ids):
            inp[r, :len(row)] = torch.tensor(row)
            mask[r, H:H + len(row)] = 1
        cache = copy.deepcopy(head_cache)
        cache.batch_repeat_interleave(len(ids))
        pos = (H + torch.arange(L)).unsqueeze(0).expand(len(ids), L)
        with torch.inference_mode():
            hidden = hf_model.model(inp, attention_mask=mask, position_ids=pos,
                                    past_key_values=cache).last_hidden_state
            last = hidden[torch.arange(len(ids)), torch.tensor([len(r) - 1 for r in ids])]
            logits = hf_model.lm_head(last)
        for r, row in enumerate(ids):
            logp = torch.log_softmax(logits[r].float(), dim=-1)
            scores[chunk[r]] = float(torch.logsumexp(logp[judge.yes_ids], 0) -
                                     torch.logsumexp(logp[judge.no_ids], 0))
    return scores


# ---------------------------------------------------------------- the ground truth of lesson 5

DEFAULT_JUDGE = "smollm2-135m-judge"       # lesson 5's judge: smollm2-135m trained for the task
UNTRAINED_JUDGE = "smollm2-135m"           # the contrast: the same model, untrained, yes/no log-odds


def answers_path(model: str = DEFAULT_JUDGE) -> Path:
    """The recorded ground-truth file of a judge (data/semcache/)."""
    return GROUND_TRUTH_PATH if model == UNTRAINED_JUDGE else GROUND_TRUTH_PATH.with_name(f"judge_answers_{model}.json")


def live_judge(model: str = DEFAULT_JUDGE):
    return load_judge() if model == UNTRAINED_JUDGE else load_trained_judge(model)


def ground_truth_judge(kind: str = "recorded", path=None, progress: bool = True, model: str = DEFAULT_JUDGE):
    """The judge whose fresh answers are the ground truth.

    kind: "real" (the judge ``model`` live on the engine), "recorded" (its recorded file, checked against
    the live judge's fingerprint and completed live where items are missing; if the live judge is
    a different one, its answers replace the file's), or "rule" (the fast fake, for tests).
    model: a trained judge (default smollm2-135m-judge) or "smollm2-135m" (untrained, the contrast).
    """
    if kind == "rule":
        return RuleJudge(), None
    live = live_judge(model)
    if kind == "real":
        return live, live
    try:
        rec = RecordedJudge.from_file(path or answers_path(model))
    except LessonkitError:
        return RecordedJudge({}, live.score_fingerprint, live.bias, live), live
    if rec.score_fingerprint != live.score_fingerprint:
        print(f"note: recorded scores are from judge {rec.score_fingerprint}, the live judge is "
              f"{live.score_fingerprint}; judging live instead", file=sys.stderr)
        return RecordedJudge({}, live.score_fingerprint, live.bias, live), live
    return RecordedJudge(rec.scores, rec.score_fingerprint, live.bias, live), live


def record_ground_truth(texts: list[str], batched: bool = True, n_check: int = 3, path=None,
                        model: str = UNTRAINED_JUDGE) -> Path:
    """Score every distinct text (the shipped stream's, for lesson 5) with the judge ``model`` and write its file.

    batched (untrained smollm2-135m only): same weights and token ids run in batches by transformers
    (much faster on a CPU), then ``n_check`` items re-scored by the engine itself; the largest
    difference is recorded. A trained judge is scored on the engine.
    """
    path = path or answers_path(model)
    if model != UNTRAINED_JUDGE:
        return record_scores(load_trained_judge(model), list(dict.fromkeys(texts)), path)
    judge = load_judge()
    texts = list(dict.fromkeys(texts))
    if not batched:
        return record_scores(judge, texts, path)
    hf = to_transformers(load_smollm2(progress=False))
    scores = score_batched_transformers(judge, hf, texts)
    diffs = [abs(judge.score(t) - scores[t]) for t in texts[:n_check]]
    check = {"computed_with": "transformers, batched, same weights and token ids",
             "engine_rescored_items": len(diffs), "max_abs_diff_vs_engine": max(diffs) if diffs else None}
    return write_ground_truth(judge, scores, path, check)


# ---------------------------------------------------------------- trained judges (lessonkit train judge)

def answer_head(engine) -> list[int]:
    """Tokens of '{"needs_action":' as they start every encoded answer; the next token is true / false."""
    t = engine.encode('{"needs_action":true,')
    f = engine.encode('{"needs_action":false,')
    n = 0
    while n < min(len(t), len(f)) and t[n] == f[n]:
        n += 1
    if engine.decode(t[:n]) != '{"needs_action":':
        raise LessonkitError(f"{engine.name}: the answer head does not end before true/false ({engine.decode(t[:n])!r})")
    return t[:n]


class TrainedJudge:
    """A trained judge (base model + merged adapter) scored on its own prompt: the shipped prefix, the item
    (ITEM_TEMPLATE) and the answer head '{"needs_action":'; ``score`` is log P(true) - log P(false) of
    the next token, the decision the judge's NDJSON answer starts with. Same protocol as LogitJudge."""

    def __init__(self, engine, prefix: str, item_template: str, bias: float = 0.0):
        self.engine, self.prefix, self.item_template, self.bias = engine, prefix, item_template, float(bias)
        self.head_ids = engine.encode(prefix)
        self.answer_ids = answer_head(engine)
        n = len(self.answer_ids)
        self.true_id = engine.encode('{"needs_action":true,')[n]
        self.false_id = engine.encode('{"needs_action":false,')[n]
        self._snapshot = None
        self.instruction = prefix + item_template
        rule = hashlib.sha256((prefix + "\x00" + item_template + "\x00true-false").encode()).hexdigest()[:16]
        self.score_fingerprint = f"{engine.fingerprint()[:16]}:{rule}"
        self.fingerprint = judge_fingerprint(self.score_fingerprint, self.bias)
        self.calls, self.seconds = 0, 0.0

    @property
    def prefilled(self) -> bool:
        """Whether the shared prefix is already prefilled (the first score call does it)."""
        return self._snapshot is not None

    def score(self, item: str) -> float:
        t0 = time.perf_counter()
        rest = self.engine.encode(self.item_template.format(text=item)) + self.answer_ids
        cache = self.engine.new_cache(len(self.head_ids) + len(rest) + 8)
        with torch.inference_mode():
            if self._snapshot is None:
                self.engine.forward(self.head_ids, cache, last_only=True)
                self._snapshot = cache.snapshot()
            else:
                cache.restore(self._snapshot)
            logp = torch.log_softmax(self.engine.forward(rest, cache, last_only=True)[-1].float(), dim=-1)
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        return float(logp[self.true_id] - logp[self.false_id])

    def __call__(self, item: str) -> bool:
        return self.score(item) > self.bias


def trained_prompt(name: str) -> dict | None:
    """The prompt (prefix, item_template) a trained judge was trained on, or None for other models."""
    spec = MODELS_DIR / name / "judge.json"
    return json.loads(spec.read_text(encoding="utf-8")) if spec.exists() else None


def load_trained_judge(name: str = "smollm2-135m-judge", **kw) -> TrainedJudge:
    """A trained judge by registry name: the merged engine and the prompt in data/models/NAME/judge.json."""
    spec = MODELS_DIR / name / "judge.json"
    try:
        doc = json.loads(spec.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LessonkitError(f"trained judge {name!r}: {spec} not found (lessonkit train judge)") from None
    return TrainedJudge(load_model(name), doc["prefix"], doc["item_template"], **kw)


def agreement(items, answers: dict[str, bool]) -> dict:
    """Agreement of judge answers (text -> yes) with the intended needs_action labels: overall, per
    family, per relation and per perturbation, and the confusion counts (over the items as streamed)."""
    def rate(sel):
        sel = list(sel)
        return {"n": len(sel), "agree": sum(answers[it.text] == it.needs_action for it in sel),
                "accuracy": round(sum(answers[it.text] == it.needs_action for it in sel) / max(1, len(sel)), 4)}
    groups = {"overall": {"all": rate(items)}}
    for key in ("family", "relation", "perturbation"):
        vals = sorted({getattr(it, key) for it in items if getattr(it, key) is not None})
        groups[key] = {v: rate(it for it in items if getattr(it, key) == v) for v in vals}
    conf = {"tp": 0, "fp": 0, "fn": 0, "tn": 0}
    for it in items:
        yes = answers[it.text]
        conf[("t" if yes == it.needs_action else "f") + ("p" if yes else "n")] += 1
    groups["confusion"] = conf
    return groups


# ---------------------------------------------------------------- recorded answer lines (warm caches)

def answer_lines_path(model: str) -> Path:
    """The recorded NDJSON answer lines of a judge (data/semcache/judge_lines_<model>.json)."""
    return GROUND_TRUTH_PATH.with_name(f"judge_lines_{model}.json")


def _prompt_key(engine, prefix: str, max_new_tokens: int) -> dict:
    return {"engine": engine.fingerprint()[:16], "prefix_sha256": hashlib.sha256(prefix.encode()).hexdigest()[:16],
            "max_new_tokens": int(max_new_tokens)}


def write_answer_lines(engine, prefix: str, max_new_tokens: int, answers: dict[str, str], path=None) -> Path:
    """Record a judge's greedy answer line per text, keyed by what produced them (weights, prompt, length cap)."""
    doc = {"what": f"greedy NDJSON answer lines of {engine.name} on the lessonkit engine for every distinct item "
                   "of the shipped stream (they warm the capstone's semantic cache); written by lessonkit train judge",
           "model": engine.name, "key": _prompt_key(engine, prefix, max_new_tokens), "answers": dict(answers)}
    path = Path(path or answer_lines_path(engine.name))
    atomic_write(path, (json.dumps(doc, indent=0, ensure_ascii=False) + "\n").encode("utf-8"))   # old or whole
    return path


def recorded_answers(engine, prefix: str, max_new_tokens: int, path=None) -> dict[str, str]:
    """The recorded answer lines of this judge for this prompt and length cap; {} when none were recorded
    for exactly that (other weights, prompt or cap: a warm-up then judges live, which gives the same bytes)."""
    path = Path(path or answer_lines_path(engine.name))
    if not path.exists():
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        key, answers = doc["key"], doc["answers"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise LessonkitError(f"{path}: not a file of recorded judge answers ({exc})") from None
    if key != _prompt_key(engine, prefix, max_new_tokens):
        print(f"note: {path.name} was recorded for another judge, prompt or length cap; warming up live",
              file=sys.stderr)
        return {}
    return {str(t): str(a) for t, a in answers.items()}
