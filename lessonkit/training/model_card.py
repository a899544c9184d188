"""The model card (card.md) of a model trained by lessonkit.training.tiny_models: architecture, data, held-out
figures, measured drafting figures when given, training settings and time, files."""
from __future__ import annotations

from lessonkit.workloads.corpus import KINDS


def _data_lines(log: dict) -> list[str]:
    """The card's data and held-out sections: corpus mix, or the teacher pass a drafter learnt from."""
    c = log["config"]
    if c["distill_from"]:
        lines = ["", "## Data: the target's own predictions", "",
                 f"Teacher pass over {c['distill_from']} (lessonkit/training/distill.py, preset "
                 f"{log['distill_preset']!r}): corpus train-split windows teacher-forced in batched prefill and "
                 "short corpus prompts followed by the target's greedy continuation; labels are the target's top-k "
                 "next-token probabilities at every position. Tokens per source/kind: "
                 + ", ".join(f"{k} {v:,}" for k, v in log["train_tokens"].items()) + "."]
    else:
        lines = ["", "## Corpus", "",
                 "data/corpus/ (see PROVENANCE.md): Python standard-library prose and sources (PSF licence) and "
                 "seeded NDJSON monitoring records; train split only. Training mix per batch row: "
                 + ", ".join(f"{k} {w}" for k, w in c["mix"]) + "."]
    lines += ["", "## Held-out loss (nats/token, %d windows of %d tokens per kind)" % (c["eval_windows"], c["seq_len"]),
              "", "| kind | model | unigram baseline |", "|---|---|---|"]
    lines += [f"| {k} | {log['heldout_loss'][k]:.3f} | {log['unigram_loss'][k]:.3f} |" for k in KINDS + ("mean",)]
    if c["distill_from"]:
        lines += ["", "A drafter distilled on the target's top-k puts little probability on tokens outside them, so "
                  "its cross-entropy on corpus text says little about it (it can lie above the unigram baseline); "
                  "its agreement with the target below is what drafting needs."]
    for k in [k for k in log if k.startswith("heldout_agreement_with_")]:
        lines += ["", f"Greedy next-token agreement with {k.split('_with_')[1]} on its held-out teacher pass "
                  "(text: teacher-forced corpus; greedy: the target's own continuations): "
                  + ", ".join(f"{kk} {v:.1%}" for kk, v in log[k].items()) + "."]
    lines += _measured_lines(log)
    return lines


def _measured_lines(log: dict) -> list[str]:
    if "speculative" not in log:
        return []
    sp = log["speculative"]
    return ["", f"## Measured as a drafter ({sp['condition']})", "",
            f"Greedy speculative decoding with {sp['target']}, k={sp['k']}, {sp['prompts_per_kind']} held-out "
            f"prompts per kind, {sp['max_new_tokens']} new tokens: acceptance rate (accepted / drafted) "
            + ", ".join(f"{k} {sp['acceptance'][k]:.3f}" for k in KINDS)
            + f"; mean {sp['acceptance']['mean']:.3f}. Draft cost c = {sp['c']:.3f} of a target step "
            f"(draft seconds per draft token / plain greedy seconds per token"
            + {"C": "; draft step: one C call per token",       # older logs: the removed rk_dense_step
                "C forward": "; draft step: its own C forward, a greedy turn in one C call",
                "torch": "; draft step: PyTorch lean step"}.get(
                sp.get("draft_step"), "") + "); output identical to plain "
            f"greedy: {sp['identical']}."]


def _curves_line(label: str, files: dict) -> str:
    """Where the training curves are: a loss_curve.png drawn beside the log by an earlier version of `lessonkit
    train` (the shipped models have one), else the log's "steps" and "eval" (training draws no figure)."""
    if "loss_curve.png" in files:
        return f"- {label}: loss_curve.png; full log: train_log.json"
    return f'- {label}: "steps" and "eval" of train_log.json, the full log'


def cut_card(log: dict, files: dict) -> str:
    """card.md of a drafter cut from its target (lessonkit.training.cut_draft)."""
    c, p = log["config"], log["params"]
    agree = log["heldout_agreement_with_" + c["target"]]
    lines = [f"# {log['name']}", "",
             f"Draft model cut from {c['target']}: its layers {', '.join(map(str, c['layers']))}, fine-tuned on "
             f"{c['target']}'s own predictions, with an output layer over its {c['head_rows']:,} most frequent "
             "corpus tokens (lessonkit/training/cut_draft.py explains the design).", "",
             "## Architecture", "",
             f"- {len(c['layers'])} layers of {c['target']} (width, heads and MLP unchanged); input embedding "
             f"borrowed from {c['target']} at load (borrow.json; frozen in training, not shipped)",
             f"- output layer: {c['head_rows']:,} rows (untied, initialised from the target's rows); a target "
             f"token outside them cannot be drafted. They hold {log['head_coverage']:.1%} of the teacher "
             "pass' greedy picks",
             f"- weights read per draft token: {p['read_per_token']:,}, {p['read_per_token'] / p['target_read_per_token']:.3f}"
             f" of a {c['target']} step's {p['target_read_per_token']:,}; trained: {p['trainable']:,}",
             "", "## Data: the target's own predictions", "",
             f"Teacher pass over {c['target']} (lessonkit/training/distill.py, preset {log['distill_preset']!r}): "
             "corpus train-split windows teacher-forced in batched prefill and short corpus prompts followed by "
             "the target's greedy continuation; labels are the target's top-k next-token probabilities. Tokens "
             "per source/kind: " + ", ".join(f"{k} {v:,}" for k, v in log["train_tokens"].items()) + ".",
             "", "## Held-out agreement", "",
             f"Greedy next-token agreement with {c['target']} on its held-out teacher pass (text: teacher-forced "
             "corpus; greedy: the target's own continuations), before and after fine-tuning:", "",
             "| rows | " + " | ".join(agree) + " |", "|---|" + "---|" * len(agree),
             "| the cut, untrained | " + " | ".join(f"{log['initial_agreement'][k]:.1%}" for k in agree) + " |",
             "| fine-tuned | " + " | ".join(f"{agree[k]:.1%}" for k in agree) + " |"]
    lines += _measured_lines(log)
    lines += ["", "## Training", "",
              f"- {c['steps']} steps x {c['batch_size']} x {log['seq_len']} tokens = {log['tokens_seen']:,} tokens, "
              f"AdamW lr {c['lr']} (warmup {c['warmup']}, cosine to {c['min_lr_frac']}x), seed {c['seed']}, "
              f"torch threads {c['threads']}, deterministic algorithms; loss: top-k distillation + "
              f"{c['hard_weight']} x greedy-pick CE over the kept rows",
              f"- training time: {log['train_time_s'] / 60:.1f} min (+ {log['teacher_pass_s'] / 60:.1f} min teacher "
              f"pass, 0 when cached) on {log['machine']['platform']} ({log['machine']['cpu_count']} shared CPU "
              f"cores, {c['threads']} torch thread, torch {log['machine']['torch']})",
              _curves_line("curves", files), "",
              "## Reproduce", "", "```", f"lessonkit train {log['name']}", "```", "",
              "Weights are stored as bfloat16 in the engine's streaming layout. A reduced output layer has no "
              "transformers equivalent, so `lessonkit export` refuses this model.", "", "## Files", ""]
    lines += [f"- {k}: {v:,} bytes" for k, v in files.items()]
    return "\n".join(lines) + "\n"


def model_card(log: dict, files: dict) -> str:
    """card.md of a model trained by lessonkit.training.tiny_models (or cut_draft), from its log and file sizes."""
    if log.get("kind") == "cut":
        return cut_card(log, files)
    c, p = log["config"], log["params"]
    lines = [f"# {log['name']}", "",
             {"olmoe": "OLMoE-style mixture-of-experts target (transformers `OlmoeForCausalLM`).",
              "llama": "Dense drafter (transformers `LlamaForCausalLM`)."}[c["arch"]], "",
             "## Architecture", "",
             f"- width {c['dim']}, {c['n_layers']} layers, {c['n_heads']} query heads / {c['n_kv_heads']} KV heads "
             f"(head dim {c['dim'] // c['n_heads']}), intermediate {c['intermediate_size']}"
             + (f" per expert, {c['n_experts']} experts, top-{c['top_k']}, qk-norm, router aux loss coef "
                f"{c['router_aux_loss_coef']}" if c["arch"] == "olmoe" else "")
             + f", {'tied' if c['tie_embeddings'] else 'untied'} embeddings, vocabulary {log['vocab_size']:,} "
             "(corpus tokenizer), "
             f"trained at sequence length {c['seq_len']}",
             f"- parameters: total {p['total']:,}; excluding embeddings {p['total_excl_embeddings']:,}",
             f"- active per token: {p['active']:,} including embeddings, {p['active_excl_embeddings']:,} excluding",
             ]
    if "teacher_params" in log:
        tp = log["teacher_params"]
        lines.append(f"- vs target {c['distill_from']}: {p['active'] / tp['active']:.3f} of its active parameters "
                     f"including embeddings, {p['active_excl_embeddings'] / tp['active_excl_embeddings']:.3f} "
                     f"excluding (limit 1/8 = 0.125)")
    lines += _data_lines(log)
    if "expert_load" in log:
        lo = min(min(r) for r in log["expert_load"])
        hi = max(max(r) for r in log["expert_load"])
        lines += ["", f"Routing on held-out text: each expert's share of routed slots per layer lies in "
                  f"[{lo:.1%}, {hi:.1%}] (uniform = {1 / c['n_experts']:.1%})."]
    lines += ["", "## Training", "",
              f"- {c['steps']} steps x {c['batch_size']} x {c['seq_len']} tokens = {log['tokens_seen']:,} tokens, "
              f"AdamW lr {c['lr']} (warmup {c['warmup']}, cosine to {c['min_lr_frac']}x), seed {c['seed']}, "
              f"torch threads {c['threads']}, deterministic algorithms"
              + (f"; distilled from {c['distill_from']} (top-k loss + {c['hard_weight']} x greedy-pick CE)"
                 if c["distill_from"] else ""),
              f"- training time: {log['train_time_s'] / 60:.1f} min"
              + (f" (+ {log['teacher_pass_s'] / 60:.1f} min teacher pass, 0 when cached)" if c["distill_from"] else "")
              + f" on {log['machine']['platform']} (2 shared CPU cores, {c['threads']} torch thread, "
              f"torch {log['machine']['torch']})",
              _curves_line("loss curve", files), "",
              "## Reproduce", "", "```", f"lessonkit train {log['name']}", "```", "",
              "Weights are stored as bfloat16 in the engine's streaming layout; `lessonkit export "
              f"{log['name']} OUT_DIR` writes a Hugging Face checkpoint.", "",
              "## Files", ""]
    lines += [f"- {k}: {v:,} bytes" for k, v in files.items()]
    return "\n".join(lines) + "\n"
