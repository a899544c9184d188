"""How well a draft model agrees with its target in real greedy speculative decoding.

The figure a drafter's model card reports: acceptance rate (accepted / drafted) per kind of text at a
fixed k on held-out prompts (the prompts of lesson 1), the draft cost c (draft seconds per draft
token over plain greedy seconds per token, both measured in this run) and whether the output is
identical to plain greedy decoding.
"""
from __future__ import annotations

import datetime
import os
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lessonkit.engine.generate import generate
from lessonkit.models.registry import load_model
from lessonkit.speculative.drafters import ModelDrafter
from lessonkit.speculative.verify import speculative_generate, total_stats
from lessonkit.workloads.corpus import KINDS, prompts_by_kind


def drafter_acceptance(target, draft_engine, *, k: int = 4, n: int = 8, max_new_tokens: int = 48, seed: int = 0,
                       progress: bool = True) -> dict:
    """Acceptance rate per kind and draft cost c of `draft_engine` drafting for `target` (greedy)."""
    prompts = prompts_by_kind(target, n=n, max_tokens=48, seed=seed)
    acc, same, draft_s, draft_tok, plain_s, plain_tok = {}, True, 0.0, 0, 0.0, 0
    for kind in tqdm(KINDS, desc=f"acceptance {draft_engine.name}", disable=not progress, leave=False):
        sts = []
        for p in prompts[kind]:
            plain = generate(target, p, max_new_tokens)
            spec = speculative_generate(target, ModelDrafter(draft_engine, name=draft_engine.name), p,
                                        max_new_tokens, k=k)
            same &= spec.token_ids == plain.token_ids
            plain_s, plain_tok = plain_s + plain.stats["wall_s"], plain_tok + len(plain.token_ids)
            sts.append(spec.stats)
        t = total_stats(sts)
        acc[kind] = t["acceptance_rate"]
        draft_s, draft_tok = draft_s + t["draft_s"], draft_tok + t["num_draft_tokens"]
    acc["mean"] = sum(acc[k_] for k_ in KINDS) / len(KINDS)
    c = (draft_s / max(draft_tok, 1)) / (plain_s / max(plain_tok, 1))
    return {"target": target.name, "k": k, "prompts_per_kind": n, "max_new_tokens": max_new_tokens,
            "acceptance": acc, "c": c, "identical": bool(same),
            "draft_step": _step_name(ModelDrafter(draft_engine).model.step_path),
            "condition": f"{datetime.date.today().isoformat()}, {os.cpu_count()} shared CPU cores, "
                         f"{torch.get_num_threads()} torch thread"}


def _step_name(step_path: str) -> str:
    """The log's name for a drafter's step: "C forward" (a greedy turn on its own C forward; "C" in older logs
    named the removed one-token C draft step), else the step path."""
    return "C forward" if step_path == "C" else step_path


def measure_shipped(target_name: str):
    """A `measure(model_dir)` callback for `training.tiny_models.ship`: the draft model in model_dir
    drafting for `target_name`."""
    def measure(model_dir: Path) -> dict:
        return drafter_acceptance(load_model(target_name), load_model(str(model_dir)))   # assembled if it borrows
    return measure
