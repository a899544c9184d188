"""A draft model cut from its target: the target's first layers, fine-tuned on the target's own predictions,
with an output layer over the target's most frequent tokens (`lessonkit train smollm2-draft`).

Why a cut. A drafter trained from scratch learns the language from its teacher pass alone: smollm2-draft
trained that way (width 96, 2 layers, 384k tokens) agreed with smollm2-135m on 17-18% of held-out prose
and code tokens, and accepted 7% of its drafts. The target's own first layers already hold what its
pretraining taught it: its token embedding and the early layers that read it. Cut after layer 2, the
target's final norm and output layer make nonsense of the residual stream (about 3% agreement: the model
was never trained to exit early, unlike LayerSkip's), but a few minutes of distillation on the teacher
pass teach the two layers to predict what the whole stack would (the layer-skipping drafts of Draft &
Verify, Zhang et al. 2024, and LayerSkip, Elhoushi et al. 2024, start from the same idea).

What it costs per draft token is what a memory-bound step reads: two layers of width 576 (7 M weights)
and the output layer. The full output layer (49,152 x 576 = 28 M) would cost four times the layers, so
the drafter's output layer keeps only the rows of the 8,192 most frequent corpus tokens (FR-Spec, Zhao et
al. 2025; lessonkit/speculative/vocab.py), 4.7 M weights, initialised from the target's rows and trained
with the layers. A target token outside those rows cannot be proposed: the loss ignores it.

What it ships: the two layers, the final norm and the reduced output layer (config.json `head_rows`,
dense tensor `lm_head_ids`), in bfloat16. The input embedding is the target's, unchanged (it is frozen
in training): borrow.json names it, and the engine assembles the model at first load
(lessonkit/models/borrowed.py), so 57 MB of embedding are not shipped twice.

Shapes: B batch rows, T positions, K top-k, D width, R output rows (head_rows), V vocabulary.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lessonkit.files.atomic import atomic_write
from lessonkit.engine.checkpoint import FORMAT_VERSION, _atomic_save, _check_shapes, _layer_tensors, _Tensors
from lessonkit.engine.config import ModelConfig
from lessonkit.engine.machine import machine_record
from lessonkit.errors import LessonkitError
from lessonkit.engine.threads import pin_torch_threads
from lessonkit.models.borrowed import BORROW_FILE
from lessonkit.models.integrity import write_manifest
from lessonkit.models.registry import load_model, resolve_model_dir
from lessonkit.speculative.vocab import frequent_tokens
from lessonkit.training.distill import PRESETS as DISTILL_PRESETS
from lessonkit.training.distill import agreement, distill_data, distill_loss, heldout, teacher_model
from lessonkit.training.tiny_models import cosine_lr


@dataclass(frozen=True)
class CutConfig:
    name: str
    target: str                       # the model it is cut from and drafts for
    layers: tuple = (0, 1)            # the target's layers it keeps, in order
    head_rows: int = 8192             # output rows: the target's most frequent corpus tokens
    distill_preset: str = "smollm2-135m-spread"   # the teacher pass it learns from (distill.PRESETS)
    steps: int = 1500
    batch_size: int = 8
    lr: float = 3e-4
    warmup: int = 50
    min_lr_frac: float = 0.1
    grad_clip: float = 1.0
    hard_weight: float = 0.5          # weight of the target's greedy pick next to its top-k distribution
    seed: int = 0
    threads: int = 1
    eval_every: int = 250
    log_every: int = 10


# 2 threads: the teacher pass and training take 34 min together (2026-12-02), the measurement about 3 more
PRESETS = {"smollm2-draft": CutConfig(name="smollm2-draft", target="smollm2-135m", threads=2)}


# ----------------------------------------------------------------------------- the model
def cut_model(teacher, layers, head_ids: torch.Tensor):
    """A copy of the transformers `teacher` with only `layers` and an untied output layer over the rows
    `head_ids` (initialised from the teacher's); its input embedding frozen (it stays the teacher's)."""
    n = teacher.config.num_hidden_layers
    if not layers or any(not 0 <= l < n for l in layers):
        raise LessonkitError(f"cut layers {list(layers)}: the target has layers 0 .. {n - 1}")
    m = copy.deepcopy(teacher)
    m.model.layers = torch.nn.ModuleList([m.model.layers[l] for l in layers])
    for i, layer in enumerate(m.model.layers):
        layer.self_attn.layer_idx = i
    m.config.num_hidden_layers = len(layers)
    m.config.tie_word_embeddings = False
    head = torch.nn.Linear(m.config.hidden_size, len(head_ids), bias=False)
    with torch.no_grad():
        head.weight.copy_(teacher.lm_head.weight[head_ids])
    m.lm_head = head
    m.model.embed_tokens.weight.requires_grad_(False)
    return m.train()


def reduced_targets(topk_ids: torch.Tensor, topk_probs: torch.Tensor, row_of: torch.Tensor):
    """The teacher's top-k [.., K] in output-row indices: (rows, probabilities with 0 for tokens that have no
    row, whether the greedy pick has one [..])."""
    rows = row_of[topk_ids.long()]
    keep = rows >= 0
    return rows.clamp_min(0), topk_probs.float() * keep, keep[..., 0]


def cut_loss(logits: torch.Tensor, rows: torch.Tensor, probs: torch.Tensor, has_pick: torch.Tensor,
             hard_weight: float) -> torch.Tensor:
    """lessonkit.training.distill's loss on a reduced output layer: the teacher's top-k renormalised over the
    kept rows, the greedy-pick part only where the pick has a row (the arguments of `reduced_targets`)."""
    return distill_loss(logits, rows, probs, hard_weight, has_pick=has_pick)


@torch.no_grad()
def cut_agreement(model, head_ids: torch.Tensor, held, batch: int = 16) -> dict:
    """Greedy agreement of the cut model with its target on a (held-out) teacher pass."""
    was = model.training
    model.eval()
    pred = torch.cat([head_ids[model(input_ids=held.tokens[i:i + batch]).logits.argmax(-1)]
                      for i in range(0, len(held.tokens), batch)])
    model.train(was)
    return agreement(pred, held)


# ----------------------------------------------------------------------------- training
def train_cut(cfg: CutConfig, progress: bool = True) -> tuple:
    """Cut, then distil; returns (transformers model, head token ids [R], training log)."""
    pin_torch_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(cfg.seed)
    target = load_model(cfg.target)
    t_data = time.perf_counter()
    data = distill_data(target, cfg.distill_preset, progress)
    held = distill_data(target, heldout(DISTILL_PRESETS[cfg.distill_preset]), progress)
    t_data = time.perf_counter() - t_data
    head_ids = frequent_tokens(target, cfg.head_rows)
    row_of = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    row_of[head_ids] = torch.arange(len(head_ids))
    teacher = teacher_model(target)
    model = cut_model(teacher, cfg.layers, head_ids)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    g = torch.Generator().manual_seed(cfg.seed)
    log = {"name": cfg.name, "kind": "cut", "config": asdict(cfg), "distill_preset": cfg.distill_preset,
           "train_tokens": {f"{s}/{k}": int(data.rows(k, s).numel() * data.tokens.shape[1])
                            for s in ("text", "greedy") for k in ("prose", "code", "records")},
           "seq_len": int(data.tokens.shape[1]), "teacher_pass_s": round(t_data, 1),
           "params": _params(model, teacher), "steps": [], "eval": [],
           "initial_agreement": cut_agreement(model, head_ids, held)}
    t0 = time.perf_counter()
    bar = tqdm(range(cfg.steps), desc=f"train {cfg.name}", disable=not progress, mininterval=2.0)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = cosine_lr(cfg, step)
        idx = torch.randint(0, len(data.tokens), (cfg.batch_size,), generator=g)
        logits = model(input_ids=data.tokens[idx]).logits                       # [B, T, R]
        loss = cut_loss(logits, *reduced_targets(data.topk_ids[idx], data.topk_probs[idx], row_of), cfg.hard_weight)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, cfg.grad_clip)
        opt.step()
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            loss_f = float(loss.detach())
            log["steps"].append({"step": step, "loss": round(loss_f, 5), "lr": cosine_lr(cfg, step),
                                 "elapsed_s": round(time.perf_counter() - t0, 2)})
            bar.set_postfix(loss=f"{loss_f:.3f}")
        if (step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1:
            log["eval"].append({"step": step + 1, **{k: round(v, 5) for k, v in
                                                     cut_agreement(model, head_ids, held).items()}})
    log["train_time_s"] = round(time.perf_counter() - t0, 1)
    log["tokens_seen"] = cfg.steps * cfg.batch_size * log["seq_len"]
    log["heldout_agreement_with_" + cfg.target] = cut_agreement(model, head_ids, held)
    log["head_coverage"] = _coverage(data, row_of)
    log["machine"] = {**machine_record(refuse_bad_weights=False), "threads": cfg.threads}    # the one record
    return model, head_ids, log


def _params(model, teacher) -> dict:
    """Weights a one-token step reads (all but the input embedding, of which it reads one row; a tied output
    layer is the embedding, read in full), the cut's and its target's."""
    def read(m):
        n = sum(p.numel() for p in m.parameters()) - m.model.embed_tokens.weight.numel()
        return n + (m.lm_head.weight.numel() if m.config.tie_word_embeddings else 0)
    return {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "read_per_token": read(model), "target_read_per_token": read(teacher)}


def _coverage(data, row_of: torch.Tensor) -> float:
    """Share of the teacher pass' greedy picks that have a row in the reduced output layer."""
    return float((row_of[data.greedy] >= 0).float().mean())


# ----------------------------------------------------------------------------- shipping
def write_cut(model, head_ids: torch.Tensor, cfg: CutConfig, out: Path, dtype=torch.bfloat16) -> None:
    """The streaming layout without the input embedding (borrowed from cfg.target at load), in `dtype`."""
    target_dir = resolve_model_dir(cfg.target)[1]
    base = ModelConfig.load(target_dir / "config.json")
    c = dataclasses.replace(base, n_layers=len(cfg.layers), tie_embeddings=False, head_rows=len(head_ids))
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    t = _Tensors(sd, f"{cfg.name} (cut of {cfg.target})")
    dense = {"embed": t.take("model.embed_tokens.weight"), "norm": t.take("model.norm.weight"),
             "lm_head": t.take("lm_head.weight"), "lm_head_ids": head_ids.to(torch.int64)}
    experts: dict = {}
    for l in range(c.n_layers):
        _layer_tensors(c, t, l, dense, experts)
    _check_shapes(c, dense, experts, cfg.name)
    del dense["embed"]                                            # borrowed: borrow.json names it
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": f"lessonkit-stream-v{FORMAT_VERSION}"}
    _atomic_save({k: v if k == "lm_head_ids" else v.to(dtype) for k, v in dense.items()},
                 out / "dense.safetensors", meta)
    _atomic_save({k: v.to(dtype) for k, v in experts.items()}, out / "experts.safetensors", meta)
    c.save(out / "config.json")
    atomic_write(out / BORROW_FILE, (json.dumps({"base": cfg.target, "tensors": ["embed"]}, indent=1) + "\n").encode())
    shutil.copyfile(target_dir / "tokenizer.json", out / "tokenizer.json")
    write_manifest(out)
