"""Lesson 1, section 4 (issue 59, item 4): exactness with a before arm. The same prompts decoded at verify widths
1, 2, 4 and 8 under 1 and 2 threads, and the distinct completions counted per prompt, in two arms:

  (a) lessonkit: every verify row through the row-invariant kernel (lessonkit.measure.exactness);
  (b) transformers' assisted generation on the same weights exported to Hugging Face files (float32): a verify of
      w rows is one batched forward, each product one `torch.matmul` over all its rows, whose summation order
      the BLAS may choose by the row count. The assistant is a second copy of the target, drafting w - 1 tokens a
      step (constant schedule, no confidence cut-off), so every verify is w rows wide; width 1 is plain greedy.

Thinking Machines counted 80 distinct completions in 1,000 runs without batch-invariant kernels and 1 with them.
Where arm (b) gives 1 here, `why_one` says why from the run's own logits: how far a batched verify moved them
against the smallest gap between the greedy pick and its runner-up.
"""
from __future__ import annotations

import pandas as pd
import torch

from lessonkit.engine.threads import torch_threads
from lessonkit.files.resources import lessonkit_home
from lessonkit.measure.exactness import distinct_completions
from lessonkit.models.convert import export_hf


def _hf_pair(target):
    """(the target, its assistant): two transformers copies of `target`'s weights, exported once per fingerprint."""
    import transformers
    transformers.logging.set_verbosity_error()          # its notes on generation_config are not the lesson's
    out = lessonkit_home() / "hf-export" / f"{target.name}-{target.fingerprint()[:12]}"
    if not (out / "config.json").exists():
        export_hf(target.model_dir, out)
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    return load(), load()


def _hf_run(model, assistant, prompt: list[int], n_new: int, width: int):
    """(tokens, per-step logits) of greedy decoding; width > 1: assisted, every verify `width` rows wide."""
    ids = torch.tensor([prompt])
    kw = {}
    if width > 1:
        cfg = assistant.generation_config
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = width - 1, "constant"
        cfg.assistant_confidence_threshold = 0.0
        kw["assistant_model"] = assistant
    with torch.no_grad():
        o = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=0, **kw)
    return tuple(o.sequences[0, len(prompt):].tolist()), torch.stack([s[0] for s in o.scores])


def _shift(a: torch.Tensor, b: torch.Tensor, upto: int) -> float:
    """The largest difference between two runs' logits over their first `upto` steps (finite entries only)."""
    n = min(upto, len(a), len(b))
    a, b = a[:n], b[:n]
    ok = torch.isfinite(a) & torch.isfinite(b)
    return float((a - b)[ok].abs().max()) if ok.any() else 0.0


def _first_fork(outs) -> int | None:
    """The first position where any completion differs from the first one (None: all equal)."""
    forks = [next((i for i, (a, b) in enumerate(zip(outs[0], o)) if a != b), min(len(o), len(outs[0])))
             for o in outs[1:] if o != outs[0]]
    return min(forks) if forks else None


def transformers_arm(target, prompts, *, widths=(1, 2, 4, 8), threads=(1, 2), max_new_tokens: int = 128) -> pd.DataFrame:
    """Arm (b), per prompt: runs, distinct completions, the first fork position, the largest logit difference
    between a run and the first one (up to the fork) and the smallest top-1/top-2 logit gap of the first run."""
    model, assistant = _hf_pair(target)
    rows = []
    for i, p in enumerate(prompts):
        outs, logits = [], []
        for n in threads:
            with torch_threads(n):
                for w in widths:
                    toks, lg = _hf_run(model, assistant, p, max_new_tokens, w)
                    outs.append(toks)
                    logits.append(lg)
        fork = _first_fork(outs)
        upto = fork if fork is not None else max_new_tokens
        top2 = logits[0][:max(upto, 1)].topk(2, dim=-1).values
        rows.append({"arm": "transformers assisted", "prompt": i, "runs": len(outs), "new_tokens": max_new_tokens,
                     "distinct_completions": len(set(outs)), "first_fork": fork,
                     "max_logit_shift": max(_shift(lg, logits[0], upto) for lg in logits),
                     "min_top2_gap": float((top2[:, 0] - top2[:, 1]).min())})
    return pd.DataFrame(rows)


def lessonkit_arm(target, prompts, *, widths=(1, 2, 4, 8), threads=(1, 2), max_new_tokens: int = 128) -> pd.DataFrame:
    """Arm (a), per prompt: measure.exactness.distinct_completions (width 1 is its plain greedy run)."""
    df = distinct_completions(target, prompts, widths=tuple(w for w in widths if w > 1), threads=threads,
                              max_new_tokens=max_new_tokens)
    return pd.DataFrame({"arm": "lessonkit", "prompt": df.prompt, "runs": df.runs, "new_tokens": max_new_tokens,
                         "distinct_completions": df.distinct_completions, "first_fork": None})


def two_arms(target, prompts, **kw) -> pd.DataFrame:
    """Both arms on the same prompts, widths and threads: one row per (arm, prompt)."""
    return pd.concat([lessonkit_arm(target, prompts, **kw), transformers_arm(target, prompts, **kw)], ignore_index=True)


def arm_sentences(df: pd.DataFrame) -> list[str]:
    """Per arm: the most distinct completions of a prompt and the first fork; for an arm that gave 1, why."""
    out = []
    for arm, g in df.groupby("arm", sort=False):
        forks = [int(f) for f in g.first_fork if f is not None and f == f]
        line = (f"{arm}: {int(g.runs.iloc[0])} runs per prompt of {int(g.new_tokens.iloc[0])} new tokens, "
                f"{len(g)} prompt(s): at most {int(g.distinct_completions.max())} distinct completion(s) per prompt; "
                + (f"first fork at token {min(forks)}" if forks else
                   "no fork" if g.distinct_completions.max() == 1 else "fork position not recorded"))
        if "max_logit_shift" in g and g.max_logit_shift.notna().any() and g.distinct_completions.max() == 1:
            shift, gap = g.max_logit_shift.max(), g.min_top2_gap.min()
            line += (f". Why 1 here: the batched verify moved the logits by up to {shift:.1e}, while the greedy pick "
                     f"led its runner-up by at least {gap:.1e} at every step" if shift > 0 else
                     ". Why 1 here: torch.matmul gave every row the same bits at these widths on this CPU")
            line += "; a longer run or more prompts meets a closer tie" if 0 < shift < gap else ""
        out.append(line)
    return out


def price_of_exactness(cost_df: pd.DataFrame, k: int) -> str:
    """The exact numerics' verify cost against the int8 numerics', from section 2's curves (numerics_paths.
    verify_costs: measure_cost_curve under each numerics): both are row-invariant, only the exact one gives the
    float model's own tokens."""
    at = cost_df[cost_df.k == k].set_index("numerics")
    one = cost_df[cost_df.k == 0].set_index("numerics")
    if not {"exact", "int8"} <= set(at.index):
        return f"the price of exactness: needs both numerics' curves; this run measured {', '.join(at.index)}"
    e, i = at.loc["exact"], at.loc["int8"]
    return (f"the price of exactness: a verify of {k + 1} rows costs {e.measured:.2f} plain steps "
            f"({e.T_ms:.1f} ms) on the exact numerics against {i.measured:.2f} ({i.T_ms:.1f} ms) on int8, "
            f"whose one-row step is {one.loc['int8'].T_ms / one.loc['exact'].T_ms:.2f} of the exact one's")
