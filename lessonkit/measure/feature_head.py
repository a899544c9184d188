"""The feature head measured: held-out acceptance by draft position and by task category, and its model card.

Acceptance is measured as drafting meets it: `speculative_generate` at a fixed depth on the HELDOUT requests of
lessonkit.workloads.requests (never the training ones), greedy; a_i is the share of drafts whose position i was
accepted given positions 1 .. i - 1 were (vLLM's per-position counts), E = tokens per verify.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lessonkit.engine import active
from lessonkit.errors import LessonkitError
from lessonkit.feature_head.drafter import HEADS_DIR, FeatureHeadDrafter
from lessonkit.files.atomic import atomic_write
from lessonkit.engine.machine import cpu_name
from lessonkit.models.integrity import write_manifest
from lessonkit.models.registry import load_model
from lessonkit.speculative.gate import acceptance_by_position
from lessonkit.speculative.verify import speculative_generate, total_stats
from lessonkit.training.feature_head import PRESETS, train
from lessonkit.workloads.corpus import prompts_by_kind
from lessonkit.workloads.requests import requests


CARD_REQUESTS = 12            # held-out requests per category the card measures (24 chat prompts are held out)
CHECKS_TITLE = "## Checked on other numerics"


def heldout_acceptance(target, drafter, *, per_category: int = CARD_REQUESTS, max_new: int = 64, k: int = 3,
                       progress: bool = False) -> dict:
    """category -> {acceptance_by_position [k], tokens_per_verify, draft_tokens}, plus "all"."""
    prompts = heldout_prompts(target, per_category)
    out, everything = {}, []
    for cat in tqdm(prompts, desc="held-out acceptance", disable=not progress):
        stats = [speculative_generate(target, drafter, p, max_new, k=k).stats for p in prompts[cat]]
        everything += stats
        out[cat] = _summary(total_stats(stats))
    out["all"] = _summary(total_stats(everything))
    return out


def heldout_prompts(target, per_category: int) -> dict[str, list[list[int]]]:
    """The HELDOUT requests by category; for a model of the corpus (its preset continues corpus openings, as
    tiny-moe's does), openings of the corpus' held-out split by kind of text."""
    tc = PRESETS.get(target.name)
    if tc is not None and tc.continuations and not tc.per_category:
        return prompts_by_kind(target, n=per_category, max_tokens=48, split="heldout")
    return requests(target, "heldout", per_category)


def _summary(t: dict) -> dict:
    return {"acceptance_by_position": [round(a, 3) for a in acceptance_by_position(t)],
            "tokens_per_verify": round(1 + t["num_accepted_tokens"] / max(1, t["num_drafts"]), 3),
            "draft_tokens": t["num_draft_tokens"]}


def _sources(tc: dict) -> str:
    """The card's words for what the target pass ran on."""
    parts = []
    if tc["per_category"]:
        parts.append(f"the target's greedy answers to {4 * tc['per_category']} TRAIN requests of "
                     "lessonkit/workloads/requests.py")
    if tc.get("continuations"):
        parts.append(f"its greedy continuations of {tc['continuations']} openings per kind of text of the corpus' "
                     "train split")
    if tc.get("text_windows"):
        parts.append(f"{tc['text_windows']} windows of {tc['window']} tokens per kind of the corpus' train split")
    where = "the HELDOUT requests" if tc["per_category"] else "openings of the corpus' held-out split"
    return " and ".join(parts) + f"; evaluation on {where} only"


def _table(evaluation: dict) -> list[str]:
    """The card's acceptance table: a row per category, acceptance at positions 1-3 and tokens per verify."""
    lines = ["| category | position 1 | 2 | 3 | tokens per verify |", "|---|---|---|---|---|"]
    for cat, e in evaluation.items():
        a = e["acceptance_by_position"] + [float("nan")] * 3
        lines.append(f"| {cat} | {a[0]:.2f} | {a[1]:.2f} | {a[2]:.2f} | {e['tokens_per_verify']:.2f} |")
    return lines


def _checks_lines(info: dict) -> list[str]:
    """The card's section on the numerics the head was checked on after training (info["checks"]), if any."""
    checks = info.get("checks") or {}
    lines = ["", CHECKS_TITLE, "", f"The head drafts only beside the numerics it was trained or checked on "
             f"(numerics_checked in train_log.json: {', '.join(info.get('numerics_checked', []))}; any other is "
             "refused, docs/feature_head.md). Checked = its held-out acceptance measured there as above:"] if checks else []
    for nm, c in checks.items():
        step = f"; drafted by the {c['step']}" if c.get("step") else ""
        lines += ["", f"**{nm} numerics** ({c['weights']} weights{step}; greedy, k = {c['k']}, {c['per_category']} held-out "
                  f"prompts per category x {c['max_new']} new tokens; {c['threads']} thread(s), {c['cpu']}, "
                  f"{c['date']}, {c['seconds']:.0f} s)", ""] + _table(c["acceptance"])
        lines += ["", f"Reproduce: `python -c \"from lessonkit.measure.feature_head import check_head; "
                  f"check_head('{info['target']}', '{nm}', per_category={c['per_category']})\"`."]
    return lines


def check_head(model: str, numerics: str, folder: str | Path | None = None, *,
               per_category: int = CARD_REQUESTS, progress: bool = True) -> dict:
    """Check a trained head on other numerics: its held-out acceptance (as the card's, on `model` with its default
    weights) measured on `numerics`, recorded in the train_log.json beside it (numerics_checked, so the head
    loads there from now on, and the numbers under checks), in its card and its manifest. The measurement back."""
    with active.use(numerics=numerics):
        target = load_model(model)
        folder = Path(folder) if folder is not None else HEADS_DIR / target.name
        drafter = FeatureHeadDrafter(target, folder / "head.safetensors", any_numerics=True)
        t0 = time.perf_counter()
        evaluation = heldout_acceptance(target, drafter, per_category=per_category, progress=progress)
        spent = time.perf_counter() - t0
    info = json.loads((folder / "train_log.json").read_text(encoding="utf-8"))
    info["numerics_checked"] = list(dict.fromkeys([info["numerics"], *info.get("numerics_checked", []), numerics]))
    info.setdefault("checks", {})[numerics] = {
        "weights": target.weights, "step": drafter.step, "k": 3, "per_category": per_category, "max_new": 64, "acceptance": evaluation,
        "threads": torch.get_num_threads(), "cpu": cpu_name(), "date": time.strftime("%Y-%m-%d"),
        "seconds": round(spent, 1)}
    atomic_write(folder / "train_log.json", json.dumps(info, indent=1).encode())
    card = folder / "card.md"
    if card.exists():                            # its checks section replaced (a head fresh from train() has none)
        kept = card.read_text(encoding="utf-8").split("\n" + CHECKS_TITLE)[0].rstrip("\n")
        atomic_write(card, ("\n".join([kept] + _checks_lines(info)) + "\n").encode())
    write_manifest(folder, ["head.safetensors", "train_log.json", "card.md"])
    return info["checks"][numerics]


def write_card(folder: Path, info: dict, evaluation: dict, k: int, step: str) -> Path:
    cfg = info["config"]
    lines = [f"# Feature head for {info['target']}", "",
             "EAGLE-3-style drafter (lessonkit/feature_head/): the target's residual streams after layers "
             f"{', '.join(map(str, cfg['taps']))} and its top layer, fused, with the embedding of the token just chosen, "
             f"through one transformer layer (MLP {cfg['intermediate_size']}), then the target's own final norm and the "
             f"{cfg['draft_vocab']} output rows of its most frequent greedy picks (FR-Spec). Trained with training-time "
             f"test over {info['train']['ttt_steps']} chained steps on the target's own greedy answers.", "",
             f"- trained for: {info['target']} (weights {info['target_fingerprint'][:12]}), target pass on the "
             f"{info['numerics']} numerics" + (f" ({info['train']['weights']} blocks)" if info['train'].get('weights') else ""),
             f"- data: {info['requests']} sequences ({info['positions']:,} positions): {_sources(info['train'])}",
             f"- time: target pass {info['pass_s']:.0f} s "
             + (f"on {info['pass_workers']} processes" if (info.get("pass_workers") or 1) > 1 else "in the training process")
             + f" (shards already on disk are read, not recomputed), training {info['train_s']:.0f} s ({info['steps']} "
             f"steps) on {info['threads']} thread(s), {info['cpu']}, {info['date']}",
             "- draft-vocabulary coverage of the target's greedy picks in the training data: "
             + ", ".join(f"{c} {v:.1%}" for c, v in info["coverage"].items()), "",
             f"## Held-out acceptance (greedy, k = {k}, {CARD_REQUESTS} held-out prompts per category x 64 new tokens, "
             f"acceptance at position i given 1 .. i - 1 accepted; drafted by the {step})", ""] + _table(evaluation)
    lines += ["", f"Reproduce: `lessonkit train-head --model {info['target']} --numerics {info['numerics']} "
              f"--threads {info['threads']}` (deterministic for a given torch version and thread count: torch "
              "splits a sum over its threads, so another count gives other bits)."] + _checks_lines(info)
    path = folder / "card.md"
    atomic_write(path, ("\n".join(lines) + "\n").encode())
    return path


def train_and_describe(model: str, preset: str | None, out: str | None, numerics: str, workers: int = 1) -> int:
    """`lessonkit train-head`: train with the model's preset (the target pass on `workers` processes), measure
    held-out acceptance, write the card."""
    if preset is not None and preset not in PRESETS:
        raise LessonkitError(f"unknown preset {preset!r}: known {', '.join(PRESETS)}")
    tc = PRESETS.get(preset or model)
    if tc is None:
        raise LessonkitError(f"no feature-head preset for {model}: pass --preset ({', '.join(PRESETS)})")
    target = load_model(model, weights=tc.weights)
    folder = Path(out) if out else HEADS_DIR / target.name
    train(target, tc, folder, workers=workers)        # its train_log.json names the CPU, date and threads
    print(describe_head(target, folder))
    return 0


def describe_head(target, folder: Path) -> str:
    """Measure the head in `folder` on the held-out requests, write its card (and manifest); one line back."""
    info = json.loads((folder / "train_log.json").read_text(encoding="utf-8"))
    drafter = FeatureHeadDrafter(target, folder / "head.safetensors")
    evaluation = heldout_acceptance(target, drafter, progress=True)
    card = write_card(folder, info, evaluation, k=3, step=drafter.step)
    write_manifest(folder, ["head.safetensors", "train_log.json", "card.md"])
    return (f"{folder / 'head.safetensors'}, {card.name}: {info['steps']} steps, training {info['train_s']:.0f} s; "
            "held-out acceptance at position 1: " + ", ".join(
                f"{c} {e['acceptance_by_position'][0]:.2f}" for c, e in evaluation.items() if e["acceptance_by_position"]))
